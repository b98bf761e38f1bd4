"""Where the guard that stops a settled failure goes (``middleware.settled``).

The plugin's scope does the guard's work when the plugin's middleware is the first of the
broker's, so every message then passes one middleware of the plugin's, not two. The
behaviours the guard keeps (an app's middleware outside the plugin hears of every failure,
FastStream logs none it settled, Redis' successes acknowledged beside the handlers) are
pinned on real brokers: tests/integration/test_nothing_else_changes.py,
tests/redis/test_acks.py, tests/redis/test_middleware.py, tests/nats.
"""

from __future__ import annotations

from typing import Any

import pytest
from faststream import BaseMiddleware
from faststream.nats import NatsBroker
from faststream.rabbit import RabbitBroker
from faststream.redis import RedisBroker

from faststream_retry import RetryMiddleware
from faststream_retry.middleware.settled import Guard

BROKERS = [RabbitBroker, NatsBroker, RedisBroker]


class Observer(BaseMiddleware):
    """An app's middleware."""


def guards(broker: Any) -> list[int]:
    """The places of the plugin's guards in ``broker``'s middlewares."""
    return [i for i, m in enumerate(broker.middlewares) if isinstance(m, Guard)]


@pytest.mark.parametrize("kind", BROKERS)
def test_no_guard_when_the_plugin_is_the_first_middleware(kind: type[Any]) -> None:
    retry = RetryMiddleware()
    broker = retry.install(kind(middlewares=[retry, Observer]))
    assert list(broker.middlewares) == [retry, Observer]


@pytest.mark.parametrize("kind", BROKERS)
def test_no_guard_when_install_puts_the_plugin_first(kind: type[Any]) -> None:
    retry = RetryMiddleware()
    broker = retry.install(kind(middlewares=[Observer]))
    assert list(broker.middlewares) == [retry, Observer]


@pytest.mark.parametrize("kind", BROKERS)
def test_the_guard_goes_first_when_a_middleware_of_the_app_is_outside_the_plugin(
    kind: type[Any],
) -> None:
    retry = RetryMiddleware()
    broker = retry.install(kind(middlewares=[Observer, retry]))
    assert guards(broker) == [0]
    assert list(broker.middlewares)[1:] == [Observer, retry]
