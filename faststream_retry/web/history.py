"""The last hour of each queue's depths, sampled by the page's server while it runs.

Kept in memory (a page restarted starts a new hour) and drawn as small inline SVG
charts: numbers only go into them, so no text of a message or a queue can become markup.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["History", "sparkline"]

WINDOW_S = 3600.0
EVERY_S = 15.0
"""How often the server samples while it runs (and on each overview it serves)."""
GAP_S = 5.0
"""The least time between two samples, however often the status is asked for."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One queue's depths at one moment."""

    at: float
    retry: int
    dlq: int


class History:
    """Each queue's samples over the last ``WINDOW_S`` seconds."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        """Keep ``window_s`` seconds of samples."""
        self.window_s = window_s
        self._samples: dict[str, deque[Sample]] = {}
        self._last: float | None = None

    def record(self, status: dict[str, Any], now: float | None = None) -> None:
        """Add a sample per queue of ``status`` (``Status.to_json()``'s shape).

        At most one every ``GAP_S``: the overview's script and every API client ask for
        the status as often as they like, and each answer is not a sample. A queue no
        longer in the status loses its samples.
        """
        at = time.time() if now is None else now
        if self._last is not None and self._last <= at < self._last + GAP_S:
            return
        self._last = at
        seen: set[str] = set()
        for row in status.get("queues", []):
            queue = row.get("queue")
            if not isinstance(queue, str):
                continue
            seen.add(queue)
            kept = self._samples.setdefault(queue, deque())
            kept.append(Sample(at, _count(row.get("retry")), _count(row.get("dlq"))))
            while kept and kept[0].at < at - self.window_s:
                kept.popleft()
        for gone in set(self._samples) - seen:
            del self._samples[gone]

    def of(self, queue: str) -> list[Sample]:
        """Return the samples of ``queue``, oldest first."""
        return list(self._samples.get(queue, ()))


def _count(depth: Any) -> int:  # noqa: ANN401 - a Depth's JSON
    if isinstance(depth, dict) and isinstance(depth.get("messages"), int):
        return int(depth["messages"])
    return 0


def sparkline(samples: list[Sample], field: str, width: int = 120, height: int = 24) -> str:
    """Return an inline SVG of ``field`` (``retry`` or ``dlq``) over the samples' hour."""
    if not samples:
        return ""
    if len(samples) == 1:  # the first sample: a flat line until the next one
        samples = [samples[0], Sample(samples[0].at + 1, samples[0].retry, samples[0].dlq)]
    values = [int(getattr(s, field)) for s in samples]
    start, end = samples[0].at, samples[-1].at
    span = max(end - start, 1e-9)
    top = max(*values, 1)
    points = " ".join(
        f"{(s.at - start) / span * (width - 2) + 1:.1f},{height - 1 - v / top * (height - 2):.1f}"
        for s, v in zip(samples, values, strict=True)
    )
    css = "spark " + ("dead" if field == "dlq" else "waiting")
    return (
        f'<svg class="{css}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{field}: {values[-1]} now, at most {max(values)} in the hour">'
        f'<polyline fill="none" stroke-width="1.5" points="{points}"/></svg>'
    )
