"""The Redis transport's engine: what RetryMiddleware calls on a ``RedisBroker``.

One ``RedisRetryEngine`` per app (per broker): it knows the covered streams, each with
the one consumer group that reads it, and runs a mover and a claimer beside the app.

- ``await engine.check()`` checks the server (``checks``); ``await engine.start()`` checks
  it unless that was done, then starts the mover (due copies back to their streams) and,
  when ``claim_idle_ms`` is set, the claimer (dead consumers' entries, and the keep-alive
  of this replica's own: ``own_consumers``, whose names must be this replica's alone, the
  engine built before the subscribers start reading). At a stop, ``await
  engine.stop_claiming()`` first (the claimer takes nothing more, the mover stops), then,
  once the app's handlers drained, ``await engine.release()`` (this replica's entries
  read and never handed to a handler are delivered afresh, no attempt spent) and ``await
  engine.stop()`` (the keep-alive last: a handler still draining is never claimed).
- ``await engine.retry_later(entry, delay_ms=..., headers=...)`` settles a failed
  delivery: it acknowledges the entry and schedules its copy with ``headers``
  (``core.headers.retry_headers(...)``) ``delay_ms`` from the server's now, in one
  script. It returns the due time, or ``None`` when another consumer had settled the
  entry: then nothing was scheduled. An entry trimmed from the stream (``MAXLEN``,
  ``XDEL``) while its handler held it is scheduled from the handler's copy, with a
  warning; a step run again after its reply was lost finds its copy and returns its due.
- ``await engine.dead_letter(entry, headers=...)`` acknowledges it and adds it to
  ``P.dlq`` with ``headers`` (``core.headers.dead_letter_headers(...)``), capped near
  ``dlq_maxlen``; ``False`` when another consumer had settled it. A letter whose headers
  the format cannot hold is made lean (``steps.fitted``), never refused.
- ``await engine.dead_letter_invalid(entry, exc)``: an entry whose copy could not be
  built at all (``exc``, raised building it) is dead-lettered as ``invalid`` with a
  minimal letter (``steps.invalid_letter``: its raw bytes, the retry state), which
  cannot fail.
- ``with engine.holding(stream, consumer, entry_id):`` wraps each handler's call (its
  failure's step included): the claimer keeps alive only what this replica's handlers
  hold, and the rest of a read still waiting for them (``claimer.Claimer``).
- ``await engine.ack_handled(stream, entry_id)``: a handled entry's ``XACK``, queued and
  sent in batches beside the handlers (``acks``), kept alive until answered, awaited at
  the stop with the failures' steps.
- ``engine.abandon(entry)``: a delivery whose step Redis refused (down, read-only) is left
  pending for the claimer, which no longer keeps it alive here: claimed ``claim_idle_ms``
  later by any replica, and counted as a lost attempt.
- ``StreamEntry.incoming_headers()`` gives the entry's headers as the core reads them
  (its ``retry-history`` a list again).

The engine imports no FastStream: the caller builds a ``StreamEntry`` from FastStream's
message (``StreamEntry.from_raw(msg.raw_message, group)``). The pure core decides; this
only carries out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason, RetryEvent, Rule, Verdict
from faststream_retry.core.policy import RetryPolicy
from faststream_retry.errors import RetryConfigError
from faststream_retry.redis import steps
from faststream_retry.redis.acks import Acks
from faststream_retry.redis.checks import Server, check_server
from faststream_retry.redis.claimer import CONSUMER_LOST, ClaimedStep, Claimer, claimed_step
from faststream_retry.redis.envelope import EnvelopeTooLarge
from faststream_retry.redis.keys import StreamKeys, stream_keys
from faststream_retry.redis.lua import ALREADY_WRITTEN, FROM_MEMORY, SETTLED_ELSEWHERE, Scripts
from faststream_retry.redis.mover import Mover
from faststream_retry.redis.settling import Settlements, bound_for
from faststream_retry.reporting.log import Throttle

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from faststream_retry.redis.client import Client
    from faststream_retry.redis.steps import StreamEntry
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["RedisRetryEngine"]

logger = logging.getLogger("faststream_retry.redis")
# A producer's MAXLEN below its backlog trims every held entry: one line per stream and
# minute says so, with how many more, not one per failure.
_TRIMMED = Throttle(60.0, logger=logger)

DEFAULT_DLQ_MAXLEN = 100_000
_NODE = 100
"""Redis' default ``stream-node-max-entries``, when ``CONFIG`` does not say."""


class RedisRetryEngine:
    """Retries and dead letters held by Redis for the covered streams; see the module docstring.

    Args:
        client: a redis-py asyncio client (``decode_responses=False``), the app's own or
            one for the engine alone.
        streams: ``(stream, group)`` per covered stream subscriber.
        consumer: the consumer name claimed entries wait under while being settled.
        own_consumers: ``(stream, consumer)`` per covered subscriber of this replica: its
            pending entries are kept from growing idle while it lives (``claimer``). Each
            replica needs names of its own, and its engine built before its subscribers
            start reading, or ``born`` given.
        born: when this replica began (``time.monotonic()``; ``claimer.Claimer``):
            ``None``, now.
        claim_idle_ms: claim entries pending this long (above the handler's timeout);
            ``None``: no claimer.
        policy: the policy a claimed entry is counted against (``max_attempts``,
            ``backoff``); ``policies`` overrides it per stream.
        dlq_maxlen: each dead-letter stream's approximate cap (0: none).
        reporter: the app's (its hooks, metrics and log): a dead letter the claimer
            settles is reported through it, as the sink's are; ``None``: only logged.
        batch, cap_s, tick_ms: the mover's (``mover.Mover``).
        settle_bound: failures' steps in flight beside their handlers at most
            (``redis.settling``); ``None``: ``settling.bound_for(client)``.
        settle_wait_s: how long a stop waits for those steps (a Redis that stopped
            answering must not hold it for ever); one still running is left pending.
    """

    def __init__(
        self,
        client: Client,
        streams: Sequence[tuple[str, str]],
        *,
        consumer: str = "faststream-retry",
        own_consumers: Sequence[tuple[str, str]] = (),
        claim_idle_ms: int | None = None,
        policy: RetryPolicy | None = None,
        policies: Mapping[str, RetryPolicy] | None = None,
        dlq_maxlen: int = DEFAULT_DLQ_MAXLEN,
        batch: int = 100,
        cap_s: float = 5.0,
        tick_ms: int = 0,
        born: float | None = None,
        reporter: Reporter | None = None,
        settle_bound: int | None = None,
        settle_wait_s: float = 61.0,
    ) -> None:
        """Name every key (refusing a stream no hash tag can follow); nothing is sent yet."""
        groups: dict[str, str] = {}
        for stream, group in streams:
            if groups.setdefault(stream, group) != group:
                raise RetryConfigError(
                    f"stream {stream!r} is covered for groups {groups[stream]!r} and {group!r}: "
                    "a retry's copy goes back into the stream, where both would read it; give "
                    "each group a stream of its own"
                )
        if claim_idle_ms is not None and claim_idle_ms < 1:
            raise RetryConfigError(f"claim_idle_ms must be >= 1 ms, got {claim_idle_ms!r}")
        self._client = client
        self._keys: dict[str, StreamKeys] = {s: stream_keys(s) for s in groups}
        self._groups = groups
        self._scripts = Scripts(client)
        self._policy = policy or RetryPolicy()
        self._policies = dict(policies or {})
        self._dlq_maxlen = dlq_maxlen
        self._uncapped: set[str] = set()
        """Streams whose ``.dlq`` held more than the cap at start: not trimmed (``check``)."""
        self._claim_idle_ms = claim_idle_ms
        self._reporter = reporter
        self.mover = Mover(
            client,
            self._scripts,
            [(self._keys[s], g) for s, g in groups.items()],
            batch=batch,
            cap_s=cap_s,
            tick_ms=tick_ms,
        )
        self.claimer: Claimer | None = None
        if claim_idle_ms is not None:
            self.claimer = Claimer(
                client,
                [(self._keys[s], g) for s, g in groups.items()],
                consumer=consumer,
                idle_ms=claim_idle_ms,
                settle=self._settle_claimed,
                own=[(self._keys[s], groups[s], c) for s, c in own_consumers],
                born=born,
            )
        self.settlements = Settlements(bound_for(client) if settle_bound is None else settle_bound)
        """The failures' steps running beside their handlers (``redis.settling``)."""
        self.acks = Acks(client, retry_s=settle_wait_s)
        """The handled entries waiting for their ``XACK`` (``redis.acks``)."""
        self._settle_wait_s = settle_wait_s
        self.server: Server | None = None

    async def _drain(self) -> None:
        """Wait for the failures' steps and the handled entries' ``XACK``s; say what runs on.

        Both within the stop's bound, together: a Redis that answers neither must not hold
        the stop for the bound twice over.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settle_wait_s
        left = await self.settlements.drain(self._settle_wait_s)
        unacked = await self.acks.drain(max(0.0, deadline - loop.time()))
        if left or unacked:
            logger.warning(
                "%d failure step(s) and %d handled entries' XACK still unanswered by Redis "
                "after %.0f s at the stop: their entries stay pending, claimed once idle for "
                "claim_idle and counted as lost attempts",
                left,
                unacked,
                self._settle_wait_s,
            )

    def keys(self, stream: str) -> StreamKeys:
        """Return the keys of covered ``stream``."""
        try:
            return self._keys[stream]
        except KeyError:
            raise RetryConfigError(f"stream {stream!r} is not covered by this engine") from None

    def covers(self, stream: str) -> bool:
        """Whether ``stream`` is one of this engine's."""
        return stream in self._groups

    def group(self, stream: str) -> str:
        """Return the consumer group that reads covered ``stream``."""
        self.keys(stream)
        return self._groups[stream]

    async def check(self) -> Server:
        """Check the server; raise ``RetryTopologyError`` naming every problem.

        A ``.dlq`` that already holds more dead letters than the cap (an upgrade from no
        cap, a lowered ``dlq_max_length``) is not capped in this run: its next letter's
        ``MAXLEN`` would trim every letter over the cap at once, and a start must never
        delete dead letters. A warning says so; the cap applies from the next start that
        finds it below.
        """
        self.server = await check_server(self._client, list(self._keys))
        await self._hold_caps()
        return self.server

    async def _hold_caps(self) -> None:
        self._uncapped.clear()
        if not self._dlq_maxlen:
            return
        try:
            config = await self._client.config_get("stream-node-max-entries")
            node = int(config.get("stream-node-max-entries") or _NODE)
        except (RedisError, ValueError):  # CONFIG renamed or denied (a managed service)
            node = _NODE
        for stream, keys in self._keys.items():
            held = int(await self._client.xlen(keys.dlq))
            # MAXLEN ~ trims whole nodes: a capped .dlq runs over by less than one.
            if held >= self._dlq_maxlen + node:
                self._uncapped.add(stream)
                logger.warning(
                    "faststream-retry: %s holds %d dead letters, more than its cap "
                    "dlq_max_length=%d, so the cap is not applied: a start never deletes "
                    "dead letters. Export or replay them (faststream-retry dlq export/replay "
                    "%s), or raise dlq_max_length; the cap applies at the next start below it",
                    keys.dlq,
                    held,
                    self._dlq_maxlen,
                    stream,
                )

    def _maxlen(self, stream: str) -> int:
        """The ``MAXLEN`` of ``stream``'s next dead letter (0: none)."""
        return 0 if stream in self._uncapped else self._dlq_maxlen

    async def start(self) -> None:
        """Check the server unless ``check()`` did, then start moving (and claiming)."""
        if self.server is None:
            await self.check()
        self.mover.start()
        if self.claimer is not None:
            self.claimer.start()

    async def stop_claiming(self) -> None:
        """Claim nothing more and stop the mover; this replica's entries are still kept alive."""
        if self.claimer is not None:
            await self.claimer.stop_claiming()
        await self.mover.stop()

    async def release(self) -> int:
        """Deliver afresh this replica's pending entries no handler started; return how many.

        Called once the app's handlers drained, at a graceful stop: the rest of a read
        (FastStream reads a whole backlog at once) is added again unchanged and
        acknowledged, one script per entry (``lua.RELEASE``), so no attempt is spent on
        it; left pending, each would be claimed ``claim_idle`` later as a lost attempt.
        """
        await self._drain()  # a step in flight settles its entry: not released
        claimer = self.claimer
        if claimer is None:
            return 0
        counted = [0]
        try:
            # Bounded as the drain is: a Redis that stopped answering must not hold the
            # stop (redis-py waits for an answer as long as its socket timeout, none unset).
            await asyncio.wait_for(self._release(claimer, counted), self._settle_wait_s)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            logger.warning(
                "the entries read and never handed to a handler were not all released within "
                "%.0f s at the stop (%d were): the rest are claimed once idle for claim_idle, "
                "each as a lost attempt",
                self._settle_wait_s,
                counted[0],
            )
        if counted[0]:
            logger.info(
                "released %d entries read and never handed to a handler: delivered again",
                counted[0],
            )
        return counted[0]

    async def _release(self, claimer: Claimer, counted: list[int]) -> None:
        """Release each unstarted entry of this replica's consumers, counting into ``counted``."""
        for keys, group, consumer in claimer.own:
            for entry_id in await claimer.unstarted(keys, group, consumer):
                done = await self._scripts.release(
                    keys=[keys.stream], args=[group, consumer, entry_id]
                )
                counted[0] += int(done)

    async def stop(self) -> None:
        """Stop the mover and the claimer; waiting copies stay in Redis for the next start.

        The failures' steps still in flight are awaited first: each acknowledges its entry.
        """
        await self._drain()
        await self.acks.close()
        await self.stop_claiming()
        if self.claimer is not None:
            await self.claimer.stop()

    async def retry_later(
        self, entry: StreamEntry, *, delay_ms: int, headers: Mapping[str, Any]
    ) -> int | None:
        """Acknowledge ``entry`` and schedule its copy; see the module docstring."""
        outcome, due = await steps.retry_later(
            self._scripts, self.keys(entry.stream), entry, delay_ms=delay_ms, headers=headers
        )
        _say(outcome, entry, "its copy was scheduled")
        return None if outcome == SETTLED_ELSEWHERE else due

    async def dead_letter(self, entry: StreamEntry, *, headers: Mapping[str, Any]) -> bool:
        """Acknowledge ``entry`` and dead-letter it; see the module docstring."""
        outcome = await steps.dead_letter(
            self._scripts,
            self.keys(entry.stream),
            entry,
            headers=headers,
            maxlen=self._maxlen(entry.stream),
        )
        _say(outcome, entry, "its dead letter was added")
        return outcome != SETTLED_ELSEWHERE

    async def dead_letter_invalid(self, entry: StreamEntry, exc: BaseException) -> bool:
        """Dead-letter ``entry`` as ``invalid`` with a letter that cannot fail to build."""
        headers = steps.invalid_headers(entry, exc, now_ms=h.now_ms())
        return await self._place_invalid(entry, headers)

    async def _place_invalid(self, entry: StreamEntry, headers: Mapping[str, Any]) -> bool:
        letter = steps.invalid_letter(entry, headers)
        outcome = await steps.place_letter(
            self._scripts, self.keys(entry.stream), entry, letter, maxlen=self._maxlen(entry.stream)
        )
        _say(outcome, entry, "its dead letter was added")
        return outcome != SETTLED_ELSEWHERE

    def holding(
        self, stream: str, consumer: str, entry_id: str
    ) -> contextlib.AbstractContextManager[None]:
        """Wrap a handler's call on ``entry_id``: what this replica holds is kept alive.

        Only that (``claimer.Claimer.holding``): an entry read and never handed to a
        handler, or handled and not acknowledged, is left to be claimed. No claimer: a
        no-op.
        """
        if self.claimer is None:
            return contextlib.nullcontext()
        return self.claimer.holding(stream, consumer, entry_id)

    def settling(self, entry: StreamEntry) -> contextlib.AbstractContextManager[None]:
        """Wrap the step of ``entry``'s failure run beside its handler: kept alive meanwhile."""
        if self.claimer is None:
            return contextlib.nullcontext()
        return self.claimer.settling(entry.stream, entry.id)

    async def ack_handled(self, stream: str, entry_id: str) -> None:
        """Acknowledge ``entry_id`` of covered ``stream``, its handler done, beside the handlers.

        Returns once it is queued (``redis.acks``); kept alive until its ``XACK`` answers.
        """
        hold = (
            contextlib.nullcontext()
            if self.claimer is None
            else self.claimer.settling(stream, entry_id)
        )
        await self.acks.add(stream, self._groups[stream], entry_id, hold)

    def abandon(self, entry: StreamEntry) -> None:
        """Leave ``entry`` pending to the claimer: its step failed, and this replica gave it up."""
        if self.claimer is not None:
            self.claimer.abandon(entry.stream, entry.id)

    async def _settle_claimed(self, entry: StreamEntry) -> None:
        assert self._claim_idle_ms is not None  # noqa: S101 - only the claimer calls it
        try:
            dead, done, headers, retried = await self._settle_lost(entry, self._claim_idle_ms)
        except (RedisError, OSError):
            raise
        except Exception as exc:  # bytes no copy can be built from
            logger.warning(
                "entry %s of %s claimed from a lost consumer: its copy could not be built "
                "(%s): dead-lettered as invalid, its bytes as they were",
                entry.id,
                entry.stream,
                h.exception_name(exc),
            )
            headers = steps.invalid_headers(entry, exc, now_ms=h.now_ms())
            dead, done, retried = True, await self._place_invalid(entry, headers), None
        if done and self._reporter is not None:
            # The app's hooks, metrics and log hear of a claimed entry's step as of the
            # sink's: a consumer that died mid-message is a failed attempt.
            if dead:
                self._reporter.report(
                    self._claimed_dead_letter(entry, entry.incoming_headers(), headers)
                )
            elif retried is not None:
                self._reporter.report(self._claimed_retry(entry, retried))
        logger.info(
            "claimed %s of %s from a consumer gone for %d ms: %s",
            entry.id,
            entry.stream,
            self._claim_idle_ms,
            ("dead-lettered" if dead else "retried later") if done else "already settled",
        )

    def _claimed_dead_letter(
        self, entry: StreamEntry, incoming: Mapping[str, Any], headers: Mapping[str, Any]
    ) -> RetryEvent:
        """The event of a claimed entry dead-lettered, from what its letter says."""
        return RetryEvent.dead_lettered(
            queue=entry.stream,
            message_id=_claimed_id(entry, incoming),
            attempt=h.read_attempt(headers),
            at_ms=h.now_ms(),
            max_attempts=self._policies.get(entry.stream, self._policy).max_attempts,
            reason=Reason(headers[h.REASON]),
            exception=str(headers[h.EXCEPTION]),
            error=str(headers[h.ERROR]),
            dlq=self.keys(entry.stream).dlq,
        )

    def _claimed_retry(self, entry: StreamEntry, step: ClaimedStep) -> RetryEvent:
        """The event of a claimed entry scheduled again: its lost attempt, a transient failure."""
        due = step.headers.get(h.DUE)
        return RetryEvent.scheduled(
            queue=entry.stream,
            message_id=_claimed_id(entry, entry.incoming_headers()),
            attempt=h.read_attempt(step.headers),
            at_ms=h.now_ms(),
            max_attempts=self._policies.get(entry.stream, self._policy).max_attempts,
            delay_ms=step.delay_ms,
            due_ms=due if isinstance(due, int) else None,
            exception=CONSUMER_LOST,
            error=step.error,
            # No exception to classify: the plugin's own rule counts a lost consumer as
            # a transient failure (``claimer.claimed_step``).
            rule=Rule.BUILTIN,
            classification=Verdict.TRANSIENT,
        )

    async def _settle_lost(
        self, entry: StreamEntry, idle_ms: int
    ) -> tuple[bool, bool, Mapping[str, Any], ClaimedStep | None]:
        """Settle a claimed entry as a lost attempt.

        Return whether it was dead-lettered, whether the step was done, its headers, and
        the retry's step when it was scheduled again (``None`` otherwise).
        """
        incoming = entry.incoming_headers()
        now = h.now_ms()
        step = claimed_step(
            incoming,
            stream=entry.stream,
            policy=self._policies.get(entry.stream, self._policy),
            idle_ms=idle_ms,
            now_ms=now,
        )
        if step.dead_letter:
            return True, await self.dead_letter(entry, headers=step.headers), step.headers, None
        try:
            due = await self.retry_later(entry, delay_ms=step.delay_ms, headers=step.headers)
        except EnvelopeTooLarge:  # its own headers leave the copy no room
            headers = steps.too_large_headers(
                incoming,
                stream=entry.stream,
                attempt=h.read_attempt(step.headers),
                now_ms=now,
                cause=CONSUMER_LOST,
            )
            return True, await self.dead_letter(entry, headers=headers), headers, None
        return False, due is not None, step.headers, step


def _claimed_id(entry: StreamEntry, incoming: Mapping[str, Any]) -> str:
    """The id a claimed entry's events name it by.

    Its ``message_id`` header when it has one (a copy, or a producer's), else its entry
    id: FastStream names it anew at each delivery.
    """
    message_id = incoming.get("message_id")
    return message_id if isinstance(message_id, str) and message_id else entry.id


def _say(outcome: int, entry: StreamEntry, done: str) -> None:
    """Log the outcomes of a step that are not the plain one."""
    if outcome == FROM_MEMORY:
        _TRIMMED.log(
            logging.WARNING,
            ("trimmed", entry.stream),
            "entry %s of %s was gone from the stream when its failure was settled (trimmed "
            "by MAXLEN or deleted while a handler held it): %s from the handler's copy. "
            "Keep a covered stream's MAXLEN above its backlog",
            entry.id,
            entry.stream,
            done,
        )
    elif outcome == ALREADY_WRITTEN:
        logger.info(
            "entry %s of %s: %s already, by this same step (run again after its reply was lost)",
            entry.id,
            entry.stream,
            done,
        )
