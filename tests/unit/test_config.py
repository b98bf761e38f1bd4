"""The middleware's options: each one checked at its edges and carried through exactly (pure)."""

from __future__ import annotations

import functools
import inspect
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from unittest.mock import AsyncMock

import pytest

from faststream_retry import Fixed, RetryConfigError, RetryEvent, RetryMiddleware, RetryPolicy
from faststream_retry.core.config import RETRY_TRACEBACKS, RetryConfig, traceback_on_retry
from faststream_retry.core.outage import OutageOptions
from faststream_retry.core.topology import TopologyOptions

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

STOCK: dict[str, Any] = {
    "prefix": "retry",
    "tick": None,
    "max_delay": timedelta(days=1),
    "queue_type": "classic",
    "delivery_limit": 20,
    "prefetch": 100,
    "publish_failure_pause": 1,
    "publish_timeout": 10,
    "log_retry_traceback": "first",
    "outage_after": None,
    "outage_probe": None,
    "outage_hold": timedelta(minutes=5),
}


def build(default: RetryPolicy | None = None, **changes: Any) -> RetryConfig:
    return RetryConfig.build(default, **(STOCK | changes))


def refusal(**changes: Any) -> str:
    with pytest.raises(RetryConfigError) as raised:
        build(**changes)
    return str(raised.value)


def test_every_option_is_carried_in_the_plugins_units() -> None:
    """Durations become ms (topology) or s (timeouts); the rest as given."""
    default = RetryPolicy(backoff=Fixed(2))
    config = build(
        default,
        prefix="svc",
        tick=0.5,
        max_delay=60,
        queue_type="quorum",
        delivery_limit=7,
        prefetch=3,
        publish_failure_pause=timedelta(milliseconds=250),
        publish_timeout=2.5,
        log_retry_traceback="every",
        outage_after=20,
        outage_probe=0.5,
        outage_hold=timedelta(minutes=2),
    )
    assert config == RetryConfig(
        default=default,
        topology=TopologyOptions(
            prefix="svc", max_delay_ms=60_000, queue_type="quorum", delivery_limit=7, tick_ms=500
        ),
        prefetch=3,
        pause_s=0.25,
        publish_timeout_s=2.5,
        log_retry_traceback="every",
        outage=OutageOptions(after=20, probe_ms=500, hold_ms=120_000),
    )


def test_stock_values() -> None:
    """No default policy means RetryPolicy(); classic queues; the tick left to the plan."""
    config = build()
    assert config.default == RetryPolicy()
    assert config.topology == TopologyOptions("retry", 86_400_000, "classic", 20, None)
    assert config.outage is None


def test_a_publish_timeout_below_a_second_is_refused() -> None:
    """A copy confirmed after the timeout is published again: a tryout's 0 s multiplied
    a message six times. A zero pause is fine (it only makes the requeue prompt)."""
    assert build(publish_timeout=1).publish_timeout_s == 1
    assert refusal(publish_timeout=0.999) == (
        "publish_timeout must be at least 1 s, got 999 ms: a copy whose confirm comes later "
        "is published again, and its message handled twice"
    )
    assert refusal(publish_timeout=0).startswith("publish_timeout must be at least 1 s, got 0 ms")
    assert build(publish_failure_pause=0).pause_s == 0


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("max_delay", 2**32 / 1000, "must be at most 49 d 17 h 2 min 47.295 s"),
        ("publish_timeout", 0.5, "must be at least 1 s, got 500 ms"),
        ("claim_idle", 0.5, "must be at least 1 s, got 500 ms"),
    ],
)
def test_a_bound_names_its_option_for_the_worker_config(
    option: str, value: float, problem: str
) -> None:
    """The worker's config says the key from ``option`` and the text from ``problem``."""
    changes: dict[str, Any] = {option: value}
    with pytest.raises(RetryConfigError) as raised:
        build(**changes)
    assert raised.value.option == option
    assert raised.value.problem.startswith(problem)
    assert str(raised.value) == f"{option} {raised.value.problem}"


def test_max_delay_is_at_most_rabbitmqs_longest_ttl() -> None:
    """x-message-ttl is a 32-bit count of ms: a longer tier could never be declared."""
    assert build(max_delay=(2**32 - 1) / 1000).topology.max_delay_ms == 2**32 - 1
    assert refusal(max_delay=2**32 / 1000) == (
        "max_delay must be at most 49 d 17 h 2 min 47.295 s (RabbitMQ's longest queue TTL), "
        "got 49 d 17 h 2 min 47.296 s"
    )


def test_prefix_length() -> None:
    """100 characters is the longest prefix (queue names are at most 255 bytes)."""
    assert build(prefix="p" * 100).topology.prefix == "p" * 100
    assert refusal(prefix="p" * 101) == f"prefix must be a short non-empty str, got {'p' * 101!r}"
    assert refusal(prefix="") == "prefix must be a short non-empty str, got ''"


def test_queue_type() -> None:
    """Only RabbitMQ's two durable types, spelled as RabbitMQ spells them."""
    assert build(queue_type="classic").topology.queue_type == "classic"
    assert refusal(queue_type="Quorum") == "queue_type is 'classic' or 'quorum', got 'Quorum'"


@pytest.mark.parametrize("name", ["delivery_limit", "prefetch"])
def test_positive_ints(name: str) -> None:
    """1 is the smallest; 0, a bool and a float are refused, naming the option."""
    one: dict[str, Any] = {name: 1}
    assert build(**one) is not None
    for bad in (0, True, 1.0):
        assert refusal(**{name: bad}) == f"{name} must be an int >= 1, got {bad!r}"


@pytest.mark.parametrize(
    "name", ["tick", "max_delay", "publish_failure_pause", "publish_timeout", "claim_idle"]
)
def test_durations_name_themselves(name: str) -> None:
    """A duration that is not one is refused with the option's name."""
    assert refusal(**{name: "1s"}) == f"{name} takes a timedelta or seconds, got '1s'"


def test_tick_and_max_delay_are_checked_together() -> None:
    """An explicit tick must be >= 100 ms and fit max_delay at least once."""
    assert build(tick=0.1, max_delay=0.1).topology.tick_ms == 100
    assert refusal(tick=0.099).startswith("tick must be at least 100 ms, got 99 ms")
    assert refusal(tick=2, max_delay=1) == (
        "max_delay (1000 ms) must be at least one tick (2000 ms)"
    )


def test_default_must_be_a_policy() -> None:
    """A handler policy or a dict in place of default is a mistake worth naming."""
    with pytest.raises(RetryConfigError) as raised:
        RetryConfig.build({"max_attempts": 3}, **STOCK)  # type: ignore[arg-type]
    assert str(raised.value) == "default takes a RetryPolicy(...), got {'max_attempts': 3}"


@pytest.mark.parametrize("value", ["first", "every", "never"])
def test_each_retry_traceback_choice_is_carried(value: str) -> None:
    """``log_retry_traceback`` takes exactly the three documented values."""
    assert build(log_retry_traceback=value).log_retry_traceback == value
    assert value in RETRY_TRACEBACKS


def test_retry_traceback_choices_are_the_documented_three() -> None:
    """The allowed values, in the order the error and the docs give them."""
    assert RETRY_TRACEBACKS == ("first", "every", "never")


@pytest.mark.parametrize("value", ["First", "all", "", None, True, 1])
def test_an_unknown_retry_traceback_choice_names_the_allowed_ones(value: object) -> None:
    """A typo fails at construction, listing what is allowed."""
    assert refusal(log_retry_traceback=value) == (
        f"log_retry_traceback is 'first', 'every' or 'never', got {value!r}"
    )


@pytest.mark.parametrize(
    ("choice", "attempt", "expected"),
    [
        ("first", 1, True),
        ("first", 2, False),
        ("first", 0, False),
        ("every", 1, True),
        ("every", 5, True),
        ("never", 1, False),
        ("never", 3, False),
    ],
)
def test_which_retry_lines_carry_the_traceback(choice: str, attempt: int, expected: bool) -> None:
    """first: a message's first failure only; every: each; never: none."""
    assert traceback_on_retry(choice, attempt) is expected


def test_quorum_is_the_default_queue_type() -> None:
    """Classic queues dead-letter at most once: "never lost" needs quorum out of the box."""
    assert TopologyOptions("p", 1000).queue_type == "quorum"
    default = inspect.signature(RetryMiddleware).parameters["queue_type"].default
    assert default == "quorum"
    assert build(queue_type=default).topology.queue_type == "quorum"


async def _async_hook(event: RetryEvent) -> None:
    """What the tryout passed: accepted before, never run (a "never awaited" warning only)."""


async def _async_generator_hook(event: RetryEvent) -> AsyncIterator[None]:
    yield


class _AsyncCallable:
    async def __call__(self, event: RetryEvent) -> None:
        """An instance whose __call__ is async."""


class _PlainCallable:
    def __call__(self, event: RetryEvent) -> None:
        """A plain callable instance: fine."""


@pytest.mark.parametrize(
    "hook",
    [
        _async_hook,
        _async_generator_hook,
        _AsyncCallable(),
        functools.partial(_async_hook),
        AsyncMock(),
    ],
    ids=["async def", "async generator", "async __call__", "partial", "AsyncMock"],
)
def test_an_async_hook_is_refused_with_the_fix(hook: Any) -> None:
    """Hooks are called synchronously: an async one is refused in hooks= and add_hook."""
    fix = r"hooks are called synchronously, so it would never run\. Pass a plain function; "
    with pytest.raises(RetryConfigError, match=r"is async: " + fix) as caught:
        RetryMiddleware(hooks=[hook])
    assert "create_task(work(event))" in str(caught.value)
    retry = RetryMiddleware()
    with pytest.raises(RetryConfigError, match=fix):
        retry.add_hook(hook)


@pytest.mark.parametrize(
    "hook", [print, _PlainCallable(), functools.partial(print), lambda event: None]
)
def test_plain_hooks_are_taken(hook: Any) -> None:
    RetryMiddleware(hooks=[hook]).add_hook(hook)


def test_claim_idle_is_a_minute_unless_set_and_at_least_a_second() -> None:
    """Redis' claim idle time: carried in ms; below 1 s refused, naming the option and why."""
    assert build().claim_idle_ms == 60_000
    assert (
        build().claim_idle_ms
        == RetryConfig(
            default=RetryPolicy(),
            topology=build().topology,
            prefetch=1,
            pause_s=1,
            publish_timeout_s=1,
            log_retry_traceback="first",
        ).claim_idle_ms
    )
    assert build(claim_idle=timedelta(seconds=1)).claim_idle_ms == 1000
    assert build(claim_idle=90).claim_idle_ms == 90_000
    assert refusal(claim_idle=timedelta(milliseconds=999)) == (
        "claim_idle must be at least 1 s, got 999 ms: a replica keeps its pending entries "
        "alive every quarter of it, and a shorter one would have live replicas claim each "
        "other's"
    )


def test_the_dead_letter_cap_is_100000_unless_set_none_for_no_cap() -> None:
    """``dlq_max_length``: a count of letters, or ``None`` (no cap); anything else refused
    naming both, so a 0 meant as "no cap" is not taken as a cap of nothing."""
    assert build().dlq_max_length == 100_000
    assert RetryMiddleware()._plugin.config.dlq_max_length == 100_000  # the signature's default
    assert build(dlq_max_length=5).dlq_max_length == 5
    assert build(dlq_max_length=1).dlq_max_length == 1, "one letter is a cap, the least"
    assert build(dlq_max_length=None).dlq_max_length is None
    for wrong in (0, -1, True, 2.5, "10"):
        assert refusal(dlq_max_length=wrong) == (
            f"dlq_max_length must be an int >= 1, or None for no cap, got {wrong!r}"
        )
