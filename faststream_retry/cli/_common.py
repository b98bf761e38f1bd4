"""What the commands share: connection options, output, running an operation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from faststream_retry.ops.common import DEFAULT_URL, OperationError

if TYPE_CHECKING:
    from collections.abc import Coroutine

__all__ = [
    "DEFAULT_URL",
    "EXIT_ACTION",
    "EXIT_ERROR",
    "Json",
    "Prefix",
    "Url",
    "err",
    "fail",
    "out",
    "print_json",
    "run",
]

T = TypeVar("T")

EXIT_ACTION = 1
"""Exit status when the command worked and found something that needs action."""
EXIT_ERROR = 2
"""Exit status when the command could not do what was asked."""

out = Console(highlight=False, soft_wrap=True)
"""Results: tables, records. JSON goes to stdout unformatted (``print_json``)."""
err = Console(stderr=True, highlight=False)
"""Progress, notes and errors, kept off stdout so ``--json`` output stays parseable."""

# aiormq and aio-pika log connection failures themselves; the command says it once.
logging.getLogger("aiormq").setLevel(logging.CRITICAL)
logging.getLogger("aio_pika").setLevel(logging.CRITICAL)

Url = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="RABBITMQ_URL",
        help="The broker's AMQP URL (or the RABBITMQ_URL environment variable).",
    ),
]
Prefix = Annotated[
    str,
    typer.Option("--prefix", help="The prefix given to RetryMiddleware (its tiers' names)."),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON, for scripts.")]


def fail(message: str, status: int = EXIT_ERROR) -> NoReturn:
    """Print ``message`` as an error and exit with ``status``."""
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(status)


def run(operation: Coroutine[Any, Any, T]) -> T:
    """Run ``operation``; an ``OperationError`` ends the command with its text.

    SIGTERM and SIGHUP (a closed terminal, an SSH session gone) stop it as Ctrl-C does:
    the operation is cancelled and its cleanup runs, so copies in flight are confirmed
    and acked and held messages go back, rather than a kill leaving them twice.
    """

    async def main() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if task is not None:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(signum, task.cancel)
        return await operation

    try:
        return asyncio.run(main())
    except OperationError as exc:
        fail(str(exc))
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Every move is confirm-then-ack: what was not acked is still in its queue.
        err.print("interrupted: nothing was lost (a message in flight may now be in both queues)")
        raise typer.Exit(130) from None


def print_json(data: object) -> None:
    """Write ``data`` as one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()
