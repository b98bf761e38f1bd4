"""The explanation's schedule is what the middleware and the re-check consumer do (pure).

Every number ``explain`` prints comes from ``decide``, ``Tiers.wait`` and ``recheck_step``;
these tests pin the numbers for known policies and check, for any policy and any
``rand()``, that what ``decide`` picks lies in the range the schedule states.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from faststream_retry import Exponential, Fixed, RetryPolicy, Schedule, TransientError
from faststream_retry.core.decision import Action, decide
from faststream_retry.core.policy import HandlerPolicy
from faststream_retry.core.tiers import Tiers
from faststream_retry.core.topology import Handler, Route, TopologyOptions, plan, work_queue_of
from faststream_retry.ops.explanation import (
    Explanation,
    Leg,
    describe_backoff,
    explain_plan,
    format_ms,
    legs,
)
from faststream_retry.ops.management import vhost_of


def _explain(route: Route, default: RetryPolicy, max_delay_ms: int) -> Explanation:
    topology = plan([route], default, TopologyOptions(prefix="p", max_delay_ms=max_delay_ms))
    return explain_plan("m:app", topology, default, [(route, ["handle"])])


def _handler_policy(**options: object) -> HandlerPolicy:
    return HandlerPolicy(dict(options))


def test_a_jittered_exponential_schedule_is_each_delays_range_rounded_up_to_the_tick() -> None:
    """1 immediate retry, then 1 s x 2^(n-1) with jitter 0.5: delays [500, 1500) ms and so on.

    Rounded up to the 1 s tick: 1-2 s, 1-3 s, 2-6 s; dead letter after 4-11 s.
    """
    default = RetryPolicy(max_attempts=3, backoff=Fixed(2))
    handler = _handler_policy(
        max_attempts=5,
        immediate=1,
        backoff=Exponential(initial=1, factor=2, maximum=10, jitter=0.5),
    )
    route = Route("q", (Handler(handler),))
    explanation = _explain(route, default, max_delay_ms=60_000)
    (queue,) = explanation.queues
    (explained,) = queue.handlers
    rows = [
        (s.attempt, s.action, s.delay_min_ms, s.delay_max_ms, s.elapsed_min_ms, s.elapsed_max_ms)
        for s in explained.schedule
    ]
    assert rows == [
        (1, "retry_now", 0, 0, 0, 0),
        (2, "retry_later", 1000, 2000, 1000, 2000),
        (3, "retry_later", 1000, 3000, 2000, 5000),
        (4, "retry_later", 2000, 6000, 4000, 11000),
        (5, "dead_letter", 0, 0, 4000, 11000),
    ]
    assert (explained.dead_letter_min_ms, explained.dead_letter_max_ms) == (4000, 11000)
    assert explained.schedule[2].legs_max == (Leg(2000, "q.retry"), Leg(1000, "q"))
    assert explanation.tiers_ms == (1000, 2000, 4000, 8000, 16000, 32000)


def test_a_delay_that_is_one_tier_goes_home_from_it_and_a_longer_one_through_recheck() -> None:
    tiers = Tiers.build(100, 60_000)
    route = Route("q", ())
    assert legs(800, tiers, route) == (Leg(800, "q"),)
    assert legs(1100, tiers, route) == (Leg(800, "q.retry"), Leg(200, "q.retry"), Leg(100, "q"))


def test_a_reject_publish_queue_ends_every_wait_in_recheck_which_releases_it() -> None:
    """``x-overflow: reject-publish``: no tier delivers to the work queue (``home_from_tier``)."""
    tiers = Tiers.build(100, 60_000)
    route = Route("q", (), {"x-overflow": "reject-publish"})
    assert legs(800, tiers, route) == (Leg(800, "q.retry"),)


@given(
    ticks=st.integers(1, 600),
    tick=st.sampled_from([100, 250, 1000]),
)
def test_the_legs_of_a_delay_on_the_tick_grid_add_up_to_it(ticks: int, tick: int) -> None:
    tiers = Tiers.build(tick, tick * 600)
    path = legs(ticks * tick, tiers, Route("q", ()))
    assert sum(leg.tier_ms for leg in path) == ticks * tick
    assert [leg.to for leg in path] == ["q.retry"] * (len(path) - 1) + ["q"]
    assert len(path) <= ticks.bit_length() + 1


@given(
    initial=st.integers(100, 5000),
    factor=st.floats(1, 4),
    jitter=st.floats(0, 1),
    immediate=st.integers(0, 2),
    max_attempts=st.integers(1, 8),
    rand=st.floats(0, 1, exclude_max=True),
)
def test_whatever_rand_gives_decide_picks_a_delay_inside_the_stated_range(
    *, initial: int, factor: float, jitter: float, immediate: int, max_attempts: int, rand: float
) -> None:
    default = RetryPolicy()
    handler = _handler_policy(
        max_attempts=max_attempts,
        immediate=immediate,
        backoff=Exponential(initial=initial / 1000, factor=factor, maximum=120, jitter=jitter),
    )
    route = Route("q", (Handler(handler),))
    topology = plan([route], default, TopologyOptions(prefix="p", max_delay_ms=600_000))
    explanation = explain_plan("m:app", topology, default, [(route, ["handle"])])
    schedule = explanation.queues[0].handlers[0].schedule
    assert len(schedule) == max_attempts
    assert schedule[-1].action == "dead_letter"
    for step in schedule:
        decision = decide(
            TransientError("x"),
            attempt=step.attempt,
            handler=handler,
            default=default,
            tiers=topology.tiers,
            rand=lambda: rand,
        )
        assert decision.action == Action(step.action)
        assert step.delay_min_ms <= decision.delay_ms <= step.delay_max_ms


def test_a_handler_without_retry_policy_runs_the_default_and_unknown_failures_are_transient() -> (
    None
):
    default = RetryPolicy(max_attempts=2, backoff=Schedule([1, 5]), transient=(KeyError,))
    explanation = explain_plan(
        "m:app",
        plan([Route("q", (Handler(None),))], default, TopologyOptions("p", 60_000)),
        default,
        [(Route("q", (Handler(None),)), ["handle"])],
    )
    explained = explanation.queues[0].handlers[0]
    assert not explained.own_policy
    assert explained.rules is not None
    assert explained.rules.handler == {"transient": (), "permanent": ()}
    assert explained.rules.default == {"transient": ("KeyError",), "permanent": ()}
    assert (explained.rules.unknown, explained.rules.unknown_rule) == ("transient", "fallback")
    assert [s.delay_min_ms for s in explained.schedule] == [1000, 0]


def test_listing_exception_as_permanent_makes_unknown_failures_permanent() -> None:
    default = RetryPolicy(permanent=(Exception,))
    route = Route("q", (Handler(_handler_policy(transient=(OSError,))),))
    explanation = explain_plan(
        "m:app", plan([route], default, TopologyOptions("p", 60_000)), default, [(route, ["h"])]
    )
    rules = explanation.queues[0].handlers[0].rules
    assert rules is not None
    assert (rules.unknown, rules.unknown_rule) == ("permanent", "default")


def test_a_queue_whose_handlers_all_have_retries_off_is_not_covered_and_declares_nothing() -> None:
    default = RetryPolicy()
    route = Route("q", (Handler(_handler_policy(enabled=False)),))
    explanation = explain_plan(
        "m:app", plan([route], default, TopologyOptions("p", 60_000)), default, [(route, ["h"])]
    )
    (queue,) = explanation.queues
    assert (queue.covered, queue.objects) == (False, ())
    assert queue.to_json()["handlers"] == [{"handler": "h", "retries": False, "own_policy": True}]


def test_backoffs_are_described_in_milliseconds() -> None:
    assert describe_backoff(Fixed(timedelta(seconds=2))) == {
        "kind": "fixed",
        "delay_ms": 2000,
        "text": "fixed 2 s",
    }
    assert describe_backoff(Schedule([0.5, 60]))["delays_ms"] == [500, 60000]
    described = describe_backoff(Exponential(initial=1, factor=3, maximum=90, jitter=0.25))
    assert described["text"] == "exponential 1 s x 3^(n-1), at most 1 min 30 s, jitter ±25%"


def test_durations_read_as_people_write_them() -> None:
    assert [format_ms(ms) for ms in (0, 400, 1000, 1600, 60_000, 102_400, 93_600_000)] == [
        "0 ms",
        "400 ms",
        "1 s",
        "1.6 s",
        "1 min",
        "1 min 42.4 s",
        "1 d 2 h",
    ]


def test_queue_names_and_vhosts_mean_what_an_operator_types() -> None:
    assert [work_queue_of(q) for q in ("orders", "orders.retry", "orders.dlq", ".dlq")] == [
        "orders",
        "orders",
        "orders",
        ".dlq",
    ]
    assert vhost_of("amqp://u:p@h:5672/") == "/"
    assert vhost_of("amqp://u:p@h:5672") == "/"
    assert vhost_of("amqp://u:p@h:5672/prod%2Feu") == "prod/eu"
