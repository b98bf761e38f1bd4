"""Where a handler's failure goes on Redis: one script acknowledges the entry and writes its copy.

The same decisions as on RabbitMQ and NATS (``core.decision``, ``core.steps.failed``): an
``immediate`` retry calls the handler again in the process; a later one is the engine's
retry-later script (``XACK``, and the copy scheduled ``delay_ms`` from the server's now);
a dead letter its dead-letter script (``XACK``, and the letter added to ``P.dlq``). Each
acknowledges and writes in one atomic step: never half done.

- A later retry's script runs beside the handler, not in its turn (``redis.settling``:
  bounded, awaited at the stop): the handler's turn ends once it is handed over, and
  FastStream is told the message is settled (``settled``), so that its own
  acknowledgement sends nothing. The entry stays pending until the script that stores
  its copy acknowledges it, kept alive against the claimer meanwhile; events and spans
  fire once the script answered. A dead letter's script keeps the handler's turn: a
  stream's dead letters land in its ``.dlq`` in the order they were handled.
- A script Redis refuses or cannot answer (down, read-only, a cut connection) leaves the
  entry pending, given up to the claimer (``engine.abandon``), which claims it
  ``claim_idle`` later on any replica and counts the lost attempt; a warning says so
  (one a minute per stream). Nothing is lost, and the handler is not run again here.
- A step whose acknowledgement found nothing pending (a claimer took the entry from a
  replica that stopped answering) writes nothing and reports nothing: whoever holds the
  entry now settles it. An entry gone from the stream (``MAXLEN``) is written from the
  handler's copy, and one whose step already ran (a lost reply, sent again) is reported.
- Any other error building the copy (bytes no format explains) dead-letters the entry as
  ``invalid`` with a minimal letter: its raw bytes, the retry state alone.
- A copy whose headers FastStream's binary format cannot hold (``EnvelopeTooLarge``)
  sends its message to the dead letters as ``invalid`` (``HeadersTooLarge``), lean.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import RedisError

from faststream_retry.core import headers as h
from faststream_retry.core import steps
from faststream_retry.core.decision import Action
from faststream_retry.core.events import EventKind, Reason
from faststream_retry.redis import steps as redis_steps
from faststream_retry.redis.envelope import EnvelopeTooLarge
from faststream_retry.redis.keys import stream_keys
from faststream_retry.redis.steps import StreamEntry
from faststream_retry.reporting.log import Throttle

if TYPE_CHECKING:
    from collections.abc import Callable

    from faststream_retry.core.decision import Decision
    from faststream_retry.core.steps import Copy, Step
    from faststream_retry.core.topology import Plan, Route
    from faststream_retry.redis.engine import RedisRetryEngine
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["Message", "RedisSink"]

logger = logging.getLogger("faststream_retry.redis")
# Redis down during a burst refuses every failure's step: one line per stream a minute.
_REFUSED = Throttle(60.0, logger=logger)

MESSAGE_ID = "message_id"
"""The header FastStream's Redis parser reads a message's id from."""


class Message(Protocol):
    """What the sink reads of FastStream's ``RedisStreamMessage``."""

    @property
    def raw_message(self) -> Any: ...  # noqa: ANN401, D102 - FastStream's DefaultStreamMessage

    @property
    def message_id(self) -> str: ...  # noqa: D102

    @property
    def headers(self) -> Any: ...  # noqa: ANN401, D102


class RedisSink:
    """A running Redis broker's sink."""

    __slots__ = ("_engine", "_plan", "_reporter", "_settled")

    def __init__(
        self,
        engine: RedisRetryEngine,
        plan: Plan,
        reporter: Reporter,
        settled: Callable[[Message], None] = lambda _: None,
    ) -> None:
        """Carry failures of ``plan``'s streams out through ``engine``.

        ``settled``: told of each message whose step was handed over (its script
        acknowledges the entry, or leaves it pending for the claimer), so FastStream does
        not send an ``XACK`` of its own: a round trip per failure that acknowledges
        nothing, or that would acknowledge an entry whose copy is not stored yet.
        """
        self._engine = engine
        self._plan = plan
        self._reporter = reporter
        self._settled = settled

    async def retry(
        self, msg: Message, route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """An immediate retry is made now, in process; a later one is scheduled in Redis."""
        if decision.action is Action.RETRY_NOW:
            self._reporter.in_process(
                route.queue, msg.message_id, msg.headers, decision, exc, immediate=True
            )
            return True
        await self._send(msg, route, decision, exc, beside=True)
        return False

    async def dead_letter(
        self, msg: Message, route: Route, decision: Decision, exc: BaseException
    ) -> bool:
        """Acknowledge the entry and add its dead letter to the stream's ``.dlq``, in one step."""
        # In the handler's turn: a stream's dead letters land in the order they were handled.
        await self._send(msg, route, decision, exc, beside=False)
        return True

    async def _send(
        self, msg: Message, route: Route, decision: Decision, exc: BaseException, *, beside: bool
    ) -> None:
        entry = StreamEntry.from_raw(msg.raw_message, self._engine.group(route.queue))
        if not beside:
            await self._settle(msg, entry, route, decision, exc, hold=contextlib.nullcontext())
            self._settled(msg)
            return
        hold = self._engine.settling(entry)
        hold.__enter__()  # from the handler's turn on: no pass of the keep-alive misses it
        try:
            await self._engine.settlements.submit(
                lambda: self._settle(msg, entry, route, decision, exc, hold=hold)
            )
        except BaseException:
            hold.__exit__(None, None, None)
            raise
        self._settled(msg)

    async def _settle(
        self,
        msg: Message,
        entry: StreamEntry,
        route: Route,
        decision: Decision,
        exc: BaseException,
        *,
        hold: contextlib.AbstractContextManager[None],
    ) -> None:
        """Run the failure's step beside the handlers; a refused one leaves the entry pending.

        ``hold`` was entered in the handler's turn (``_send``): it is exited here, once.
        """
        try:
            try:
                await self._step(msg, entry, route, decision, exc)
            except (RedisError, OSError):
                raise
            except Exception as unbuilt:  # bytes no copy can be built from
                await self._invalid(msg, entry, route, unbuilt)
        except (RedisError, OSError) as refused:
            self._engine.abandon(entry)
            _REFUSED.log(
                logging.WARNING,
                ("refused", entry.stream),
                "entry %s of %s: the step of its handler's failure could not be run "
                "(%r): left pending, claimed once idle for claim_idle and counted as a "
                "lost attempt",
                entry.id,
                entry.stream,
                refused,
            )
        finally:
            hold.__exit__(None, None, None)

    async def _step(
        self,
        msg: Message,
        entry: StreamEntry,
        route: Route,
        decision: Decision,
        exc: BaseException,
    ) -> None:
        incoming = entry.incoming_headers()
        # FastStream names a Redis message by this header, or by a new id at each delivery
        # (its producers write none): the copies carry the first, so every attempt has it.
        incoming.setdefault(MESSAGE_ID, msg.message_id)
        step = steps.failed(
            self._plan,
            route,
            decision,
            exc,
            message_id=msg.message_id,
            incoming=incoming,
            now_ms=h.now_ms(),
        )
        try:
            await self._place(entry, step, incoming, exc)
        except EnvelopeTooLarge:
            letter = steps.too_large(
                step, incoming, now_ms=h.now_ms(), error=redis_steps.TOO_LARGE_ERROR
            )
            if letter is None:  # a dead letter is made to fit: it never raises this
                raise
            await self._place(entry, letter, incoming, exc)

    async def _invalid(
        self, msg: Message, entry: StreamEntry, route: Route, exc: Exception
    ) -> None:
        """Dead-letter an entry whose copy could not be built, with a letter that cannot fail.

        Reported as every dead letter is (hooks, metrics, span, line): an operator's alert
        on dead letters must see these too. The event is the core's, from what is known
        without the entry's headers.
        """
        logger.warning(
            "entry %s of %s: its copy could not be built (%s): dead-lettered as invalid, "
            "its bytes as they were",
            entry.id,
            entry.stream,
            h.exception_name(exc),
        )
        failure = h.FailureRecord(
            attempt=h.read_attempt(msg.headers) + 1,
            at_ms=h.now_ms(),
            exception=h.exception_name(exc),
            error=str(exc),
        )
        letter = steps.dead_letter(
            route.dlq, route.queue, msg.message_id, None, failure, reason=Reason.INVALID
        )

        async def send(_copy: Copy) -> bool:
            return await self._engine.dead_letter_invalid(entry, exc)

        await self._reporter.publish(
            letter.event,
            letter.copy,
            send,
            incoming=None,
            exception=exc,
            destination=stream_keys(entry.stream).dlq,
        )

    async def _place(
        self, entry: StreamEntry, step: Step, incoming: dict[str, Any], exc: BaseException
    ) -> None:
        """Run ``step``'s script and report it; a step that found nothing pending is not."""
        engine = self._engine
        dead = step.event.kind is EventKind.DEAD_LETTERED

        async def send(copy: Copy) -> bool:
            if dead:
                done = await engine.dead_letter(entry, headers=copy.headers)
            else:
                due = await engine.retry_later(
                    entry, delay_ms=step.event.delay_ms or 0, headers=copy.headers
                )
                done = due is not None
            if not done:
                logger.warning(
                    "entry %s of %s was no longer pending for group %s when its handler's "
                    "failure was settled: a claimer took it (this replica held it longer than "
                    "claim_idle without keeping it alive), and settles it. Nothing written",
                    entry.id,
                    entry.stream,
                    entry.group,
                )
            return done

        keys = stream_keys(entry.stream)
        await self._reporter.publish(
            step.event,
            step.copy,
            send,
            incoming=incoming,
            exception=exc,
            destination=keys.dlq if dead else keys.schedule,
        )
