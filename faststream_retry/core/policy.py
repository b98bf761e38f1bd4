"""Retry policies and backoff strategies (pure: no broker imports).

Internally every duration is a whole number of milliseconds, the unit of the wire
format and of RabbitMQ's TTLs; the public constructors take ``timedelta`` or seconds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar, runtime_checkable

from faststream_retry.core.durations import ms_of_seconds
from faststream_retry.errors import RetryConfigError

__all__ = [
    "Backoff",
    "Exponential",
    "Fixed",
    "HandlerPolicy",
    "RetryPolicy",
    "Schedule",
    "effective_policy",
    "get_handler_policy",
    "retry_policy",
    "to_ms",
]

# Past this, a delay is certainly beyond any max_delay; keeps floats exact.
_HUGE_MS = 2**53
_POLICY_ATTR = "__faststream_retry_policy__"

# The policies of handlers that take no attributes (FastStream's slotted call wrapper,
# which @broker.publisher and @broker.subscriber return), by id. Each entry keeps its
# handler alive, so no other object can come to have that id.
_HELD: dict[int, tuple[object, HandlerPolicy]] = {}

Duration = timedelta | float | int


def to_ms(
    value: Duration, option: str, *, owner: str | None = None, index: int | None = None
) -> int:
    """Normalise a duration (``timedelta`` or seconds) to whole milliseconds.

    Rounds up, so a delay is never shortened. Raises ``RetryConfigError`` about
    ``option`` (of ``owner``, at ``index`` of a list) for anything that is not a finite,
    non-negative duration.
    """
    if isinstance(value, timedelta):
        # Exactly, in whole microseconds: total_seconds() is a float, whose noise at ten
        # billion ms (a maximum of about three months) rounds a whole ms up by one.
        us = value // timedelta(microseconds=1)
        if us >= 0:
            return -(-us // 1000)
        problem = f"must be a finite duration >= 0, got {value!r}"
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        problem = f"takes a timedelta or seconds, got {value!r}"
    else:
        seconds = float(value)
        if math.isfinite(seconds) and seconds >= 0:
            return ms_of_seconds(seconds)
        problem = f"must be a finite duration >= 0, got {value!r}"
    label = option if owner is None else f"{owner}({option}=...)"
    if index is not None:
        label += f"[{index}]"
    raise RetryConfigError(f"{label} {problem}", option=option, problem=problem)


@runtime_checkable
class Backoff(Protocol):
    """How long to wait before delayed retry number ``n`` (1 for the first)."""

    def delay_ms(self, n: int, rand: Callable[[], float]) -> int:
        """Return the delay in ms before rounding to the tick; ``rand()`` is in [0, 1)."""
        ...

    def named_delays_ms(self) -> tuple[int, ...]:
        """Return the delays this strategy names; the tick is their GCD."""
        ...


@dataclass(frozen=True, slots=True, init=False)
class Fixed:
    """The same delay before every retry."""

    delay: timedelta
    _ms: int = field(repr=False, compare=False)

    def __init__(self, delay: Duration) -> None:
        """Take the delay as a ``timedelta`` or seconds; it must be positive."""
        ms = to_ms(delay, "delay", owner="Fixed")
        if ms <= 0:
            raise RetryConfigError.argument("Fixed", "delay", "must be positive")
        object.__setattr__(self, "delay", timedelta(milliseconds=ms))
        object.__setattr__(self, "_ms", ms)

    def delay_ms(self, n: int, rand: Callable[[], float]) -> int:  # noqa: ARG002 - protocol
        """Return the fixed delay."""
        return self._ms

    def named_delays_ms(self) -> tuple[int, ...]:
        """Return the one delay."""
        return (self._ms,)


@dataclass(frozen=True, slots=True, init=False)
class Exponential:
    """``initial * factor ** (n - 1)``, capped at ``maximum``, with optional jitter.

    ``jitter`` is a fraction in [0, 1]: each delay is multiplied by a random factor
    in ``[1 - jitter, 1 + jitter]`` and then capped, so retries of many messages that
    failed together spread out instead of coming back as one wave.
    """

    initial: timedelta
    factor: float
    maximum: timedelta | None
    jitter: float
    _initial_ms: int = field(repr=False, compare=False)
    _maximum_ms: int | None = field(repr=False, compare=False)

    def __init__(
        self,
        initial: Duration,
        factor: float = 2.0,
        maximum: Duration | None = None,
        jitter: float = 0.0,
    ) -> None:
        """Validate and normalise; see the class docstring."""
        initial_ms = to_ms(initial, "initial", owner="Exponential")
        if initial_ms <= 0:
            raise RetryConfigError.argument("Exponential", "initial", "must be positive")
        if (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not math.isfinite(factor)
            or factor < 1
        ):
            raise RetryConfigError.argument(
                "Exponential", "factor", f"must be a number >= 1, got {factor!r}"
            )
        maximum_ms = None
        if maximum is not None:
            maximum_ms = to_ms(maximum, "maximum", owner="Exponential")
            if maximum_ms < initial_ms:
                raise RetryConfigError.argument(
                    "Exponential",
                    "maximum",
                    f"must be >= initial ({timedelta(milliseconds=maximum_ms)} < "
                    f"{timedelta(milliseconds=initial_ms)})",
                )
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 1:
            raise RetryConfigError.argument(
                "Exponential", "jitter", f"is a fraction in [0, 1], got {jitter!r}"
            )
        object.__setattr__(self, "initial", timedelta(milliseconds=initial_ms))
        object.__setattr__(self, "factor", float(factor))
        object.__setattr__(
            self,
            "maximum",
            None if maximum_ms is None else timedelta(milliseconds=maximum_ms),
        )
        object.__setattr__(self, "jitter", float(jitter))
        object.__setattr__(self, "_initial_ms", initial_ms)
        object.__setattr__(self, "_maximum_ms", maximum_ms)

    def delay_ms(self, n: int, rand: Callable[[], float]) -> int:
        """Return the capped, jittered delay for retry ``n``."""
        cap = self._maximum_ms if self._maximum_ms is not None else _HUGE_MS
        try:
            base = self._initial_ms * self.factor ** max(n - 1, 0)
        except OverflowError:
            base = float(cap)
        if self.jitter:
            base *= 1 - self.jitter + 2 * self.jitter * rand()
        return max(1, min(cap, math.ceil(min(base, _HUGE_MS))))

    def named_delays_ms(self) -> tuple[int, ...]:
        """Return initial and maximum: the delays a user wrote down."""
        if self._maximum_ms is None:
            return (self._initial_ms,)
        return (self._initial_ms, self._maximum_ms)


@dataclass(frozen=True, slots=True, init=False)
class Schedule:
    """An explicit list of delays ("10 s, 1 min, 5 min"); the last one repeats."""

    delays: tuple[timedelta, ...]
    _ms: tuple[int, ...] = field(repr=False, compare=False)

    def __init__(self, delays: Sequence[Duration]) -> None:
        """Take at least one positive delay."""
        if isinstance(delays, (str, bytes)) or not isinstance(delays, Sequence):
            raise RetryConfigError.argument(
                "Schedule", "delays", f"takes a list of delays, got {delays!r}"
            )
        if not delays:
            raise RetryConfigError.argument("Schedule", "delays", "needs at least one delay")
        ms = tuple(to_ms(d, "delays", owner="Schedule", index=i) for i, d in enumerate(delays))
        if min(ms) <= 0:
            raise RetryConfigError.argument("Schedule", "delays", "must be positive")
        object.__setattr__(self, "delays", tuple(timedelta(milliseconds=m) for m in ms))
        object.__setattr__(self, "_ms", ms)

    def delay_ms(self, n: int, rand: Callable[[], float]) -> int:  # noqa: ARG002 - protocol
        """Return the n-th delay, or the last one past the end."""
        return self._ms[min(max(n, 1), len(self._ms)) - 1]

    def named_delays_ms(self) -> tuple[int, ...]:
        """Return every listed delay."""
        return self._ms


ExcTypes = tuple[type[BaseException], ...]


def _exc_types(value: object, name: str) -> ExcTypes:
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, (tuple, list, set, frozenset)) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in value
    ):
        raise RetryConfigError(
            f"{name} takes exception classes, e.g. {name}=(TimeoutError,), got {value!r}"
        )
    return tuple(value)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a handler's failures are retried.

    Args:
        max_attempts: handler calls in all, the first included; after the last
            failed one the message is dead-lettered with reason ``exhausted``.
        backoff: delays between delayed retries (``Fixed``, ``Exponential``,
            ``Schedule`` or your own ``Backoff``).
        transient: exception types to retry (checked after explicit
            ``TransientError``/``PermanentError``/``RetryLater``).
        permanent: exception types to dead-letter at once.
        immediate: in-process retries on the first delivery, before the first
            delayed one (they count as attempts; they hold the delivery).
        enabled: ``False`` switches the plugin off for a handler: its exceptions
            reach FastStream untouched.
    """

    max_attempts: int = 5
    backoff: Backoff = field(
        default_factory=lambda: Exponential(
            initial=timedelta(seconds=1), factor=2, maximum=timedelta(minutes=5)
        )
    )
    transient: ExcTypes = ()
    permanent: ExcTypes = ()
    immediate: int = 0
    enabled: bool = True

    def __post_init__(self) -> None:
        """Validate every option, naming it in the error."""
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise RetryConfigError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not isinstance(self.backoff, Backoff):
            raise RetryConfigError(
                "backoff takes Fixed(...), Exponential(...), Schedule(...) or an "
                f"object with delay_ms() and named_delays_ms(), got {self.backoff!r}"
            )
        object.__setattr__(self, "transient", _exc_types(self.transient, "transient"))
        object.__setattr__(self, "permanent", _exc_types(self.permanent, "permanent"))
        overlap = set(self.transient) & set(self.permanent)
        if overlap:
            names = ", ".join(sorted(t.__name__ for t in overlap))
            raise RetryConfigError(f"{names} listed as both transient and permanent")
        if (
            isinstance(self.immediate, bool)
            or not isinstance(self.immediate, int)
            or self.immediate < 0
        ):
            raise RetryConfigError(f"immediate must be an int >= 0, got {self.immediate!r}")
        if not isinstance(self.enabled, bool):
            raise RetryConfigError(f"enabled must be True or False, got {self.enabled!r}")


_OPTIONS = frozenset(f.name for f in dataclasses.fields(RetryPolicy))


@dataclass(frozen=True, slots=True)
class HandlerPolicy:
    """What ``@retry_policy`` wrote down: only the options the handler set.

    Unset options come from the middleware default; exception types are layered:
    the handler's lists are consulted before the default's.
    """

    options: Mapping[str, Any]

    def resolve(self, default: RetryPolicy) -> RetryPolicy:
        """Return the effective policy: the handler's options over ``default``."""
        scalars = {k: v for k, v in self.options.items() if k not in {"transient", "permanent"}}
        return dataclasses.replace(
            default,
            **scalars,
            transient=self.options.get("transient", ()),
            permanent=self.options.get("permanent", ()),
        )


F = TypeVar("F", bound=Callable[..., Any])


def retry_policy(**options: Any) -> Callable[[F], F]:  # noqa: ANN401 - validated below
    """Set a handler's retry policy; place it under ``@broker.subscriber``.

    Above or below ``@broker.publisher`` alike: FastStream's wrapper takes no
    attributes, so the policy of a wrapper is kept here, by identity.

    Takes the fields of ``RetryPolicy`` (``max_attempts``, ``backoff``, ``transient``,
    ``permanent``, ``immediate``, ``enabled``); what is not given comes from the
    middleware's default. Unknown or invalid options raise ``RetryConfigError`` here,
    at decoration time.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise RetryConfigError(
            f"@retry_policy got unknown option(s) {', '.join(unknown)}; "
            f"valid options: {', '.join(sorted(_OPTIONS))}"
        )
    # Validate now, against the stock defaults, so a bad value fails at import time.
    RetryPolicy(**options)
    handler_policy = HandlerPolicy(dict(options))

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise RetryConfigError(f"@retry_policy decorates a handler, got {fn!r}")
        try:
            setattr(fn, _POLICY_ATTR, handler_policy)
        except AttributeError:
            _HELD[id(fn)] = (fn, handler_policy)
        return fn

    return decorate


def get_handler_policy(fn: object) -> HandlerPolicy | None:
    """Return the policy ``@retry_policy`` attached to ``fn`` or to what it wraps, if any.

    Decorators FastStream applies around a handler keep the original in
    ``__wrapped__``; the chain is followed until the policy shows up.
    """
    seen: set[int] = set()
    while fn is not None and id(fn) not in seen:
        held = _HELD.get(id(fn))
        if held is not None:
            return held[1]
        policy = getattr(fn, _POLICY_ATTR, None)
        if isinstance(policy, HandlerPolicy):
            return policy
        seen.add(id(fn))
        fn = getattr(fn, "__wrapped__", None)
    return None


def effective_policy(handler: HandlerPolicy | None, default: RetryPolicy) -> RetryPolicy:
    """Return the policy a handler runs with: its own options over ``default``."""
    return handler.resolve(default) if handler is not None else default
