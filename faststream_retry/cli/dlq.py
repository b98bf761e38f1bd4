"""``faststream-retry dlq ...``: list, show, replay, purge, export and import dead letters."""

from __future__ import annotations

import shlex
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from faststream_retry.cli._common import (
    EXIT_ACTION,
    EXIT_ERROR,
    Factory,
    Json,
    app_and_broker,
    err,
    fail,
    out,
    print_json,
    run,
)
from faststream_retry.cli._files import STDOUT, FileRefusedError, check_target, written
from faststream_retry.core import headers as h
from faststream_retry.core.durations import format_ms
from faststream_retry.core.topology import dlq_of, looks_like_intake
from faststream_retry.ops import dlq as ops
from faststream_retry.ops import dlq_store as stores
from faststream_retry.ops.common import OperationError, connect
from faststream_retry.ops.dlq_open import is_store_url, open_store
from faststream_retry.ops.records import (
    DeadLetter,
    Decoder,
    Selection,
    load_decoder,
    not_a_time,
    selection,
)
from faststream_retry.ops.records import moment as time_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from faststream_retry.ops.walk import Pass

__all__ = ["register"]

dlq = typer.Typer(
    help="Look at dead letters, send them back, remove them, save and restore them.",
    no_args_is_help=True,
)

Queue = Annotated[
    str,
    typer.Argument(
        help=(
            "The work queue (or its .dlq). NATS: the covered stream, a subscriber's key "
            "(STREAM.DURABLE) or the dead-letter stream; Redis: the stream (or its .dlq key)."
        ),
        show_default=False,
    ),
]
DlqUrl = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="RABBITMQ_URL",
        show_default=False,
        help=(
            "The broker: amqp://..., nats://... or redis://... (or the RABBITMQ_URL "
            "environment variable, for RabbitMQ); default: --app's broker, else "
            "amqp://guest:guest@localhost:5672/."
        ),
    ),
]
DlqApp = Annotated[
    str | None,
    typer.Option(
        "--app",
        metavar="MODULE:APP",
        help="Work on this app's broker (and its RetryMiddleware's prefix) unless --url says.",
    ),
]
Ids = Annotated[
    list[str] | None, typer.Option("--id", help="A message id (or #position); repeatable.")
]
Reasons = Annotated[
    list[str] | None,
    typer.Option("--reason", help="permanent, exhausted, invalid, ...; repeatable."),
]
Exceptions = Annotated[
    list[str] | None,
    typer.Option("--exception", help="Exception type, qualified or not; repeatable."),
]
Since = Annotated[
    str | None,
    typer.Option("--since", help="Last failure at or after: ISO 8601 or an age (30m, 2h, 7d)."),
]
Until = Annotated[
    str | None, typer.Option("--until", help="Last failure at or before: ISO 8601 or an age.")
]
Limit = Annotated[int | None, typer.Option("--limit", min=1, help="At most this many.")]
StorePrefix = Annotated[
    str,
    typer.Option(
        "--prefix",
        help="NATS: the prefix given to RetryMiddleware (its dead-letter streams' names).",
    ),
]
DecoderOption = Annotated[
    str | None,
    typer.Option(
        "--decoder",
        help="module:function(body, content_type, headers) returning text or a JSON-able value.",
    ),
]


def register(app: typer.Typer) -> None:
    """Add the ``dlq`` group to ``app``."""
    app.add_typer(dlq, name="dlq")


def _broker(url: str | None, app: str | None, prefix: str, *, factory: bool) -> tuple[str, str]:
    """The broker's URL and the plugin's prefix: ``--url`` and ``--prefix``, else ``--app``'s.

    With ``--app``, its broker is used unless ``--url`` (or, for a RabbitMQ app,
    ``RABBITMQ_URL``) names one, and its ``RetryMiddleware``'s prefix.
    """
    loaded, found, _ = app_and_broker(app, url, factory=factory)
    return found, prefix if loaded is None else loaded.plan.options.prefix


def _when(ms: object, *, short: bool = False, clock: bool = False) -> str:
    """A failure time in UTC; ``short`` (list rows) leaves out the date when it is today.

    ``clock``: the time of day only. A header's value that names no time is shown as
    text, escaped for rich (``not_a_time``).
    """
    if ms is None or ms == 0:
        return "-"
    moment = time_of(ms)
    if moment is None:
        return escape(not_a_time(ms))
    if clock:
        return moment.strftime("%H:%M:%S.%f")[:12] + "Z"
    if not short:
        return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:23] + "Z"
    today = moment.date() == datetime.now(timezone.utc).date()
    return moment.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M")


def _select(
    ids: list[str] | None,
    reasons: list[str] | None,
    exceptions: list[str] | None,
    since: str | None,
    until: str | None,
) -> Selection:
    try:
        return selection(ids or (), reasons or (), exceptions or (), since, until)
    except OperationError as exc:
        fail(str(exc))


def _decoder(spec: str | None) -> Decoder | None:
    if spec is None:
        return None
    # As --app does: the decoder's module is found from where the command runs.
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return load_decoder(spec)
    except OperationError as exc:
        fail(str(exc))


@contextmanager
def _progress(what: str, *, show: bool = True) -> Iterator[Callable[[Pass], None]]:
    """A progress bar on stderr (when it is a terminal) fed by a pass's counts."""
    if not show or not err.is_terminal:
        yield lambda _done: None
        return
    with Progress(
        TextColumn(f"{what}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=None, detail="")

        def update(done: Pass) -> None:
            detail = f"moved {done.moved}" if done.moved else ""
            detail += f" removed {done.dropped}" if done.dropped else ""
            bar.update(task, total=done.total, completed=done.visited, detail=detail)

        yield update


def _letters_table(letters: list[DeadLetter], title: str) -> Table:
    """One line per dead letter; the error and the body share what the terminal has left.

    On a narrow terminal the first failure's time goes first (``dlq show`` has it).
    """
    names = ["#", "message id", "reason", "attempts", "exception", "first failure", "last"]
    rows = [
        [
            str(letter.position),
            letter.message_id or "-",
            letter.reason,
            str(letter.attempts),
            letter.exception.rsplit(".", 1)[-1] or "-",
            _when(letter.first_failed_ms, short=True),
            _when(letter.last_failed_ms, short=True),
        ]
        for letter in letters
    ]
    fixed = [max([len(name)] + [len(row[i]) for row in rows]) for i, name in enumerate(names)]
    # Each column is padded by a space on either side, and the edges by one more.
    left = out.width - sum(fixed) - 3 * 9
    if left < 30:
        first = names.index("first failure")
        left += fixed[first] + 3
        for columns in (names, fixed, *rows):
            del columns[first]  # type: ignore[attr-defined]
    left = max(left, 24)
    error_width = max(left * 11 // 20, 12)
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in names[:5]:
        table.add_column(
            name, no_wrap=True, justify="right" if name in {"#", "attempts"} else "left"
        )
    table.add_column("error", no_wrap=True, overflow="ellipsis", max_width=error_width)
    for name in names[5:]:
        table.add_column(name, no_wrap=True)
    table.add_column("body", no_wrap=True, overflow="ellipsis", max_width=left - error_width)
    for row, letter in zip(rows, letters, strict=True):
        table.add_row(
            *map(escape, row[:5]),
            escape(_short(letter.error, error_width)),
            *row[5:],
            escape(letter.body.preview(left - error_width)),
        )
    return table


def _note_consumers(done: Pass | None, *, moving: str = "") -> None:
    """Say what a pass could not see (what consumers hold unacked) or could not publish.

    ``moving`` names what a move of the pass does (``replayed``): a message too large
    to publish was not.
    """
    if done is None:
        return
    if done.consumers:
        err.print(
            f"note: {done.queue} has {done.consumers} consumer(s): the messages they hold "
            "unacked were not seen"
        )
    stays = (
        "stays in its place"
        if done.in_place
        else "went back with one requeue (a quorum queue counts that as a delivery)"
    )
    for item in done.too_large:
        _note(
            f"#{item.position} (message id {item.message_id!r})"
            f"{f' was not {moving} and' if moving else ''} {stays}: {item.why}"
        )
    if done.too_large:
        _note(
            f"{len(done.too_large)} message(s) in {done.queue} cannot be published as they "
            "are: dlq export keeps every byte of them, dlq purge --id removes them"
        )


def _note(text: str) -> None:
    """A note on stderr, printed as it is: message ids are not markup."""
    err.print(f"note: {text}", markup=False, highlight=False)


def _short(text: str, chars: int) -> str:
    line = " ".join(text.split()) or "-"
    return line if len(line) <= chars else line[: chars - 1] + "…"


@dlq.command("list")
def list_(
    queue: Queue,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many rows.")] = (
        ops.LIST_LIMIT
    ),
    ids: Ids = None,
    reasons: Reasons = None,
    exceptions: Exceptions = None,
    since: Since = None,
    until: Until = None,
    decoder: DecoderOption = None,
    as_json: Json = False,
    url: DlqUrl = None,
    app: DlqApp = None,
    factory: Factory = False,
    prefix: StorePrefix = "retry",
) -> None:
    """One row per dead letter, head first. Removes nothing and spends no delivery count.

    A queue not known to be classic (a quorum one) is read by republishing every
    message to its tail, in order, whatever --limit says: a requeue would spend its
    delivery count. Messages that arrive meanwhile land among them. Ctrl-C or SIGTERM
    stops it cleanly; a kill -9 can leave the copies in flight (up to 200) twice and
    the queue rotated (what it went through behind the rest). On NATS and Redis the
    dead-letter stream is read by sequence (NATS) or XRANGE (Redis): nothing moves.
    """
    url, prefix = _broker(url, app, prefix, factory=factory)
    chosen = _select(ids, reasons, exceptions, since, until)
    decode = _decoder(decoder)

    async def go() -> ops.Outcome:
        if is_store_url(url):
            async with open_store(url, queue, prefix=prefix) as store:
                return await stores.list_dead_letters(
                    store, selection=chosen, limit=limit, decoder=decode
                )
        async with connect(url) as connection:
            with _progress("reading") as progress:
                return await ops.list_dead_letters(
                    connection,
                    queue,
                    selection=chosen,
                    limit=limit,
                    decoder=decode,
                    progress=progress,
                )

    found = run(go())
    _note_consumers(found.done)
    if not found.complete:
        # On stderr too under --json: a script that reads only the rows still hears it.
        _note(
            f"only the first {limit} are listed: there may be more (--limit N to see more; "
            '--json says "complete": false)'
        )
    if as_json:
        print_json(found.listing())
        return
    total = found.done.total if found.done else 0
    title = f"{found.queue}: {total} dead letter{'s' if total != 1 else ''} (times in UTC)"
    if not chosen.everything:
        title += f", {len(found.taken)} selected"
    if not found.complete:
        title += f" (first {limit}; --limit to see more)"
    out.print(_letters_table(found.taken, title))


@dlq.command("show")
def show(
    queue: Queue,
    message_id: Annotated[
        str, typer.Argument(help="The message id, or #position from dlq list.", show_default=False)
    ],
    decoder: DecoderOption = None,
    as_json: Json = False,
    url: DlqUrl = None,
    app: DlqApp = None,
    factory: Factory = False,
    prefix: StorePrefix = "retry",
) -> None:
    """Everything about one dead letter: properties, headers, history, traceback, body.

    It reads the queue as dlq list does (see its help, and what a kill -9 can do).
    """
    url, prefix = _broker(url, app, prefix, factory=factory)
    decode = _decoder(decoder)

    async def go() -> DeadLetter | None:
        if is_store_url(url):
            async with open_store(url, queue, prefix=prefix) as store:
                return await stores.show_dead_letter(store, message_id, decoder=decode)
        async with connect(url) as connection:
            return await ops.show_dead_letter(connection, queue, message_id, decoder=decode)

    letter = run(go())
    if letter is None:
        where = queue if is_store_url(url) else dlq_of(queue)
        fail(f"no dead letter {message_id!r} in {where}")
    if as_json:
        print_json(letter.details())
        return
    _show(letter)


BODY_SHOWN = 20_000
"""Characters of a body ``dlq show`` prints; a terminal is no place for megabytes."""

_SHOWN_ABOVE = {*h.RETRY_STATE, h.REPLAYED}


def _show(letter: DeadLetter) -> None:
    out.print(f"[bold]{escape(letter.key)}[/bold] at position {letter.position}")
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    for name, value in [
        ("reason", letter.reason),
        ("attempts", str(letter.attempts)),
        ("exception", letter.exception or "-"),
        ("error", letter.error or "-"),
        ("origin queue", letter.origin_queue or "-"),
        ("first failed", _when(letter.first_failed_ms)),
        ("last failed", _when(letter.last_failed_ms)),
    ]:
        facts.add_row(name, escape(value))
    out.print(facts)
    out.print("\n[bold]properties[/bold]")
    props = Table.grid(padding=(0, 2))
    props.add_column()
    props.add_column(overflow="fold")
    for name, value in letter.properties.items():
        if value is not None:
            props.add_row(name, escape(str(value)))
    out.print(props)
    out.print("\n[bold]headers[/bold] (the plugin's are above and below; --json shows them raw)")
    hdrs = Table.grid(padding=(0, 2))
    hdrs.add_column()
    hdrs.add_column(overflow="fold")
    for name, value in letter.headers.items():
        if name not in _SHOWN_ABOVE:
            hdrs.add_row(escape(name), escape(_short(repr(value), 200)))
    out.print(hdrs)
    _show_history(letter)
    if letter.traceback:
        out.print("\n[bold]traceback[/bold]")
        out.print(escape(letter.traceback))
    out.print(f"\n[bold]body[/bold] ({letter.size} bytes, {letter.body.kind})")
    shown = letter.body.text
    if len(shown) > BODY_SHOWN:
        rest = len(shown) - BODY_SHOWN
        shown = f"{shown[:BODY_SHOWN]}\n… {rest} more characters (--json, or dlq export, has all)"
    out.print(escape(shown))


def _show_history(letter: DeadLetter) -> None:
    if letter.history:
        history = Table(title="\nhistory", title_justify="left", title_style="bold")
        for column in ("attempt", "at (UTC)", "exception", "error", "then waited"):
            history.add_column(column, overflow="fold")
        for entry in letter.history:
            history.add_row(
                str(entry["attempt"]),
                _when(entry["at"], clock=True),
                escape(entry["exception"].rsplit(".", 1)[-1]),
                escape(entry["error"]),
                format_ms(entry["delay"]) if entry["delay"] else "-",
            )
        out.print(history)
    for record in letter.replayed:
        if isinstance(record, dict):
            out.print(
                f"\n[bold]replayed[/bold] at {_when(record.get('at') or None)} after "
                f"{escape(str(record.get('attempts')))} attempts "
                f"({escape(str(record.get('reason')))}: "
                f"{escape(str(record.get('exception')))}: {escape(str(record.get('error')))})"
            )


@dlq.command("replay")
def replay(
    queue: Queue,
    ids: Ids = None,
    reasons: Reasons = None,
    exceptions: Exceptions = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = None,
    rate: Annotated[
        float | None, typer.Option("--rate", min=0.001, help="At most this many a second.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would move; move nothing.")
    ] = False,
    to: Annotated[
        str | None, typer.Option("--to", help="Send them to this queue instead of the work queue.")
    ] = None,
    as_json: Json = False,
    url: DlqUrl = None,
    app: DlqApp = None,
    factory: Factory = False,
    prefix: StorePrefix = "retry",
) -> None:
    """Send dead letters back to their work queue with a fresh attempt count.

    Each copy is confirmed before its dead letter is acked. The old retry state is
    kept in a retry-replayed header. Dead letters that do not match stay, in order.
    """
    url, prefix = _broker(url, app, prefix, factory=factory)
    chosen = _select(ids, reasons, exceptions, since, until)
    if to is None and not is_store_url(url) and looks_like_intake(queue):
        # The retry worker's intake takes only dead-lettered messages: a replay into it
        # would be refused again, straight back here.
        fail(
            f"{queue} looks like the retry worker's intake: its dead letters go back to "
            "their own queues. Give --to QUEUE (each one's retry-origin-queue names it; "
            "see dlq list --json)"
        )

    async def go() -> ops.Outcome:
        if is_store_url(url):
            async with open_store(url, queue, prefix=prefix) as store:
                with _progress("replaying", show=not dry_run) as progress:
                    return await stores.replay_dead_letters(
                        store,
                        selection=chosen,
                        to=to,
                        limit=limit,
                        dry_run=dry_run,
                        rate=rate,
                        progress=progress,
                    )
        async with connect(url) as connection:
            with _progress("replaying", show=not dry_run) as progress:
                return await ops.replay_dead_letters(
                    connection,
                    queue,
                    selection=chosen,
                    to=to,
                    limit=limit,
                    rate=rate,
                    dry_run=dry_run,
                    progress=progress,
                )

    done = run(go())
    _note_consumers(done.done, moving="replayed")
    verb = "would replay" if dry_run else "replayed"
    if as_json:
        print_json(done.replayed(dry_run=dry_run))
    else:
        _print_replayed(done, verb, dry_run=dry_run)
    if done.done is not None and done.done.too_large and not dry_run:
        raise typer.Exit(EXIT_ACTION)


def _print_replayed(done: ops.Outcome, verb: str, *, dry_run: bool) -> None:
    if dry_run:
        out.print(_letters_table(done.taken, f"{verb} to {done.target}:"))
    count = len(done.taken) if dry_run or done.done is None else done.done.moved
    out.print(
        f"{verb} {count} of {done.done.total if done.done else 0} dead letters "
        f"from {done.queue} to {done.target}"
    )


def _confirm_purge(queue: str, what: str, *, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        fail(
            "purge removes dead letters for good: add --yes (dlq export saves them first, "
            "and purge --from-export FILE then removes exactly what FILE holds, whatever "
            "arrived since)"
        )
    if not typer.confirm(f"remove {what} in {dlq_of(queue)} for good?"):
        raise typer.Exit(EXIT_ERROR)


@dlq.command("purge")
def purge(
    queue: Queue,
    from_export: Annotated[
        typer.FileText | None,
        typer.Option(
            "--from-export",
            help="Remove exactly the dead letters this dlq export file holds, nothing else.",
        ),
    ] = None,
    ids: Ids = None,
    reasons: Reasons = None,
    exceptions: Exceptions = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    as_json: Json = False,
    url: DlqUrl = None,
    app: DlqApp = None,
    factory: Factory = False,
    prefix: StorePrefix = "retry",
) -> None:
    """Remove dead letters for good; those that do not match stay, in order.

    After a dlq export, --from-export FILE removes exactly the dead letters FILE holds
    (by their content: body, properties and headers), even while new ones arrive.
    """
    url, prefix = _broker(url, app, prefix, factory=factory)
    chosen = _select(ids, reasons, exceptions, since, until)
    if from_export is not None:
        if not chosen.everything or limit is not None:
            fail(
                "--from-export removes exactly what the export holds: leave out --id, "
                "--reason, --exception, --since, --until and --limit (select when you export)"
            )
        _confirm_purge(queue, f"the dead letters {from_export.name} holds", yes=yes)
    else:
        what = "EVERY dead letter" if chosen.everything else "the matching dead letters"
        _confirm_purge(queue, what, yes=yes)

    async def go() -> ops.Outcome:
        if is_store_url(url):
            async with open_store(url, queue, prefix=prefix) as store:
                with _progress("removing") as progress:
                    if from_export is not None:
                        return await stores.purge_exported(
                            store, from_export, source=from_export.name, progress=progress
                        )
                    return await stores.purge_dead_letters(
                        store, selection=chosen, limit=limit, progress=progress
                    )
        async with connect(url) as connection:
            with _progress("removing") as progress:
                if from_export is not None:
                    return await ops.purge_exported(
                        connection, queue, from_export, source=from_export.name, progress=progress
                    )
                return await ops.purge_dead_letters(
                    connection, queue, selection=chosen, limit=limit, progress=progress
                )

    done = run(go())
    _note_consumers(done.done)
    if as_json:
        print_json(done.purged(from_export=from_export is not None))
        return
    out.print(f"removed {len(done.taken)} dead letters from {done.queue}")
    if from_export is not None and done.not_found:
        _note(
            f"{done.not_found} of the dead letters in {from_export.name} were not in "
            f"{done.queue} as they were exported (gone since, or changed): nothing else was "
            "removed"
        )


@dlq.command("export")
def export(
    queue: Queue,
    file: Annotated[
        str,
        typer.Argument(
            metavar="FILE", help="JSON Lines file to write; - for stdout.", show_default=False
        ),
    ],
    ids: Ids = None,
    reasons: Reasons = None,
    exceptions: Exceptions = None,
    since: Since = None,
    until: Until = None,
    limit: Limit = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace FILE if it exists (once the export is complete)."),
    ] = False,
    as_json: Json = False,
    url: DlqUrl = None,
    app: DlqApp = None,
    factory: Factory = False,
    prefix: StorePrefix = "retry",
) -> None:
    """Save dead letters as JSON Lines, every byte and header; they stay in the queue.

    FILE appears only once the export is complete: a failure or an interruption never
    touches a FILE that exists (it is replaced only with --force) and leaves no new one;
    a kill -9 can leave the hidden .FILE.partial-* it was writing. It reads the queue as
    dlq list does (see its help, and what a kill -9 can do). purge --from-export FILE
    then removes exactly what FILE holds.
    """
    url, prefix = _broker(url, app, prefix, factory=factory)
    chosen = _select(ids, reasons, exceptions, since, until)
    if as_json and file == STDOUT:
        fail("--json prints a summary on stdout, which carries the export: give a file")
    try:
        check_target(file, force=force)
    except FileRefusedError as exc:
        fail(str(exc))

    async def go() -> ops.Outcome:
        with written(file, force=force) as stream:
            if is_store_url(url):
                async with open_store(url, queue, prefix=prefix) as store:
                    with _progress("exporting") as progress:
                        return await stores.export_dead_letters(
                            store,
                            stream.write,
                            selection=chosen,
                            limit=limit,
                            progress=progress,
                        )
            async with connect(url) as connection:
                with _progress("exporting") as progress:
                    return await ops.export_dead_letters(
                        connection,
                        queue,
                        stream.write,
                        selection=chosen,
                        limit=limit,
                        progress=progress,
                    )

    try:
        done = run(go())
    except FileRefusedError as exc:
        fail(str(exc))
    _note_consumers(done.done)
    if as_json:
        print_json(done.exported(file))
    shown = "stdout" if file == STDOUT else file
    err.print(
        f"exported {len(done.taken)} dead letters from {done.queue} to {shown}",
        markup=False,
        highlight=False,
    )
    saved = "that file" if file == STDOUT else shlex.quote(file)
    err.print(
        f"to remove exactly these from the queue: faststream-retry dlq purge "
        f"{shlex.quote(queue)} --from-export {saved}",
        markup=False,
        highlight=False,
    )


@dlq.command("import")
def import_(
    file: Annotated[
        typer.FileText,
        typer.Argument(help="JSON Lines from dlq export; - for stdin.", show_default=False),
    ],
    to: Annotated[
        str | None,
        typer.Option("--to", help="Publish to this queue instead of the one each came from."),
    ] = None,
    as_json: Json = False,
    url: DlqUrl = None,
    app: DlqApp = None,
    factory: Factory = False,
    prefix: StorePrefix = "retry",
) -> None:
    """Publish exported messages back, each confirmed by the broker."""
    url, prefix = _broker(url, app, prefix, factory=factory)

    async def go(stream: TextIO) -> ops.Imported:
        if is_store_url(url):
            with stores.rereadable(stream) as lines:  # read line by line, never whole
                queue = stores.queue_of(lines(), file.name, to=to)
                async with open_store(url, queue, prefix=prefix) as store:
                    return await stores.import_messages(store, lines, source=file.name, to=to)
        async with connect(url) as connection:
            return await ops.import_messages(connection, stream, source=file.name, to=to)

    done = run(go(file))
    if as_json:
        print_json(
            {
                "file": file.name,
                "published": done.published,
                "too_large": [item.to_json() for item in done.too_large],
            }
        )
    for item in done.too_large:
        _note(
            f"{file.name}:{item.position} (message id {item.message_id!r}) was not "
            f"imported: {item.why}"
        )
    skipped = f", {len(done.too_large)} too large to publish" if done.too_large else ""
    err.print(f"imported {done.published} messages from {file.name}{skipped}")
    if done.too_large:
        raise typer.Exit(EXIT_ACTION)
