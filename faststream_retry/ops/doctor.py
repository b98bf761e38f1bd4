"""``doctor``: the plugin's startup checks against the live broker, as findings, changing nothing.

Everything here only looks: passive declares, and a declaration with the planned
arguments only of an object that already exists (equal, it is a no-op; different, a
406 that closes a throwaway channel). The registry is read without acking. For an app
with a transient work queue, a probe queue that expires after a second asks, on a
connection of its own, whether the broker refuses such queues. What the findings mean is
decided in ``faststream_retry.ops.diagnosis``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from faststream_retry.core.advice import series_advice, work_queue_findings
from faststream_retry.core.topology import merge_routes, migrating_name, tier_ttl
from faststream_retry.core.versions import parse_version
from faststream_retry.ops import diagnosis
from faststream_retry.ops.common import amqp_of
from faststream_retry.ops.management import list_queues
from faststream_retry.rabbit.checks import Checked, check_objects
from faststream_retry.rabbit.probe import depth, refuses_transient_queues
from faststream_retry.rabbit.registry import retry_queues_in_use, stranded_queues

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from faststream_retry.core.topology import Plan
    from faststream_retry.middleware.app import LoadedApp

__all__ = ["doctor", "plan_findings"]


async def plan_findings(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    topology: Plan,
) -> tuple[str | None, Checked, list[diagnosis.Finding]]:
    """What every doctor says first of a plan, and what it found to say it.

    The server's version (as the broker gives it) for the plan's queue type, and each
    planned object that exists declared with its planned arguments: the refusals and
    mismatches. What is missing means something else to each doctor, so it is left to them.
    """
    raw = amqp.server_properties.get("version")
    version = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    version = None if version is None else str(version)
    findings = [diagnosis.version_finding(version, topology.options.queue_type)]
    checked = await check_objects(amqp, topology, create=False)
    findings += diagnosis.refusal_findings(checked.refusals)
    findings += diagnosis.mismatch_findings(checked.mismatches, topology.options)
    return version, checked, findings


async def doctor(
    connection: AbstractConnection,
    app: LoadedApp,
    *,
    management_url: str | None = None,
    vhost: str = "/",
) -> diagnosis.Report:
    """Check ``app``'s topology on the broker as its start would, and report, never raise.

    Covers: the server version for the app's ``queue_type``; every planned object that
    exists, declared with its planned arguments (406 mismatches, 403 refusals); the
    quorum work queues' delivery limits; the consumers of the app's queues; ``.retry``
    queues in the registry that no subscriber of the app owns; and tiers of other ticks
    (probed by name: see ``diagnosis.PROBED_TICKS_MS``). Given ``management_url``
    (RabbitMQ's management API, for ``vhost``), also the copies a tier holds that their
    queue would not take, which AMQP cannot count.

    Raises:
        OperationError: the management API could not be read.
    """
    amqp = amqp_of(connection)
    topology = await _as_started(connection, app)
    options = topology.options
    version_text, checked, findings = await plan_findings(amqp, topology)
    findings += diagnosis.missing_findings(checked.missing)
    if not checked.refusals and not checked.mismatches:
        present = len(topology.queues) + len(topology.exchanges) - len(checked.missing)
        findings.append(
            diagnosis.Finding(
                "ok",
                "arguments",
                "",
                f"the {present} existing object(s) the app declares have the planned arguments",
                "",
                "",
            )
        )
    version = parse_version(version_text)
    findings += diagnosis.limit_findings(
        work_queue_findings(topology.routes.values(), app.config.default, version)
    )
    refused = any(route.transient for route in topology.routes.values()) and bool(
        await _refuses_transient(connection)
    )
    findings += diagnosis.series_findings(
        series_advice(topology.routes.values(), version), transient_refused=refused
    )
    findings += diagnosis.queue_findings(await _states(connection, topology))
    findings += diagnosis.cut_short_findings(await _cut_short(connection, topology), options)
    owned = {route.queue for route in app.routes}
    stranded = await stranded_queues(connection, options.prefix, owned)
    findings += diagnosis.stranded_findings((s.queue, s.messages) for s in stranded)
    findings += diagnosis.old_tier_findings(await _old_tiers(connection, topology))
    if management_url is not None:
        listed = await asyncio.to_thread(list_queues, management_url, vhost)
        findings += diagnosis.backlog_findings(
            {row.name: row.undeliverable for row in listed},
            [row.name for row in listed if tier_ttl(row.name, options.prefix) is not None],
        )
    return diagnosis.Report(
        app=app.spec,
        prefix=options.prefix,
        queue_type=options.queue_type,
        server_version=version_text,
        findings=tuple(findings),
    )


async def _refuses_transient(connection: AbstractConnection) -> bool | None:
    """Probe, on a connection of its own to the same broker, whether it refuses transient queues.

    ``None`` when the connection does not say its URL (nothing is known then).
    """
    url = getattr(connection, "url", None)
    return None if url is None else await refuses_transient_queues(str(url))


async def _as_started(connection: AbstractConnection, app: LoadedApp) -> Plan:
    """Return the plan as the app's start makes it.

    A subscriber with retries off whose ``.retry`` exists is covered too: the plugin
    keeps releasing what waits there.
    """
    topology = app.plan
    routes = merge_routes(app.routes)
    for queue in await retry_queues_in_use(connection, sorted(set(routes) - set(topology.routes))):
        topology = topology.with_route(routes[queue])
    return topology


async def _states(connection: AbstractConnection, topology: Plan) -> list[diagnosis.QueueState]:
    looks: list[tuple[str, Any]] = [(topology.tier(ttl), "tier") for ttl in topology.tiers.ttls_ms]
    for route in topology.routes.values():
        looks += [(route.queue, "work"), (route.retry_queue, "retry"), (route.dlq, "dlq")]
    states = []
    for name, role in looks:
        found = await depth(connection, name)
        if found is not None:
            states.append(diagnosis.QueueState(name, role, found.messages, found.consumers))
        elif role == "work":
            states.append(diagnosis.QueueState(name, "missing-work", 0, 0))
    return states


async def _cut_short(connection: AbstractConnection, topology: Plan) -> list[tuple[str, int]]:
    """Return the app's queues whose migration's temporary queue still exists."""
    found = []
    for spec in topology.queues:
        temp = await depth(connection, migrating_name(spec.name))
        if temp is not None:
            found.append((spec.name, temp.messages))
    return found


async def _old_tiers(connection: AbstractConnection, topology: Plan) -> list[tuple[str, int]]:
    planned = set(topology.exchanges)
    old = []
    for name in diagnosis.tier_candidates(topology.options.prefix, [topology.tiers.tick_ms]):
        if name in planned:
            continue
        found = await depth(connection, name)
        if found is not None:
            old.append((name, found.messages))
    return old
