"""Where each step's copy goes, what it carries and what is told of it (pure, no broker).

Every runtime sends what these build: a retry never goes elsewhere than its tier and its
own queue, a dead letter only to its dead-letter queue.
"""

from __future__ import annotations

from typing import Any

import pytest

from faststream_retry import Fixed, PermanentError, RetryPolicy, TransientError
from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.classify import Classification
from faststream_retry.core.decision import Action, Decision
from faststream_retry.core.events import EventKind, Reason, RetryEvent, Rule, Verdict
from faststream_retry.core.intake import DELAY, PERMANENT, DeadLetter, Refuse, Retry
from faststream_retry.core.steps import Copy, Step
from faststream_retry.core.topology import Handler, Plan, Route, TopologyOptions, plan

INCOMING: dict[str, Any] = {"tenant": "acme", h.ATTEMPT: 1, "x-death": [{"queue": "orders"}]}
"""A delivery's headers: the application's own, the plugin's, and RabbitMQ's."""

HOME = Route("orders", (Handler(None),))
FULL = Route("orders", (Handler(None),), {"x-overflow": "reject-publish", "x-max-length": 5})
"""A queue that refuses publishes when full: its copies never go home from a tier."""


def a_plan() -> Plan:
    """Tiers of 1, 2, 4 and 8 s."""
    topology = plan([HOME], RetryPolicy(backoff=Fixed(1)), TopologyOptions("p", 8000, "classic"))
    assert topology.tiers.ttls_ms == (1000, 2000, 4000, 8000)
    return topology


def failure(delay_ms: int = 0, error: str = "down") -> h.FailureRecord:
    return h.FailureRecord(
        attempt=2, at_ms=10_000, exception="app.Down", error=error, delay_ms=delay_ms
    )


class TestRetry:
    def test_a_wait_of_one_tier_goes_from_it_straight_to_the_work_queue(self) -> None:
        step = steps.retry(
            a_plan(),
            HOME,
            "m1",
            INCOMING,
            failure(4000),
            max_attempts=5,
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
        )
        assert step == Step(
            RetryEvent(
                kind=EventKind.SCHEDULED,
                queue="orders",
                message_id="m1",
                attempt=2,
                at_ms=10_000,
                max_attempts=5,
                delay_ms=4000,
                due_ms=14_000,
                exception="app.Down",
                error="down",
                rule=Rule.BUILTIN,
                classification=Verdict.TRANSIENT,
            ),
            Copy("p.delay.4000", "orders", h.retry_headers(INCOMING, failure(4000), 14_000)),
            4000,
            "orders.dlq",
        )
        assert step.copy.headers[h.DUE] == 14_000
        assert not step.copy.room

    def test_a_longer_wait_takes_the_largest_tier_under_it_and_the_re_check_step(self) -> None:
        step = steps.retry(
            a_plan(),
            HOME,
            "m1",
            INCOMING,
            failure(3000),
            max_attempts=5,
            rule=Rule.EXPLICIT,
            classification=Verdict.TRANSIENT,
        )
        assert (step.copy.exchange, step.copy.routing_key, step.tier_ms) == (
            "p.delay.2000",
            "orders.retry",
            2000,
        )
        assert step.event.due_ms == 13_000
        assert step.event.rule is Rule.EXPLICIT

    def test_a_queue_that_refuses_when_full_takes_the_re_check_step_even_for_one_tier(
        self,
    ) -> None:
        step = steps.retry(
            a_plan(),
            FULL,
            None,
            None,
            failure(4000),
            max_attempts=5,
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
        )
        assert (step.copy.exchange, step.copy.routing_key) == ("p.delay.4000", "orders.retry")
        assert step.event.message_id is None

    def test_the_event_carries_the_error_as_the_history_does(self) -> None:
        long = "é" * 300
        step = steps.retry(
            a_plan(),
            HOME,
            "m1",
            INCOMING,
            failure(1000, long),
            max_attempts=5,
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
        )
        assert step.event.error == h.truncate(long, h.HISTORY_ERROR_LIMIT)
        assert len(step.event.error.encode()) <= h.HISTORY_ERROR_LIMIT


class TestHop:
    @pytest.mark.parametrize(
        ("route", "last", "home"),
        [(HOME, True, "orders"), (HOME, False, "orders.retry"), (FULL, True, "orders.retry")],
    )
    def test_only_a_last_tier_on_a_queue_that_takes_it_goes_home(
        self, route: Route, last: bool, home: str
    ) -> None:
        step = steps.hop(
            a_plan(),
            route,
            "m1",
            INCOMING,
            attempt=3,
            now_ms=20_000,
            due_ms=27_000,
            tier_ms=4000,
            last=last,
        )
        assert step == Step(
            RetryEvent(
                kind=EventKind.HOP,
                queue="orders",
                message_id="m1",
                attempt=3,
                at_ms=20_000,
                delay_ms=4000,
                due_ms=27_000,
            ),
            Copy("p.delay.4000", home, h.carry_over(INCOMING)),
            dlq="orders.dlq",
        )


class TestRelease:
    def test_a_due_message_goes_home_by_the_default_exchange(self) -> None:
        step = steps.release(
            HOME, "m1", INCOMING, attempt=3, now_ms=20_050, due_ms=20_000, lateness_ms=50
        )
        assert step == Step(
            RetryEvent(
                kind=EventKind.RELEASED,
                queue="orders",
                message_id="m1",
                attempt=3,
                at_ms=20_050,
                due_ms=20_000,
                lateness_ms=50,
            ),
            Copy("", "orders", h.carry_over(INCOMING)),
            dlq="orders.dlq",
        )
        assert "x-death" not in step.copy.headers


class TestDeadLetter:
    def test_the_copy_goes_to_the_dlq_and_may_make_room(self) -> None:
        step = steps.dead_letter(
            "orders.dlq",
            "orders",
            "m1",
            INCOMING,
            failure(),
            reason=Reason.EXHAUSTED,
            max_attempts=5,
            due_ms=9000,
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
            traceback="Traceback ...",
        )
        headers = h.dead_letter_headers(
            INCOMING,
            failure(),
            reason=Reason.EXHAUSTED,
            origin_queue="orders",
            traceback="Traceback ...",
        )
        assert step == Step(
            RetryEvent(
                kind=EventKind.DEAD_LETTERED,
                queue="orders",
                message_id="m1",
                attempt=2,
                at_ms=10_000,
                max_attempts=5,
                due_ms=9000,
                reason=Reason.EXHAUSTED,
                exception="app.Down",
                error="down",
                rule=Rule.BUILTIN,
                classification=Verdict.TRANSIENT,
                dlq="orders.dlq",
            ),
            Copy("", "orders.dlq", headers, room=True),
        )
        assert step.copy.headers[h.ORIGIN_QUEUE] == "orders"
        assert step.copy.headers[h.TRACEBACK] == "Traceback ..."

    def test_by_default_it_names_no_rule_and_its_own_queue_as_the_origin(self) -> None:
        step = steps.dead_letter(
            "p.intake.dlq", "p.intake", None, None, failure(), reason=Reason.INVALID
        )
        assert step.event == RetryEvent(
            kind=EventKind.DEAD_LETTERED,
            queue="p.intake",
            message_id=None,
            attempt=2,
            at_ms=10_000,
            reason=Reason.INVALID,
            exception="app.Down",
            error="down",
            dlq="p.intake.dlq",
        )
        assert step.copy.headers[h.ORIGIN_QUEUE] == "p.intake"
        assert step.copy.headers[h.TRACEBACK] == ""
        assert step.copy.routing_key == "p.intake.dlq"
        assert step.tier_ms is None
        assert step.dlq is None  # it makes room itself

    def test_another_origin_is_recorded_for_the_operator(self) -> None:
        step = steps.dead_letter(
            "p.intake.dlq",
            "p.intake",
            "m1",
            INCOMING,
            failure(error="x" * 2000),
            reason=Reason.INVALID,
            origin_queue="orders",
        )
        assert step.copy.headers[h.ORIGIN_QUEUE] == "orders"
        assert step.event.queue == "p.intake"
        assert step.event.error == h.truncate("x" * 2000, h.HISTORY_ERROR_LIMIT)
        assert step.copy.headers[h.ERROR] == h.truncate("x" * 2000, h.ERROR_LIMIT)


def decision(action: Action, **fields: Any) -> Decision:
    return Decision(action, 2, 5, Classification(Verdict.TRANSIENT, Rule.BUILTIN), **fields)


class TestFailed:
    def test_a_retry_later_is_sent_round_the_tiers(self) -> None:
        exc = TransientError("db down")
        step = steps.failed(
            a_plan(),
            HOME,
            decision(Action.RETRY_LATER, delay_ms=4000),
            exc,
            message_id="m1",
            incoming=INCOMING,
            now_ms=10_000,
        )
        record = h.FailureRecord.of(exc, attempt=2, at_ms=10_000, delay_ms=4000)
        assert step == steps.retry(
            a_plan(),
            HOME,
            "m1",
            INCOMING,
            record,
            max_attempts=5,
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
        )
        assert step.copy.headers[h.HISTORY][-1]["delay"] == 4000

    def test_a_dead_letter_carries_its_reason_problem_and_traceback(self) -> None:
        try:
            raise PermanentError("bad order")
        except PermanentError as raised:
            exc = raised
        verdict = Classification(Verdict.PERMANENT, Rule.EXPLICIT)
        asked = Decision(
            Action.DEAD_LETTER, 2, 5, verdict, reason=Reason.PERMANENT, problem="a bad delay"
        )
        step = steps.failed(
            a_plan(), HOME, asked, exc, message_id="m1", incoming=INCOMING, now_ms=10_000
        )
        record = h.FailureRecord.of(exc, attempt=2, at_ms=10_000, problem="a bad delay")
        assert step == steps.dead_letter(
            "orders.dlq",
            "orders",
            "m1",
            INCOMING,
            record,
            reason=Reason.PERMANENT,
            max_attempts=5,
            rule=Rule.EXPLICIT,
            classification=Verdict.PERMANENT,
            traceback=h.traceback_text(exc),
        )
        assert step.copy.headers[h.ERROR] == "a bad delay (bad order)"
        assert "PermanentError: bad order" in step.copy.headers[h.TRACEBACK]

    def test_a_dead_letter_without_a_reason_is_permanent(self) -> None:
        step = steps.failed(
            a_plan(),
            HOME,
            decision(Action.DEAD_LETTER),
            ValueError("x"),
            message_id=None,
            incoming=None,
            now_ms=0,
        )
        assert step.event.reason is Reason.PERMANENT
        assert step.copy.headers[h.REASON] == "permanent"


class TestInProcess:
    @pytest.mark.parametrize(("immediate", "due"), [(True, None), (False, 10_500)])
    def test_an_in_process_retry_is_told_with_no_copy(
        self, immediate: bool, due: int | None
    ) -> None:
        exc = TransientError("é" * 300)
        asked = decision(Action.RETRY_NOW, delay_ms=500, problem="why")
        event = steps.in_process("orders", "m1", asked, exc, 10_000, immediate=immediate)
        assert event == RetryEvent(
            kind=EventKind.SCHEDULED,
            queue="orders",
            message_id="m1",
            attempt=2,
            at_ms=10_000,
            max_attempts=5,
            delay_ms=500,
            due_ms=due,
            exception="faststream_retry.errors.TransientError",
            error=h.error_text(exc, h.HISTORY_ERROR_LIMIT, "why"),
            rule=Rule.BUILTIN,
            immediate=immediate,
            classification=Verdict.TRANSIENT,
        )


BACK: dict[str, Any] = {"tenant": "acme", h.ATTEMPT: 3, h.DUE: 20_000}
"""A copy back from a tier: due at 20 s, after its third failure."""


class TestRecheck:
    def test_a_due_copy_is_released_with_its_lateness(self) -> None:
        step = steps.recheck(a_plan(), HOME, "m1", BACK, now_ms=20_050)
        assert step == steps.release(
            HOME, "m1", BACK, attempt=3, now_ms=20_050, due_ms=20_000, lateness_ms=50
        )

    def test_a_copy_without_a_due_time_is_released_at_once(self) -> None:
        step = steps.recheck(a_plan(), HOME, None, {h.ATTEMPT: 2}, now_ms=20_000)
        assert step == steps.release(
            HOME, None, {h.ATTEMPT: 2}, attempt=2, now_ms=20_000, due_ms=None, lateness_ms=None
        )

    def test_an_early_copy_goes_round_the_largest_tier_under_its_wait(self) -> None:
        step = steps.recheck(a_plan(), HOME, "m1", BACK, now_ms=13_000)
        assert step == steps.hop(
            a_plan(),
            HOME,
            "m1",
            BACK,
            attempt=3,
            now_ms=13_000,
            due_ms=20_000,
            tier_ms=4000,
            last=False,
        )
        assert step.copy.routing_key == "orders.retry"

    def test_a_wait_of_one_tier_goes_from_it_straight_home(self) -> None:
        step = steps.recheck(a_plan(), HOME, "m1", BACK, now_ms=16_000)
        assert (step.copy.exchange, step.copy.routing_key) == ("p.delay.4000", "orders")
        assert step.event.kind is EventKind.HOP

    def test_a_due_time_no_delay_explains_is_dead_lettered_as_invalid(self) -> None:
        step = steps.recheck(a_plan(), HOME, "m1", BACK, now_ms=10_999)
        error = "retry-due 20000 is more than max_delay (8000 ms) ahead of now (10999)"
        record = h.FailureRecord(
            attempt=3, at_ms=10_999, exception="faststream_retry.InvalidDueTime", error=error
        )
        assert step == steps.dead_letter(
            "orders.dlq", "orders", "m1", BACK, record, reason=Reason.INVALID, due_ms=20_000
        )
        assert step.copy.headers[h.ERROR] == error

    def test_a_due_time_max_delay_and_a_tick_ahead_is_still_waited_for(self) -> None:
        step = steps.recheck(a_plan(), HOME, "m1", BACK, now_ms=11_000)
        assert step.event.kind is EventKind.HOP


def released(lateness_ms: int | None) -> Step:
    return steps.release(
        HOME, "m1", BACK, attempt=3, now_ms=20_000, due_ms=19_000, lateness_ms=lateness_ms
    )


class TestWaitAgain:
    @pytest.mark.parametrize(
        ("lateness", "tier"), [(5000, 2000), (7999, 2000), (2000, 1000), (50, 1000)]
    )
    def test_a_refused_release_waits_half_its_lateness_at_least_a_tick(
        self, lateness: int, tier: int
    ) -> None:
        step = steps.wait_again(a_plan(), HOME, released(lateness), BACK, now_ms=21_000)
        assert step == steps.hop(
            a_plan(),
            HOME,
            "m1",
            BACK,
            attempt=3,
            now_ms=21_000,
            due_ms=19_000,
            tier_ms=tier,
            last=False,
        )

    def test_it_comes_back_to_the_re_check_step_even_from_its_queue_s_own_tier(self) -> None:
        # Whatever tier it waits in, it comes back here: its queue refused it once, and a
        # release must be confirmed.
        step = steps.wait_again(a_plan(), HOME, released(2000), BACK, now_ms=21_000)
        assert step is not None
        assert (step.copy.exchange, step.copy.routing_key) == ("p.delay.1000", "orders.retry")

    @pytest.mark.parametrize("lateness", [None, 8000, 8001])
    def test_one_late_by_max_delay_or_of_unknown_lateness_is_requeued(
        self, lateness: int | None
    ) -> None:
        assert steps.wait_again(a_plan(), HOME, released(lateness), BACK, now_ms=0) is None

    def test_only_a_release_waits_again(self) -> None:
        hop = steps.hop(
            a_plan(), HOME, "m1", BACK, attempt=3, now_ms=0, due_ms=0, tier_ms=1000, last=False
        )
        assert steps.wait_again(a_plan(), HOME, hop, BACK, now_ms=0) is None


def hopped() -> Step:
    return steps.hop(
        a_plan(), HOME, "m1", BACK, attempt=3, now_ms=0, due_ms=19_000, tier_ms=1000, last=False
    )


class TestStuck:
    """The plugin ends its own requeue loops: RabbitMQ 4.3 no longer counts a requeue."""

    def test_a_copy_not_confirmed_is_requeued_while_under_both_bounds(self) -> None:
        back = {**BACK, "x-delivery-count": 2, "x-acquired-count": 2}
        got = steps.stuck(
            HOME, released(7999), back, now_ms=1, limit=3, max_delay_ms=8000, outcome="failed"
        )
        assert got is None

    @pytest.mark.parametrize("count", ["x-delivery-count", "x-acquired-count"])
    def test_at_the_delivery_limit_by_either_count_it_is_dead_lettered_as_stuck(
        self, count: str
    ) -> None:
        back = {**BACK, count: 3}
        step = steps.stuck(
            HOME, hopped(), back, now_ms=21_000, limit=3, max_delay_ms=8000, outcome="refused"
        )
        error = (
            "its hop copy to 'p.delay.1000' was not confirmed (refused) and it came back 3 "
            "times (the delivery limit is 3)"
        )
        record = h.FailureRecord(
            attempt=3, at_ms=21_000, exception="faststream_retry.CopyNotConfirmed", error=error
        )
        assert step == steps.dead_letter(
            "orders.dlq", "orders", "m1", back, record, reason=Reason.STUCK, due_ms=19_000
        )

    def test_a_classic_queue_counts_nothing_so_the_runtimes_own_count_ends_the_loop(
        self,
    ) -> None:
        """No broker count on the delivery: the requeues this process made decide."""
        under = steps.stuck(
            HOME, hopped(), BACK, now_ms=0, limit=3, max_delay_ms=8000, outcome="x", requeued=2
        )
        assert under is None
        at = steps.stuck(
            HOME, hopped(), BACK, now_ms=0, limit=3, max_delay_ms=8000, outcome="x", requeued=3
        )
        assert at is not None
        assert at.copy.headers[h.ERROR].endswith("came back 3 times (the delivery limit is 3)")

    def test_a_held_message_counts_each_placement_and_says_its_handler_ran_once(self) -> None:
        """Held, not requeued: each placement counts toward the limit, on top of the requeues."""
        under = steps.stuck(
            HOME,
            hopped(),
            BACK,
            now_ms=0,
            limit=4,
            max_delay_ms=8000,
            outcome="x",
            requeued=1,
            held=2,
        )
        assert under is None
        at = steps.stuck(
            HOME,
            hopped(),
            BACK,
            now_ms=0,
            limit=4,
            max_delay_ms=8000,
            outcome="refused",
            requeued=1,
            held=3,
        )
        assert at is not None
        assert at.copy.headers[h.ERROR] == (
            "its hop copy to 'p.delay.1000' was not confirmed (refused) and it was placed "
            "again 3 times while the message was held, its handler not run again (each "
            "counts as a requeue: 4 of the delivery limit of 4)"
        )
        once = steps.stuck(
            HOME,
            hopped(),
            BACK,
            now_ms=0,
            limit=2,
            max_delay_ms=8000,
            outcome="x",
            requeued=1,
            held=1,
        )
        assert once is not None
        assert "was placed again once while" in once.copy.headers[h.ERROR]

    def test_without_either_count_nothing_came_back(self) -> None:
        """A first failure with a limit of 1: requeued once before it is stuck."""
        got = steps.stuck(HOME, hopped(), BACK, now_ms=0, limit=1, max_delay_ms=8000, outcome="x")
        assert got is None

    def test_the_larger_of_the_broker_and_the_runtime_count_decides(self) -> None:
        back = {**BACK, "x-acquired-count": 1}
        step = steps.stuck(
            HOME, hopped(), back, now_ms=0, limit=9, max_delay_ms=8000, outcome="x", requeued=9
        )
        assert step is not None
        assert step.copy.headers[h.ERROR].endswith("came back 9 times (the delivery limit is 9)")
        back = {**BACK, "x-acquired-count": 9}
        step = steps.stuck(
            HOME, hopped(), back, now_ms=0, limit=9, max_delay_ms=8000, outcome="x", requeued=1
        )
        assert step is not None

    def test_a_retry_copy_at_the_limit_keeps_its_attempts_and_policy(self) -> None:
        """The middleware's stuck failure: the dead letter's event says how far it got."""
        tried = steps.retry(
            a_plan(),
            HOME,
            "m1",
            INCOMING,
            failure(4000),
            max_attempts=5,
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
        )
        back = {**INCOMING, "x-acquired-count": 20}
        step = steps.stuck(
            HOME, tried, back, now_ms=11_000, limit=20, max_delay_ms=8000, outcome="refused"
        )
        assert step is not None
        assert (step.event.attempt, step.event.max_attempts) == (2, 5)
        assert step.event.due_ms == 14_000
        assert step.copy.headers[h.EXCEPTION] == "faststream_retry.CopyNotConfirmed"

    def test_a_release_max_delay_late_is_dead_lettered_whatever_the_count(self) -> None:
        step = steps.stuck(
            HOME, released(8000), BACK, now_ms=21_000, limit=3, max_delay_ms=8000, outcome="x"
        )
        assert step is not None
        assert step.copy == Copy("", "orders.dlq", step.copy.headers, room=True)
        assert step.event.reason is Reason.STUCK
        assert step.copy.headers[h.REASON] == "stuck"
        assert step.copy.headers[h.ERROR] == (
            "its released copy to 'orders' was not confirmed (x) and it is 8000 ms past its "
            "due time (max_delay is 8000 ms)"
        )

    def test_a_copy_that_was_its_dead_letter_gets_no_second_one(self) -> None:
        letter = steps.dead_letter(
            "orders.dlq", "orders", "m1", BACK, failure(), reason=Reason.PERMANENT
        )
        back = {**BACK, "x-delivery-count": 9}
        assert (
            steps.stuck(HOME, letter, back, now_ms=0, limit=3, max_delay_ms=1, outcome="x") is None
        )

    def test_a_copy_to_another_exchange_named_like_the_dlq_still_gets_its_dead_letter(
        self,
    ) -> None:
        # Only the default exchange routes by queue name: the test is of both.
        tier_to_dlq = Step(hopped().event, Copy("p.delay.1000", "orders.dlq", {}))
        back = {**BACK, "x-delivery-count": 3}
        step = steps.stuck(HOME, tier_to_dlq, back, now_ms=0, limit=3, max_delay_ms=1, outcome="x")
        assert step is not None


class TestIntake:
    def test_a_dead_letter_to_retry_goes_round_the_tiers_as_transient(self) -> None:
        decided = Retry("orders", 2, 5, 4000, failure(4000))
        step = steps.intake(a_plan(), HOME, "m1", INCOMING, decided)
        assert step == steps.retry(
            a_plan(),
            HOME,
            "m1",
            INCOMING,
            failure(4000),
            max_attempts=5,
            rule=Rule.DEAD_LETTERING,
            classification=Verdict.TRANSIENT,
        )
        assert step.copy.routing_key == "orders"

    def test_a_dead_letter_to_keep_goes_to_the_queue_s_dlq_as_permanent(self) -> None:
        decided = DeadLetter("orders", 2, 5, Reason.POISON, failure())
        step = steps.intake(a_plan(), HOME, "m1", INCOMING, decided)
        assert step == steps.dead_letter(
            "orders.dlq",
            "orders",
            "m1",
            INCOMING,
            failure(),
            reason=Reason.POISON,
            max_attempts=5,
            rule=Rule.DEAD_LETTERING,
            classification=Verdict.PERMANENT,
        )

    def test_classification_rule_and_traceback_are_the_decision_s(self) -> None:
        """An exhausted dead letter is transient, as the middleware's is; the rest is passed on."""
        decided = DeadLetter(
            "orders", 5, 5, Reason.EXHAUSTED, failure(), Verdict.TRANSIENT, Rule.EXPLICIT, "at x"
        )
        step = steps.intake(a_plan(), HOME, "m1", INCOMING, decided)
        assert (step.event.classification, step.event.rule) == (Verdict.TRANSIENT, Rule.EXPLICIT)
        assert step.copy.headers[h.TRACEBACK] == "at x"
        retried = steps.intake(
            a_plan(),
            HOME,
            "m1",
            INCOMING,
            Retry("orders", 2, 5, 4000, failure(4000), Rule.EXPLICIT),
        )
        assert (retried.event.classification, retried.event.rule) == (
            Verdict.TRANSIENT,
            Rule.EXPLICIT,
        )

    def test_the_consumer_s_word_is_answered_and_left_out_of_every_copy(self) -> None:
        """retry-permanent and retry-delay never ride on: a retry or a replay starts afresh."""
        said = {**INCOMING, PERMANENT: "gone", DELAY: "5s", h.ERROR: "e"}
        kept = {k: v for k, v in said.items() if k not in (PERMANENT, DELAY)}
        letter = steps.intake(
            a_plan(), HOME, "m1", said, DeadLetter("orders", 2, 5, Reason.PERMANENT, failure())
        )
        retried = steps.intake(a_plan(), HOME, "m1", said, Retry("orders", 2, 5, 4000, failure()))
        for step in (letter, retried):
            assert PERMANENT not in step.copy.headers
            assert DELAY not in step.copy.headers
            assert step.copy.headers["tenant"] == "acme"
        assert letter == steps.intake(
            a_plan(), HOME, "m1", kept, DeadLetter("orders", 2, 5, Reason.PERMANENT, failure())
        )
        assert h.ERROR not in retried.copy.headers  # a retry's copy drops the description


class TestRefused:
    def test_a_refused_delivery_goes_to_the_intake_s_dlq_naming_where_it_died(self) -> None:
        step = steps.refused(
            Refuse("not named", "orders"),
            intake_queue="p.intake",
            dlq="p.intake.dlq",
            message_id="m1",
            incoming=INCOMING,
            now_ms=30_000,
        )
        record = h.FailureRecord(attempt=1, at_ms=30_000, exception="refused", error="not named")
        assert step == steps.dead_letter(
            "p.intake.dlq",
            "p.intake",
            "m1",
            INCOMING,
            record,
            reason=Reason.INVALID,
            origin_queue="orders",
            rule=Rule.DEAD_LETTERING,
            classification=Verdict.PERMANENT,
        )
        assert step.event.exception == "refused"
        assert step.copy.headers[h.ORIGIN_QUEUE] == "orders"

    def test_one_that_died_nowhere_known_names_the_intake(self) -> None:
        step = steps.refused(
            Refuse("published"),
            intake_queue="p.intake",
            dlq="p.intake.dlq",
            message_id=None,
            incoming=None,
            now_ms=30_000,
        )
        assert step.copy.headers[h.ORIGIN_QUEUE] == "p.intake"
        assert step.event.attempt == 0


TOO_LARGE = (
    "with the retry headers its copy would not fit in the frame RabbitMQ carries headers "
    "in (frame_max): its own headers leave no room"
)


class TestTooLarge:
    def test_a_retry_that_cannot_fit_is_dead_lettered_with_what_it_failed_with(self) -> None:
        step = steps.retry(
            a_plan(),
            HOME,
            "m1",
            INCOMING,
            failure(4000),
            max_attempts=5,
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
        )
        record = h.FailureRecord(
            attempt=2,
            at_ms=30_000,
            exception="faststream_retry.HeadersTooLarge",
            error=f"{TOO_LARGE}; it had failed with app.Down: down",
        )
        assert steps.TOO_LARGE_ERROR == TOO_LARGE
        assert steps.too_large(step, INCOMING, now_ms=30_000) == steps.dead_letter(
            "orders.dlq",
            "orders",
            "m1",
            INCOMING,
            record,
            reason=Reason.INVALID,
            max_attempts=5,
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
        )

    def test_a_release_that_cannot_fit_says_only_that(self) -> None:
        letter = steps.too_large(released(50), BACK, now_ms=30_000)
        assert letter is not None
        assert letter.copy.headers[h.ERROR] == TOO_LARGE
        assert letter.copy.headers[h.ORIGIN_QUEUE] == "orders"
        assert (letter.event.attempt, letter.event.max_attempts, letter.event.rule) == (3, 0, None)
        assert letter.copy.room

    def test_a_failure_without_a_message_is_named_all_the_same(self) -> None:
        event = RetryEvent(
            kind=EventKind.SCHEDULED,
            queue="orders",
            message_id=None,
            attempt=1,
            at_ms=0,
            exception="app.Down",
        )
        step = Step(event, Copy("p.delay.1000", "orders", {}), 1000, "orders.dlq")
        letter = steps.too_large(step, None, now_ms=0)
        assert letter is not None
        assert letter.event.error == f"{TOO_LARGE}; it had failed with app.Down: "

    def test_a_dead_letter_makes_room_itself(self) -> None:
        letter = steps.dead_letter(
            "orders.dlq", "orders", None, None, failure(), reason=Reason.EXHAUSTED
        )
        assert steps.too_large(letter, None, now_ms=0) is None


class TestParked:
    def test_a_held_message_waits_round_the_tier_with_its_attempt_and_a_due_of_its_own(
        self,
    ) -> None:
        """The copy keeps the attempt and the application's headers, goes to the tier's
        retry queue (never home at once), and is due when the wait ends, not when an old
        due time said."""
        incoming = {**INCOMING, h.DUE: 99_999_999}
        step = steps.parked(a_plan(), HOME, "m1", incoming, now_ms=10_000, wait_ms=2000)
        assert step == Step(
            RetryEvent.hop(
                queue="orders",
                message_id="m1",
                attempt=1,
                at_ms=10_000,
                tier_ms=2000,
                due_ms=12_000,
            ),
            Copy(
                "p.delay.2000",
                "orders.retry",
                {"tenant": "acme", h.ATTEMPT: 1, h.DUE: 12_000},
            ),
            dlq="orders.dlq",
        )
        assert incoming[h.DUE] == 99_999_999, "the delivery's headers are left as they are"

    def test_a_message_that_never_failed_is_parked_at_attempt_0(self) -> None:
        step = steps.parked(a_plan(), HOME, None, None, now_ms=5, wait_ms=1000)
        assert step.event.attempt == 0
        assert step.copy.headers == {h.DUE: 1005}
        assert step.event.due_ms == 1005
