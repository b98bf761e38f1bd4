"""``faststream-retry doctor module:app``: the plugin's startup checks, as a report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from faststream_retry.amqp.connection import safe_url
from faststream_retry.cli._common import (
    EXIT_ACTION,
    AppUrl,
    Factory,
    Json,
    broker_of,
    examined,
    fail,
    out,
    print_json,
    run,
)
from faststream_retry.cli.status import ManagementUrl  # noqa: TC001 - typer reads it
from faststream_retry.ops import OperationError, connect, doctor, load_app
from faststream_retry.ops.common import is_nats_url, safe_nats_url
from faststream_retry.ops.management import vhost_of

if TYPE_CHECKING:
    from faststream_retry.middleware.app import LoadedApp
    from faststream_retry.ops.diagnosis import Report

__all__ = ["register"]

_STYLE = {"ok": "green", "warning": "yellow", "action": "bold red"}


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to ``app``."""
    app.command(name="doctor")(doctor_command)


def doctor_command(
    app: Annotated[
        str, typer.Argument(help="The app, as `faststream run` takes it: module:attribute.")
    ],
    url: AppUrl = None,
    management_url: ManagementUrl = None,
    json: Json = False,
    factory: Factory = False,
) -> None:
    """Check an app's retry topology on the live broker (RabbitMQ or NATS), changing nothing.

    Runs the plugin's startup checks (server version, the arguments of each
    queue and exchange it declares, permissions, quorum delivery limits) and
    finds what a start only logs or cannot see: queues without the consumer
    they need, stranded .retry queues, dead letters, tiers of an earlier
    tick, migrations cut short; with --management-url, copies a tier holds
    that their queue would not take (AMQP cannot count them).

    The app's own broker is examined unless --url (or RABBITMQ_URL) says otherwise.
    On NATS (a NatsBroker app, or --url nats://...) it runs the NATS start checks:
    the wiring, each covered consumer as the server holds it (ack policy,
    max_deliver, ack_wait), and the plugin's streams (duplicate window, size).

    Exit status 0: healthy, or warnings only; 1: something needs action;
    3: the check could not run.
    """
    try:
        loaded = load_app(app, cwd=Path.cwd(), factory=factory, nats=True)
    except OperationError as exc:
        fail(str(exc))
    url, origin = broker_of(url, loaded)
    if loaded.nats or is_nats_url(url):
        report = _nats(url, loaded, management_url)
        shown = safe_nats_url(url)
        header = f"broker {shown} ({origin})"
    else:

        async def check() -> Report:
            async with connect(url) as connection:
                return await doctor(
                    connection, loaded, management_url=management_url, vhost=vhost_of(url)
                )

        report = run(check())
        shown, header = safe_url(url), examined(url, origin)
    if json:
        print_json({**report.as_dict(), "broker": shown})
    else:
        render(report, header)
    if report.status == "action":
        raise typer.Exit(EXIT_ACTION)


def _nats(url: str, loaded: LoadedApp, management_url: str | None) -> Report:
    """``doctor`` on NATS: the app's broker must be a ``NatsBroker`` and ``url`` a NATS one."""
    if not loaded.nats:
        fail(
            f"{loaded.spec}'s broker is a RabbitBroker and {safe_nats_url(url)} is a NATS "
            "server: give the app's AMQP URL (--url amqp://...)"
        )
    if not is_nats_url(url):
        fail(
            f"{loaded.spec}'s broker is a NatsBroker and {safe_url(url)} is not a NATS URL: "
            "give the app's server (--url nats://host:4222), or leave --url out"
        )
    if management_url is not None:
        fail("--management-url is RabbitMQ's management API: leave it out on NATS")
    from faststream_retry.ops.nats_doctor import doctor as nats_doctor  # noqa: PLC0415 - nats-py

    return run(nats_doctor(url, loaded))


def render(report: Report, broker: str = "") -> None:
    """Print ``report`` for a person: most urgent first, each with why and the fix.

    ``broker`` says which broker was examined.
    """
    if report.system == "nats":
        server = f"nats-server {escape(str(report.server_version))}"
    else:
        server = f"queue_type {report.queue_type!r}, RabbitMQ {escape(str(report.server_version))}"
    out.print(
        f"[bold]faststream-retry doctor[/bold] {escape(report.app)}: prefix "
        f"{escape(report.prefix)!r}, {server}"
    )
    if broker:
        out.print(escape(broker), style="dim")
    order = {"action": 0, "warning": 1, "ok": 2}
    for finding in sorted(report.findings, key=lambda f: order[f.severity]):
        style = _STYLE[finding.severity]
        out.print(f"[{style}]{finding.severity.upper():>7}[/{style}]  {escape(finding.what)}")
        if finding.why:
            out.print(f"         why: {escape(finding.why)}")
        if finding.fix:
            out.print(f"         fix: {escape(finding.fix)}")
    out.print(
        f"{report.count('action')} need action, {report.count('warning')} warning(s), "
        f"{report.count('ok')} ok"
    )
