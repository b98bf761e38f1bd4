"""Dead letters on a broker that keeps them in a stream: NATS JetStream and Redis Streams.

The same operations and answers as ``ops.dlq`` (RabbitMQ), on a ``Store``: a stream of
dead letters that can be *read without consuming* (by sequence or entry id) and whose
entries can be *removed one by one*. So, unlike a queue, nothing is moved to be read:
``list`` and ``show`` change nothing, and a replay publishes a copy, waits for the
server's confirmation, then removes that one dead letter (``Store.replay``).

Each broker's store is a module of its own (``ops.nats_dlq``, ``ops.redis_dlq``);
``ops.dlq_open.open_store`` picks one by the URL's scheme and imports only that
broker's client.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import shutil
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from faststream_retry.core import headers as h
from faststream_retry.ops.common import OperationError
from faststream_retry.ops.dlq import LIST_LIMIT, Imported, Outcome
from faststream_retry.ops.pace import Rate
from faststream_retry.ops.records import DeadLetter, Decoder, Selection
from faststream_retry.ops.walk import Pass
from faststream_retry.ops.wire import FORMAT, decode_value, encode_value

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable, Iterator
    from typing import TextIO

__all__ = [
    "LIST_LIMIT",
    "ExportRecord",
    "Store",
    "Stored",
    "export_dead_letters",
    "import_messages",
    "list_dead_letters",
    "purge_dead_letters",
    "purge_exported",
    "queue_of",
    "replay_dead_letters",
    "rereadable",
    "show_dead_letter",
]


@dataclass(frozen=True, slots=True)
class Stored:
    """One dead letter as its stream holds it."""

    position: int
    """1 for the oldest dead letter in the stream (or under the key) when it was read."""
    ref: str
    """Where it is: the stream sequence (NATS) or the entry id (Redis)."""
    body: bytes
    headers: dict[str, str]
    """Its headers as the broker carries them (text), for an export and a fingerprint."""
    decoded: dict[str, Any]
    """Its headers as the core reads them (``retry-*`` values parsed)."""
    properties: dict[str, Any] = field(default_factory=dict)
    """What ``DeadLetter`` shows as properties: its message id and content type."""
    origin: str = ""
    """The covered subscriber (NATS key) or stream (Redis) it failed in: a replay's target."""
    subject: str = ""
    """(NATS) the subject it is stored under, which an import puts it back on."""


class Store(Protocol):
    """One dead-letter stream (or one subscriber's part of it) on a broker."""

    name: str
    """What the answers call the ``queue``: the dead-letter stream, or its key."""
    system: str
    """``nats`` or ``redis``."""
    origin: str
    """Where the dead letters named go back to by default, when the name says (the covered
    stream, the subscriber's key); ``""``: each one's own ``retry-origin-queue``."""

    async def total(self) -> int:
        """How many dead letters it holds now."""
        ...

    def read(self) -> AsyncIterator[Stored]:
        """Every dead letter held when the read began, oldest first; nothing consumed."""
        ...

    async def check_target(self, target: str | None, letters: list[Stored]) -> None:
        """Raise ``OperationError`` if a replay of ``letters`` to ``target`` cannot land."""
        ...

    async def replay(self, letter: Stored, headers: dict[str, Any], target: str | None) -> bool:
        """Publish ``letter`` with ``headers`` to ``target`` (its origin), confirmed; remove it.

        Returns ``False`` when the dead letter was gone already (another replay or purge
        took it): then nothing was published.
        """
        ...

    async def remove(self, letter: Stored) -> bool:
        """Remove ``letter``; ``False`` if it was gone already."""
        ...

    def line(self, letter: Stored) -> dict[str, Any]:
        """The broker's own fields of an export line (``subject``), besides the common ones."""
        ...

    async def put(self, record: ExportRecord, to: str | None) -> None:
        """Publish an exported dead letter back, to ``to`` or where it was exported from."""
        ...


def _letter(stored: Stored, decoder: Decoder | None = None) -> DeadLetter:
    return DeadLetter.read(stored.position, stored.body, stored.properties, stored.decoded, decoder)


async def _pass(
    store: Store,
    step: Callable[[Stored], Any] | None,
    *,
    selection: Selection | None,
    limit: int | None,
    decoder: Decoder | None = None,
    look_past_limit: bool = False,
    keep: Callable[[DeadLetter], DeadLetter] | None = None,
    progress: Callable[[Pass], None] | None = None,
) -> tuple[Outcome, list[Stored]]:
    """Read ``store`` head first; collect the selected letters, up to ``limit``.

    ``look_past_limit``: at the limit, read on for one more selected letter, so that
    ``Outcome.complete`` is exact. Returns the outcome and the stored letters taken.
    """
    chosen = selection or Selection()
    done = Pass(store.name, await store.total(), in_place=True)
    outcome = Outcome(store.name, done=done, limit=limit)
    taken: list[Stored] = []
    async for stored in store.read():
        done.visited += 1
        letter = _letter(stored, decoder)
        if not chosen.matches(letter):
            done.kept += 1
            continue
        if limit is not None and len(taken) >= limit:
            outcome.more = True
            done.kept += 1
            break
        taken.append(stored)
        outcome.taken.append(letter if keep is None else keep(letter))
        if step is not None:
            await step(stored)
        else:
            done.kept += 1
        if progress is not None:
            progress(done)
        if not look_past_limit and limit is not None and len(taken) >= limit:
            break
    # A stream can hold more than were there at the start (new dead letters): the
    # count is what the pass saw, so that visited <= total stays true.
    done.total = max(done.total, done.visited)
    return outcome, taken


async def list_dead_letters(
    store: Store,
    *,
    selection: Selection | None = None,
    limit: int | None = LIST_LIMIT,
    decoder: Decoder | None = None,
    keep: Callable[[DeadLetter], DeadLetter] | None = None,
) -> Outcome:
    """Return the selected dead letters, oldest first, up to ``limit``; nothing is consumed.

    ``Outcome.complete`` is exact: at the limit the read goes on to the next selected
    dead letter, and says whether there was one.
    """
    outcome, _ = await _pass(
        store,
        None,
        selection=selection,
        limit=limit,
        decoder=decoder,
        look_past_limit=True,
        keep=keep,
    )
    return outcome


async def show_dead_letter(
    store: Store, key: str, *, decoder: Decoder | None = None
) -> DeadLetter | None:
    """Return the dead letter with message id ``key`` (or ``#position``), if there is one."""
    outcome, _ = await _pass(
        store, None, selection=Selection(ids=frozenset({key})), limit=1, decoder=decoder
    )
    return outcome.taken[0] if outcome.taken else None


async def replay_dead_letters(
    store: Store,
    *,
    selection: Selection | None = None,
    to: str | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    now_ms: Callable[[], int] = h.now_ms,
    rate: float | None = None,
    progress: Callable[[Pass], None] | None = None,
) -> Outcome:
    """Send the selected dead letters back to their subscriber (or ``to``), a fresh retry state.

    The selection is read first (nothing moves), every target checked, then each dead
    letter is published, confirmed by the server, and only then removed: a failure
    stops the replay with what was replayed replayed and the rest in place. A replay
    killed between a confirmation and the removal leaves that one dead letter in place
    as well as its copy (NATS: a replay run again within the stream's duplicate window,
    2 minutes, publishes no second copy; Redis: publish and removal are one script).
    ``rate``: at most this many a second (a replayed poison fails again at once: a
    thousand of them back at full speed would crowd the subscriber's good messages).

    Raises:
        OperationError: a target cannot take the copies (checked before anything
            moves, for a dry run too), or a publish was not confirmed.
    """
    outcome, taken = await _pass(store, None, selection=selection, limit=limit)
    await store.check_target(to, taken)
    # A replay that finds nothing (another took them) names the same target as one that does.
    outcome.target = to or _origins(taken) or store.origin or "their own subscribers"
    done = outcome.done
    assert done is not None  # noqa: S101 - _pass always sets it
    if dry_run:
        return outcome
    done.kept -= len(taken)
    pace = Rate(rate)
    for stored in taken:
        await pace.wait()
        headers = h.replayed_headers(stored.decoded, now_ms())
        try:
            moved = await store.replay(stored, headers, to)
        except OperationError as exc:
            raise OperationError(f"{exc}; {done.moved} replayed before it, the rest stay") from exc
        if moved:
            done.moved += 1
        if progress is not None:
            progress(done)
    return outcome


def _origins(letters: list[Stored]) -> str:
    found = sorted({letter.origin for letter in letters if letter.origin})
    return ", ".join(found)


async def purge_dead_letters(
    store: Store,
    *,
    selection: Selection | None = None,
    limit: int | None = None,
    progress: Callable[[Pass], None] | None = None,
) -> Outcome:
    """Remove the selected dead letters for good (``export_dead_letters`` keeps a copy first)."""
    outcome, taken = await _pass(store, None, selection=selection, limit=limit)
    done = outcome.done
    assert done is not None  # noqa: S101 - _pass always sets it
    done.kept -= len(taken)
    for stored in taken:
        if await store.remove(stored):
            done.dropped += 1
        if progress is not None:
            progress(done)
    return outcome


@dataclass(frozen=True, slots=True)
class ExportRecord:
    """One line of an export: where it came from, its headers (as carried) and its body."""

    queue: str
    headers: dict[str, str]
    body: bytes
    extra: dict[str, Any]


def write_line(store: Store, stored: Stored) -> str:
    """Return ``stored`` as one JSON line: ``ops.wire``'s format, headers as the broker has them."""
    data = {
        "format": FORMAT,
        "queue": store.name,
        "system": store.system,
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "properties": {},
        **store.line(stored),
        "headers": encode_value(stored.headers),
        "body": base64.b64encode(stored.body).decode(),
    }
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"


def read_line(line: str, where: str, system: str) -> ExportRecord:
    """Read a line ``write_line`` wrote for ``system``.

    Raises:
        OperationError: the line is not one, or was exported from another broker.
    """
    try:
        data = json.loads(line)
        _check(data)
        found = data.get("system", "rabbitmq")
        if found != system:
            raise OperationError(
                f"{where} was exported from {found}, and this is {system}: nothing was done"
            )
        headers = decode_value(data.get("headers") or {})
        body = base64.b64decode(data["body"], validate=True)
        extra = {k: v for k, v in data.items() if k == "subject"}
        return ExportRecord(
            str(data["queue"]), {str(k): str(v) for k, v in headers.items()}, body, extra
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise OperationError(f"{where}: not an exported message ({exc})") from None


def _check(data: object) -> None:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a format-{FORMAT} record")
    if not isinstance(data.get("headers") or {}, dict):
        raise TypeError("headers is not an object")


def fingerprint(headers: dict[str, str], body: bytes) -> str:
    """A digest of a dead letter's headers and body, the same read from the stream or a line."""
    canonical = json.dumps(
        {"headers": encode_value(headers), "body": base64.b64encode(body).decode()},
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


async def export_dead_letters(
    store: Store,
    write: Callable[[str], object],
    *,
    selection: Selection | None = None,
    limit: int | None = None,
    progress: Callable[[Pass], None] | None = None,
) -> Outcome:
    """Write the selected dead letters as JSON Lines through ``write``; they stay.

    Raises:
        OperationError: ``write`` failed (a full disk, a closed pipe).
    """

    async def step(stored: Stored) -> None:
        try:
            write(write_line(store, stored))
        except OSError as exc:
            raise OperationError(
                f"the export could not be written ({exc.strerror or exc!r}): it is "
                f"incomplete, and every dead letter is still in {store.name}"
            ) from exc

    outcome, _ = await _pass(
        store, step, selection=selection, limit=limit, keep=_bare, progress=progress
    )
    return outcome


def _bare(letter: DeadLetter) -> DeadLetter:
    """``letter`` without what takes room, as ``ops.dlq`` keeps an export's rows."""
    from faststream_retry.ops.records import Body  # noqa: PLC0415

    return dataclasses.replace(
        letter, body=Body(letter.body.kind, ""), headers={}, traceback="", history=[], replayed=[]
    )


async def purge_exported(
    store: Store,
    lines: Iterable[str],
    *,
    source: str = "<input>",
    progress: Callable[[Pass], None] | None = None,
) -> Outcome:
    """Remove exactly the dead letters an export of this stream holds (by content), no more.

    Raises:
        OperationError: a line is not an exported message, or came from another stream.
    """
    wanted: Counter[str] = Counter()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = read_line(line, f"{source}:{number}", store.system)
        if record.queue != store.name:
            raise OperationError(
                f"{source}:{number} was exported from {record.queue}, not {store.name}: "
                f"nothing was removed. Purge {record.queue} with it instead"
            )
        wanted[fingerprint(record.headers, record.body)] += 1
    left = sum(wanted.values())
    done = Pass(store.name, await store.total(), in_place=True)
    outcome = Outcome(store.name, done=done)
    async for stored in store.read():
        if left == 0:
            break
        done.visited += 1
        key = fingerprint(stored.headers, stored.body)
        if wanted[key] <= 0:
            done.kept += 1
            continue
        wanted[key] -= 1
        left -= 1
        outcome.taken.append(_letter(stored))
        if await store.remove(stored):
            done.dropped += 1
        if progress is not None:
            progress(done)
    outcome.not_found = left
    return outcome


async def import_messages(
    store: Store,
    lines: Iterable[str] | Callable[[], Iterable[str]],
    *,
    source: str = "<input>",
    to: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> Imported:
    """Publish every exported dead letter in ``lines`` back, each confirmed.

    Every line is read first: a damaged file publishes nothing. ``lines`` may be a
    function that reads the lines anew at each call (``rereadable``): the file is then
    read twice, a line at a time, and never held in memory whole.

    Raises:
        OperationError: a line is not an exported message (nothing was published),
            or the server did not take one (the count so far is in the text).
    """
    again = lines if callable(lines) else _twice(list(lines))
    for number, line in enumerate(again(), 1):
        if line.strip():
            read_line(line, f"{source}:{number}", store.system)
    done = Imported()
    for number, line in enumerate(again(), 1):
        if not line.strip():
            continue
        record = read_line(line, f"{source}:{number}", store.system)
        try:
            await store.put(record, to)
        except OperationError as exc:
            raise OperationError(_stopped(str(exc), done.published, source, number)) from exc
        done.published += 1
        if progress is not None:
            progress(done.published)
    return done


def _twice(lines: list[str]) -> Callable[[], Iterable[str]]:
    return lambda: lines


@contextmanager
def rereadable(stream: TextIO) -> Iterator[Callable[[], Iterable[str]]]:
    """Read ``stream``'s lines as often as asked, never holding them all in memory.

    A file is read again from its start at each call; a pipe (stdin) is first copied to
    a temporary file, which is removed at the end.
    """
    if stream.seekable():
        start = stream.tell()

        def again() -> Iterable[str]:
            stream.seek(start)
            return stream

        yield again
        return
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="surrogateescape") as copy:
        shutil.copyfileobj(stream, copy)
        copy.seek(0)
        with rereadable(copy) as again:
            yield again


def _stopped(why: str, published: int, source: str, number: int) -> str:
    """What an import stopped at line ``number`` says: how many went in, where to go on."""
    if not published:
        return f"{why}; nothing was imported"
    # Running the whole file again would publish the first ones twice.
    return (
        f"{why}; {published} imported, up to the line before {source}:{number}: to go on "
        f"without importing them twice, import from line {number} on (for example "
        f"tail -n +{number} FILE | faststream-retry dlq import - ...)"
    )


def queue_of(lines: Iterable[str], source: str, *, to: str | None = None) -> str:
    """The one dead-letter stream the lines of an export were exported from.

    Raises:
        OperationError: the file is empty of messages, or names several streams.
    """
    found: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            found.add(str(data["queue"]))
        except (ValueError, KeyError, TypeError):
            raise OperationError(f"{source}:{number}: not an exported message") from None
    if len(found) != 1:
        what = "no message" if not found else f"messages of {len(found)} streams"
        raise OperationError(
            f"{source} holds {what}: import one dead-letter stream's export at a time"
            + ("" if to is None else f" (--to {to} names where they go in it)")
        )
    return found.pop()
