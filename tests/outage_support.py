"""Outage mode's tests on NATS and Redis share their dependency: down until told, every call
recorded, by message id (a str on NATS, an int on Redis)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Generic, TypeVar

from faststream_retry import EventKind, Fixed, RetryEvent, RetryPolicy

Key = TypeVar("Key", str, int)

N = 30
POLICY = RetryPolicy(max_attempts=4, backoff=Fixed(timedelta(milliseconds=200)))
"""Would dead-letter every message within a second of an outage without outage mode."""


class Dependency(Generic[Key]):
    """A database that is down until ``down = False``; every call is recorded."""

    def __init__(self) -> None:
        self.down = True
        self.calls_while_down: list[float] = []
        self.processed: Counter[Key] = Counter()
        self.attempts: dict[Key, int] = {}
        self.failed: Counter[Key] = Counter()
        self.events: list[RetryEvent] = []
        self.delivered: list[int] = []
        """How often the broker had delivered each message a call took (NATS)."""

    def call(self, key: Key, attempt: int) -> None:
        """One handler call on message ``key`` at ``attempt``: fails while the database is down."""
        if self.down:
            self.calls_while_down.append(time.monotonic())
            self.failed[key] += 1
            raise ConnectionError("database down")
        self.processed[key] += 1
        self.attempts[key] = attempt

    def kinds(self, kind: EventKind) -> list[RetryEvent]:
        return [e for e in self.events if e.kind is kind]

    def probes_since(self, switched: float) -> list[float]:
        """The calls made after the switch into outage mode (a call running then may land
        just after it)."""
        return [t for t in self.calls_while_down if t > switched + 0.05]
