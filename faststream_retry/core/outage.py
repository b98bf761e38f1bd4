"""Outage mode: one work queue's streak of transient failures, and when to probe (pure).

When a handler's dependency is down, every message of its queue fails transiently and
spends an attempt per delay: a ten-minute outage can burn every message's attempts into
the DLQ. After ``after`` consecutive transient failures on one work queue, the queue is
in *outage mode*: the middleware holds its new messages (unacked, in the subscriber's
prefetch) and lets one through per probe interval as a *probe*. The first success ends
the mode and every held message goes on at full speed.

What counts:

- a handler call that fails with a **transient** verdict adds one, whatever the decision
  (retry later, retry now, dead-letter as exhausted): the dependency failed again;
- a **success** resets the count to 0 and ends the mode;
- a **permanent** failure leaves the count as it is: a bad payload says nothing about
  the dependency.

One probe at a time: the next one is due ``probe_ms`` after the previous one finished
(or after the mode began), so a handler that hangs against a dead dependency is never
called by two probes at once. This module is the state machine and keeps no clock:
callers pass the time in. ``faststream_retry.outages`` holds the messages and carries its
decisions out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from faststream_retry.core.events import Verdict
from faststream_retry.core.policy import to_ms
from faststream_retry.errors import RetryConfigError

if TYPE_CHECKING:
    from datetime import timedelta

__all__ = ["MIN_PROBE_MS", "Entered", "Left", "Outage", "OutageOptions"]

MIN_PROBE_MS = 100
"""The shortest probe interval: the tick's floor, so outage mode is never a hot loop."""


@dataclass(frozen=True, slots=True)
class OutageOptions:
    """The middleware's outage options, checked (durations in ms)."""

    after: int
    """Consecutive transient failures on one work queue that switch it into outage mode."""
    probe_ms: int | None
    """The probe interval; ``None``: the tick."""
    hold_ms: int
    """How long a message may wait at the gate before it is requeued."""

    @classmethod
    def build(
        cls,
        after: int | None,
        probe: timedelta | float | None,
        hold: timedelta | float,
    ) -> OutageOptions | None:
        """Check the options (see ``RetryMiddleware``); ``None``: outage mode is off."""
        if after is not None and (isinstance(after, bool) or not isinstance(after, int)):
            raise RetryConfigError(
                f"outage_after takes an int (consecutive transient failures, 20 say) or None "
                f"(outage mode off), got {after!r}"
            )
        if after is not None and after < 1:
            raise RetryConfigError(
                f"outage_after must be >= 1 (20 is a good start), or None to switch outage "
                f"mode off; got {after!r}"
            )
        probe_ms = None if probe is None else to_ms(probe, "outage_probe")
        hold_ms = to_ms(hold, "outage_hold")
        if after is None:
            if probe_ms is not None:
                raise RetryConfigError(
                    "outage_probe is set but outage_after is None, so outage mode is off: "
                    "pass outage_after (20, say) to switch it on, or drop outage_probe"
                )
            return None
        if probe_ms is not None and probe_ms < MIN_PROBE_MS:
            raise RetryConfigError(
                f"outage_probe must be at least {MIN_PROBE_MS} ms (or None: one probe per "
                f"tick), got {probe_ms} ms"
            )
        if hold_ms < 1:
            raise RetryConfigError(
                "outage_hold must be longer than 0: a held message is requeued after it "
                "(keep it below RabbitMQ's consumer_timeout, 30 min by default)"
            )
        if probe_ms is not None and probe_ms > hold_ms:
            raise RetryConfigError(
                f"outage_probe ({probe_ms} ms) must not exceed outage_hold ({hold_ms} ms): "
                "every held message would be requeued before each probe. Shorten "
                "outage_probe or lengthen outage_hold"
            )
        return cls(after=after, probe_ms=probe_ms, hold_ms=hold_ms)


@dataclass(frozen=True, slots=True)
class Entered:
    """The queue went into outage mode."""

    failures: int
    """The consecutive transient failures that switched it."""


@dataclass(frozen=True, slots=True)
class Left:
    """The queue left outage mode: a handler call succeeded."""

    duration_ms: int
    probes: int
    """Messages let through as probes while it lasted."""
    failures: int
    """Transient failures while it lasted (probes, and calls already running at its start)."""


class Outage:
    """One work queue's streak of transient failures, its mode and its probe slot."""

    __slots__ = (
        "_failures",
        "_next_probe_ms",
        "_probes",
        "_probing",
        "_since_ms",
        "after",
        "probe_ms",
        "streak",
    )

    def __init__(self, after: int, probe_ms: int) -> None:
        """Start in normal mode; ``after`` failures switch it, probes come ``probe_ms`` apart."""
        self.after = after
        self.probe_ms = probe_ms
        self.streak = 0
        """Consecutive transient failures (since the last success)."""
        self._since_ms: int | None = None
        self._probes = 0
        self._probing = False
        # Read only in outage mode; entering it sets them.
        self._failures: int
        self._next_probe_ms: int

    @property
    def active(self) -> bool:
        """Return whether the queue is in outage mode."""
        return self._since_ms is not None

    @property
    def probing(self) -> bool:
        """Return whether a probe is running."""
        return self._probing

    @property
    def probes(self) -> int:
        """Return how many probes the current outage let through (0 outside one)."""
        return self._probes

    def failed(self, verdict: Verdict, now_ms: int) -> Entered | None:
        """Count a failed handler call; ``Entered`` when it switches the queue into outage mode."""
        if verdict is not Verdict.TRANSIENT:
            return None  # a bad payload says nothing about the dependency
        self.streak += 1
        if self._since_ms is not None:
            self._failures += 1
            return None
        if self.streak < self.after:
            return None
        self._since_ms = now_ms
        self._probes = self._failures = 0
        self._probing = False
        self._next_probe_ms = now_ms + self.probe_ms
        return Entered(self.streak)

    def succeeded(self, now_ms: int) -> Left | None:
        """Count a successful handler call; ``Left`` when it ends outage mode."""
        self.streak = 0
        return self._end(now_ms)

    def stopped(self, now_ms: int) -> Left | None:
        """End outage mode without a success (the consumer stops); ``None`` if not in it.

        The streak stays: the dependency has not been seen to work.
        """
        return self._end(now_ms)

    def _end(self, now_ms: int) -> Left | None:
        since = self._since_ms
        if since is None:
            return None
        left = Left(max(now_ms - since, 0), self._probes, self._failures)
        self._since_ms = None
        self._probing = False
        self._probes = self._failures = 0
        return left

    def take_probe(self, now_ms: int) -> bool:
        """Take the probe slot if it is free and due; ``True``: the caller is the probe."""
        if self._since_ms is None or self._probing or now_ms < self._next_probe_ms:
            return False
        self._probing = True
        self._probes += 1
        return True

    def probe_done(self, now_ms: int) -> None:
        """The probe finished, whatever its outcome: the next one is due a probe interval on."""
        if not self._probing:
            return
        self._probing = False
        self._next_probe_ms = now_ms + self.probe_ms

    def until_probe_ms(self, now_ms: int) -> int | None:
        """Return how long until the probe slot is due; ``None``: no probe to wait for.

        ``None`` outside outage mode and while a probe runs (its end sets the next one).
        """
        if self._since_ms is None or self._probing:
            return None
        return max(self._next_probe_ms - now_ms, 0)
