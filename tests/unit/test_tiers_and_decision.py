"""Tick, tiers, decomposition, classification precedence and the decision (pure)."""

from __future__ import annotations

import json
import math

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
    RetryTopologyError,
    Schedule,
    TransientError,
)
from faststream_retry.core.classify import (
    BUILTIN_PERMANENT_NAMES,
    Classification,
    Verdict,
    classify,
)
from faststream_retry.core.decision import (
    Action,
    Decision,
    Hop,
    Invalid,
    Release,
    decide,
    recheck_step,
)
from faststream_retry.core.events import Reason, Rule
from faststream_retry.core.policy import HandlerPolicy
from faststream_retry.core.tiers import MIN_TICK_MS, Tiers, Wait, compute_tick_ms
from faststream_retry.core.topology import dlq_name, tier_name


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

    def test_a_wait_that_is_a_tier_is_the_last_one(self) -> None:
        """1 s, 2 s, 4 s go straight home from their tier; 3 s and 30 s take the largest fit."""
        tiers = Tiers.build(1000, 60_000)
        assert tiers.wait(1000) == Wait(1000, last=True)
        assert tiers.wait(2000) == Wait(2000, last=True)
        assert tiers.wait(3000) == Wait(2000, last=False)
        assert tiers.wait(30_000) == Wait(16_000, last=False)
        assert tiers.wait(60_000) == Wait(32_000, last=False)
        assert tiers.wait(1) == Wait(1000, last=True)
        assert tiers.wait(0) == Wait(1000, last=True)
        # Due now or past due: one tick, the base tier's, even on a 1 ms grid.
        fine = Tiers.build(1, 8)
        assert [fine.wait(ms) for ms in (-5, 0, 1)] == [Wait(1, last=True)] * 3
        assert fine.wait(3) == Wait(2, last=False)

    def test_hop_lag_costs_no_extra_pass(self) -> None:
        """30 s with a few ms lost on each hop: 16 + 8 + 4 + 2, not 16 + 8 + 4 + 1 + 1."""
        tiers = Tiers.build(1000, 60_000)
        remaining, passes = 30_000, []
        while True:
            wait = tiers.wait(remaining)
            passes.append(wait.tier_ms)
            if wait.last:
                break
            remaining -= wait.tier_ms + 20  # each hop is 20 ms late
        assert passes == [16_000, 8_000, 4_000, 2_000]

    @given(
        tick=st.integers(min_value=MIN_TICK_MS, max_value=5_000),
        ticks=st.integers(min_value=1, max_value=10_000),
        remaining=st.integers(min_value=-10, max_value=10**9),
    )
    def test_a_wait_is_never_early_and_the_last_tier_covers_it(
        self, tick: int, ticks: int, remaining: int
    ) -> None:
        """The last tier covers the wait by less than a tick; any other comes back before due."""
        tiers = Tiers.build(tick, ticks * tick)
        wait = tiers.wait(remaining)
        assert wait.tier_ms in tiers.ttls_ms
        if wait.last:
            assert wait.tier_ms >= remaining
            assert wait.tier_ms - tick < max(remaining, 1)
        else:
            assert wait.tier_ms < remaining
            assert wait.tier_ms == tiers.ttls_ms[-1] or wait.tier_ms * 2 > remaining

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
        ("remaining", "tier", "last"),
        [
            (1, 100, True),
            (100, 100, True),
            (101, 200, True),
            (301, 400, True),
            (399, 400, True),
            (400, 400, True),
            (401, 400, False),
            (501, 400, False),
            (700, 400, False),
            (701, 800, True),
            (801, 800, False),
            (1_100, 800, False),
        ],
    )
    def test_not_due_waits_in_the_tier_its_wait_rounds_to(
        self, remaining: int, tier: int, last: bool
    ) -> None:
        """Rounded up to the grid: a wait that is a tier goes home from it, else the largest fits.

        Never released early: even 1 ms short waits out the base tier.
        """
        assert recheck_step(5_000 + remaining, 5_000, self.TIERS) == Hop(tier, remaining, last)

    def test_beyond_max_delay_and_a_tick_is_invalid(self) -> None:
        """max_delay + one tick is the last legitimate wait; one ms more is a forged header."""
        assert isinstance(recheck_step(5_000 + 1_100, 5_000, self.TIERS), Hop)
        assert recheck_step(5_000 + 1_101, 5_000, self.TIERS) == Invalid(1_101)


class TestTickEdges:
    def test_explicit_tick_at_the_floor(self) -> None:
        """tick=100 ms is allowed; 99 ms is refused with the reason."""
        assert compute_tick_ms([], explicit_ms=100) == 100
        with pytest.raises(RetryConfigError) as raised:
            compute_tick_ms([], explicit_ms=99)
        assert str(raised.value) == (
            "tick must be at least 100 ms, got 99 ms "
            "(a shorter tick turns the re-check loop into a busy loop)"
        )

    def test_no_positive_delay_means_one_second(self) -> None:
        """Without a named delay (or only zeros) the tick is 1 s; 1 ms delays floor at 100."""
        assert compute_tick_ms([]) == 1000
        assert compute_tick_ms([0]) == 1000
        assert compute_tick_ms([0, 3000]) == 3000
        assert compute_tick_ms([1]) == MIN_TICK_MS


class TestTierEdges:
    def test_max_delay_is_rounded_down_to_the_grid(self) -> None:
        """No scheduled delay may exceed max_delay, so it sits on the tick grid."""
        tiers = Tiers.build(1000, 2500)
        assert (tiers.max_delay_ms, tiers.ttls_ms) == (2000, (1000, 2000))
        assert tiers.round_delay(2500) == 2000

    def test_max_delay_of_one_tick_is_one_tier(self) -> None:
        """max_delay == tick: a single tier; less than a tick is refused."""
        assert Tiers.build(1000, 1000).ttls_ms == (1000,)
        with pytest.raises(RetryConfigError) as raised:
            Tiers.build(1000, 999)
        assert str(raised.value) == "max_delay (999 ms) must be at least one tick (1000 ms)"

    @pytest.mark.parametrize("delay", [float("nan"), float("-inf"), -5, 0, 0.5])
    def test_odd_delays_wait_one_tick(self, delay: float) -> None:
        """A backoff returning nonsense still waits a tick: never early, never a crash."""
        assert Tiers.build(1000, 10_000).round_delay(delay) == 1000

    def test_an_infinite_delay_is_max_delay(self) -> None:
        """An unbounded backoff is bounded by max_delay."""
        assert Tiers.build(1000, 10_000).round_delay(float("inf")) == 10_000

    @given(
        tick=st.integers(min_value=MIN_TICK_MS, max_value=10_000),
        ticks=st.integers(min_value=1, max_value=100_000),
        delay=st.one_of(st.floats(min_value=-1e6, max_value=1e12), st.just(math.nan)),
    )
    def test_rounded_delays_are_on_the_grid_and_within_bounds(
        self, tick: int, ticks: int, delay: float
    ) -> None:
        """Every rounded delay is a whole number of ticks in [tick, max_delay] and never shorter."""
        tiers = Tiers.build(tick, ticks * tick + tick // 2)
        assert tiers.max_delay_ms == ticks * tick
        rounded = tiers.round_delay(delay)
        assert rounded % tick == 0
        assert tick <= rounded <= tiers.max_delay_ms
        if not math.isnan(delay):
            assert rounded >= min(delay, tiers.max_delay_ms)
            assert rounded - tick < max(delay, 0) or rounded == tick

    @given(
        tick=st.integers(min_value=MIN_TICK_MS, max_value=5_000),
        ticks=st.integers(min_value=1, max_value=10_000),
        remaining=st.integers(min_value=1, max_value=10**9),
    )
    def test_pick_is_the_largest_tier_that_fits(
        self, tick: int, ticks: int, remaining: int
    ) -> None:
        """The picked TTL fits the remaining wait (or is the base tier); its double does not."""
        tiers = Tiers.build(tick, ticks * tick)
        ttl = tiers.pick(remaining)
        assert ttl in tiers.ttls_ms
        assert ttl <= remaining or ttl == tick
        assert ttl == tiers.ttls_ms[-1] or ttl * 2 > remaining


class TestClassifyEdges:
    @pytest.mark.parametrize(
        ("exc", "verdict"),
        [
            (ConnectionResetError(), Verdict.TRANSIENT),
            (BrokenPipeError(), Verdict.TRANSIENT),
            (json.JSONDecodeError("x", "{", 0), Verdict.PERMANENT),
        ],
    )
    def test_builtins_match_subclasses(self, exc: BaseException, verdict: Verdict) -> None:
        """The built-in lists match along the MRO: ConnectionResetError is a ConnectionError."""
        assert classify(exc) == Classification(verdict, Rule.BUILTIN)

    def test_one_sided_lists_at_each_level(self) -> None:
        """A level with only a transient (or only a permanent) list still decides."""
        assert classify(KeyError(), handler_transient=(KeyError,)) == Classification(
            Verdict.TRANSIENT, Rule.HANDLER
        )
        assert classify(KeyError(), handler_permanent=(KeyError,)) == Classification(
            Verdict.PERMANENT, Rule.HANDLER
        )
        assert classify(KeyError(), default_transient=(KeyError,)) == Classification(
            Verdict.TRANSIENT, Rule.DEFAULT
        )
        assert classify(KeyError(), default_permanent=(KeyError,)) == Classification(
            Verdict.PERMANENT, Rule.DEFAULT
        )

    def test_a_level_that_does_not_list_the_exception_passes_it_on(self) -> None:
        """Unlisted at the handler level: the default level decides, then the built-ins."""
        assert classify(
            KeyError(), handler_transient=(OSError,), default_permanent=(KeyError,)
        ) == Classification(Verdict.PERMANENT, Rule.DEFAULT)
        assert classify(
            TimeoutError(), handler_permanent=(KeyError,), default_permanent=(KeyError,)
        ) == Classification(Verdict.TRANSIENT, Rule.BUILTIN)


class TestClassifyHostile:
    """Classification never raises and never reads what an exception says about itself."""

    def test_a_retry_config_error_from_a_handler_is_explicitly_permanent(self) -> None:
        """RetryLater(delay=-3) in a handler: permanent whatever the lists say."""
        for exc in (RetryConfigError("bad"), RetryTopologyError("bad")):
            assert classify(
                exc, handler_transient=(ValueError,), default_transient=(Exception,)
            ) == Classification(Verdict.PERMANENT, Rule.EXPLICIT)

    def test_fastapi_validation_errors_are_permanent_by_name(self) -> None:
        """FastAPI's RequestValidationError, and subclasses, without importing FastAPI."""
        fake = type("RequestValidationError", (Exception,), {"__module__": "fastapi.exceptions"})
        sub = type("MyValidationError", (fake,), {"__module__": "app"})
        assert classify(fake()) == Classification(Verdict.PERMANENT, Rule.BUILTIN)
        assert classify(sub()) == Classification(Verdict.PERMANENT, Rule.BUILTIN)
        assert classify(sub(), handler_transient=(sub,)) == Classification(
            Verdict.TRANSIENT, Rule.HANDLER
        )
        assert "fastapi.exceptions.RequestValidationError" in BUILTIN_PERMANENT_NAMES

    def test_a_name_alike_in_another_module_is_not_fastapis(self) -> None:
        """Only the qualified name counts: same class name elsewhere is unknown."""
        other = type("RequestValidationError", (Exception,), {"__module__": "app.exceptions"})
        not_a_str = type("RequestValidationError", (Exception,), {"__module__": 42})
        assert classify(other()) == Classification(Verdict.TRANSIENT, Rule.FALLBACK)
        assert classify(not_a_str()) == Classification(Verdict.TRANSIENT, Rule.FALLBACK)

    def test_a_str_subclass_module_is_not_trusted(self) -> None:
        """A __module__ that merely acts like the name does not match."""

        class Liar(str):
            __slots__ = ()

            def __eq__(self, other: object) -> bool:
                return True

            __hash__ = str.__hash__

        sly = type(
            "RequestValidationError", (Exception,), {"__module__": Liar("fastapi.exceptions")}
        )
        assert classify(sly()) == Classification(Verdict.TRANSIENT, Rule.FALLBACK)

    def test_class_is_read_with_type_not_dunder_class(self) -> None:
        """A __class__ property (raising or lying) changes nothing."""

        class LyingError(TimeoutError):
            @property  # type: ignore[misc]
            def __class__(self) -> type:
                return PermanentError

        class RaisingError(KeyError):
            @property  # type: ignore[misc]
            def __class__(self) -> type:
                raise IndexError

        assert classify(LyingError()) == Classification(Verdict.TRANSIENT, Rule.BUILTIN)
        assert classify(RaisingError(), handler_permanent=(KeyError,)) == Classification(
            Verdict.PERMANENT, Rule.HANDLER
        )

    def test_a_class_that_cannot_be_compared_falls_back_to_transient(self) -> None:
        """A metaclass whose __eq__ or __hash__ raises: transient fallback, no exception."""

        class BadEq(type):
            def __eq__(cls, other: object) -> bool:
                raise IndexError

            __hash__ = type.__hash__

        class BadHash(type):
            def __hash__(cls) -> int:
                raise IndexError

        compared = BadEq("Compared", (Exception,), {})
        hashed = BadHash("Hashed", (Exception,), {})
        assert classify(compared(), handler_transient=(KeyError,)) == Classification(
            Verdict.TRANSIENT, Rule.FALLBACK
        )
        assert classify(hashed(), handler_permanent=(KeyError,)) == Classification(
            Verdict.TRANSIENT, Rule.FALLBACK
        )
        assert classify(compared(), handler_permanent=(compared,)) == Classification(  # type: ignore[arg-type]
            Verdict.PERMANENT, Rule.HANDLER
        )


ONE_TICK = Tiers.build(100, 10_000)


def decide_with(
    exc: BaseException, attempt: int, handler: HandlerPolicy | None, default: RetryPolicy
) -> Decision:
    return decide(
        exc, attempt=attempt, handler=handler, default=default, tiers=ONE_TICK, rand=lambda: 0.5
    )


class TestDecideExactly:
    """Whole decisions compared, and the order the rules are applied in."""

    def test_permanent_on_the_last_attempt_reads_permanent(self) -> None:
        """The verdict is checked before the count: the DLQ says why it really failed."""
        decision = decide_with(PermanentError(), 3, None, RetryPolicy(max_attempts=3))
        assert decision == Decision(
            Action.DEAD_LETTER,
            3,
            3,
            Classification(Verdict.PERMANENT, Rule.EXPLICIT),
            reason=Reason.PERMANENT,
        )

    def test_exhausted(self) -> None:
        """The max_attempts-th failure of a transient error is exhausted."""
        decision = decide_with(KeyError(), 2, None, RetryPolicy(max_attempts=2))
        assert decision == Decision(
            Action.DEAD_LETTER,
            2,
            2,
            Classification(Verdict.TRANSIENT, Rule.FALLBACK),
            reason=Reason.EXHAUSTED,
        )

    def test_one_attempt_means_no_retry(self) -> None:
        """max_attempts=1: the first failure is the last."""
        decision = decide_with(KeyError(), 1, None, RetryPolicy(max_attempts=1, immediate=3))
        assert (decision.action, decision.reason) == (Action.DEAD_LETTER, Reason.EXHAUSTED)

    def test_retry_later_beats_immediate_retries(self) -> None:
        """A rate-limited handler waits the delay it asked for, even where immediate applies."""
        decision = decide_with(RetryLater(0.25), 1, None, RetryPolicy(immediate=2))
        assert decision == Decision(
            Action.RETRY_LATER, 1, 5, Classification(Verdict.TRANSIENT, Rule.EXPLICIT), 300
        )

    def test_retry_later_zero_waits_one_tick(self) -> None:
        """RetryLater(0) still goes through the tiers: one tick, never a hot loop."""
        assert decide_with(RetryLater(0), 1, None, RetryPolicy()).delay_ms == 100

    def test_a_tampered_retry_later_delay_is_a_permanent_failure(self) -> None:
        """A delay changed after construction is the handler's bug: dead-lettered at once."""
        exc = RetryLater(1)
        exc.delay = -1  # type: ignore[assignment]
        assert decide_with(exc, 1, None, RetryPolicy(permanent=(KeyError,))) == Decision(
            Action.DEAD_LETTER,
            1,
            5,
            Classification(Verdict.PERMANENT, Rule.EXPLICIT),
            reason=Reason.PERMANENT,
            problem="RetryLater(delay=...) must be a finite duration >= 0, got -1",
        )

    def test_a_retry_later_without_a_delay_is_a_permanent_failure(self) -> None:
        """A subclass that skips RetryLater.__init__ (or whose delay raises) never stalls."""

        class NoInit(RetryLater):
            def __init__(self) -> None:
                Exception.__init__(self, "no delay")

        class Raising(NoInit):
            @property
            def delay(self) -> float:  # type: ignore[override]
                raise LookupError

        for exc, raised in ((NoInit(), "AttributeError"), (Raising(), "LookupError")):
            decision = decide_with(exc, 5, None, RetryPolicy())
            assert decision == Decision(
                Action.DEAD_LETTER,
                5,
                5,
                Classification(Verdict.PERMANENT, Rule.EXPLICIT),
                reason=Reason.PERMANENT,
                problem=f"reading RetryLater.delay raised {raised}",
            )

    def test_a_retry_later_longer_than_max_delay_is_capped_and_says_so(self) -> None:
        """Above max_delay: max_delay, with the asked delay kept for the warning."""
        assert decide_with(RetryLater(15), 1, None, RetryPolicy()) == Decision(
            Action.RETRY_LATER,
            1,
            5,
            Classification(Verdict.TRANSIENT, Rule.EXPLICIT),
            10_000,
            capped_from_ms=15_000,
        )

    def test_a_retry_later_of_exactly_max_delay_is_not_capped(self) -> None:
        """max_delay itself fits: no capping reported."""
        decision = decide_with(RetryLater(10), 1, None, RetryPolicy())
        assert (decision.delay_ms, decision.capped_from_ms) == (10_000, None)

    def test_a_backoff_delay_is_never_reported_capped(self) -> None:
        """Only RetryLater's delays are unknown in advance; a policy's are checked at start."""
        policy = RetryPolicy(backoff=Fixed(50))
        decision = decide_with(KeyError(), 1, None, policy)
        assert (decision.delay_ms, decision.capped_from_ms) == (10_000, None)

    def test_an_invalid_retry_later_raised_in_a_handler_is_permanent(self) -> None:
        """RetryLater(delay=-3) raises RetryConfigError in the handler: dead-lettered, named."""
        with pytest.raises(RetryConfigError) as raised:
            RetryLater(-3)
        handler = HandlerPolicy({"transient": (ValueError, Exception)})
        decision = decide_with(raised.value, 1, handler, RetryPolicy(transient=(ValueError,)))
        assert decision == Decision(
            Action.DEAD_LETTER,
            1,
            5,
            Classification(Verdict.PERMANENT, Rule.EXPLICIT),
            reason=Reason.PERMANENT,
        )
        assert str(raised.value) == "RetryLater(delay=...) must be a finite duration >= 0, got -3"

    def test_immediate_retry(self) -> None:
        """Within immediate, a retry is in-process and carries no delay."""
        decision = decide_with(KeyError(), 2, None, RetryPolicy(immediate=2))
        assert decision == Decision(
            Action.RETRY_NOW, 2, 5, Classification(Verdict.TRANSIENT, Rule.FALLBACK)
        )

    def test_delayed_retry_numbers_skip_the_immediate_ones(self) -> None:
        """After immediate=1, the 2nd call's failure takes the backoff's first delay."""
        policy = RetryPolicy(backoff=Schedule([1, 2, 3]), immediate=1)
        assert decide_with(KeyError(), 2, None, policy) == Decision(
            Action.RETRY_LATER, 2, 5, Classification(Verdict.TRANSIENT, Rule.FALLBACK), 1000
        )

    def test_jitter_gets_the_random_source(self) -> None:
        """The backoff's jitter draws from the rand passed in."""
        policy = RetryPolicy(backoff=Exponential(initial=1, jitter=0.5))
        decision = decide(
            KeyError(), attempt=1, handler=None, default=policy, tiers=ONE_TICK, rand=lambda: 0.0
        )
        assert decision.delay_ms == 500

    def test_without_a_handler_policy_the_default_lists_are_the_default_level(self) -> None:
        """The default's types classify with rule 'default', not 'handler'."""
        default = RetryPolicy(transient=(KeyError,), permanent=(OSError,))
        assert decide_with(KeyError(), 1, None, default).classification == Classification(
            Verdict.TRANSIENT, Rule.DEFAULT
        )
        assert decide_with(OSError(), 1, None, default).classification == Classification(
            Verdict.PERMANENT, Rule.DEFAULT
        )

    def test_handler_lists_come_before_the_defaults(self) -> None:
        """A handler's transient type beats the same type listed permanent by the default."""
        default = RetryPolicy(transient=(OSError,), permanent=(KeyError,))
        handler = HandlerPolicy({"transient": (KeyError,), "permanent": (OSError,)})
        assert decide_with(KeyError(), 1, handler, default).classification == Classification(
            Verdict.TRANSIENT, Rule.HANDLER
        )
        assert decide_with(OSError(), 1, handler, default).classification == Classification(
            Verdict.PERMANENT, Rule.HANDLER
        )

    def test_a_handler_without_lists_falls_through_to_the_default(self) -> None:
        """A handler that sets only scalars leaves classification to the default's lists."""
        default = RetryPolicy(permanent=(KeyError,))
        handler = HandlerPolicy({"max_attempts": 9})
        decision = decide_with(KeyError(), 1, handler, default)
        assert (decision.classification, decision.max_attempts) == (
            Classification(Verdict.PERMANENT, Rule.DEFAULT),
            9,
        )


@given(st.lists(st.integers(min_value=0, max_value=10**8), max_size=8))
def test_the_tick_divides_every_delay_unless_floored(delays: list[int]) -> None:
    """The tick is the largest grid every named delay sits on, or the floor when that is finer."""
    tick = compute_tick_ms(delays)
    positive = [d for d in delays if d > 0]
    if not positive:
        assert tick == 1000
    elif tick > MIN_TICK_MS:
        assert all(d % tick == 0 for d in positive)
        assert math.gcd(*positive) == tick
    else:
        assert math.gcd(*positive) <= MIN_TICK_MS
