"""``doctor`` on NATS: the start checks of a ``NatsBroker`` app, as findings, changing nothing.

The same findings the start logs or raises (``NatsRuntime.findings``, ``nats.checks``):
the wiring as the code declares it, each covered durable consumer as the server holds it
(FastStream binds to an existing one as it is), the plugin's streams as the server holds
them; and what a start cannot see: JetStream off, the plugin's streams not made yet.
Only reads (``consumer_info``, ``stream_info``, ``account_info``), on a connection of its
own. Imported by the command only for a NATS app: it needs nats-py.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import nats
from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError

from faststream_retry.middleware.nats_runtime import NatsRuntime
from faststream_retry.nats import checks, survey
from faststream_retry.ops import diagnosis
from faststream_retry.ops.common import CONNECT_TIMEOUT_S, OperationError, safe_nats_url

if TYPE_CHECKING:
    from nats.aio.client import Client

    from faststream_retry.middleware.app import LoadedApp

__all__ = ["doctor"]


async def doctor(url: str, app: LoadedApp, timeout: float = CONNECT_TIMEOUT_S) -> diagnosis.Report:
    """Check ``app``'s subscribers, their consumers and the plugin's streams on ``url``.

    ``url``: one server, or several comma-separated. Reports, never raises for what it
    finds.

    Raises:
        OperationError: the server cannot be reached, or ``app`` is not a NATS app.
    """
    if not app.nats:
        raise OperationError(f"{app.spec}'s broker is not a NatsBroker")
    servers = [one.strip() for one in url.split(",") if one.strip()]
    try:
        # Once per server, quietly: nats-py otherwise retries for ever (its
        # max_reconnect_attempts=0 means no limit) and prints each failure's traceback.
        client = await asyncio.wait_for(
            nats.connect(
                servers=servers,
                connect_timeout=timeout,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                error_cb=_quiet,
            ),
            timeout * (len(servers) + 1),
        )
    except Exception as exc:  # any failure to connect is the same answer to an operator
        raise OperationError(
            f"cannot reach the NATS server at {safe_nats_url(url)}: {exc!r}"
        ) from exc
    try:
        version = _version(client)
        found = await _findings(client, app)
    except (NatsError, TimeoutError) as exc:  # the server went away, or did not answer
        raise OperationError(
            f"the NATS server at {safe_nats_url(url)} stopped answering: {exc!r}; run doctor "
            "again once it is back"
        ) from exc
    finally:
        await client.close()
    return diagnosis.Report(
        app=app.spec,
        prefix=app.config.topology.prefix,
        queue_type="",
        server_version=version,
        findings=tuple(found),
        system="nats",
    )


async def _quiet(error: Exception) -> None:
    """nats-py's error callback: the failure is the command's to say, once."""


def _version(client: Client) -> str | None:
    """The server's version (``2.9.10``), as it said when the client connected."""
    try:
        found = client.connected_server_version
        version = f"{found.major}.{found.minor}.{found.patch}"
    except Exception:  # an odd version string: not known
        return None
    return version


async def _findings(client: Client, app: LoadedApp) -> list[diagnosis.Finding]:
    js = client.jetstream()
    try:
        await js.account_info()
    except JetStreamError as exc:
        return [
            diagnosis.Finding(
                "action",
                "jetstream",
                "",
                "JetStream does not answer on this server",
                f"the plugin keeps every retry and dead letter in JetStream streams ({exc!r})",
                "enable JetStream on the server (nats-server -js, or jetstream {} in its config)",
            )
        ]
    runtime = app.middleware.runtime(app.broker)
    if not isinstance(runtime, NatsRuntime):  # pragma: no cover - doctor() checked app.nats
        raise OperationError(f"{app.spec}'s broker is not a NatsBroker")
    prefix = app.config.topology.prefix
    topology = runtime.replan()
    durables = [(c.stream, c.durable) for c in runtime.covered(topology, {}) if c.durable]
    consumers = await survey.consumers(js, durables)
    topology, said = runtime.findings(app.middleware, consumers)
    covered = runtime.covered(topology, consumers)
    streams = await survey.streams(js, prefix, {c.stream for c in covered})
    said += checks.stream_findings(prefix, covered, streams, survey.max_payload_of(client))
    found = [
        diagnosis.Finding(
            "action" if f.refuse else "warning", f.check, f.subject, f.what, f.why, f.fix
        )
        for f in said
    ]
    missing = streams.missing(prefix) if covered else []
    if missing:
        found.append(
            diagnosis.Finding(
                "warning",
                "missing",
                ", ".join(missing),
                f"{len(missing)} stream(s) the plugin makes do not exist: "
                + ", ".join(repr(m) for m in missing),
                "the plugin has not started with this configuration yet (it starts with the "
                "broker after retry.install(broker), else at the first message), or they were "
                "deleted; their duplicate window and size could not be checked",
                "start the app: the plugin makes them; run doctor again to check them",
            )
        )
    if not said:
        on_server = sum(1 for c in covered if (c.stream, c.durable) in consumers)
        found.append(
            diagnosis.Finding(
                "ok",
                "consumers",
                "",
                f"{len(covered)} covered subscriber(s), {on_server} of their consumers on the "
                "server: nothing in their consumers or the plugin's streams fights the plan",
                "",
                "",
            )
        )
    return found
