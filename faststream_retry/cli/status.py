"""``faststream-retry status``: messages waiting per work queue, ``.retry``, ``.dlq`` and tier."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from faststream_retry.cli._common import (
    AppUrl,
    Factory,
    Json,
    Prefix,
    app_and_broker,
    examined,
    fail,
    out,
    print_json,
    rule,
    run,
)
from faststream_retry.core.defaults import PREFIX
from faststream_retry.core.topology import looks_like_intake
from faststream_retry.ops.common import OperationError, safe_broker_url
from faststream_retry.ops.explanation import format_ms
from faststream_retry.ops.status_open import StatusReader, status_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from rich.console import RenderableType

    from faststream_retry.ops.status import Depth, Status

__all__ = ["register"]

REFRESH_S = 2.0
"""How often ``--watch`` asks the broker again."""

Queues = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[QUEUE]...",
        help="Work queues to show (default: --app's, else the registry's).",
        show_default=False,
    ),
]
AppOption = Annotated[
    str | None,
    typer.Option("--app", metavar="MODULE:APP", help="Show this app's queues and tiers."),
]
ManagementUrl = Annotated[
    str | None,
    typer.Option(
        "--management-url",
        envvar="RABBITMQ_MANAGEMENT_URL",
        help=(
            "http://user:password@host:15672 of the management API: lists the tiers and, "
            "with no QUEUE or --app, every queue with a .retry or .dlq."
        ),
    ),
]
Watch = Annotated[bool, typer.Option("--watch", help="Refresh every 2 s until Ctrl-C.")]


def register(app: typer.Typer) -> None:
    """Add the ``status`` command to ``app``."""
    app.command("status")(status)


def status(
    queues: Queues = None,
    *,
    app: AppOption = None,
    factory: Factory = False,
    management_url: ManagementUrl = None,
    watch: Watch = False,
    json: Json = False,
    url: AppUrl = None,
    prefix: Prefix = PREFIX,
) -> None:
    """Show ready messages, consumers, re-checks waiting and dead letters per queue, and tiers.

    Changes nothing on the broker. Exits 0 unless the broker or the app cannot be read.
    With --app, the app's own broker is read unless --url (or RABBITMQ_URL) says
    otherwise. On NATS (--url nats://..., or a NatsBroker app) a row is a covered
    subscriber's key (STREAM.DURABLE); on Redis (redis://...) a covered stream.
    """
    loaded, url, origin = app_and_broker(app, url, factory=factory)
    if not watch:
        found = run(
            status_of(url, queues or [], app=loaded, management_url=management_url, prefix=prefix)
        )
        if json:
            print_json({**found.to_json(), "broker": safe_broker_url(url)})
        else:
            out.print(_render(found, header=examined(url, origin)))
        return
    if json:
        fail("--watch shows a live table; leave out --json")
    reader = StatusReader(
        url, queues or [], app=loaded, management_url=management_url, prefix=prefix
    )
    try:
        asyncio.run(_watch(reader, examined(url, origin)))
    except KeyboardInterrupt:
        return  # Ctrl-C is how a watch ends: a success, and nothing was changed
    except OperationError as exc:
        fail(str(exc))


async def _watch(reader: StatusReader, header: str) -> None:
    """Read again every ``REFRESH_S`` (on RabbitMQ over one connection, ``StatusReader``)."""
    async with reader:
        await _refresh(reader.read, header)


async def _refresh(ask: Callable[[], Awaitable[Status]], header: str) -> None:
    footer = f"refreshing every {REFRESH_S:g} s; Ctrl-C ends"
    if not out.is_terminal:
        # Piped or logged: Live would print only at the end; a snapshot per refresh
        # makes a readable log instead.
        while True:
            found = await ask()
            rule(time.strftime("%H:%M:%S"))
            out.print(_render(found, header=header))
            out.file.flush()
            await asyncio.sleep(REFRESH_S)
    with Live(console=out, auto_refresh=False) as live:
        while True:
            found = await ask()
            live.update(_render(found, header=header, footer=footer), refresh=True)
            await asyncio.sleep(REFRESH_S)


def _count(found: Depth) -> str:
    return "missing" if found.messages is None else str(found.messages)


def _render(found: Status, header: str = "", footer: str | None = None) -> RenderableType:
    parts: list[RenderableType] = [Text(header, style="dim")] if header else []
    queues = Table(
        title=f"work queues (from {' and '.join(found.queues_from)})", title_justify="left"
    )
    for column in ("queue", "ready", "consumers", ".retry", "re-checkers", ".dlq"):
        queues.add_column(column, justify="left" if column == "queue" else "right")
    for row in found.queues:
        # The worker's intake has no .retry by design: "missing" would read as a fault.
        intake = looks_like_intake(row.queue) and not row.retry.exists
        queues.add_row(
            escape(row.queue),
            _count(row.work),
            "" if row.work.consumers is None else str(row.work.consumers),
            "-" if intake else _count(row.retry),
            "-"
            if row.retry.consumers is None and found.system != "rabbitmq"
            else ""
            if row.retry.consumers is None
            else str(row.retry.consumers),
            _count(row.dlq),
        )
    parts.append(queues if found.queues else Text("no work queues found"))
    if found.tiers and found.prefix is not None:
        tiers = Table(
            title=f"delay tiers {found.prefix}.delay.<ms> (from {' and '.join(found.tiers_from)})",
            title_justify="left",
        )
        backlog = any(tier.undeliverable is not None for tier in found.tiers)
        for column in ("tier", "TTL", "waiting", *(["undeliverable"] if backlog else [])):
            tiers.add_column(column, justify="left" if column == "tier" else "right")
        for tier in found.tiers:
            tiers.add_row(
                escape(tier.depth.name),
                format_ms(tier.ttl_ms),
                _count(tier.depth),
                *([str(tier.undeliverable or 0)] if backlog else []),
            )
        parts.append(tiers)
    parts.extend(Text(f"note: {note}", style="dim") for note in found.notes)
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)
