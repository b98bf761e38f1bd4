"""Dead letters on NATS JetStream: the ``dlq`` commands' ``Store`` of a dead-letter stream.

The plugin keeps the dead letters of a covered stream ``S`` in the stream
``<prefix>-dlq-S``, each under ``<prefix>.dlq.<key>`` (``nats.naming``; the key is
``S.<durable>``). A command names them by the covered stream (``orders``: every
subscriber's), a subscriber's key (``orders.billing``: that one's), or the dead-letter
stream itself.

- Reading is the stream API's message get, by sequence (``next_by_subj``): no consumer
  is made, nothing is acked or redelivered, and a message that arrives meanwhile is not
  read (the read ends at the last sequence there when it began).
- A replay publishes the copy to its subscriber's ready subject in the delay stream
  (``<prefix>.ready.<key>``), where the plugin hands it to that subscriber alone (the
  work subject would reach every consumer of the stream), confirmed by its PubAck, and
  only then deletes the dead letter (``delete_msg``). The copy carries a ``Nats-Msg-Id``
  made of the dead letter's stream, sequence and stored time: a replay run again after
  one killed between the PubAck and the delete publishes no second copy within the
  delay stream's duplicate window (2 minutes).

Imported by the commands only for a ``nats://`` URL: it needs nats-py.
"""

from __future__ import annotations

import base64
import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError
from nats.js.errors import NotFoundError

from faststream_retry.core import headers as h
from faststream_retry.nats import naming, wire
from faststream_retry.ops.common import CONNECT_TIMEOUT_S, OperationError, safe_nats_url, shown_name
from faststream_retry.ops.dlq_store import ExportRecord, Stored
from faststream_retry.ops.nats_client import connect_client

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from nats.aio.client import Client
    from nats.js import JetStreamContext

__all__ = ["NatsStore", "connect", "open_store"]

PUBLISH_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 10.0


class _Raw(NamedTuple):
    """One message as the stream API's get gives it."""

    seq: int
    subject: str
    headers: dict[str, str]
    body: bytes
    stored: str
    """When the server stored it (its text: RFC 3339)."""


def _headers(block: bytes) -> dict[str, str]:
    """NATS headers as sent: ``NATS/1.0`` then ``Name: value`` lines, case and bytes kept.

    Not UTF-8 (another client's bytes): replaced, never raised on. A name given twice
    keeps its last value, as nats-py's own reading does.
    """
    lines = block.decode(errors="replace").split("\r\n")
    found: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep and name:
            found[name] = value.strip()
    return found


@asynccontextmanager
async def connect(url: str, timeout: float = CONNECT_TIMEOUT_S) -> AsyncIterator[Client]:
    """A connection to the NATS server(s) at ``url`` that fails at once, never reconnects.

    Raises:
        OperationError: no server can be reached.
    """
    client = await connect_client(url, timeout)
    try:
        yield client
    except (NatsError, JetStreamError, TimeoutError) as exc:
        raise OperationError(
            f"the NATS server at {safe_nats_url(url)} stopped answering or refused: {exc!r}; "
            "nothing was removed before its copy was confirmed: run the command again"
        ) from exc
    finally:
        await client.close()


@asynccontextmanager
async def open_store(url: str, queue: str, *, prefix: str) -> AsyncIterator[NatsStore]:
    """The dead letters ``queue`` names on ``url`` (see the module docstring)."""
    async with connect(url) as client:
        store = NatsStore(client.jetstream(), queue, prefix)
        await store.open()
        yield store


class NatsStore:
    """One dead-letter stream, or one subscriber's dead letters in it."""

    system = "nats"

    def __init__(self, js: JetStreamContext, queue: str, prefix: str) -> None:
        """Name the stream and subjects ``queue`` means under ``prefix``; nothing is asked yet."""
        self._js = js
        self._prefix = prefix
        dlq_head = naming.dlq_stream(prefix, "")
        if queue.startswith(dlq_head) and len(queue) > len(dlq_head):
            stream, key = queue[len(dlq_head) :], None
        elif "." in queue:
            stream, key = naming.key_stream(queue), queue
        else:
            stream, key = queue, None
        if not stream or any(c in stream for c in " .*>\t\r\n"):
            raise OperationError(
                f"no dead-letter stream for {shown_name(queue)}: name a covered stream "
                "(orders), a subscriber's key (orders.billing) or the dead-letter stream "
                f"({naming.dlq_stream(prefix, 'orders')})"
            )
        self.stream = naming.dlq_stream(prefix, stream)
        self.filter = naming.dlq_subject(prefix, key) if key else naming.dlq_filter(prefix, stream)
        self.key = key
        self.origin = key or ""
        self.name = self.stream
        self._dlq_head = naming.dlq_subject(prefix, "")

    async def open(self) -> None:
        """Check that the dead-letter stream exists.

        Raises:
            OperationError: it does not (wrong prefix or stream name, or no dead letter yet).
        """
        try:
            await self._js.stream_info(self.stream)
        except NotFoundError:
            raise OperationError(
                f"there is no dead-letter stream {self.stream!r} on this server: the plugin "
                "makes it when a subscriber of that stream starts. Check the stream's name "
                "and --prefix (RetryMiddleware(prefix=...), 'retry' by default)"
            ) from None

    async def total(self) -> int:
        """How many dead letters it (or the key's subject) holds."""
        if self.key is None:
            return int((await self._js.stream_info(self.stream)).state.messages)
        info = await self._js.stream_info(self.stream, subjects_filter=self.filter)
        return sum((info.state.subjects or {}).values())

    def stream_of(self) -> str:
        """The covered stream whose dead letters these are."""
        return self.stream[len(naming.dlq_stream(self._prefix, "")) :]

    async def read(self) -> AsyncIterator[Stored]:
        """Each dead letter by sequence, oldest first, up to the last one there at the start."""
        info = await self._js.stream_info(self.stream)
        last = int(info.state.last_seq)
        seq = max(int(info.state.first_seq), 1)
        position = 0
        while seq <= last and info.state.messages:
            found = await self._get(seq)
            if found is None or found.seq > last:
                return
            position += 1
            yield self._stored(position, found)
            seq = found.seq + 1

    async def _get(self, seq: int) -> _Raw | None:
        """The first message at or after ``seq`` on the filter; ``None``: there is none.

        The stream API's message get, asked directly: nats-py's ``get_msg`` reads the
        headers with an e-mail parser, which turns a value that is not ASCII into an
        object of its own and loses what it said.
        """
        request = json.dumps({"seq": seq, "next_by_subj": self.filter}).encode()
        api = getattr(self._js, "_prefix", "$JS.API")
        reply = await self._js._nc.request(  # noqa: SLF001 - the client the context has
            f"{api}.STREAM.MSG.GET.{self.stream}", request, timeout=REQUEST_TIMEOUT_S
        )
        answer = json.loads(reply.data)
        error = answer.get("error")
        if error:
            if error.get("code") == 404:
                return None
            raise OperationError(f"the NATS server refused to read {self.stream!r}: {error}")
        message = answer["message"]
        headers = _headers(base64.b64decode(message.get("hdrs") or ""))
        body = base64.b64decode(message.get("data") or "")
        stored = str(message.get("time") or "")
        return _Raw(int(message["seq"]), str(message["subject"]), headers, body, stored)

    def _stored(self, position: int, found: _Raw) -> Stored:
        seq, subject, raw, body, stored = found
        decoded = wire.decode(raw)
        origin = subject[len(self._dlq_head) :] if subject.startswith(self._dlq_head) else ""
        message_id = decoded.get(wire.MESSAGE_ID)
        return Stored(
            position=position,
            ref=str(seq),
            body=body,
            headers=raw,
            decoded=decoded,
            properties={
                "message_id": message_id if isinstance(message_id, str) else None,
                "content_type": raw.get("content-type"),
                "subject": subject,
                "sequence": seq,
                "stored": stored,
            },
            origin=origin or h.read_text(decoded, h.ORIGIN_QUEUE, h.QUEUE_LIMIT),
            subject=subject,
        )

    async def check_target(self, target: str | None, letters: list[Stored]) -> None:
        """Each target key's hand-over consumer must exist, else a copy would wait for ever.

        Raises:
            OperationError: a key names no subscriber that has run with this prefix.
        """
        keys = {target} if target else {letter.origin for letter in letters}
        for key in sorted(keys):
            problem = None
            if not key or key.count(".") != 1 or any(c in key for c in " *>\t\r\n"):
                problem = "it is not a subscriber's key (<stream>.<durable>)"
            else:
                durable = naming.ready_durable(self._prefix, key)
                try:
                    await self._js.consumer_info(naming.delay_stream(self._prefix), durable)
                except NotFoundError:
                    problem = (
                        f"no subscriber with that key has run with prefix {self._prefix!r} "
                        f"(its hand-over consumer {durable!r} is not in "
                        f"{naming.delay_stream(self._prefix)!r}): start the app, or name "
                        "another with --to STREAM.DURABLE"
                    )
            if problem is not None:
                raise OperationError(
                    f"cannot replay to {shown_name(key)}: {problem}; nothing was replayed"
                )

    async def replay(self, letter: Stored, headers: dict[str, Any], target: str | None) -> bool:
        """Publish to the key's ready subject, confirmed; then delete the dead letter."""
        key = target or letter.origin
        # The dead letter's place and stored time: a stream deleted and made again numbers
        # from 1 again, and a copy taken for a duplicate of another would be lost.
        msg_id = f"{self.stream}:{letter.ref}:{letter.properties.get('stored', '')}:replay"
        try:
            await self._js.publish(
                naming.ready_subject(self._prefix, key),
                letter.body,
                timeout=PUBLISH_TIMEOUT_S,
                stream=naming.delay_stream(self._prefix),
                headers=wire.encode(headers, msg_id=msg_id),
            )
        except (NatsError, JetStreamError, TimeoutError) as exc:
            raise OperationError(
                f"the copy of dead letter {letter.ref} to {key!r} was not confirmed ({exc!r}): "
                "it stays in the dead-letter stream"
            ) from exc
        return await self.remove(letter)

    async def remove(self, letter: Stored) -> bool:
        """Delete the dead letter at its sequence; ``False`` if it was gone."""
        try:
            return bool(await self._js.delete_msg(self.stream, int(letter.ref)))
        except NotFoundError:
            return False
        except JetStreamError as exc:
            if "no message found" in str(exc).lower() or "10057" in str(exc):
                return False
            raise

    def line(self, letter: Stored) -> dict[str, Any]:
        """An export line keeps the subject the dead letter is stored under."""
        return {"subject": letter.subject}

    async def put(self, record: ExportRecord, to: str | None) -> None:
        """Publish an exported dead letter back to its subject (``to``: a key's), confirmed.

        Its ``Nats-*`` headers stay out (``Nats-Msg-Id`` would have the server drop it as
        a duplicate of the dead letter it was exported from, within the window).
        """
        subject = naming.dlq_subject(self._prefix, to) if to else record.extra.get("subject")
        if not isinstance(subject, str) or not subject.startswith(
            naming.dlq_subject(self._prefix, self.stream_of() + ".")
        ):
            raise OperationError(
                f"{subject!r} is not a subject of {self.stream!r}: import it into the "
                "dead-letter stream it was exported from"
            )
        headers = {k: v for k, v in record.headers.items() if not k.lower().startswith("nats-")}
        try:
            await self._js.publish(
                subject,
                record.body,
                timeout=PUBLISH_TIMEOUT_S,
                stream=self.stream,
                headers=headers or None,
            )
        except (NatsError, JetStreamError, TimeoutError) as exc:
            raise OperationError(f"{subject!r} did not take a message ({exc!r})") from exc
