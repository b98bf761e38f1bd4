"""The claimer: brings back entries a dead consumer left pending in its group.

FastStream's stream subscriber reads only new entries (``XREADGROUP >``), never a
pending list, not even its own after a restart: an entry whose consumer died while
handling it would stay pending for ever. The claimer takes entries idle for
``idle_ms`` (``XAUTOCLAIM``, which the user sets above the handler's timeout, so that
no entry whose handler still runs is taken) and settles each as a failed attempt
(``claimed_step``): a retry later, or a dead letter once the attempts are spent. The
count is the plugin's own ``retry-attempt`` header, not Redis' delivery count, as on
RabbitMQ it is not ``x-death``. A settlement that Redis refuses leaves the entry
pending under the claimer; it is claimed again ``idle_ms`` later.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason
from faststream_retry.redis.steps import StreamEntry
from faststream_retry.redis.tasks import stop_tasks

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from faststream_retry.core.policy import RetryPolicy
    from faststream_retry.redis.client import Client
    from faststream_retry.redis.keys import StreamKeys

__all__ = ["CONSUMER_LOST", "ClaimedStep", "Claimer", "claimed_step"]

logger = logging.getLogger("faststream_retry.redis")

CONSUMER_LOST = "faststream_retry.ConsumerLost"
"""``retry-exception`` of an attempt that ended with its consumer gone (nothing raises it)."""

_COUNT = 100
_PAGE = 1000


@dataclass(frozen=True, slots=True)
class ClaimedStep:
    """What a claimed entry becomes: a retry ``delay_ms`` later, or a dead letter."""

    headers: dict[str, Any]
    delay_ms: int
    dead_letter: bool
    error: str = ""
    """What the lost attempt's record says happened (its ``retry-error``)."""


def claimed_step(
    incoming: Mapping[str, Any] | None,
    *,
    stream: str,
    policy: RetryPolicy,
    idle_ms: int,
    now_ms: int,
    rand: Callable[[], float] = random.random,
) -> ClaimedStep:
    """Count a claimed entry's lost delivery as a failed attempt and decide its step (pure)."""
    attempt = h.read_attempt(incoming) + 1
    error = (
        f"its consumer held it {idle_ms} ms or more without acknowledging it: it stopped "
        "(killed, crashed or cut off) while handling it"
    )
    if attempt >= policy.max_attempts:
        failure = h.FailureRecord(
            attempt=attempt, at_ms=now_ms, exception=CONSUMER_LOST, error=error
        )
        headers = h.dead_letter_headers(
            incoming, failure, reason=Reason.EXHAUSTED, origin_queue=stream
        )
        return ClaimedStep(headers, 0, dead_letter=True, error=error)
    delay = policy.backoff.delay_ms(max(1, attempt - policy.immediate), rand)
    failure = h.FailureRecord(
        attempt=attempt, at_ms=now_ms, exception=CONSUMER_LOST, error=error, delay_ms=delay
    )
    headers = h.retry_headers(incoming, failure, now_ms + delay)
    return ClaimedStep(headers, delay, dead_letter=False, error=error)


class Claimer:
    """Keeps this replica's own pending entries alive, and claims other consumers' idle ones.

    FastStream reads a whole backlog at once (``XREADGROUP`` without ``COUNT``): an entry
    waits in the reader's memory, pending and growing idle, until its turn comes, which
    may take longer than any idle time. So the replica that holds it says so: every
    quarter of the idle time it ``XCLAIM``s its own consumers' pending entries to
    themselves (``JUSTID``: the delivery count is left alone), which resets their idle
    time; only a replica that stopped doing that (killed, frozen, cut off) has entries
    that grow idle enough to be claimed. An entry pending for its consumer since before
    this claimer was built (with the engine, before the app's subscribers start) is not
    this replica's (a previous process under the same name left it) and is left to grow
    idle. Each replica needs consumer names of its own: two live
    replicas under one name keep each other's entries alive. An entry this replica gave
    up (``abandon``: its step failed, Redis refused it) is no longer kept alive, so it
    grows idle and is claimed as a dead consumer's would be.

    Kept alive is only what the replica still holds, as its handlers say (``holding``):
    the entry a handler runs on, and those after the last one a handler started (a read's
    rest, waiting in memory), while handlers run or started within the last pass. An
    entry below that mark that no handler holds is one this replica will never hand to a
    handler again: a group read whose reply a cut connection dropped (redis-py sends the
    read again and gets the next entries: the first ones are pending here and were never
    seen), or a success whose ``XACK`` failed. Such an entry grows idle and is claimed;
    kept alive, it would wait for ever behind a live replica. When no handler ran for a
    whole pass, the reader holds nothing, and nothing is kept alive.
    """

    def __init__(
        self,
        client: Client,
        targets: Sequence[tuple[StreamKeys, str]],
        *,
        consumer: str,
        idle_ms: int,
        settle: Callable[[StreamEntry], Awaitable[None]],
        own: Sequence[tuple[StreamKeys, str, str]] = (),
        born: float | None = None,
    ) -> None:
        """Keep the settings; nothing runs until ``start()``.

        ``consumer`` is the name the claimed entries are pending under until settled;
        ``own`` the ``(keys, group, consumer)`` this replica's subscribers read as.
        ``born``: when this replica began (``time.monotonic()``), before its subscribers
        first read and after any earlier process under its consumer names last did;
        ``None``: now, the claimer built before the subscribers start.
        """
        self._client = client
        self._targets = tuple(targets)
        self._own = tuple(own)
        # An entry delivered since is this replica's own, and one delivered before is not.
        self._born = time.monotonic() if born is None else born
        self._consumer = consumer
        self._idle_ms = idle_ms
        self._settle = settle
        self._unsettled: set[str] = set()
        self._interval_s = min(5.0, max(0.1, idle_ms / 4000))
        self._fresh_ms = int(self._interval_s * 500)
        """Half a pass: a keep-alive pass leaves entries idle for less (``keep_alive_once``)."""
        self._alive: asyncio.Task[None] | None = None
        self._claiming: asyncio.Task[None] | None = None
        self._abandoned: dict[str, set[str]] = {}
        self._reading: dict[tuple[str, str], _Reading] = {}
        self._settling: dict[str, dict[str, int]] = {}
        """Per stream, entry id: its failure's steps in flight beside the handlers."""
        self.claimed = 0
        """Entries this claimer claimed (a test's count)."""
        self.kept = 0
        """Own entries kept alive, summed over the passes (a test's count)."""

    def start(self) -> None:
        """Keep own entries alive and claim others', each every quarter of the idle time.

        Two tasks, so that settling a large claim never delays the keep-alive.
        """
        if self._alive is not None or self._claiming is not None:
            return
        if self._own:
            self._alive = asyncio.create_task(self._keep_alive(), name="faststream-retry alive")
        if self._targets:
            self._claiming = asyncio.create_task(self._run(), name="faststream-retry claimer")

    async def stop_claiming(self) -> None:
        """Claim nothing more; own entries are still kept alive, for handlers still running."""
        claiming, self._claiming = self._claiming, None
        if claiming is not None:
            await stop_tasks([claiming])

    async def stop(self) -> None:
        """Stop both; an entry claimed and not yet settled is claimed again later."""
        alive, self._alive = self._alive, None
        await self.stop_claiming()
        if alive is not None:
            await stop_tasks([alive])

    @property
    def own(self) -> tuple[tuple[StreamKeys, str, str], ...]:
        """``(keys, group, consumer)`` per subscriber of this replica."""
        return self._own

    async def unstarted(self, keys: StreamKeys, group: str, consumer: str) -> list[str]:
        """Return ``consumer``'s pending entries this replica read and no handler started.

        Those delivered since this replica began, above the last entry a handler started
        and held by none: the rest of a read, at a stop once the handlers drained.
        """
        uptime_ms = (time.monotonic() - self._born) * 1000
        reading = self._reading.get((keys.stream, consumer), _Reading())
        settling = self._settling.get(keys.stream, {})
        start: bytes | str = "-"
        found: list[str] = []
        while True:
            rows: list[dict[str, Any]] = await self._client.xpending_range(
                keys.stream, group, min=start, max="+", count=_PAGE, consumername=consumer
            )
            for row in rows:
                entry_id = _str(row["message_id"])
                if (
                    row["time_since_delivered"] < uptime_ms
                    and entry_id not in reading.held
                    and entry_id not in settling
                    and (reading.last is None or _order(entry_id) > reading.last)
                ):
                    found.append(entry_id)
            if len(rows) < _PAGE:
                return found
            start = "(" + _str(rows[-1]["message_id"])

    def abandon(self, stream: str, entry_id: str) -> None:
        """Stop keeping ``entry_id`` of ``stream`` alive: it is left to grow idle and be claimed."""
        self._abandoned.setdefault(stream, set()).add(entry_id)

    def settling(self, stream: str, entry_id: str) -> contextlib.AbstractContextManager[None]:
        """Say that the step of ``entry_id``'s failure runs, its handler done: keep it alive.

        The step runs beside the handlers (``redis.settling``); until it acknowledges the
        entry, the entry is this replica's as a running handler's is.
        """
        return _Settling(self._settling.setdefault(stream, {}), entry_id)

    def holding(
        self, stream: str, consumer: str, entry_id: str
    ) -> contextlib.AbstractContextManager[None]:
        """Say that a handler of this replica runs on ``entry_id``, read by ``consumer``.

        The middleware wraps each handler's call, its failure's step included, in it.
        """
        reading = self._reading.get((stream, consumer))
        if reading is None:
            reading = self._reading[stream, consumer] = _Reading()
        return _Hold(reading, entry_id)

    async def keep_alive_once(
        self, keys: StreamKeys, group: str, consumer: str, seen: set[str] | None = None
    ) -> int:
        """Reset the idle time of ``consumer``'s entries delivered since this replica started.

        ``seen`` gets the ids of the entries pending for ``consumer`` that the pass
        listed: every one when an entry of the stream is abandoned, else those idle for
        half a pass or more.
        """
        uptime_ms = (time.monotonic() - self._born) * 1000
        abandoned = self._abandoned.get(keys.stream, set())
        holds = self._reading.setdefault((keys.stream, consumer), _Reading()).pass_()
        settling = self._settling.get(keys.stream, {})
        # Only entries idle for half a pass or more are listed and reset (XPENDING's
        # IDLE): one left now was delivered or reset less than half a pass ago, and the
        # next pass resets it, 1.5 passes after at most (3/8 of idle_ms). So a read
        # FastStream has just made (a whole backlog, idle for 0 ms) costs a pass nothing,
        # where it listed every entry (5 reply lines each) and rewrote it (an XCLAIM each,
        # written to the AOF). With an entry abandoned on the stream, all are listed:
        # ``seen`` must hold every pending one, or an abandoned entry still pending would
        # be forgotten, and kept alive again.
        min_idle = None if abandoned else self._fresh_ms
        start: bytes | str = "-"
        kept = 0
        while True:
            rows: list[dict[str, Any]] = await self._client.xpending_range(
                keys.stream,
                group,
                min=start,
                max="+",
                count=_PAGE,
                consumername=consumer,
                idle=min_idle,
            )
            pending = [(r, _str(r["message_id"])) for r in rows]
            if seen is not None:
                seen.update(entry_id for _, entry_id in pending)
            ids = [
                r["message_id"]
                for r, entry_id in pending
                if r["time_since_delivered"] < uptime_ms
                and entry_id not in abandoned
                and (holds(entry_id) or entry_id in settling)
            ]
            if ids:
                await self._client.xclaim(keys.stream, group, consumer, 0, ids, justid=True)
                kept += len(ids)
            if len(rows) < _PAGE:
                self.kept += kept
                return kept
            start = "(" + _str(rows[-1]["message_id"])

    async def _keep_alive(self) -> None:
        while True:
            seen: dict[str, set[str]] = {}
            complete = True
            for keys, group, consumer in self._own:
                ids = seen.setdefault(keys.stream, set())
                complete = await self._keep(keys, group, consumer, ids) and complete
            if complete:
                # An abandoned entry no longer pending here was claimed (or settled): forget it.
                for stream, abandoned in self._abandoned.items():
                    abandoned.intersection_update(seen.get(stream, ()))
            await asyncio.sleep(self._interval_s)

    async def _keep(self, keys: StreamKeys, group: str, consumer: str, seen: set[str]) -> bool:
        try:
            await self.keep_alive_once(keys, group, consumer, seen)
        except (RedisError, OSError) as exc:  # NOGROUP before the subscriber starts, too
            logger.debug("keeping %s/%s alive: %s", keys.stream, consumer, exc)
            return False
        return True

    async def claim_once(self, keys: StreamKeys, group: str) -> int:
        """Claim and settle every entry of ``group`` idle for ``idle_ms``; return how many."""
        start: bytes | str = "0-0"
        claimed = 0
        trimmed = 0
        while True:
            reply = await self._client.xautoclaim(
                keys.stream, group, self._consumer, self._idle_ms, start, count=_COUNT
            )
            start, entries = reply[0], reply[1]
            # Redis 7.0+: ids pending here but gone from the stream, which XAUTOCLAIM has
            # just dropped from the pending list, idle or not.
            trimmed += len(reply[2]) if len(reply) > 2 else 0
            for entry_id, fields in entries:
                if fields is None:  # deleted from the stream while pending (Redis 6.2)
                    continue
                claimed += 1
                entry = StreamEntry(keys.stream, group, _str(entry_id), fields)
                try:
                    await self._settle(entry)
                except (RedisError, OSError):
                    raise
                except Exception:
                    # One entry the plugin cannot settle (a bug its bytes find) must not
                    # stop the claimer, here or on the next replica that claims it: it
                    # stays pending, said once per entry, and the pass goes on.
                    if entry.id not in self._unsettled and len(self._unsettled) < 1000:
                        self._unsettled.add(entry.id)
                        logger.exception(
                            "could not settle entry %s of %s claimed from a lost consumer: "
                            "it stays pending under %s",
                            entry.id,
                            keys.stream,
                            self._consumer,
                        )
            if _str(start) == "0-0":
                self.claimed += claimed
                if trimmed:
                    logger.warning(
                        "%d entries of %s were pending in group %s but gone from the stream "
                        "(trimmed by MAXLEN or deleted): dropped from the pending list. A "
                        "handler still holding one settles it from its copy; any other is "
                        "lost. Keep a covered stream's MAXLEN above its backlog",
                        trimmed,
                        keys.stream,
                        group,
                    )
                return claimed

    async def _run(self) -> None:
        while True:
            for keys, group in self._targets:
                await self._claim(keys, group)
            await asyncio.sleep(self._interval_s)

    async def _claim(self, keys: StreamKeys, group: str) -> None:
        try:
            await self.claim_once(keys, group)
        except ResponseError as exc:
            # NOGROUP: the stream or its group is not there yet (the subscriber creates
            # them when it starts), or an operator deleted it.
            logger.debug("claiming in %s/%s: %s", keys.stream, group, exc)
        except (RedisError, OSError) as exc:
            logger.warning("claiming in %s/%s failed: %s", keys.stream, group, exc)
        except Exception:  # the task must outlive any one pass: it is every replica's claimer
            logger.exception("claiming in %s/%s failed", keys.stream, group)


def _order(entry_id: str) -> tuple[int, int]:
    """A stream entry id's place: ``"1700000000000-3"`` is ``(1700000000000, 3)``."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False, slots=True)
class _Reading:
    """What one consumer's handlers in this replica hold (``Claimer.holding``)."""

    held: dict[str, int] = field(default_factory=dict)
    """Entry id: handlers running on it now."""
    last: tuple[int, int] | None = None
    """The highest entry id a handler started on."""
    starts: int = 0
    starts_at_pass: int = -1
    """``starts`` at the previous keep-alive pass (-1: none yet)."""

    def started(self, entry_id: str) -> None:
        self.held[entry_id] = self.held.get(entry_id, 0) + 1
        self.starts += 1
        order = _order(entry_id)
        if self.last is None or order > self.last:
            self.last = order

    def pass_(self) -> Callable[[str], bool]:
        """Return whether the replica still holds an entry, as of this pass."""
        quiet = not self.held and self.starts == self.starts_at_pass
        self.starts_at_pass = self.starts
        held, last = set(self.held), self.last
        if quiet:
            return held.__contains__  # empty: no handler ran for a whole pass
        return lambda entry_id: entry_id in held or last is None or _order(entry_id) >= last


class _Hold:
    """One handler's hold on an entry (``Claimer.holding``), from its start to its end.

    A class rather than a generator's context manager: one is built for every message.
    """

    __slots__ = ("_entry_id", "_reading")

    def __init__(self, reading: _Reading, entry_id: str) -> None:
        self._reading = reading
        self._entry_id = entry_id

    def __enter__(self) -> None:
        self._reading.started(self._entry_id)

    def __exit__(self, *exc: object) -> None:
        _release(self._reading.held, self._entry_id)


class _Settling:
    """One step's hold on an entry (``Claimer.settling``), from its hand-over to its answer."""

    __slots__ = ("_entry_id", "_held")

    def __init__(self, held: dict[str, int], entry_id: str) -> None:
        self._held = held
        self._entry_id = entry_id

    def __enter__(self) -> None:
        self._held[self._entry_id] = self._held.get(self._entry_id, 0) + 1

    def __exit__(self, *exc: object) -> None:
        _release(self._held, self._entry_id)


def _release(held: dict[str, int], entry_id: str) -> None:
    """Drop one hold of ``entry_id`` from ``held``: the entry leaves it with its last."""
    left = held[entry_id] - 1
    if left:
        held[entry_id] = left
    else:
        del held[entry_id]


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
