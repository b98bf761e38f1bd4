"""``faststream-retry migrate QUEUE --queue-type ...``: new queue arguments, no message lost."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.prompt import Confirm

from faststream_retry.cli._common import Json, Prefix, Url, err, fail, out, print_json, run
from faststream_retry.core.defaults import DELIVERY_LIMIT, PREFIX, QUEUE_TYPES, is_queue_type
from faststream_retry.ops import connect, migrate

if TYPE_CHECKING:
    from faststream_retry.ops.migrate import MigrationResult

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``migrate`` command to ``app``."""
    app.command(name="migrate")(migrate_command)


def migrate_command(
    queue: Annotated[
        str,
        typer.Argument(help="<queue>.retry, <queue>.dlq or a tier <prefix>.delay.<ms>."),
    ],
    queue_type: Annotated[
        str,
        typer.Option(
            "--queue-type", metavar="|".join(QUEUE_TYPES), help="The queue type to move it to."
        ),
    ],
    url: Url = "amqp://guest:guest@localhost:5672/",
    prefix: Prefix = PREFIX,
    delivery_limit: Annotated[
        int,
        typer.Option(
            "--delivery-limit",
            min=0,
            help="RetryMiddleware's delivery_limit (a quorum .retry queue carries it).",
        ),
    ] = DELIVERY_LIMIT,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before starting.")] = False,
    json: Json = False,
) -> None:
    """Give a queue the plugin owns another queue type, losing no message.

    Moves its messages into a temporary queue (<queue>.migrating, durable,
    quorum where the broker has it), deletes the queue, declares it exactly
    as RetryMiddleware does with the new queue_type (a tier is bound to its
    exchange again) and moves them back. Each copy keeps every property and
    header, and its original is acked only once the broker confirmed it.

    Killed mid-way? Run it again: it finishes the job (a message of the last
    batch in flight may then be there twice). Stop every service that uses
    the queue first: a queue with consumers is refused.

    Messages in a tier start their TTL again: they come out later than
    planned, never early.
    """
    kind = queue_type.lower()
    if not is_queue_type(kind):
        fail(f"--queue-type is {' or '.join(QUEUE_TYPES)}, got {queue_type!r}")
    if not yes:
        if not sys.stdin.isatty():
            fail("migrate deletes and re-declares the queue: pass --yes to go ahead")
        if not Confirm.ask(
            f"Migrate {escape(queue)!r} to {kind} queues (stop its services first)?",
            console=err,
        ):
            raise typer.Exit(1)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(step: str, done: int, total: int) -> None:
            if step not in tasks:
                label = "moving out " if step == "out" else "moving back"
                tasks[step] = bar.add_task(label, total=total)
            bar.update(tasks[step], completed=done, total=total)

        async def move() -> MigrationResult:
            async with connect(url) as connection:
                return await migrate(
                    connection,
                    queue,
                    queue_type=kind,
                    prefix=prefix,
                    delivery_limit=delivery_limit,
                    progress=progress,
                )

        result = run(move())
    if json:
        print_json(result.as_dict())
        return
    render(result)


def render(result: MigrationResult) -> None:
    """Print what the migration did."""
    if not result.steps:
        out.print(
            f"{escape(result.queue)!r} already has the {result.queue_type} arguments: nothing to do"
        )
        return
    if result.resumed:
        out.print(f"finishing an earlier migration of {escape(result.queue)!r} (it was cut short)")
    out.print(
        f"migrated {escape(result.queue)!r} ({result.role}) to {result.queue_type}: "
        f"{result.moved_out} message(s) moved out to {escape(result.temp_queue)!r}, "
        f"{result.moved_back} moved back"
    )
    arguments = ", ".join(f"{k}={v!r}" for k, v in sorted(result.arguments.items()))
    out.print(f"its arguments now: {escape(arguments)}")
