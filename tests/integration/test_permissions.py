"""A least-privilege RabbitMQ user: the permissions the Topology reference lists are enough, and a
missing one stops the start with ``RetryTopologyError`` naming the object and the
permission, not a raw ``ChannelAccessRefused``."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import pytest

from faststream_retry import Fixed, PermanentError, RetryPolicy, RetryTopologyError
from faststream_retry.core import headers as h
from faststream_retry.core.events import EventKind
from tests.rabbit import App, drain, eventually, run_ctl, script_broker_ctl, series_of, unique

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


def patterns(prefix: str, *queues: str) -> dict[str, str]:
    """The Topology reference's patterns for a service with this tier prefix and these work queues."""
    p = re.escape(prefix)
    q = "|".join(re.escape(queue) for queue in queues)
    return {
        "configure": rf"^({p}\.(delay\.\d+|queues)|({q})(\.retry|\.dlq)?)$",
        "write": rf"^(amq\.default|{p}\.delay\.\d+)$",
        "read": rf"^({p}\.(delay\.\d+|queues)|({q})(\.retry)?)$",
    }


@pytest.fixture
async def grant(rabbit_url: str) -> AsyncIterator[Callable[[dict[str, str]], str]]:
    """Create users with given vhost permissions; return each one's URL. Deleted after."""
    ctl = script_broker_ctl(rabbit_url)
    if ctl is None:
        pytest.skip("needs the broker of scripts/rabbitmq/start.sh to create users")
    users: list[str] = []

    def create(permissions: dict[str, str]) -> str:
        user = unique("least")
        run_ctl(ctl, "add_user", user, "secret")
        users.append(user)
        run_ctl(
            ctl,
            "set_permissions",
            "-p",
            "/",
            user,
            permissions["configure"],
            permissions["write"],
            permissions["read"],
        )
        parts = urlsplit(rabbit_url)
        netloc = f"{user}:secret@{parts.hostname}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    yield create
    for user in users:
        await asyncio.to_thread(run_ctl, ctl, "delete_user", user)


# Several broker round trips (rabbitmqctl, policies, a killed process): 120 s was short
# for them on a loaded machine, where a sid Python job runs beside the other lane.
@pytest.mark.timeout(300)
async def test_the_documented_permissions_run_retries_and_dead_letters(
    grant: Callable[[dict[str, str]], str],
    amqp: AbstractRobustConnection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Retried messages are processed once, poison ones dead-lettered once, by id; and
    nothing at start (the registry, the look for stranded queues) is refused."""
    prefix, queue = unique("lp"), unique("orders")
    app = App(
        grant(patterns(prefix, queue)), prefix=prefix, default=RetryPolicy(backoff=Fixed(0.2))
    )
    calls: Counter[str] = Counter()
    processed: list[str] = []

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        calls[body] += 1
        if body.startswith("poison"):
            raise PermanentError(body)
        if calls[body] < 3:
            raise ConnectionError("down")
        processed.append(body)

    good = [unique("good") for _ in range(3)]
    poison = [unique("poison") for _ in range(2)]
    try:
        with caplog.at_level(logging.WARNING, logger="faststream_retry"):
            await app.start()
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        for body in good + poison:
            await app.broker.publish(body, queue=queue, message_id=body)
        await eventually(lambda: sorted(processed) == sorted(good), timeout=20, what="processed")
        await eventually(
            lambda: sum(e.kind is EventKind.DEAD_LETTERED for e in app.events) == len(poison),
            what="dead letters",
        )
        dead = await drain(amqp, f"{queue}.dlq", expect=len(poison))
        assert sorted(m.message_id or "" for m in dead) == sorted(poison)
        assert all(m.headers[h.REASON] == "permanent" for m in dead)
        await app.stop()
        assert calls == {**dict.fromkeys(good, 3), **dict.fromkeys(poison, 1)}
        assert await app.waiting(amqp, queue) == 0
    finally:
        await app.stop()
        await app.cleanup(amqp)


# Several broker round trips (rabbitmqctl, policies, a killed process): 120 s was short
# for them on a loaded machine, where a sid Python job runs beside the other lane.
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("take", "queue_type", "expected"),
    [
        (
            "configure",
            "quorum",
            "- exchange '{prefix}.delay.100': to declare it, the user needs configure permission",
        ),
        (
            "write",
            "quorum",
            "- queue '{prefix}.delay.100': to bind it, the user needs write permission",
        ),
        (
            # RabbitMQ checks read on a queue that dead-letters when it is declared. 3.x's
            # refusal does not say which permission; 4.x's does, and so does the advice.
            "read",
            "quorum",
            {
                (3, 0): (
                    "- queue '{queue}.retry': to declare it, the user needs configure "
                    "permission, and read permission on it and write permission on "
                    "'amq.default'"
                ),
                (4, 0): "- queue '{queue}.retry': to declare it, the user needs read permission",
            },
        ),
        (
            # A classic .retry has no dead-letter exchange: its consumer finds out.
            "read",
            "classic",
            "- queue '{queue}.retry': to consume it, the user needs read permission",
        ),
    ],
    ids=["configure-tiers", "write-tiers", "read-retry", "read-retry-classic"],
)
async def test_a_missing_permission_is_named_at_start(
    grant: Callable[[dict[str, str]], str],
    amqp: AbstractRobustConnection,
    take: str,
    queue_type: str,
    expected: str | dict[tuple[int, int], str],
) -> None:
    """One permission short of the documented set: the start fails, naming what is missing."""
    if isinstance(expected, dict):  # the newest wording the broker's series has
        expected = expected[max(s for s in expected if s <= series_of(amqp))]
    prefix, queue = unique("lp"), unique("orders")
    permissions = patterns(prefix, queue)
    p, q = re.escape(prefix), re.escape(queue)
    permissions[take] = {
        "configure": rf"^({q})(\.retry|\.dlq)?$",  # no tiers
        "write": r"^amq\.default$",  # no tiers
        "read": rf"^({p}\.delay\.\d+|{q})$",  # no .retry
    }[take]
    app = App(grant(permissions), prefix=prefix, max_delay=0.1, queue_type=queue_type)

    @app.broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise ConnectionError(body)

    try:
        with pytest.raises(RetryTopologyError) as caught:
            await app.start()
    finally:
        await app.broker.stop()
        await app.cleanup(amqp)
    text = str(caught.value)
    assert text.startswith("faststream-retry's RabbitMQ user lacks permissions it needs")
    assert expected.format(prefix=prefix, queue=queue) in text
    assert "ACCESS_REFUSED" in text
