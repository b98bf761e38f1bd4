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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason
from faststream_retry.redis.steps import StreamEntry

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from faststream_retry.core.policy import RetryPolicy
    from faststream_retry.redis.client import Client
    from faststream_retry.redis.keys import StreamKeys

__all__ = ["CONSUMER_LOST", "ClaimedStep", "Claimer", "claimed_step"]

logger = logging.getLogger("faststream_retry.redis")

CONSUMER_LOST = "faststream_retry.ConsumerLost"
"""``retry-exception`` of an attempt that ended with its consumer gone (nothing raises it)."""

_COUNT = 100


@dataclass(frozen=True, slots=True)
class ClaimedStep:
    """What a claimed entry becomes: a retry ``delay_ms`` later, or a dead letter."""

    headers: dict[str, Any]
    delay_ms: int
    dead_letter: bool


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
        return ClaimedStep(headers, 0, dead_letter=True)
    delay = policy.backoff.delay_ms(max(1, attempt - policy.immediate), rand)
    failure = h.FailureRecord(
        attempt=attempt, at_ms=now_ms, exception=CONSUMER_LOST, error=error, delay_ms=delay
    )
    return ClaimedStep(h.retry_headers(incoming, failure, now_ms + delay), delay, dead_letter=False)


class Claimer:
    """Claims idle pending entries of ``(keys, group)`` pairs and hands each to ``settle``."""

    def __init__(
        self,
        client: Client,
        targets: Sequence[tuple[StreamKeys, str]],
        *,
        consumer: str,
        idle_ms: int,
        settle: Callable[[StreamEntry], Awaitable[None]],
    ) -> None:
        """Keep the settings; nothing runs until ``start()``.

        ``consumer`` is the name the claimed entries are pending under until settled.
        """
        self._client = client
        self._targets = tuple(targets)
        self._consumer = consumer
        self._idle_ms = idle_ms
        self._settle = settle
        self._interval_s = min(5.0, max(0.1, idle_ms / 4000))
        self._task: asyncio.Task[None] | None = None
        self.claimed = 0
        """Entries this claimer claimed (a test's count)."""

    def start(self) -> None:
        """Start claiming, every quarter of the idle time (0.1 s to 5 s)."""
        if self._task is None and self._targets:
            self._task = asyncio.create_task(self._run(), name="faststream-retry claimer")

    async def stop(self) -> None:
        """Stop claiming; an entry claimed and not yet settled is claimed again later."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:  # a task that died: said here, and the stop goes on
                logger.exception("the claimer had stopped with an error")

    async def claim_once(self, keys: StreamKeys, group: str) -> int:
        """Claim and settle every entry of ``group`` idle for ``idle_ms``; return how many."""
        start: bytes | str = "0-0"
        claimed = 0
        while True:
            reply = await self._client.xautoclaim(
                keys.stream, group, self._consumer, self._idle_ms, start, count=_COUNT
            )
            start, entries = reply[0], reply[1]
            for entry_id, fields in entries:
                if fields is None:  # deleted from the stream while pending (Redis 6.2)
                    continue
                claimed += 1
                await self._settle(StreamEntry(keys.stream, group, _str(entry_id), fields))
            if _str(start) == "0-0":
                self.claimed += claimed
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


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
