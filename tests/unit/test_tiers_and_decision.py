"""Tick, tiers, decomposition, classification precedence and the decision (pure)."""

from __future__ import annotations

import json

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from faststream_retry import (
    Exponential,
    Fixed,
    PermanentError,
    RetryConfigError,
    RetryLater,
    RetryPolicy,
    Schedule,
    TransientError,
)
from faststream_retry.classify import Verdict, classify
from faststream_retry.decision import Action, Decision, Hop, Invalid, Release, decide, recheck_step
from faststream_retry.policy import HandlerPolicy
from faststream_retry.tiers import MIN_TICK_MS, Tiers, compute_tick_ms
from faststream_retry.topology import dlq_name, tier_name


def hops(tiers: Tiers, delay_ms: int) -> int:
    """Count the re-check hops of a delay when each hop takes no time at all."""
    now, count = 0, 0
    while isinstance(step := recheck_step(delay_ms, now, tiers), Hop):
        now += step.tier_ms
        count += 1
    assert isinstance(step, Release)
    return count


class TestTick:
    def test_gcd_of_named_delays(self) -> None:
        """The tick is the GCD of every delay the policies name."""
        delays = [
            *Exponential(initial=1, maximum=300).named_delays_ms(),
            *Schedule([10, 60, 300]).named_delays_ms(),
            *Fixed(2.5).named_delays_ms(),
        ]
        assert compute_tick_ms(delays) == 500

    def test_floor(self) -> None:
        """An odd delay cannot collapse the tick into a busy loop."""
        assert compute_tick_ms([1000, 1001]) == MIN_TICK_MS

    def test_explicit_tick_wins_but_not_below_the_floor(self) -> None:
        """An explicit tick is used as given; below the floor it is refused."""
        assert compute_tick_ms([7000], explicit_ms=250) == 250
        with pytest.raises(RetryConfigError, match="tick"):
            compute_tick_ms([], explicit_ms=10)

    def test_names(self) -> None:
        """Names are the contract of ARCHITECTURE.md."""
        assert tier_name("retry", 1000) == "retry.delay.1000"
        assert dlq_name("email-queue") == "email-queue.dlq"


class TestTiers:
    def test_ladder_up_to_max_delay(self) -> None:
        """Tiers are tick * 2**k up to max_delay."""
        tiers = Tiers.build(1000, 10_000)
        assert tiers.ttls_ms == (1000, 2000, 4000, 8000)
        assert tiers.max_delay_ms == 10_000

    def test_a_day_on_one_second_is_seventeen_tiers(self) -> None:
        """The default max_delay costs 17 queues for a 1 s tick, not 86,400 hops."""
        tiers = Tiers.build(1000, 86_400_000)
        assert len(tiers.ttls_ms) == 17
        assert hops(tiers, 86_400_000) <= 17

    @pytest.mark.parametrize(
        ("delay", "rounded"), [(1, 1000), (1000, 1000), (1001, 2000), (0, 1000), (10**12, 10_000)]
    )
    def test_round_delay(self, delay: int, rounded: int) -> None:
        """Delays round up to the grid, at least one tick, at most max_delay."""
        assert Tiers.build(1000, 10_000).round_delay(delay) == rounded

    def test_pick_largest_fitting_and_base_tier_below_a_tick(self) -> None:
        """The re-check step takes the largest tier that fits, else the base tier."""
        tiers = Tiers.build(1000, 60_000)
        assert tiers.pick(7000) == 4000
        assert tiers.pick(8000) == 8000
        assert tiers.pick(999) == 1000
        assert tiers.pick(10**9) == 32_000

    @given(st.integers(min_value=1, max_value=86_400), st.integers(min_value=1, max_value=10_000))
    def test_decomposition_is_exact_and_logarithmic(self, ticks: int, tick_ms: int) -> None:
        """A grid delay is covered exactly, in at most log2(D / tick) + 1 hops."""
        tiers = Tiers.build(tick_ms, 86_400 * tick_ms)
        delay = ticks * tick_ms
        remaining, hops = delay, 0
        while remaining > 0:
            ttl = tiers.pick(remaining)
            assert ttl <= remaining
            remaining -= ttl
            hops += 1
        assert remaining == 0
        assert hops <= ticks.bit_length()


class Boom(Exception):  # noqa: N818 - a test double
    pass


class SubBoom(Boom):
    pass


class TestClassify:
    def test_explicit_wins_over_everything(self) -> None:
        """PermanentError/TransientError beat handler and default lists."""
        assert classify(PermanentError(), handler_transient=(PermanentError,)).rule == "explicit"
        result = classify(RetryLater(1), default_permanent=(RetryLater,))
        assert result.verdict is Verdict.TRANSIENT
        assert result.rule == "explicit"

    def test_handler_before_default_before_builtin(self) -> None:
        """The handler's lists win over the default's, which win over the built-ins."""
        assert classify(
            TimeoutError(), handler_permanent=(TimeoutError,), default_transient=(TimeoutError,)
        ) == classify(TimeoutError(), handler_permanent=(TimeoutError,))
        result = classify(TimeoutError(), default_permanent=(TimeoutError,))
        assert (result.verdict, result.rule) == (Verdict.PERMANENT, "default")
        result = classify(TimeoutError())
        assert (result.verdict, result.rule) == (Verdict.TRANSIENT, "builtin")

    def test_most_specific_class_wins_within_a_level(self) -> None:
        """SubBoom listed transient beats its base Boom listed permanent."""
        result = classify(SubBoom(), handler_permanent=(Boom,), handler_transient=(SubBoom,))
        assert result.verdict is Verdict.TRANSIENT
        assert classify(
            Boom(), handler_permanent=(Boom,), handler_transient=(SubBoom,)
        ).verdict is (Verdict.PERMANENT)

    def test_builtin_permanent_decode_and_validation_errors(self) -> None:
        """Bodies that cannot be decoded or validated are permanent by default."""
        with pytest.raises(json.JSONDecodeError) as json_error:
            json.loads("{")
        assert classify(json_error.value).verdict is Verdict.PERMANENT
        with pytest.raises(pydantic.ValidationError) as validation_error:
            pydantic.TypeAdapter(int).validate_python("x")
        assert classify(validation_error.value).verdict is Verdict.PERMANENT
        assert classify(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")).verdict is (
            Verdict.PERMANENT
        )

    def test_unknown_is_transient(self) -> None:
        """Unknown errors retry: attempts are bounded, so they still end in the DLQ."""
        assert classify(Boom()).rule == "fallback"
        assert classify(Boom()).verdict is Verdict.TRANSIENT


TIERS = Tiers.build(100, 86_400_000)


def decide_for(exc: BaseException, attempt: int, **handler: object) -> Decision:
    return decide(
        exc,
        attempt=attempt,
        handler=HandlerPolicy(handler) if handler else None,
        default=RetryPolicy(max_attempts=3, backoff=Exponential(initial=1, factor=2)),
        tiers=TIERS,
        rand=lambda: 0.5,
    )


class TestDecide:
    def test_backoff_by_attempt(self) -> None:
        """Delayed retry n uses the backoff's n-th delay."""
        assert decide_for(Boom(), 1).delay_ms == 1000
        assert decide_for(Boom(), 2).delay_ms == 2000

    def test_exhausted_at_max_attempts(self) -> None:
        """The max_attempts-th failure is the last."""
        decision = decide_for(Boom(), 3)
        assert (decision.action, decision.reason) == (Action.DEAD_LETTER, "exhausted")

    def test_permanent_dead_letters_at_once(self) -> None:
        """A permanent verdict does not wait for the attempts to run out."""
        decision = decide_for(Boom(), 1, permanent=(Boom,))
        assert (decision.action, decision.reason) == (Action.DEAD_LETTER, "permanent")

    def test_immediate_retries_come_first_and_count(self) -> None:
        """immediate=2: calls 1 and 2 retry in-process, then the first delayed retry."""
        actions = [decide_for(Boom(), n, immediate=2, max_attempts=5) for n in (1, 2, 3)]
        assert [a.action for a in actions] == [
            Action.RETRY_NOW,
            Action.RETRY_NOW,
            Action.RETRY_LATER,
        ]
        assert actions[2].delay_ms == 1000

    def test_retry_later_is_rounded_and_bounded(self) -> None:
        """RetryLater's delay rounds up to the tick and stops at max_delay; it counts."""
        assert decide_for(RetryLater(0.25), 1).delay_ms == 300
        assert decide_for(RetryLater(10**9), 1).delay_ms == 86_400_000
        assert decide_for(RetryLater(1), 3).action is Action.DEAD_LETTER

    def test_explicit_transient_beats_handler_permanent(self) -> None:
        """TransientError retries even when its type is listed permanent."""
        decision = decide_for(TransientError(), 1, permanent=(TransientError,))
        assert decision.action is Action.RETRY_LATER


class TestRecheckStep:
    TIERS = Tiers.build(100, 1000)  # 100, 200, 400, 800; max_delay 1000

    def test_missing_or_unreadable_due_is_due_now(self) -> None:
        """No due time: released at once, with no lateness to report."""
        assert recheck_step(None, 5_000, self.TIERS) == Release(None)

    @pytest.mark.parametrize(("due", "lateness"), [(5_000, 0), (4_990, 10), (0, 5_000)])
    def test_due_or_overdue_is_released_with_its_lateness(self, due: int, lateness: int) -> None:
        """Due at or before now: back to the work queue, lateness = now - due."""
        assert recheck_step(due, 5_000, self.TIERS) == Release(lateness)

    @pytest.mark.parametrize(
        ("remaining", "tier"), [(1, 100), (100, 100), (399, 200), (400, 400), (1_100, 800)]
    )
    def test_not_due_waits_in_the_largest_tier_that_fits(self, remaining: int, tier: int) -> None:
        """Never released early: even 1 ms short waits out the base tier."""
        assert recheck_step(5_000 + remaining, 5_000, self.TIERS) == Hop(tier, remaining)

    def test_beyond_max_delay_and_a_tick_is_invalid(self) -> None:
        """max_delay + one tick is the last legitimate wait; one ms more is a forged header."""
        assert isinstance(recheck_step(5_000 + 1_100, 5_000, self.TIERS), Hop)
        assert recheck_step(5_000 + 1_101, 5_000, self.TIERS) == Invalid(1_101)
