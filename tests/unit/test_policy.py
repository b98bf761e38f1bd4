"""Backoff strategies, policy validation and the @retry_policy decorator (pure)."""

from __future__ import annotations

import math
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from faststream_retry import (
    Exponential,
    Fixed,
    RetryConfigError,
    RetryLater,
    RetryPolicy,
    Schedule,
    retry_policy,
)
from faststream_retry.core import policy as policy_module
from faststream_retry.core.policy import HandlerPolicy, effective_policy, get_handler_policy, to_ms

if TYPE_CHECKING:
    from collections.abc import Callable


def mid() -> float:
    return 0.5


class TestExponential:
    @pytest.mark.parametrize(
        ("n", "expected"),
        [(1, 1000), (2, 2000), (3, 4000), (4, 8000), (9, 256_000), (10, 300_000), (500, 300_000)],
    )
    def test_table_capped_at_maximum(self, n: int, expected: int) -> None:
        """Delays double from initial and stop at maximum, even for huge n."""
        backoff = Exponential(initial=timedelta(seconds=1), factor=2, maximum=timedelta(minutes=5))
        assert backoff.delay_ms(n, mid) == expected

    def test_overflow_falls_back_to_the_cap(self) -> None:
        """A factor that overflows floats gives the maximum, not an error."""
        backoff = Exponential(initial=1, factor=1e300, maximum=60)
        assert backoff.delay_ms(5, mid) == 60_000

    def test_no_maximum_is_bounded_anyway(self) -> None:
        """Without maximum the delay is still a finite int (max_delay clamps it later)."""
        assert Exponential(initial=1, factor=10).delay_ms(10_000, mid) == 2**53

    @pytest.mark.parametrize("rand", [0.0, 0.25, 0.5, 0.999999])
    def test_jitter_bounds(self, rand: float) -> None:
        """Jitter spreads each delay within [1 - j, 1 + j] of it, capped at maximum."""
        backoff = Exponential(initial=10, factor=2, maximum=25, jitter=0.2)
        first = backoff.delay_ms(1, lambda: rand)
        assert 8000 <= first <= 12000
        assert backoff.delay_ms(2, lambda: rand) <= 25_000
        assert backoff.delay_ms(1, lambda: 0.0) == 8000

    def test_named_delays(self) -> None:
        """Initial and maximum are the delays the tick is computed from."""
        assert Exponential(initial=2, maximum=60).named_delays_ms() == (2000, 60_000)
        assert Exponential(initial=2).named_delays_ms() == (2000,)

    @pytest.mark.parametrize(
        ("kwargs", "names"),
        [
            ({"initial": 0}, "initial"),
            ({"initial": -1}, "initial"),
            ({"initial": 1, "factor": 0.5}, "factor"),
            ({"initial": 1, "factor": float("nan")}, "factor"),
            ({"initial": 5, "maximum": 1}, "maximum"),
            ({"initial": 1, "jitter": 1.5}, "jitter"),
            ({"initial": "1s"}, "initial"),
        ],
    )
    def test_invalid_options_name_themselves(self, kwargs: dict[str, Any], names: str) -> None:
        """Each invalid option fails at construction with its name in the message."""
        with pytest.raises(RetryConfigError, match=names):
            Exponential(**kwargs)


class TestFixedAndSchedule:
    def test_fixed(self) -> None:
        """Fixed gives the same delay for every retry."""
        backoff = Fixed(timedelta(milliseconds=1500))
        assert [backoff.delay_ms(n, mid) for n in (1, 2, 50)] == [1500, 1500, 1500]
        assert backoff.named_delays_ms() == (1500,)

    def test_schedule_repeats_its_last_delay(self) -> None:
        """Schedule walks its list and then keeps the last delay."""
        backoff = Schedule([10, timedelta(minutes=1), 300])
        assert [backoff.delay_ms(n, mid) for n in (1, 2, 3, 4, 9)] == [
            10_000,
            60_000,
            300_000,
            300_000,
            300_000,
        ]
        assert backoff.named_delays_ms() == (10_000, 60_000, 300_000)

    @pytest.mark.parametrize("bad", [[], [0], [1, -2], "10s", None])
    def test_schedule_rejects_bad_lists(self, bad: Any) -> None:
        """An empty, non-positive or non-list schedule is refused at construction."""
        with pytest.raises(RetryConfigError, match="Schedule"):
            Schedule(bad)

    def test_fixed_rejects_zero(self) -> None:
        """A zero delay would be a hot loop."""
        with pytest.raises(RetryConfigError, match="Fixed"):
            Fixed(0)


class TestRetryPolicy:
    @pytest.mark.parametrize(
        ("kwargs", "name"),
        [
            ({"max_attempts": 0}, "max_attempts"),
            ({"max_attempts": True}, "max_attempts"),
            ({"backoff": 5}, "backoff"),
            ({"transient": (ValueError, "x")}, "transient"),
            ({"permanent": int}, "permanent"),
            ({"immediate": -1}, "immediate"),
            ({"enabled": "yes"}, "enabled"),
            ({"transient": ValueError, "permanent": (ValueError,)}, "both"),
        ],
    )
    def test_invalid_options_name_themselves(self, kwargs: dict[str, Any], name: str) -> None:
        """Each invalid option fails with its name in the message."""
        with pytest.raises(RetryConfigError, match=name):
            RetryPolicy(**kwargs)

    def test_single_type_is_accepted(self) -> None:
        """transient=SomeError is taken as a one-element tuple."""
        assert RetryPolicy(transient=KeyError).transient == (KeyError,)  # type: ignore[arg-type]

    def test_to_ms_rounds_up(self) -> None:
        """Durations become whole milliseconds, never shorter."""
        assert to_ms(0.0011, "x") == 2
        assert to_ms(timedelta(seconds=1), "x") == 1000
        assert to_ms(0.1, "x") == 100


class TestRetryPolicyDecorator:
    def test_unknown_option_is_named_with_the_valid_ones(self) -> None:
        """A typo fails at decoration time, naming it and listing what is valid."""
        with pytest.raises(RetryConfigError, match=r"max_attempt\b.*valid options: backoff"):
            retry_policy(max_attempt=3)

    def test_invalid_value_fails_at_decoration(self) -> None:
        """A bad value fails when the decorator is built, not when a message fails."""
        with pytest.raises(RetryConfigError, match="max_attempts"):
            retry_policy(max_attempts=-1)

    def test_only_given_options_override_the_default(self) -> None:
        """Options not given come from the middleware default."""

        @retry_policy(max_attempts=8)
        async def handler() -> None: ...

        policy = get_handler_policy(handler)
        assert policy is not None
        default = RetryPolicy(backoff=Fixed(3), permanent=(KeyError,))
        resolved = policy.resolve(default)
        assert resolved.max_attempts == 8
        assert resolved.backoff == Fixed(3)
        assert resolved.permanent == ()  # layered, not inherited: see classify

    def test_a_plain_function_carries_its_policy_and_is_not_kept(self) -> None:
        """Only what refuses attributes is kept by identity: functions do not pile up."""

        async def handler(body: str) -> None: ...

        retry_policy(max_attempts=2)(handler)
        assert all(held is not handler for held, _ in policy_module._HELD.values())
        policy = get_handler_policy(handler)
        assert policy is not None
        assert policy.options == {"max_attempts": 2}

    def test_placed_on_something_that_refuses_attributes(self) -> None:
        """On a slotted wrapper (FastStream's, above @broker.publisher) the policy is kept."""

        class Slotted:
            __slots__ = ()

            def __call__(self) -> None: ...

        wrapper = Slotted()
        other = Slotted()
        assert retry_policy(max_attempts=2)(wrapper) is wrapper
        # Kept alive with its policy: no later object can take over its id.
        assert any(held is wrapper for held, _ in policy_module._HELD.values())
        policy = get_handler_policy(wrapper)
        assert policy is not None
        assert policy.options == {"max_attempts": 2}
        assert get_handler_policy(other) is None

    def test_a_slotted_wrapper_is_found_through_wrappers(self) -> None:
        """A kept policy is found at any depth of a ``__wrapped__`` chain, like a set one."""

        class Slotted:
            __slots__ = ()

            def __call__(self) -> None: ...

        inner = retry_policy(max_attempts=3)(Slotted())

        def outer() -> None: ...

        outer.__wrapped__ = inner  # type: ignore[attr-defined]
        policy = get_handler_policy(outer)
        assert policy is not None
        assert policy.options == {"max_attempts": 3}


class TestEffectivePolicy:
    def test_a_handler_without_a_policy_runs_with_the_default(self) -> None:
        """No `@retry_policy`: the middleware's default, the very object."""
        default = RetryPolicy(max_attempts=3)
        assert effective_policy(None, default) is default

    def test_handler_options_win_and_the_rest_come_from_the_default(self) -> None:
        """Scalars the handler set win; the others come from the default."""
        default = RetryPolicy(max_attempts=3, backoff=Fixed(2), immediate=1)
        handler = HandlerPolicy({"max_attempts": 9, "enabled": False})
        policy = effective_policy(handler, default)
        assert (policy.max_attempts, policy.enabled) == (9, False)
        assert (policy.backoff, policy.immediate) == (Fixed(2), 1)

    def test_exception_lists_are_the_handlers_own(self) -> None:
        """The default's types are not copied in: classify consults them as their own level."""
        default = RetryPolicy(transient=(KeyError,), permanent=(ValueError,))
        policy = effective_policy(HandlerPolicy({"permanent": (OSError,)}), default)
        assert (policy.transient, policy.permanent) == ((), (OSError,))


class TestFindingTheHandlersPolicy:
    def test_found_through_wrappers(self) -> None:
        """A decorator FastStream puts around the handler (functools.wraps) hides nothing."""

        @retry_policy(max_attempts=4)
        async def handler() -> None: ...

        def wrapper() -> None: ...

        wrapper.__wrapped__ = handler  # type: ignore[attr-defined]
        policy = get_handler_policy(wrapper)
        assert policy is not None
        assert policy.options == {"max_attempts": 4}

    def test_nothing_and_cycles_give_none(self) -> None:
        """A function without a policy, None, or a wrapper cycle: no policy, no hang."""

        def a() -> None: ...

        def b() -> None: ...

        a.__wrapped__ = b  # type: ignore[attr-defined]
        b.__wrapped__ = a  # type: ignore[attr-defined]
        assert get_handler_policy(a) is None
        assert get_handler_policy(None) is None


def error_of(make: Callable[[], object]) -> str:
    """The whole message of the RetryConfigError ``make`` raises: users read it as it is."""
    with pytest.raises(RetryConfigError) as raised:
        make()
    return str(raised.value)


class TestDurations:
    def test_zero_and_negative(self) -> None:
        """0 is a duration; anything below it, infinite or NaN is refused, naming the option."""
        assert to_ms(0, "x") == 0
        for bad in (-1, -0.001, float("inf"), float("nan"), timedelta(seconds=-1)):
            assert error_of(partial(to_ms, bad, "opt")) == (
                f"opt must be a finite duration >= 0, got {bad!r}"
            )
        assert error_of(lambda: to_ms(True, "opt")) == "opt takes a timedelta or seconds, got True"

    def test_float_noise_is_not_a_millisecond(self) -> None:
        """Rounding up never turns the float error of a product into a whole extra ms."""
        assert to_ms(4e-10, "x") == 0
        assert to_ms(0.1 + 0.2, "x") == 300
        assert to_ms(0.0011, "x") == 2

    def test_a_timedelta_is_exact_at_any_size(self) -> None:
        """A timedelta's whole ms stay whole far past where a float's noise reaches a ms.

        ``timedelta(milliseconds=8464679844).total_seconds() * 1000`` is a hair above the
        whole number: rounded up, an Exponential's maximum grew by 1 ms (hypothesis found
        it in ``test_exponential_stays_within_its_bounds``).
        """
        assert to_ms(timedelta(milliseconds=8464679844), "x") == 8464679844
        assert to_ms(timedelta(microseconds=8464679844001), "x") == 8464679845
        assert to_ms(timedelta(microseconds=1), "x") == 1
        assert to_ms(timedelta(0), "x") == 0


class TestBoundaries:
    """Each limit accepted at its edge, refused one step past it, with the whole message."""

    def test_fixed(self) -> None:
        """1 ms is the shortest Fixed delay; the delay reads back as a timedelta."""
        assert Fixed(0.001).delay_ms(1, mid) == 1
        assert Fixed(1.5).delay == timedelta(seconds=1.5)
        assert error_of(lambda: Fixed(0)) == "Fixed(delay=...) must be positive"
        assert error_of(lambda: Fixed("1")) == (  # type: ignore[arg-type]
            "Fixed(delay=...) takes a timedelta or seconds, got '1'"
        )

    def test_exponential_options_read_back(self) -> None:
        """The constructor's values are what the object reports; factor defaults to 2."""
        backoff = Exponential(initial=1.5, maximum=5)
        assert (backoff.initial, backoff.factor, backoff.maximum, backoff.jitter) == (
            timedelta(seconds=1.5),
            2.0,
            timedelta(seconds=5),
            0.0,
        )
        assert Exponential(initial=1).maximum is None

    def test_exponential_edges(self) -> None:
        """initial 1 ms, factor 1 (constant), maximum == initial and jitter 1 are all valid."""
        assert Exponential(initial=0.001).delay_ms(1, mid) == 1
        assert [Exponential(initial=2, factor=1).delay_ms(n, mid) for n in (1, 5)] == [2000, 2000]
        assert Exponential(initial=2, factor=1.5).delay_ms(3, mid) == 4500
        assert Exponential(initial=2, maximum=2).delay_ms(9, mid) == 2000
        assert Exponential(initial=2, jitter=1).delay_ms(1, mid) == 2000

    def test_exponential_never_returns_zero(self) -> None:
        """Full jitter at rand() == 0 still waits 1 ms: a zero delay is a hot loop."""
        assert Exponential(initial=0.001, jitter=1).delay_ms(1, lambda: 0.0) == 1
        assert Exponential(initial=10, jitter=1).delay_ms(1, lambda: 0.0) == 1

    @pytest.mark.parametrize(("rand", "expected"), [(0.0, 8000), (0.5, 10_000), (0.75, 11_000)])
    def test_jitter_is_two_sided_and_linear_in_rand(self, rand: float, expected: int) -> None:
        """jitter=0.2 maps rand() in [0, 1) onto [0.8, 1.2) times the delay."""
        assert Exponential(initial=10, jitter=0.2).delay_ms(1, lambda: rand) == expected

    def test_exponential_messages(self) -> None:
        """Every refusal names the option, the rule and the value."""
        assert (
            error_of(lambda: Exponential(initial=0)) == "Exponential(initial=...) must be positive"
        )
        assert error_of(lambda: Exponential(initial="1")) == (  # type: ignore[arg-type]
            "Exponential(initial=...) takes a timedelta or seconds, got '1'"
        )
        factors: tuple[Any, ...] = (True, 0.99, float("inf"), "2")
        for factor in factors:
            assert error_of(partial(Exponential, initial=1, factor=factor)) == (
                f"Exponential(factor=...) must be a number >= 1, got {factor!r}"
            )
        assert error_of(lambda: Exponential(initial=2, maximum=1.999)) == (
            "Exponential(maximum=...) must be >= initial (0:00:01.999000 < 0:00:02)"
        )
        assert error_of(lambda: Exponential(initial=2, maximum="1")) == (  # type: ignore[arg-type]
            "Exponential(maximum=...) takes a timedelta or seconds, got '1'"
        )
        for jitter in (True, -0.01, 1.01):
            assert error_of(partial(Exponential, initial=1, jitter=jitter)) == (
                f"Exponential(jitter=...) is a fraction in [0, 1], got {jitter!r}"
            )

    def test_schedule(self) -> None:
        """A 1 ms delay is valid; the delays read back as timedeltas; refusals say why."""
        assert Schedule([0.001]).delays == (timedelta(milliseconds=1),)
        assert error_of(lambda: Schedule("10")) == (  # type: ignore[arg-type]
            "Schedule(delays=...) takes a list of delays, got '10'"
        )
        assert error_of(lambda: Schedule(None)) == (  # type: ignore[arg-type]
            "Schedule(delays=...) takes a list of delays, got None"
        )
        assert error_of(lambda: Schedule([])) == "Schedule(delays=...) needs at least one delay"
        assert error_of(lambda: Schedule([1, 0])) == "Schedule(delays=...) must be positive"
        not_a_duration: list[Any] = [1, "x"]
        assert error_of(lambda: Schedule(not_a_duration)) == (
            "Schedule(delays=...)[1] takes a timedelta or seconds, got 'x'"
        )

    def test_retry_policy(self) -> None:
        """One attempt (no retry) is valid; the refusals name the option and the value."""
        assert RetryPolicy(max_attempts=1).max_attempts == 1
        assert RetryPolicy(immediate=0).immediate == 0
        attempts_: tuple[Any, ...] = (0, True, 1.0)
        for attempts in attempts_:
            assert error_of(partial(RetryPolicy, max_attempts=attempts)) == (
                f"max_attempts must be an int >= 1, got {attempts!r}"
            )
        for immediate in (-1, True):
            assert error_of(partial(RetryPolicy, immediate=immediate)) == (
                f"immediate must be an int >= 0, got {immediate!r}"
            )
        assert error_of(lambda: RetryPolicy(backoff=5)) == (  # type: ignore[arg-type]
            "backoff takes Fixed(...), Exponential(...), Schedule(...) or an object with "
            "delay_ms() and named_delays_ms(), got 5"
        )
        assert error_of(lambda: RetryPolicy(transient=(1,))) == (  # type: ignore[arg-type]
            "transient takes exception classes, e.g. transient=(TimeoutError,), got (1,)"
        )
        assert error_of(lambda: RetryPolicy(permanent=int)) == (  # type: ignore[arg-type]
            "permanent takes exception classes, e.g. permanent=(TimeoutError,), got (<class 'int'>,)"
        )
        assert error_of(
            lambda: RetryPolicy(transient=(KeyError, OSError), permanent=(OSError, KeyError))
        ) == ("KeyError, OSError listed as both transient and permanent")


class TestRetryLater:
    def test_delay_spellings(self) -> None:
        """Seconds or a timedelta; 0 means as soon as the tick allows."""
        assert RetryLater(timedelta(seconds=2)).delay == timedelta(seconds=2)
        assert RetryLater(2.5).delay == timedelta(seconds=2.5)
        assert RetryLater(0).delay == timedelta(0)

    def test_a_delay_past_timedelta_is_the_longest_one(self) -> None:
        """A huge Retry-After is cut to max_delay later; it must not raise OverflowError here."""
        assert RetryLater(1e300).delay == timedelta.max
        assert RetryLater(10**400).delay == timedelta.max
        assert RetryLater(timedelta.max).delay == timedelta.max

    def test_message(self) -> None:
        """The reason is the exception's message; without one, the delay is."""
        assert str(RetryLater(5)) == "retry later, in 0:00:05"
        assert str(RetryLater(5, "rate limited")) == "rate limited"

    def test_refusals(self) -> None:
        """Not a duration, negative, infinite or NaN: a config error naming RetryLater."""
        assert error_of(lambda: RetryLater(True)) == (
            "RetryLater(delay=...) takes a timedelta or seconds, got True"
        )
        for bad in (-1, float("inf"), float("nan"), timedelta(seconds=-1)):
            assert error_of(partial(RetryLater, bad)) == (
                f"RetryLater(delay=...) must be a finite duration >= 0, got {bad!r}"
            )

    def test_a_delay_whose_repr_raises_is_still_refused_by_name(self) -> None:
        """The refusal is RetryConfigError (permanent), not the repr()'s own exception."""

        class Weird:
            def __repr__(self) -> str:
                raise IndexError

        class WeirdFloat(float):
            def __repr__(self) -> str:
                raise IndexError

        assert error_of(lambda: RetryLater(Weird())) == (  # type: ignore[arg-type]
            "RetryLater(delay=...) takes a timedelta or seconds, got an unprintable Weird"
        )
        assert error_of(lambda: RetryLater(WeirdFloat(-1))) == (
            "RetryLater(delay=...) must be a finite duration >= 0, got an unprintable WeirdFloat"
        )


class TestDecoratorMessages:
    def test_unknown_options_are_listed_with_every_valid_one(self) -> None:
        """The message lists the typos and all valid options, sorted."""
        assert error_of(lambda: retry_policy(max_attempt=3, retries=1)) == (
            "@retry_policy got unknown option(s) max_attempt, retries; valid options: "
            "backoff, enabled, immediate, max_attempts, permanent, transient"
        )

    def test_not_a_function(self) -> None:
        """Decorating something that cannot be called says what it got."""
        not_a_handler: Any = 5
        assert error_of(lambda: retry_policy(max_attempts=2)(not_a_handler)) == (
            "@retry_policy decorates a handler, got 5"
        )

    def test_handler_transient_types_are_used(self) -> None:
        """A handler's own transient list reaches the effective policy."""
        default = RetryPolicy(permanent=(KeyError,))
        policy = effective_policy(HandlerPolicy({"transient": (OSError,)}), default)
        assert (policy.transient, policy.permanent) == ((OSError,), ())


class TestBackoffProperties:
    @given(
        initial_ms=st.integers(min_value=1, max_value=10**7),
        factor=st.floats(min_value=1, max_value=100),
        cap_ticks=st.integers(min_value=1, max_value=10**4),
        jitter=st.floats(min_value=0, max_value=1),
        n=st.integers(min_value=1, max_value=10**4),
        rand=st.floats(min_value=0, max_value=1, exclude_max=True),
    )
    # A maximum whose float ms are a hair above a whole number (to_ms rounded it up).
    @example(initial_ms=1435178, factor=2.0, cap_ticks=5898, jitter=0.0, n=14, rand=0.0)
    def test_exponential_stays_within_its_bounds(
        self,
        *,
        initial_ms: int,
        factor: float,
        cap_ticks: int,
        jitter: float,
        n: int,
        rand: float,
    ) -> None:
        """Every delay is a positive int within jitter of initial * factor**(n-1), capped."""
        maximum_ms = initial_ms * cap_ticks
        backoff = Exponential(
            initial=timedelta(milliseconds=initial_ms),
            factor=factor,
            maximum=timedelta(milliseconds=maximum_ms),
            jitter=jitter,
        )
        delay = backoff.delay_ms(n, lambda: rand)
        assert type(delay) is int
        assert 1 <= delay <= maximum_ms
        plain = Exponential(
            initial=timedelta(milliseconds=initial_ms),
            factor=factor,
            maximum=timedelta(milliseconds=maximum_ms),
        ).delay_ms(n, mid)
        assert plain <= maximum_ms
        assert delay >= min(maximum_ms, (1 - jitter) * plain) - 1
        assert delay <= math.ceil((1 + jitter) * plain) + 1

    @given(
        initial_ms=st.integers(min_value=1, max_value=10**6),
        factor=st.floats(min_value=1, max_value=10),
        n=st.integers(min_value=1, max_value=200),
    )
    def test_exponential_without_jitter_never_shrinks(
        self, initial_ms: int, factor: float, n: int
    ) -> None:
        """Retry n + 1 never waits less than retry n."""
        backoff = Exponential(initial=timedelta(milliseconds=initial_ms), factor=factor)
        assert backoff.delay_ms(n + 1, mid) >= backoff.delay_ms(n, mid) >= initial_ms

    @given(
        delays=st.lists(st.integers(min_value=1, max_value=10**7), min_size=1, max_size=8),
        n=st.integers(min_value=-5, max_value=50),
    )
    def test_schedule_walks_then_repeats(self, delays: list[int], n: int) -> None:
        """Retry n takes the n-th delay; before the first, the first; past the end, the last."""
        backoff = Schedule([timedelta(milliseconds=d) for d in delays])
        assert backoff.delay_ms(n, mid) == delays[min(max(n, 1), len(delays)) - 1]


@pytest.mark.parametrize(
    ("make", "option", "label", "problem"),
    [
        (lambda: Fixed(0), "delay", "Fixed(delay=...)", "must be positive"),
        (lambda: Fixed("x"), "delay", "Fixed(delay=...)", "takes a timedelta or seconds, got 'x'"),  # type: ignore[arg-type]
        (lambda: Exponential(0), "initial", "Exponential(initial=...)", "must be positive"),
        (
            lambda: Exponential(-1),
            "initial",
            "Exponential(initial=...)",
            "must be a finite duration >= 0, got -1",
        ),
        (
            lambda: Exponential(1, factor=0.5),
            "factor",
            "Exponential(factor=...)",
            "must be a number >= 1, got 0.5",
        ),
        (
            lambda: Exponential(2, maximum=1),
            "maximum",
            "Exponential(maximum=...)",
            "must be >= initial (0:00:01 < 0:00:02)",
        ),
        (
            lambda: Exponential(1, maximum="2"),  # type: ignore[arg-type]
            "maximum",
            "Exponential(maximum=...)",
            "takes a timedelta or seconds, got '2'",
        ),
        (
            lambda: Exponential(1, jitter=2),
            "jitter",
            "Exponential(jitter=...)",
            "is a fraction in [0, 1], got 2",
        ),
        (
            lambda: Schedule("10"),  # type: ignore[arg-type]
            "delays",
            "Schedule(delays=...)",
            "takes a list of delays, got '10'",
        ),
        (lambda: Schedule([]), "delays", "Schedule(delays=...)", "needs at least one delay"),
        (lambda: Schedule([1, 0]), "delays", "Schedule(delays=...)", "must be positive"),
        (
            lambda: Schedule([1, "x"]),  # type: ignore[list-item]
            "delays",
            "Schedule(delays=...)[1]",
            "takes a timedelta or seconds, got 'x'",
        ),
        (lambda: to_ms(-1, "tick"), "tick", "tick", "must be a finite duration >= 0, got -1"),
        (
            lambda: to_ms("1", "wait", owner="Thing", index=0),  # type: ignore[arg-type]
            "wait",
            "Thing(wait=...)[0]",
            "takes a timedelta or seconds, got '1'",
        ),
    ],
)
def test_a_refusal_names_its_option_apart_from_the_problem(
    make: Callable[[], object], option: str, label: str, problem: str
) -> None:
    """The worker's config maps ``option`` to its own key and says ``problem`` after it,
    without reading the message: rewording a message cannot make its errors worse."""
    with pytest.raises(RetryConfigError) as raised:
        make()
    assert (raised.value.option, raised.value.problem) == (option, problem)
    assert str(raised.value) == f"{label} {problem}"


def test_a_refusal_about_no_one_option_is_its_whole_message() -> None:
    with pytest.raises(RetryConfigError) as raised:
        RetryPolicy(max_attempts=0)
    assert raised.value.option is None
    assert raised.value.problem == str(raised.value)
    assert str(raised.value) == "max_attempts must be an int >= 1, got 0"
