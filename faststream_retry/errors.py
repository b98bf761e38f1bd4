"""Exceptions: the handler's control exceptions and the plugin's own errors.

The bottom of the house, importable from every layer, and pure like ``core/`` (it is
mutation-tested with it). It stays at ``faststream_retry.errors`` rather than in
``core/`` because its path is on the wire: ``retry-exception`` names a class as
``<module>.<qualname>``, and dead letters and dashboards already say
``faststream_retry.errors.PermanentError``.
"""

from __future__ import annotations

import math
from datetime import timedelta

__all__ = [
    "CopyNotConfirmed",
    "FastStreamRetryError",
    "HeadersTooLarge",
    "InvalidDueTime",
    "PermanentError",
    "RetryConfigError",
    "RetryLater",
    "RetryTopologyError",
    "RetryWorkerError",
    "TransientError",
]

_LONGEST_S = timedelta.max.total_seconds()


def _shown(value: object) -> str:
    """Return ``repr(value)`` for an error message, or a stand-in if repr() raises."""
    try:
        return repr(value)
    except Exception:  # the error being reported must be raised, not repr()'s
        return f"an unprintable {type(value).__name__}"


class TransientError(Exception):
    """Raise from a handler to say: retry this message later, with backoff.

    Wins over every classification rule. Counts as an attempt.
    """


class PermanentError(Exception):
    """Raise from a handler to say: retrying cannot help, dead-letter now.

    Wins over every classification rule.
    """


class RetryLater(TransientError):  # noqa: N818 - reads as an instruction, like dramatiq's Retry
    """Raise from a handler to retry after an explicit delay.

    For example from an HTTP 429's ``Retry-After``. The delay is rounded up to the
    tick grid and bounded by the middleware's ``max_delay`` (a longer one is cut to it,
    with a WARNING once per handler). Counts as an attempt, so a handler that always
    asks for later still ends in the dead-letter queue.

    An invalid delay (negative, NaN, infinite, not a duration) raises
    ``RetryConfigError`` naming it, here in the handler: the message is then
    dead-lettered as ``permanent`` (a bug in the handler; retrying runs it again).

    Args:
        delay: how long to wait, as a ``timedelta`` or seconds.
        reason: an optional message, recorded like an exception message.
    """

    def __init__(self, delay: timedelta | float, reason: str = "") -> None:
        """Keep the delay; see the class docstring."""
        if isinstance(delay, bool) or not isinstance(delay, (timedelta, int, float)):
            raise RetryConfigError(
                f"RetryLater(delay=...) takes a timedelta or seconds, got {_shown(delay)}"
            )
        if isinstance(delay, timedelta):
            seconds = delay.total_seconds()
        elif isinstance(delay, int):  # one too large for a float outlasts any timedelta
            seconds = float(min(delay, _LONGEST_S))
        else:
            seconds = delay
        if not math.isfinite(seconds) or seconds < 0:
            raise RetryConfigError(
                f"RetryLater(delay=...) must be a finite duration >= 0, got {_shown(delay)}"
            )
        # Anything longer is cut to max_delay anyway; timedelta itself ends here.
        self.delay = timedelta.max if seconds >= _LONGEST_S else timedelta(seconds=seconds)
        super().__init__(reason or f"retry later, in {self.delay}")


class FastStreamRetryError(Exception):
    """The root of faststream-retry's own errors: catch it to catch any of them.

    Under it: ``RetryConfigError`` (an option; ``RetryTopologyError``, the broker),
    ``RetryWorkerError`` (the standalone worker's connection) and
    ``faststream_retry.ops.OperationError`` (the operator API). Not the control
    exceptions a handler raises to steer its own message (``TransientError``,
    ``PermanentError``, ``RetryLater``).
    """


class RetryConfigError(FastStreamRetryError, ValueError):
    """A retry option is missing, unknown or invalid; the message names it and the fix.

    ``option`` is the argument or option it is about, when it is about one (``"factor"``
    for ``Exponential(factor=0.5)``), and ``problem`` what is wrong with it, without its
    name (``"must be a number >= 1, got 0.5"``); otherwise ``option`` is ``None`` and
    ``problem`` is the whole message.

    Raised from a handler (``RetryLater`` with an invalid delay, say) it is a bug in
    the handler: classified permanent, like an explicit ``PermanentError``.
    """

    def __init__(self, message: str, *, option: str | None = None, problem: str = "") -> None:
        """Keep the message, and what it is about (see the class docstring)."""
        super().__init__(message)
        self.option = option
        self.problem = problem or message

    @classmethod
    def argument(cls, owner: str, option: str, problem: str) -> RetryConfigError:
        """Return the error of argument ``option`` of ``owner``: ``Owner(option=...) problem``."""
        return cls(f"{owner}({option}=...) {problem}", option=option, problem=problem)


class RetryTopologyError(RetryConfigError):
    """The live broker cannot host the plugin as configured (raised when it starts).

    Either the server is too old for the queue type, or queues or exchanges the plugin
    declares already exist with other arguments; the message names each one, the
    argument and how to migrate.
    """


class RetryWorkerError(FastStreamRetryError, ConnectionError):
    """The standalone worker has no connection to work on; the message says why.

    The broker cannot be reached or refused the login (said in one line, without the
    password), or the worker is not started yet or is stopping.
    """


class InvalidDueTime(PermanentError):  # noqa: N818 - its name is on the wire already
    """Recorded on a dead letter whose ``retry-due`` no legitimate delay can explain.

    The re-check consumer never raises it: it names the cause in ``retry-exception``
    (``faststream_retry.InvalidDueTime``) of a message dead-lettered with reason
    ``invalid``, because its due time lies beyond now + ``max_delay`` + one tick.
    """


class HeadersTooLarge(PermanentError):  # noqa: N818 - its name is on the wire
    """Recorded on a dead letter whose own headers leave no room for the plugin's.

    Nothing raises it: it names the cause in ``retry-exception``
    (``faststream_retry.HeadersTooLarge``) of a message dead-lettered with reason
    ``invalid`` because a copy of it with the retry headers would not fit in the frame
    RabbitMQ carries headers in (``frame_max``). Its largest headers of its own were
    left out to make room; ``retry-error`` names them.
    """


class CopyNotConfirmed(PermanentError):  # noqa: N818 - its name is on the wire
    """Recorded on a dead letter the plugin could not move anywhere else.

    Nothing raises it: it names the cause in ``retry-exception``
    (``faststream_retry.CopyNotConfirmed``) of a message dead-lettered with reason
    ``stuck``: its copy (a retry, a hop or a release) was not confirmed, try after try,
    until the delivery limit, or until ``max_delay`` past its due time. ``retry-error``
    says which copy and what RabbitMQ did with it.
    """


# The classes are reached as faststream_retry.InvalidDueTime, .HeadersTooLarge and
# .CopyNotConfirmed, and those are the names dead letters carry in retry-exception.
InvalidDueTime.__module__ = "faststream_retry"
HeadersTooLarge.__module__ = "faststream_retry"
CopyNotConfirmed.__module__ = "faststream_retry"
