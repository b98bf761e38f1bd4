"""The re-check loop's order of release (``nats.recheck``), on fake copies and no server."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import nats.errors

from faststream_retry.nats.recheck import Recheck

TIER_MS = 300


class _Copy:
    """What the loop reads of a fetched copy: when the server stored it."""

    def __init__(self, name: str, stored_s: float) -> None:
        self.name = name
        stamp = datetime.fromtimestamp(stored_s, tz=timezone.utc)
        self.metadata = SimpleNamespace(timestamp=stamp)

    async def in_progress(self) -> None:
        pass

    async def nak(self, delay: float | None = None) -> None:
        pass


class _Sub:
    """Fetches one batch, then the connection is closed (the loop ends)."""

    def __init__(self, batch: list[_Copy]) -> None:
        self._batches = [batch]

    async def fetch(self, batch: int, timeout: float) -> list[_Copy]:
        if self._batches:
            return self._batches.pop(0)
        raise nats.errors.ConnectionClosedError


async def test_a_copy_redelivered_among_newer_ones_is_carried_once_and_none_is_skipped() -> None:
    """A fetch in which a due copy (redelivered, stored earlier) follows one not yet due:
    every due copy goes at once, the one not due when its time comes, each exactly once."""
    now = time.time()
    due, later, redelivered = (
        _Copy("due", now - 1),
        _Copy("later", now),
        _Copy("redelivered", now - 1),
    )
    plan: Any = SimpleNamespace(options=SimpleNamespace(prefix="p"))
    nothing: Any = None  # the loop publishes nothing: its steps are recorded instead
    recheck = Recheck(nothing, nothing, nothing, lambda: plan, TIER_MS, pause_s=0.1)
    carried: list[tuple[str, float]] = []

    async def step(msg: Any) -> None:
        carried.append((msg.name, time.time()))

    recheck._step = step  # type: ignore[method-assign]
    recheck._sub = _Sub([due, later, redelivered])
    await asyncio.wait_for(recheck._loop(), 5)

    assert sorted(name for name, _ in carried) == ["due", "later", "redelivered"]
    at = dict(carried)
    assert at["redelivered"] - now < TIER_MS / 1000 / 2  # not held behind "later"
    assert at["later"] >= now + TIER_MS / 1000 - 0.01
