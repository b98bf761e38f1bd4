"""What the commands share: connection options, output, running an operation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from aiormq.exceptions import AMQPError, ChannelInvalidStateError
from rich.console import Console
from rich.markup import escape
from rich.rule import Rule
from rich.text import Text

from faststream_retry.ops.common import (
    DEFAULT_NATS_URL,
    DEFAULT_REDIS_URL,
    DEFAULT_URL,
    OperationError,
    broker_mismatch,
    safe_broker_url,
)
from faststream_retry.ops.walk import PassStoppedError, stop_all

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from faststream_retry.middleware.app import LoadedApp

__all__ = [
    "DEFAULT_URL",
    "EXIT_ACTION",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "AppUrl",
    "Factory",
    "Json",
    "Prefix",
    "Url",
    "app_and_broker",
    "broker_of",
    "err",
    "examined",
    "fail",
    "out",
    "print_json",
    "rule",
    "run",
    "same_broker",
]

T = TypeVar("T")

EXIT_ACTION = 1
"""Exit status when the command worked and found something that needs action."""
EXIT_USAGE = 2
"""Exit status of a usage error (click's: an unknown option, a missing argument)."""
EXIT_ERROR = 3
"""Exit status when the command could not do what was asked."""
GRACE_S = 10.0
"""How long a command asked to stop may take to stop cleanly before it is cancelled."""

# Piped or redirected, a table keeps its full width: rich would cut it to 80 columns.
out = Console(
    highlight=False,
    soft_wrap=True,
    width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 1_000,
)
"""Results: tables, records. JSON goes to stdout unformatted (``print_json``)."""
RULE_WIDTH = 100
"""How wide a rule is drawn when stdout is no terminal (its width is then 1,000)."""
err = Console(
    stderr=True,
    highlight=False,
    soft_wrap=True,
    width=None if sys.stderr.isatty() or "COLUMNS" in os.environ else 1_000,
)
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
AppUrl = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="RABBITMQ_URL",
        show_default=False,
        help=(
            "The broker: amqp://..., nats://... or redis://... (or the RABBITMQ_URL "
            "environment variable, for RabbitMQ); default: the app's broker, else "
            "amqp://guest:guest@localhost:5672/."
        ),
    ),
]
"""``--url`` of a command that takes an app: unset, the app's own broker is examined."""
Prefix = Annotated[
    str,
    typer.Option("--prefix", help="The prefix given to RetryMiddleware (its tiers' names)."),
]
_json_output = {"asked": False}
"""Whether the running command was given --json (its option's callback sets it)."""


def _remember_json(asked: bool) -> bool:
    _json_output["asked"] = asked
    return asked


Factory = Annotated[
    bool,
    typer.Option(
        "--factory",
        help="MODULE:APP names a function that builds the app (as `faststream run --factory`).",
    ),
]
Json = Annotated[
    bool,
    typer.Option("--json", help="Print JSON, for scripts.", callback=_remember_json),
]


def broker_of(url: str | None, app: LoadedApp | None) -> tuple[str, str]:
    """Return the broker a command examines, and where that choice came from.

    ``--url`` (or ``RABBITMQ_URL``, but not for an app on NATS) when given; else the
    app's broker, as its ``RabbitBroker(...)`` or ``NatsBroker(...)`` was built; else the
    default, ``localhost:5672`` (``localhost:4222`` for an app on NATS). A check of
    another broker than the app's could pass an app that will fail.
    """
    from_env = url is not None and os.environ.get("RABBITMQ_URL") == url
    nats = app is not None and app.nats
    redis = app is not None and app.redis
    # RABBITMQ_URL names a RabbitMQ: it says nothing of where a NATS or Redis app's server is.
    if url and not ((nats or redis) and from_env):
        return url, "RABBITMQ_URL" if from_env else "--url"
    if app is not None and app.url:
        return app.url, f"the broker of {app.spec}"
    default = DEFAULT_NATS_URL if nats else DEFAULT_REDIS_URL if redis else DEFAULT_URL
    return default, "the default"


def examined(url: str, origin: str) -> str:
    """Say which broker a command examined, without its password (or NATS token)."""
    return f"broker {safe_broker_url(url)} ({origin})"


def app_and_broker(
    spec: str | None, url: str | None, *, factory: bool
) -> tuple[LoadedApp | None, str, str]:
    """Load ``spec`` (``--app``), if given, and pick the broker as ``broker_of`` does.

    Returns the app, the broker's URL and where it came from; ends the command when the
    app cannot be loaded or ``url`` is another kind of server than its broker.
    """
    from faststream_retry.ops.app import load_app  # noqa: PLC0415 - imports the app's FastStream

    loaded = None
    if spec is not None:
        try:
            loaded = load_app(spec, cwd=Path.cwd(), factory=factory, nats=True, redis=True)
        except OperationError as exc:
            fail(str(exc))
    found, origin = broker_of(url, loaded)
    same_broker(found, loaded)
    return loaded, found, origin


def same_broker(url: str, app: LoadedApp | None) -> None:
    """End the command if ``url`` is not the kind of server ``app``'s broker needs."""
    if app is None:
        return
    system = "nats" if app.nats else "redis" if app.redis else "rabbitmq"
    if (problem := broker_mismatch(url, app.spec, system)) is not None:
        fail(problem)


def rule(title: str) -> None:
    """Draw a rule with ``title`` across the terminal, or ``RULE_WIDTH`` wide when piped.

    Piped, a title longer than that widens the rule: a queue's name is never cut.
    """
    width = None
    if not out.is_terminal:
        width = min(out.width, max(RULE_WIDTH, Text.from_markup(title).cell_len + 4))
    out.print(Rule(title, align="left"), width=width)


def fail(message: str, status: int = EXIT_ERROR) -> NoReturn:
    """Print ``message`` as an error and exit with ``status``.

    Under ``--json`` the error is a JSON document on stdout, ``{"error": ..., "status":
    ...}``, where a script reads the command's output; the text goes to stderr too.
    """
    err.print(f"[red]error:[/red] {escape(message)}")
    if _json_asked():
        print_json({"error": message, "status": status})
    raise typer.Exit(status)


def _json_asked() -> bool:
    """Whether the command running now was given ``--json``."""
    return _json_output["asked"]


def run(operation: Coroutine[Any, Any, T]) -> T:
    """Run ``operation``; an ``OperationError`` ends the command with its text.

    Ctrl-C, SIGTERM and SIGHUP (a closed terminal, an SSH session gone) ask a pass over
    a queue to stop after the message it is at: what is in flight is confirmed and
    acked, held messages go back, and nothing is left twice. A command that does not
    stop within ``GRACE_S`` (migrate, which a second run finishes) is cancelled.
    """
    stopping = False

    async def main() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def stop() -> None:
            nonlocal stopping
            stopping = True
            stop_all()
            if task is not None:
                loop.call_later(GRACE_S, task.cancel)

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, stop)
        loop.set_exception_handler(_quiet_about_the_broken_connection)
        return await operation

    try:
        return asyncio.run(main())
    except PassStoppedError as exc:
        err.print(escape(str(exc)))
        raise typer.Exit(130) from None
    except OperationError as exc:
        fail(str(exc))
    except (AMQPError, ConnectionError, ChannelInvalidStateError) as exc:
        _broke(repr(exc))
    except (KeyboardInterrupt, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and not stopping:
            # Not asked to stop: aiormq cancels what waits on a connection that closed.
            _broke(str(exc) or "cancelled")
        # Every move is confirm-then-ack: what was not acked is still in its queue.
        err.print("interrupted: nothing was lost (a message in flight may now be in both queues)")
        raise typer.Exit(130) from None


def _quiet_about_the_broken_connection(
    loop: asyncio.AbstractEventLoop, context: dict[str, Any]
) -> None:
    # aiormq fails every future that waits on a connection that broke, and the ones
    # nobody awaited any more are reported when they are collected, after the command
    # has said the connection broke: a traceback of 90 lines under the one-line answer.
    if isinstance(context.get("exception"), (AMQPError, ConnectionError)):
        return
    loop.default_exception_handler(context)


def _broke(why: str) -> NoReturn:
    fail(
        f"the connection to the broker broke ({why}): nothing was acked before its copy "
        "was confirmed, so at most the copies in flight are now in two places; run the "
        "command again once the broker is back"
    )


def print_json(data: object) -> None:
    """Write ``data`` as one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()
