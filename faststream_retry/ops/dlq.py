"""Dead letters: list, show, replay, purge, export and import them (see ``walk`` for how).

Each function takes the work queue or its ``.dlq`` by name. Selections and limits
choose which dead letters an operation takes; the rest stay in the queue, in order.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faststream_retry.core import headers as h
from faststream_retry.core.topology import dlq_of, dlq_owner
from faststream_retry.ops.common import OperationError, check_name, name_problem, shown_name
from faststream_retry.ops.records import JSON_FORMAT, Body, DeadLetter, Decoder, Selection
from faststream_retry.ops.walk import (
    DROP,
    KEEP,
    Move,
    Pass,
    Seen,
    TooLarge,
    oversize,
    publish,
    walk,
)
from faststream_retry.ops.wire import Record, fingerprint, read_line, write_line
from faststream_retry.rabbit.probe import depth

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from aio_pika.abc import AbstractConnection

    from faststream_retry.ops.walk import Step

__all__ = [
    "JSON_FORMAT",
    "Imported",
    "Outcome",
    "check_target",
    "export_dead_letters",
    "import_messages",
    "list_dead_letters",
    "purge_dead_letters",
    "purge_exported",
    "replay_dead_letters",
    "show_dead_letter",
]

LIST_LIMIT = 100


@dataclass(slots=True)
class Outcome:
    """What an operation did: which dead letters it took, and the pass's counts."""

    queue: str
    taken: list[DeadLetter] = field(default_factory=list)
    """The selected dead letters (moved, dropped or written), in queue order."""
    done: Pass | None = None
    target: str | None = None
    not_found: int = 0
    """(``purge_exported``) messages of the export that the queue no longer holds as they were."""
    limit: int | None = None
    more: bool = False
    """A dead letter past ``limit`` was selected too: ``taken`` is not all of them."""

    @property
    def complete(self) -> bool:
        """Whether ``taken`` holds every selected dead letter the queue held at the start.

        A list that reached its limit looks on for one more match, and stops there.
        """
        return not self.more

    def counts(self) -> dict[str, Any]:
        """Return the pass's counts, as every ``--json`` answer of a ``dlq`` command has them."""
        done = self.done
        if done is None:
            return {}
        return {
            "in_queue_before": done.total,
            "visited": done.visited,
            "kept": done.kept,
            "moved": done.moved,
            "removed": done.dropped,
            "kept_in_place": done.in_place,
            "consumers": done.consumers,
            "too_large": [item.to_json() for item in done.too_large],
        }

    def to_json(self, **fields: Any) -> dict[str, Any]:  # noqa: ANN401 - JSON values
        """Return the answer of a ``dlq`` command (and of the page's API) as JSON-able data.

        One shape for the command's ``--json`` and the page's API: ``format``, the
        ``queue`` gone through (the ``.dlq``), the command's own ``fields``, then the
        pass's counts (``counts``).
        """
        return {"format": JSON_FORMAT, "queue": self.queue, **fields, **self.counts()}

    def listing(self) -> dict[str, Any]:
        """Return the answer of ``dlq list --json``: the rows, and whether they are all."""
        return self.to_json(
            complete=self.complete,
            limit=self.limit,
            dead_letters=[letter.summary() for letter in self.taken],
        )

    def replayed(self, *, dry_run: bool) -> dict[str, Any]:
        """Return the answer of ``dlq replay --json``."""
        return self.to_json(
            to=self.target, dry_run=dry_run, selected=[letter.key for letter in self.taken]
        )

    def purged(self, *, from_export: bool = False) -> dict[str, Any]:
        """Return the answer of ``dlq purge --json``."""
        extra = {"not_found": self.not_found} if from_export else {}
        return self.to_json(selected=[letter.key for letter in self.taken], **extra)

    def exported(self, file: str) -> dict[str, Any]:
        """Return the answer of ``dlq export --json`` (``file``: where it was written)."""
        return self.to_json(file=file, exported=[letter.key for letter in self.taken])


@dataclass(slots=True)
class Imported:
    """What an import did: how many it published, and the lines no publish can carry."""

    published: int = 0
    too_large: list[TooLarge] = field(default_factory=list)
    """Lines whose message's headers do not fit in a frame (``position``: the line)."""


def _read(seen: Seen, decoder: Decoder | None = None) -> DeadLetter:
    props = seen.properties
    return DeadLetter.read(
        seen.position,
        seen.body,
        {
            "content_type": props.content_type,
            "content_encoding": props.content_encoding,
            "message_id": props.message_id,
            "correlation_id": props.correlation_id,
            "delivery_mode": props.delivery_mode,
            "priority": props.priority,
            "timestamp": props.timestamp,
            "type": props.message_type,
            "app_id": props.app_id,
            "user_id": props.user_id,
            "reply_to": props.reply_to,
            "expiration": props.expiration,
        },
        props.headers,
        decoder,
    )


def _target(queue: str, to: str | None) -> str:
    """Where replayed dead letters of ``queue``'s DLQ go: ``to``, or the work queue."""
    return to or dlq_owner(dlq_of(queue))


async def check_target(connection: AbstractConnection, target: str) -> None:
    """Make sure a replay can reach ``target``, before anything moves (a dry run too).

    A replay publishes by the default exchange, straight to the queue of that name:
    one that does not exist would return the first copy (``NO_ROUTE``), and a name
    AMQP cannot carry would break the connection.

    Raises:
        OperationError: the name is too long or empty, or no such queue exists; the
            same text for a dry run and a real one.
    """
    problem = name_problem(target)
    if problem is None and await depth(connection, target) is None:
        problem = (
            "it does not exist (declare it, start the app that consumes it, or name another queue)"
        )
    if problem is not None:
        raise OperationError(
            f"cannot replay to queue {shown_name(target)}: {problem}; nothing was replayed"
        )


async def list_dead_letters(
    connection: AbstractConnection,
    queue: str,
    *,
    selection: Selection | None = None,
    limit: int | None = LIST_LIMIT,
    decoder: Decoder | None = None,
    progress: Callable[[Pass], None] | None = None,
    keep: Callable[[DeadLetter], DeadLetter] | None = None,
) -> Outcome:
    """Return the dead letters of ``queue`` that ``selection`` takes, head first, up to ``limit``.

    Nothing is removed or spent (see ``walk``: a queue not known to be classic is
    passed through whole even with a limit, so its order is kept). A process killed
    mid-pass can leave the copies in flight twice and the queue's order rotated.
    ``keep`` returns what to keep of each (the page cuts bodies as it reads, so a queue
    of large messages is never held whole); all of it without.
    """
    return await _pass(
        connection,
        queue,
        lambda _seen, _letter: KEEP,
        selection=selection,
        limit=limit,
        progress=progress,
        decoder=decoder,
        keep=keep,
        look_past_limit=True,
    )


async def show_dead_letter(
    connection: AbstractConnection, queue: str, key: str, *, decoder: Decoder | None = None
) -> DeadLetter | None:
    """Return the dead letter with message id ``key`` (or ``#position``), if there is one."""
    # The first match is enough: no look past it (which a list makes, to say if it is whole).
    found = await _pass(
        connection,
        queue,
        lambda _seen, _letter: KEEP,
        selection=Selection(ids=frozenset({key})),
        limit=1,
        progress=None,
        decoder=decoder,
    )
    return found.taken[0] if found.taken else None


async def replay_dead_letters(
    connection: AbstractConnection,
    queue: str,
    *,
    selection: Selection | None = None,
    to: str | None = None,
    limit: int | None = None,
    rate: float | None = None,
    dry_run: bool = False,
    now_ms: Callable[[], int] = h.now_ms,
    progress: Callable[[Pass], None] | None = None,
) -> Outcome:
    """Send the selected dead letters back to work, with a fresh retry state.

    Each goes to its work queue (``queue`` without ``.dlq``), or to ``to``, by the
    default exchange: to that queue only, never through the exchange it first came
    by. Its attempt count and failure headers are reset and what they said is kept in
    a ``retry-replayed`` record. The pass is bounded by what was in the DLQ when it
    began, so a message that fails again during the replay is not replayed again.
    ``dry_run`` returns what would move and moves nothing. A dead letter whose headers
    do not fit in a frame stays (``done.too_large``); the others are replayed.

    Raises:
        OperationError: the DLQ or the target queue does not exist (checked before
            anything moves, for a dry run too), or a publish failed (the target was
            deleted meanwhile, say): what moved before stays moved, the rest stays.
    """
    target = _target(queue, to)
    check_name(dlq_of(queue))
    await check_target(connection, target)

    def step(seen: Seen, _letter: DeadLetter) -> Step:
        if dry_run:
            return KEEP
        # A copy of the properties: should the move fail, the dead letter is kept as
        # it was, its retry state intact.
        properties = copy.copy(seen.properties)
        properties.headers = h.replayed_headers(seen.properties.headers, now_ms())
        return Move("", target, seen.body, properties)

    outcome = await _pass(
        connection, queue, step, selection=selection, limit=limit, progress=progress, rate=rate
    )
    outcome.target = target
    return outcome


async def purge_dead_letters(
    connection: AbstractConnection,
    queue: str,
    *,
    selection: Selection | None = None,
    limit: int | None = None,
    progress: Callable[[Pass], None] | None = None,
) -> Outcome:
    """Remove the selected dead letters for good (``export_dead_letters`` first keeps a copy)."""
    return await _pass(
        connection,
        queue,
        lambda _seen, _letter: DROP,
        selection=selection,
        limit=limit,
        progress=progress,
    )


async def purge_exported(
    connection: AbstractConnection,
    queue: str,
    lines: Iterable[str],
    *,
    source: str = "<input>",
    progress: Callable[[Pass], None] | None = None,
) -> Outcome:
    """Remove exactly the dead letters an export of ``queue`` holds, and nothing else.

    Each line of ``lines`` (``export_dead_letters``'s) names a message by its content
    (``wire.fingerprint``): a dead letter goes only if the export holds the same body,
    properties and headers, and no more of them than the export holds (a duplicate
    that arrived after the export stays). Dead letters that arrived after the export,
    whatever their failure times, stay. ``Outcome.not_found`` counts the export's
    messages the queue did not hold any more as they were.

    Raises:
        OperationError: a line is not an exported message, or was exported from another
            queue; nothing was removed.
    """
    dlq = dlq_of(queue)
    wanted: Counter[str] = Counter()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = read_line(line, f"{source}:{number}")
        if record.queue != dlq:
            raise OperationError(
                f"{source}:{number} was exported from {record.queue}, not {dlq}: nothing was "
                f"removed. Purge {record.queue} with it instead"
            )
        wanted[fingerprint(record.properties, record.body)] += 1
    outcome = Outcome(dlq)
    left = sum(wanted.values())

    async def visit(seen: Seen) -> Step:
        nonlocal left
        key = fingerprint(seen.properties, seen.body)
        if wanted[key] <= 0:
            return KEEP
        wanted[key] -= 1
        left -= 1
        outcome.taken.append(_read(seen))
        return DROP

    outcome.done = await walk(connection, dlq, visit, enough=lambda: left == 0, progress=progress)
    outcome.not_found = left
    return outcome


async def export_dead_letters(
    connection: AbstractConnection,
    queue: str,
    write: Callable[[str], object],
    *,
    selection: Selection | None = None,
    limit: int | None = None,
    progress: Callable[[Pass], None] | None = None,
) -> Outcome:
    """Write the selected dead letters as JSON Lines through ``write``; they stay in the queue.

    Every byte of the body and every property and header is kept (``ops.wire``), so
    ``import_messages`` can put back what a purge removed. ``Outcome.taken`` names each
    (its fields, not its body or headers: an export of any size is never held whole).

    Raises:
        OperationError: ``write`` failed (a full disk, a closed pipe): the pass went on
            without writing, so the queue keeps its order, and the text says why.
    """
    dlq = dlq_of(queue)
    failed: list[OSError] = []

    def step(seen: Seen, _letter: DeadLetter) -> Step:
        if not failed:
            try:
                write(write_line(Record(dlq, seen.properties, seen.body)))
            except OSError as exc:
                # Going on without writing: a pass stopped here would leave a quorum
                # queue rotated (what it went through behind the rest).
                failed.append(exc)
        return KEEP

    outcome = await _pass(
        connection, queue, step, selection=selection, limit=limit, progress=progress, keep=_bare
    )
    if failed:
        raise OperationError(
            f"the export could not be written ({failed[0].strerror or failed[0]!r}): it is "
            f"incomplete, and every dead letter is still in {dlq}, in its order"
        ) from failed[0]
    return outcome


def _bare(letter: DeadLetter) -> DeadLetter:
    """``letter`` without what takes room: its body, headers, traceback and history."""
    return dataclasses.replace(
        letter,
        body=Body(letter.body.kind, ""),
        headers={},
        traceback="",
        history=[],
        replayed=[],
    )


async def import_messages(
    connection: AbstractConnection,
    lines: Iterable[str],
    *,
    source: str = "<input>",
    to: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> Imported:
    """Publish every exported message in ``lines`` to ``to`` or the queue it was exported from.

    Every line is checked first: a damaged file publishes nothing. A message whose
    headers do not fit in a frame cannot be published at all (its line is skipped and
    named in ``Imported.too_large``); the others are. The copies are confirmed one by
    one.

    Raises:
        OperationError: a line is not an exported message (nothing was published),
            or the broker did not take one (the count so far is in the text).
    """
    # Every line is read before the first is published: a damaged file publishes
    # nothing, so running the import again after a fix duplicates nothing.
    records = [
        (number, read_line(line, f"{source}:{number}"))
        for number, line in enumerate(lines, 1)
        if line.strip()
    ]
    channel = await connection.channel(publisher_confirms=True)
    done = Imported()
    user = getattr(getattr(connection, "url", None), "user", None)
    try:
        underlay = await channel.get_underlay_channel()
        moves = [
            (number, Move("", to or record.queue, record.body, record.properties))
            for number, record in records
        ]
        for number, move in moves:
            too_large = oversize(underlay, move, user, number)
            if too_large is not None:
                done.too_large.append(too_large)
                continue
            try:
                await publish(underlay, move, user)
            except OperationError as exc:
                raise OperationError(
                    f"{exc}; {done.published} published before {source}:{number}"
                ) from exc
            done.published += 1
            if progress is not None:
                progress(done.published)
    finally:
        if not channel.is_closed:
            await channel.close()
    return done


async def _pass(
    connection: AbstractConnection,
    queue: str,
    step: Callable[[Seen, DeadLetter], Step],
    *,
    selection: Selection | None,
    limit: int | None,
    progress: Callable[[Pass], None] | None,
    decoder: Decoder | None = None,
    rate: float | None = None,
    keep: Callable[[DeadLetter], DeadLetter] | None = None,
    look_past_limit: bool = False,
) -> Outcome:
    """Pass through ``queue``'s DLQ, doing ``step`` with each selected dead letter.

    ``keep`` returns what ``Outcome.taken`` keeps of each (the whole letter without it).
    ``look_past_limit``: at the limit, look on for one more selected dead letter, so
    ``Outcome.complete`` is exact (a list); otherwise stop looking there.
    """
    dlq = dlq_of(queue)
    outcome = Outcome(dlq, limit=limit)
    chosen = selection or Selection()

    async def visit(seen: Seen) -> Step:
        letter = _read(seen, decoder)
        if not chosen.matches(letter):
            return KEEP
        if limit is not None and len(outcome.taken) >= limit:
            outcome.more = True  # one past the limit: the answer is not whole
            return KEEP
        outcome.taken.append(letter if keep is None else keep(letter))
        return step(seen, letter)

    def enough() -> bool:
        if look_past_limit:
            return outcome.more
        return limit is not None and len(outcome.taken) >= limit

    outcome.done = await walk(connection, dlq, visit, enough=enough, rate=rate, progress=progress)
    return outcome
