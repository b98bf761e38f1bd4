"""A FastStream app on a stream with a consumer group whose failures go to the engine.

The real wiring (RetryMiddleware choosing the Redis transport) comes later; here the
handler's wrapper carries a failure out with the pure core and the engine directly,
the way the middleware will: the attempt from the entry's ``retry-attempt``, a fixed
delay, a dead letter once ``max_attempts`` calls failed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, RedisClusterBroker, StreamSub
from faststream.redis.annotations import RedisStreamMessage
from faststream.redis.parser.binary import BinaryMessageFormatV1
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason
from faststream_retry.core.policy import Fixed, RetryPolicy
from faststream_retry.redis import envelope
from faststream_retry.redis.engine import RedisRetryEngine
from faststream_retry.redis.steps import StreamEntry

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


async def until(
    condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition"
) -> None:
    """``eventually`` (tests/rabbit.py's) for an async condition (a query to the server)."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


class HandlerError(Exception):
    """The handler's failure in these tests."""


async def read_stream(client: Redis, name: str) -> list[tuple[str, envelope.Envelope]]:
    """Every entry of stream ``name``: its id and its message, headers as the core reads them."""
    out = []
    entries: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(name)  # type: ignore[assignment]
    for entry_id, fields in entries:
        parsed = envelope.parse(fields)
        out.append(
            (entry_id.decode(), envelope.Envelope(parsed.body, envelope.from_wire(parsed.headers)))
        )
    return out


async def fill_backlog(client: Redis, stream: str, n: int) -> None:
    """Group ``g`` from 0, then ``n`` messages ``{"id": i}`` in FastStream's format: a
    backlog the first read takes whole."""
    await client.xgroup_create(stream, "g", id="0", mkstream=True)
    async with client.pipeline(transaction=False) as pipe:
        for key in range(n):
            data = await BinaryMessageFormatV1.encode(
                message=json.dumps({"id": key}).encode(),
                reply_to=None,
                headers={"content-type": "application/json"},
                correlation_id=uuid.uuid4().hex,
            )
            pipe.xadd(stream, {"__data__": data})
        await pipe.execute()


async def pending_ids(client: Redis, stream: str, group: str, consumer: str) -> set[str]:
    """The body ``id``s of the entries pending for ``consumer``: what a kill of it leaves.

    A handled entry is handled again after a kill only if it is one of them: its ``XACK``
    (batched beside the handlers, ``redis.acks``) or its failure's step was not stored.
    """
    rows = await client.xpending_range(
        stream, group, min="-", max="+", count=1_000_000, consumername=consumer
    )
    ids: set[str] = set()
    for row in rows:
        entry = row["message_id"]
        found: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(  # type: ignore[assignment]
            stream, min=entry, max=entry
        )
        for _, fields in found:
            ids.add(str(json.loads(envelope.parse(fields).body)["id"]))
    return ids


class App:
    """A RedisBroker app: one stream subscriber in group ``g``, its failures settled by the engine.

    ``fails(id, attempt)`` says whether the handler raises for message ``id`` on call
    ``attempt`` (1 for the first). ``calls[id]`` lists each call's (attempt, time ms);
    ``done`` counts successes by id.
    """

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        fails: Callable[[int, int], bool],
        max_attempts: int = 3,
        delay_ms: int = 200,
        consumer: str = "c1",
        claim_idle_ms: int | None = None,
        group: str = "g",
        cluster: bool = False,
        on_done: Callable[[int], Awaitable[Any]] | None = None,
    ) -> None:
        self.stream = stream
        self.group = group
        self.fails = fails
        self.max_attempts = max_attempts
        self.delay_ms = delay_ms
        self.calls: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.done: Counter[int] = Counter()
        self.bodies: dict[tuple[int, int], dict[str, Any]] = {}
        self.on_done = on_done
        self.failed_at: dict[tuple[int, int], int] = {}
        self.unsettled = 0
        self.delay_for: Callable[[int], int] = lambda _id: delay_ms
        self.broker: RedisBroker | RedisClusterBroker = (
            RedisClusterBroker(url) if cluster else RedisBroker(url)
        )
        self.client: Redis | RedisCluster = (
            RedisCluster.from_url(url) if cluster else Redis.from_url(url)
        )
        self.engine = RedisRetryEngine(
            self.client,
            [(stream, group)],
            consumer=f"{consumer}-claimer",
            claim_idle_ms=claim_idle_ms,
            own_consumers=[(stream, consumer)],
            policy=RetryPolicy(max_attempts=max_attempts, backoff=Fixed(delay_ms / 1000)),
        )

        @self.broker.subscriber(stream=StreamSub(stream, group=group, consumer=consumer))
        async def handle(body: dict[str, Any], message: RedisStreamMessage) -> None:
            # As the middleware does: the claimer keeps alive what the handlers hold.
            (entry_id,) = message.raw_message["message_ids"]
            with self.engine.holding(stream, consumer, entry_id.decode()):
                await self._handle(body, message)

    async def _handle(self, body: dict[str, Any], message: RedisStreamMessage) -> None:
        entry = StreamEntry.from_raw(message.raw_message, self.group)
        incoming = entry.incoming_headers()
        attempt = h.read_attempt(incoming) + 1
        key = int(body["id"])
        now = h.now_ms()
        self.calls[key].append((attempt, now))
        self.bodies[(key, attempt)] = body
        if not self.fails(key, attempt):
            if self.on_done is not None:
                await self.on_done(key)
            self.done[key] += 1
            return
        self.failed_at[(key, attempt)] = now
        failure = h.FailureRecord.of(
            HandlerError(f"message {key} failed: σφάλμα ☃"), attempt=attempt, at_ms=now
        )
        if attempt >= self.max_attempts:
            headers = h.dead_letter_headers(
                incoming, failure, reason=Reason.EXHAUSTED, origin_queue=self.stream
            )
            settled = await self.engine.dead_letter(entry, headers=headers)
        else:
            delay = failure.delay_ms = self.delay_for(key)
            headers = h.retry_headers(incoming, failure, now + delay)
            settled = (
                await self.engine.retry_later(entry, delay_ms=delay, headers=headers) is not None
            )
        if not settled:
            self.unsettled += 1

    async def start(self) -> None:
        """Start the broker (which creates the group) and then the engine."""
        await self.broker.start()
        await self.engine.start()

    async def stop(self) -> None:
        """Stop the engine, the broker and the engine's client."""
        await self.engine.stop()
        await self.broker.stop()
        await self.client.aclose()

    async def publish(self, ids: range | list[int]) -> None:
        """Publish ``{"id": n}`` for each n, as a FastStream producer does."""
        for n in ids:
            await self.broker.publish({"id": n}, stream=self.stream)
