"""The Redis transport's engine: what RetryMiddleware calls on a ``RedisBroker``.

One ``RedisRetryEngine`` per app (per broker): it knows the covered streams, each with
the one consumer group that reads it, and runs a mover and a claimer beside the app.

- ``await engine.check()`` checks the server (``checks``); ``await engine.start()`` checks
  it unless that was done, then starts the mover (due copies back to their streams) and,
  when ``claim_idle_ms`` is set, the claimer (dead consumers' entries, and the keep-alive
  of this replica's own: ``own_consumers``, whose names must be this replica's alone, the
  engine built before the subscribers start reading). ``await engine.stop()`` stops both.
- ``await engine.retry_later(entry, delay_ms=..., headers=...)`` settles a failed
  delivery: it acknowledges the entry and schedules its copy with ``headers``
  (``core.headers.retry_headers(...)``) ``delay_ms`` from the server's now, in one
  script. It returns the due time, or ``None`` when the entry was no longer pending
  (settled by another consumer): then nothing was scheduled.
- ``await engine.dead_letter(entry, headers=...)`` acknowledges it and adds it to
  ``P.dlq`` with ``headers`` (``core.headers.dead_letter_headers(...)``), capped near
  ``dlq_maxlen``; ``False`` when it was no longer pending. A letter whose headers the
  format cannot hold is made lean (``steps.fitted``), never refused.
- ``with engine.holding(stream, consumer, entry_id):`` wraps each handler's call (its
  failure's step included): the claimer keeps alive only what this replica's handlers
  hold, and the rest of a read still waiting for them (``claimer.Claimer``).
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

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason, RetryEvent
from faststream_retry.core.policy import RetryPolicy
from faststream_retry.errors import RetryConfigError
from faststream_retry.redis import steps
from faststream_retry.redis.checks import Server, check_server
from faststream_retry.redis.claimer import CONSUMER_LOST, Claimer, claimed_step
from faststream_retry.redis.envelope import EnvelopeTooLarge
from faststream_retry.redis.keys import StreamKeys, stream_keys
from faststream_retry.redis.lua import Scripts
from faststream_retry.redis.mover import Mover

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from faststream_retry.redis.client import Client
    from faststream_retry.redis.steps import StreamEntry
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["RedisRetryEngine"]

logger = logging.getLogger("faststream_retry.redis")

DEFAULT_DLQ_MAXLEN = 100_000


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
        self._claim_idle_ms = claim_idle_ms
        self._reporter = reporter
        self.mover = Mover(
            client,
            self._scripts,
            list(self._keys.values()),
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
        self.server: Server | None = None

    def keys(self, stream: str) -> StreamKeys:
        """Return the keys of covered ``stream``."""
        try:
            return self._keys[stream]
        except KeyError:
            raise RetryConfigError(f"stream {stream!r} is not covered by this engine") from None

    def group(self, stream: str) -> str:
        """Return the consumer group that reads covered ``stream``."""
        self.keys(stream)
        return self._groups[stream]

    async def check(self) -> Server:
        """Check the server; raise ``RetryTopologyError`` naming every problem."""
        self.server = await check_server(self._client, list(self._keys))
        return self.server

    async def start(self) -> None:
        """Check the server unless ``check()`` did, then start moving (and claiming)."""
        if self.server is None:
            await self.check()
        self.mover.start()
        if self.claimer is not None:
            self.claimer.start()

    async def stop(self) -> None:
        """Stop the mover and the claimer; waiting copies stay in Redis for the next start."""
        if self.claimer is not None:
            await self.claimer.stop()
        await self.mover.stop()

    async def retry_later(
        self, entry: StreamEntry, *, delay_ms: int, headers: Mapping[str, Any]
    ) -> int | None:
        """Acknowledge ``entry`` and schedule its copy; see the module docstring."""
        return await steps.retry_later(
            self._scripts, self.keys(entry.stream), entry, delay_ms=delay_ms, headers=headers
        )

    async def dead_letter(self, entry: StreamEntry, *, headers: Mapping[str, Any]) -> bool:
        """Acknowledge ``entry`` and dead-letter it; see the module docstring."""
        return await steps.dead_letter(
            self._scripts,
            self.keys(entry.stream),
            entry,
            headers=headers,
            maxlen=self._dlq_maxlen,
        )

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

    def abandon(self, entry: StreamEntry) -> None:
        """Leave ``entry`` pending to the claimer: its step failed, and this replica gave it up."""
        if self.claimer is not None:
            self.claimer.abandon(entry.stream, entry.id)

    async def _settle_claimed(self, entry: StreamEntry) -> None:
        assert self._claim_idle_ms is not None  # noqa: S101 - only the claimer calls it
        incoming = entry.incoming_headers()
        now = h.now_ms()
        step = claimed_step(
            incoming,
            stream=entry.stream,
            policy=self._policies.get(entry.stream, self._policy),
            idle_ms=self._claim_idle_ms,
            now_ms=now,
        )
        dead = step.dead_letter
        headers = step.headers
        if dead:
            done = await self.dead_letter(entry, headers=headers)
        else:
            try:
                due = await self.retry_later(entry, delay_ms=step.delay_ms, headers=step.headers)
                done = due is not None
            except EnvelopeTooLarge:  # its own headers leave the copy no room
                dead = True
                headers = steps.too_large_headers(
                    incoming,
                    stream=entry.stream,
                    attempt=h.read_attempt(step.headers),
                    now_ms=now,
                    cause=CONSUMER_LOST,
                )
                done = await self.dead_letter(entry, headers=headers)
        if dead and done and self._reporter is not None:
            self._reporter.report(self._claimed_dead_letter(entry, incoming, headers))
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
        """The event of a claimed entry dead-lettered, from what its letter says.

        Named by its ``message_id`` header when it has one (a copy, or a producer's),
        else by its entry id: FastStream names it anew at each delivery.
        """
        message_id = incoming.get("message_id")
        return RetryEvent.dead_lettered(
            queue=entry.stream,
            message_id=message_id if isinstance(message_id, str) and message_id else entry.id,
            attempt=h.read_attempt(headers),
            at_ms=h.now_ms(),
            max_attempts=self._policies.get(entry.stream, self._policy).max_attempts,
            reason=Reason(headers[h.REASON]),
            exception=str(headers[h.EXCEPTION]),
            error=str(headers[h.ERROR]),
            dlq=self.keys(entry.stream).dlq,
        )
