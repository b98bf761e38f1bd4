"""Backoff strategies, policy validation and the @retry_policy decorator (pure)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from faststream_retry import (
    Exponential,
    Fixed,
    RetryConfigError,
    RetryPolicy,
    Schedule,
    retry_policy,
)
from faststream_retry.policy import HandlerPolicy, effective_policy, get_handler_policy, to_ms


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

    def test_placed_on_something_that_refuses_attributes(self) -> None:
        """Above @broker.subscriber (a slotted wrapper) the error says where it belongs."""

        class Slotted:
            __slots__ = ()

            def __call__(self) -> None: ...

        with pytest.raises(RetryConfigError, match=r"directly under @broker\.subscriber"):
            retry_policy(max_attempts=2)(Slotted())


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
