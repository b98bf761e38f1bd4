"""The tick and the ladder of delay tiers (pure).

A delay tier is a queue whose queue-wide TTL is ``tick * 2**k``; messages in it all
expire after the same time, so RabbitMQ's head-first expiry never holds a short wait
behind a long one. A wait that is exactly one tier (on the tick grid) is that tier's
last: the message enters it addressed to its work queue and the broker delivers it
there when it expires. A longer wait goes through the largest tier that fits and comes
back to the re-check step, so a delay D costs at most about log2(D / tick) + 1 hops
instead of D / tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING

from faststream_retry.errors import RetryConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["MIN_TICK_MS", "Tiers", "Wait", "checked_tick_ms", "compute_tick_ms"]

MIN_TICK_MS = 100
"""The floor of the tick: below it the re-check loop would spin (jitter, odd factors)."""


def checked_tick_ms(explicit_ms: int) -> int:
    """Return a tick the user set, or raise ``RetryConfigError`` when it is below the floor."""
    if explicit_ms < MIN_TICK_MS:
        raise RetryConfigError(
            f"tick must be at least {MIN_TICK_MS} ms, got {explicit_ms} ms "
            "(a shorter tick turns the re-check loop into a busy loop)"
        )
    return explicit_ms


def compute_tick_ms(delays_ms: Iterable[int], explicit_ms: int | None = None) -> int:
    """Return the tick: ``explicit_ms``, or the GCD of ``delays_ms``, never below the floor.

    A GCD below the floor is raised to it; the delays that are then off the grid are
    rounded up to it when they are scheduled.
    """
    if explicit_ms is not None:
        return checked_tick_ms(explicit_ms)
    positive = [d for d in delays_ms if d > 0]
    if not positive:
        return 1000
    return max(MIN_TICK_MS, reduce(math.gcd, positive))


@dataclass(frozen=True, slots=True)
class Wait:
    """The tier a waiting message goes into next.

    ``last``: the tier's TTL covers the whole remaining wait, so the message is
    addressed to its work queue and the broker delivers it there on expiry.
    Otherwise it comes back to the re-check step when the TTL expires.
    """

    tier_ms: int
    last: bool


MAX_TTL_MS = 2**32 - 1
"""RabbitMQ's longest queue TTL (``x-message-ttl`` is a 32-bit unsigned count of ms): no
tier, and so no delay, can be longer (about 49.7 days)."""


@dataclass(frozen=True, slots=True)
class Tiers:
    """The tiers in use: ``tick * 2**k`` for every k with a TTL <= ``max_delay_ms``.

    ``max_delay_ms`` is rounded down to the tick grid so that no scheduled delay
    can exceed it.
    """

    tick_ms: int
    max_delay_ms: int
    ttls_ms: tuple[int, ...]

    @classmethod
    def build(cls, tick_ms: int, max_delay_ms: int) -> Tiers:
        """Build the ladder; ``max_delay_ms`` must be at least one tick."""
        if max_delay_ms < tick_ms:
            raise RetryConfigError(
                f"max_delay ({max_delay_ms} ms) must be at least one tick ({tick_ms} ms)"
            )
        max_delay_ms -= max_delay_ms % tick_ms
        ttls = []
        ttl = tick_ms
        while ttl <= max_delay_ms:
            ttls.append(ttl)
            ttl *= 2
        return cls(tick_ms, max_delay_ms, tuple(ttls))

    def round_delay(self, delay_ms: float) -> int:
        """Round a delay up to the tick grid, at least one tick, at most ``max_delay``."""
        if not delay_ms > 0:  # also NaN and -inf, which ceil() refuses
            return self.tick_ms
        ticks = math.ceil(min(delay_ms, self.max_delay_ms) / self.tick_ms)
        return max(1, ticks) * self.tick_ms

    def pick(self, remaining_ms: int) -> int:
        """Return the TTL of the largest tier that fits ``remaining_ms``.

        Below one tick the base tier is used: a message is never released early, so
        it waits out the rest of the tick.
        """
        best = self.ttls_ms[0]
        for ttl in self.ttls_ms:
            if ttl > remaining_ms:
                break
            best = ttl
        return best

    def wait(self, remaining_ms: int) -> Wait:
        """Return the tier for a message that must still wait ``remaining_ms``.

        The wait is rounded up to the tick grid first: the time a hop takes never
        costs an extra pass (29.98 s left after a hop is 30 s: 16 + 8 + 4 + 2, not
        16 + 8 + 4 + 1 + 1). A rounded wait that is a tier's TTL is the last tier;
        the message arrives no earlier than ``remaining_ms`` from now, never early.
        """
        rounded = -(-max(remaining_ms, 1) // self.tick_ms) * self.tick_ms
        if rounded in self.ttls_ms:
            return Wait(rounded, last=True)
        return Wait(self.pick(rounded), last=False)
