"""Dead letters on Redis: the ``dlq`` commands' ``Store`` of a ``P.dlq`` stream.

The plugin keeps the dead letters of a covered stream ``S`` in the stream ``P.dlq``
(``redis.keys``: ``{S}.dlq``, or ``S.dlq`` when ``S`` has a hash tag), each entry one
field ``__data__`` in FastStream's binary format (``redis.envelope``). A command names
them by the covered stream or by the ``.dlq`` key itself; a name ending ``.dlq`` is the
key only when it is some stream's ``P.dlq`` (``keys.dlq_owners``): ``payments.dlq`` is a
stream like any other, whose dead letters are in ``{payments.dlq}.dlq``.

- Reading is ``XRANGE``, a page at a time, up to the last entry there when it began: no
  group, nothing acknowledged or claimed.
- A replay is one script: ``XADD`` the copy to its stream and ``XDEL`` the dead letter,
  only if the dead letter is there: never lost, never twice, however many replays run at
  once. Its stream is the one the key belongs to (named by the command, or the key's
  owner), never one a header names: a dead letter whose ``retry-origin-queue`` names
  another stream is refused unless ``--to`` says where it goes.
- An import adds each exported dead letter with ``XADD``, one at a time; a failure says how many
  went in and from which line to go on.

Imported by the commands only for a ``redis://`` URL: it needs redis-py.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from faststream_retry.core import headers as h
from faststream_retry.errors import RetryConfigError
from faststream_retry.ops import redis_client
from faststream_retry.ops.common import CONNECT_TIMEOUT_S, OperationError, shown_name
from faststream_retry.ops.dlq_store import ExportRecord, Stored
from faststream_retry.redis import envelope
from faststream_retry.redis.keys import dlq_owners, stream_keys

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from faststream_retry.ops.redis_client import Client

__all__ = ["REPLAY", "RedisStore", "open_store"]

PAGE = 200

REPLAY = """
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[2], '*', '__data__', ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
"""
"""KEYS dlq, target stream; ARGV entry id, copy. The copy only if the dead letter is there.

Written first, removed last: Redis keeps a script's writes when a later command fails (an
ACL that denies ``XADD``, a full server), so a replay stopped part-way keeps its dead
letter rather than deleting it with no copy made (at worst a copy beside it: a duplicate).
"""


def _safe(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    _, at, host = rest.rpartition("@")
    return f"{scheme}://***@{host}" if sep and at else url


@asynccontextmanager
async def open_store(url: str, queue: str) -> AsyncIterator[RedisStore]:
    """The dead letters ``queue`` names on the server at ``url`` (see the module docstring).

    On a Redis Cluster's node, a cluster client: each key is read where its slot is.

    Raises:
        OperationError: the server cannot be reached, or refused a command.
    """
    async with redis_client.connect(url, connect_timeout=CONNECT_TIMEOUT_S, timeout=30.0) as client:
        store = RedisStore(client, queue)
        try:
            await store.open()
            yield store
        except (RedisError, OSError) as exc:
            raise OperationError(
                f"Redis at {_safe(url)} stopped answering or refused ({exc!r}): a dead letter "
                "is removed only in the step that writes its copy, so none was lost; run the "
                "command again"
            ) from exc


class RedisStore:
    """The dead-letter stream of one covered stream."""

    system = "redis"

    def __init__(self, client: Client, queue: str) -> None:
        """Name the ``.dlq`` key ``queue`` means; nothing is asked yet.

        Raises:
            OperationError: no key of the plugin's can follow from ``queue``.
        """
        self._client = client
        self.origin = ""
        self._named_key = bool(dlq_owners(queue))
        if self._named_key:
            self.name = queue
            self._owners = dlq_owners(queue)
            # {orders}.dlq is the key of both orders and {orders}: only a start that
            # covered one of them made it, and each letter's origin says which.
            if len(self._owners) == 1:
                self.origin = self._owners[0]
        else:
            self.origin = queue
            self._owners = (queue,)
            try:
                self.name = stream_keys(queue).dlq
            except RetryConfigError as exc:
                raise OperationError(str(exc)) from None
        self._replay = client.register_script(REPLAY)
        self._targets: set[str] = set()

    async def open(self) -> None:
        """Check that the key is a stream (or absent: no dead letter yet) no group reads.

        Raises:
            OperationError: it holds something else, or an app consumes it.
        """
        kind = await self._kind(self.name)
        if kind not in {"stream", "none"}:
            raise OperationError(
                f"{shown_name(self.name)} is a {kind}, not the plugin's dead-letter stream"
            )
        if kind == "stream" and self._named_key:
            groups = await self._client.xinfo_groups(self.name)
            if groups:
                names = ", ".join(shown_name(_decode(g.get("name"))) for g in groups)
                raise OperationError(
                    f"{shown_name(self.name)} is read by consumer group {names}: it is a "
                    "stream an app consumes, not a dead-letter stream (no group reads the "
                    f"plugin's). Its own dead letters are in "
                    f"{shown_name(stream_keys(self.name).dlq)}: give that key as QUEUE to "
                    "reach them; nothing was done"
                )

    async def _kind(self, key: str) -> str:
        kind = await self._client.type(key)
        return _decode(kind)

    async def total(self) -> int:
        """``XLEN``."""
        return int(await self._client.xlen(self.name))

    async def read(self) -> AsyncIterator[Stored]:
        """Each entry by id, oldest first, up to the last one there at the start."""
        client: Any = self._client  # redis-py's stubs type replies loosely
        last = await client.xrevrange(self.name, count=1)
        if not last:
            return
        end: bytes = last[0][0]
        start: bytes = b"-"
        position = 0
        while True:
            page: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(
                self.name, min=start, max=end, count=PAGE
            )
            for entry_id, fields in page:
                position += 1
                yield self._stored(position, entry_id, fields)
            if len(page) < PAGE:
                return
            start = b"(" + page[-1][0]

    def _stored(self, position: int, entry_id: bytes, fields: dict[bytes, bytes]) -> Stored:
        parsed = envelope.parse(fields)
        raw = {str(k): str(v) for k, v in parsed.headers.items()}
        decoded = envelope.from_wire(raw)
        message_id = raw.get("message_id")
        return Stored(
            position=position,
            ref=entry_id.decode(),
            body=parsed.body,
            headers=raw,
            decoded=decoded,
            properties={
                "message_id": message_id or None,
                "content_type": raw.get("content-type"),
                "entry_id": entry_id.decode(),
            },
            origin=self._target_of(h.read_text(decoded, h.ORIGIN_QUEUE, h.QUEUE_LIMIT)),
        )

    def _target_of(self, said: str) -> str:
        """The stream a dead letter goes back to: this key's, whichever its header says.

        ``""``: none can be told (its header names another stream, or none and the key
        is two streams'): ``check_target`` refuses it unless ``--to``.
        """
        for owner in self._owners:
            if said in {owner, h.truncate(owner, h.QUEUE_LIMIT)}:
                return owner
        return self.origin if not said else ""

    async def check_target(self, target: str | None, letters: list[Stored]) -> None:
        """Each target must be a stream that exists (a typo would make a new one).

        Without ``target``, each letter goes back to the stream whose dead-letter key
        holds it; one whose ``retry-origin-queue`` names another stream is refused.

        Raises:
            OperationError: one is missing, or not a stream; a letter's target is not
                this key's stream.
        """
        if target is None:
            for letter in letters:
                if not letter.origin:
                    raise OperationError(self._foreign(letter))
        names = {target} if target else {letter.origin for letter in letters}
        for name in sorted(names):
            self._check_slot(name)
            await self._check_stream(name, "replay", "; nothing was replayed")

    def _check_slot(self, name: str) -> None:
        """On a cluster, the replay's one script needs the target in the dead letters' slot."""
        client: Any = self._client
        if redis_client.is_cluster(client) and client.keyslot(name) != client.keyslot(self.name):
            raise OperationError(
                f"cannot replay to stream {shown_name(name)} on this Redis Cluster: it is not "
                f"in the hash slot of {shown_name(self.name)}, and a replay adds the copy and "
                "removes the dead letter in one script, on one node. Export the dead letters "
                "and import them with --to instead; nothing was replayed"
            )

    def _foreign(self, letter: Stored) -> str:
        said = h.read_text(letter.decoded, h.ORIGIN_QUEUE, h.QUEUE_LIMIT)
        where = " or ".join(shown_name(owner) for owner in self._owners)
        if not said:
            return (
                f"dead letter {letter.ref} names no stream it came from (no "
                f"retry-origin-queue) and {shown_name(self.name)} holds the dead letters of "
                f"{where}: give --to STREAM; nothing was replayed"
            )
        return (
            f"dead letter {letter.ref} says it came from stream {shown_name(said)}, but it "
            f"is in {shown_name(self.name)}, the dead letters of {where}: a replay puts a "
            "dead letter back only into the stream its key belongs to. Select it out "
            "(--id), or give --to STREAM if it belongs there; nothing was replayed"
        )

    async def _check_stream(self, name: str, verb: str, after: str = "") -> None:
        if name in self._targets:
            return
        kind = await self._kind(name)
        if kind != "stream":
            why = "it does not exist" if kind == "none" else f"it is a {kind}"
            raise OperationError(
                f"cannot {verb} to stream {shown_name(name)}: {why} (start the app that "
                f"reads it, or name another with --to){after}"
            )
        self._targets.add(name)

    async def replay(self, letter: Stored, headers: dict[str, Any], target: str | None) -> bool:
        """One script: add the dead letter's copy to its stream and remove it, or neither."""
        to = target or letter.origin
        if not to:
            raise OperationError(self._foreign(letter))
        try:
            copy = envelope.build(letter.body, envelope.to_wire(headers))
        except envelope.EnvelopeTooLarge as exc:
            raise OperationError(f"dead letter {letter.ref} cannot be replayed: {exc}") from exc
        done = await self._replay(keys=[self.name, to], args=[letter.ref, copy])
        return bool(done)

    async def remove(self, letter: Stored) -> bool:
        """``XDEL``; ``False`` if it was gone."""
        return bool(await self._client.xdel(self.name, letter.ref))

    def line(self, letter: Stored) -> dict[str, Any]:  # noqa: ARG002 - the Store's signature
        """Nothing of Redis' own: the entry id is made anew on import."""
        return {}

    async def put(self, record: ExportRecord, to: str | None) -> None:
        """``XADD`` the exported dead letter to this dead-letter stream (or ``to``).

        ``to`` is checked as a replay's target is, before its first entry: a stream that
        exists.

        Raises:
            OperationError: ``to`` is not a stream, the entry does not fit, or Redis
                refused it or stopped answering (the text says whether it may be in).
        """
        target = to or self.name
        try:
            if to:
                await self._check_stream(to, "import")
            data = envelope.build(record.body, record.headers)
        except envelope.EnvelopeTooLarge as exc:
            raise OperationError(f"cannot import it: {exc}") from exc
        except (RedisError, OSError) as exc:
            raise OperationError(f"Redis refused or stopped answering ({exc!r})") from exc
        try:
            await self._client.xadd(target, {envelope.DATA_FIELD: data})
        except (RedisError, OSError) as exc:
            raise OperationError(
                f"Redis refused it or stopped answering ({exc!r}); if the connection was cut, "
                f"it may have been added: look at the last entry of {shown_name(target)}"
            ) from exc


def _decode(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
