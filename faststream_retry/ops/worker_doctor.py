"""``worker --doctor``: the retry worker's topology on the live broker, changing nothing.

What ``doctor`` is for a FastStream app, for a worker's config: the server version, each
object the worker declares (missing, declared with other arguments, refused), its intake
and who consumes it, and above all what a covered work queue dead-letters into. A queue
whose dead letters lead nowhere (no intake yet, an exchange that does not exist, one that
is not the intake) loses what its consumers reject without a word; that is the finding
that needs action. A queue's dead-letter exchange is read over AMQP
(``rabbit.arguments``); a policy's is not visible there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiormq.exceptions import AMQPError, ChannelNotFoundEntity, ChannelPreconditionFailed

from faststream_retry.core.advice import Mismatch, Refusal, parse_mismatch
from faststream_retry.core.topology import intake_dlq_name
from faststream_retry.ops import diagnosis
from faststream_retry.ops.common import amqp_of
from faststream_retry.ops.doctor import plan_findings
from faststream_retry.rabbit.arguments import DLX, DeadLettering, dead_lettering
from faststream_retry.rabbit.channels import close_quietly
from faststream_retry.rabbit.checks import declare_checked
from faststream_retry.rabbit.probe import depth
from faststream_retry.worker.declare import intake_arguments
from faststream_retry.worker.worker import first_plan

if TYPE_CHECKING:
    from typing import Any

    from aio_pika.abc import AbstractConnection

    from faststream_retry.core.topology import Plan
    from faststream_retry.core.worker_config import WorkerConfig

__all__ = ["worker_doctor"]

Finding = diagnosis.Finding


async def worker_doctor(connection: AbstractConnection, config: WorkerConfig) -> diagnosis.Report:
    """Check ``config``'s worker topology on the broker, and report; never raises for a finding."""
    amqp = amqp_of(connection)
    topology = await first_plan(connection, config)
    options = topology.options
    version, checked, findings = await plan_findings(amqp, topology)
    findings += _missing(list(dict.fromkeys(name for _, name in checked.missing)), config)
    intake_ok, intake_findings = await _intake(amqp, connection, config)
    findings += intake_findings
    for route in topology.routes.values():
        findings += await _work_queue(amqp, config, route.queue, intake_ok=intake_ok)
    findings += await _retry_and_dlq(connection, topology, config)
    return diagnosis.Report(
        app=f"worker --config {config.source}",
        prefix=options.prefix,
        queue_type=options.queue_type,
        server_version=version,
        findings=tuple(findings),
    )


def _declare_fix(config: WorkerConfig) -> str:
    return f"faststream-retry worker --config {config.source} --declare (or start a worker)"


def _missing(names: list[str], config: WorkerConfig) -> list[Finding]:
    if not names:
        return []
    return [
        Finding(
            "warning",
            "missing",
            ", ".join(names),
            f"{len(names)} object(s) the worker declares do not exist: {', '.join(names)}",
            "no worker has declared this configuration yet (or they were deleted); their "
            "arguments could not be checked without creating them",
            _declare_fix(config),
        )
    ]


async def _intake(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    connection: AbstractConnection,
    config: WorkerConfig,
) -> tuple[bool, list[Finding]]:
    """Say whether the intake exists as the worker declares it, who consumes it, what waits."""
    name = config.intake
    exchange = await _exchange(amqp, name)
    queue = await depth(connection, name)
    if exchange is None or queue is None:
        gone = " and ".join(
            what for what, found in (("exchange", exchange), ("queue", queue)) if found is None
        )
        return False, [
            Finding(
                "action",
                "intake",
                name,
                f"the worker's intake {name!r} does not exist (its {gone})",
                "until it exists RabbitMQ drops, without a word, every message a work queue "
                "dead-letters into it: every rejection of its consumers is lost",
                _declare_fix(config),
            )
        ]
    arguments, _ = intake_arguments(config)
    looks = (exchange, await declare_checked(amqp, "queue", name, arguments))
    options = config.retry.topology
    findings = diagnosis.mismatch_findings([m for m in looks if isinstance(m, Mismatch)], options)
    findings += diagnosis.refusal_findings([r for r in looks if isinstance(r, Refusal)])
    if queue.consumers:
        findings.append(
            Finding(
                "ok",
                "intake",
                name,
                f"{queue.consumers} worker(s) consume {name!r}; {queue.messages} dead letter(s) "
                "wait there",
                "",
                "",
            )
        )
    else:
        findings.append(
            Finding(
                "warning",
                "consumers",
                name,
                f"no worker consumes {name!r}: {queue.messages} dead letter(s) wait there",
                "none is lost: they wait until a worker runs, but none is retried meanwhile",
                f"start the worker: faststream-retry worker --config {config.source}",
            )
        )
    refused = await depth(connection, intake_dlq_name(config.prefix))
    if refused is not None and refused.messages:
        dlq = intake_dlq_name(config.prefix)
        findings.append(
            Finding(
                "warning",
                "dead-letters",
                dlq,
                f"{refused.messages} dead letter(s) the worker refused wait in {dlq!r}",
                "each came from a queue the config does not name, or was published straight to "
                "the intake; its retry-error says which",
                f"faststream-retry dlq list {name}; once the config names the queue: "
                f"faststream-retry dlq replay {name} --to <queue>",
            )
        )
    return True, findings


async def _exchange(amqp: Any, name: str) -> Mismatch | Refusal | bool | None:  # noqa: ANN401
    """Look at the intake exchange: ``None`` missing, ``True`` as declared, else what differs."""
    if not await _exchange_exists(amqp, name):
        return None
    channel = await amqp.channel()
    try:
        await channel.exchange_declare(name, exchange_type="fanout", durable=True, internal=True)
    except ChannelPreconditionFailed as exc:
        return parse_mismatch(str(exc.args[0]) if exc.args else repr(exc), "exchange", name)
    except AMQPError as exc:
        text = str(exc.args[0]) if exc.args else repr(exc)
        return Refusal("exchange", name, "configure permission", "declare", text)
    await close_quietly(channel)
    return True


async def _work_queue(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    config: WorkerConfig,
    queue: str,
    *,
    intake_ok: bool,
) -> list[Finding]:
    """Say what a covered work queue dead-letters into, and whether that reaches the intake."""
    intake = config.intake
    recreate = (
        f"declare {queue!r} with {DLX}={intake!r} (arguments cannot change in place: delete "
        "it once it is empty, or move its messages, and declare it again)"
    )
    found = await dead_lettering(amqp, queue)
    if found is None:
        return [
            Finding(
                "warning",
                "dead-lettering",
                queue,
                f"work queue {queue!r} does not exist yet",
                "its consumer declares it; nothing is dead-lettered from it until then",
                f"declare it with {DLX}={intake!r}, as the worker's how-to shows",
            )
        ]
    if not found.known:
        return [
            Finding(
                "warning",
                "dead-lettering",
                queue,
                f"could not tell what {queue!r} dead-letters into",
                found.problem,
                f"check that it dead-letters into {intake!r}",
            )
        ]
    return [await _leads(amqp, config, queue, found, intake_ok=intake_ok, recreate=recreate)]


async def _leads(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    config: WorkerConfig,
    queue: str,
    found: DeadLettering,
    *,
    intake_ok: bool,
    recreate: str,
) -> Finding:
    intake = config.intake
    target = found.exchange
    if target is None:
        return Finding(
            "warning",
            "dead-lettering",
            queue,
            f"{queue!r} has no {DLX} argument",
            "unless a policy gives it one (AMQP cannot see policies: `rabbitmqctl list_queues "
            "name effective_policy_definition` can), RabbitMQ drops what its consumers reject",
            f"apply the policy `faststream-retry worker --config {config.source} "
            "--print-policy` prints, or check the one that applies",
        )
    if target == intake:
        if intake_ok:
            return Finding(
                "ok", "dead-lettering", queue, f"{queue!r} dead-letters into {intake!r}", "", ""
            )
        return Finding(
            "action",
            "dead-lettering",
            queue,
            f"{queue!r} dead-letters into {intake!r}, which does not exist",
            "RabbitMQ drops, without a word, what its consumers reject until the intake exists",
            _declare_fix(config),
        )
    shown = "the default exchange" if target == "" else repr(target)
    exists = target == "" or await _exchange_exists(amqp, target)
    why = (
        "the worker never sees what its consumers reject"
        if exists
        else "it does not exist: RabbitMQ drops, without a word, what its consumers reject"
    )
    return Finding(
        "action",
        "dead-lettering",
        queue,
        f"{queue!r} dead-letters into {shown}, not the worker's intake {intake!r}",
        why,
        recreate,
    )


async def _exchange_exists(amqp: Any, name: str) -> bool:  # noqa: ANN401 - aiormq's connection
    channel = await amqp.channel()
    try:
        await channel.exchange_declare(name, passive=True)
    except ChannelNotFoundEntity:
        return False
    await close_quietly(channel)
    return True


async def _retry_and_dlq(
    connection: AbstractConnection, topology: Plan, config: WorkerConfig
) -> list[Finding]:
    findings: list[Finding] = []
    for route in topology.routes.values():
        waiting = await depth(connection, route.retry_queue)
        if waiting is not None and waiting.messages and not waiting.consumers:
            findings.append(
                Finding(
                    "action",
                    "consumers",
                    route.retry_queue,
                    f"{waiting.messages} retry(ies) wait in {route.retry_queue!r} and no worker "
                    "releases them",
                    "a worker's re-check consumer sends them back to their queue when due",
                    f"start the worker: faststream-retry worker --config {config.source}",
                )
            )
        dead = await depth(connection, route.dlq)
        if dead is not None and dead.messages:
            findings.append(
                Finding(
                    "warning",
                    "dead-letters",
                    route.dlq,
                    f"{dead.messages} dead letter(s) wait in {route.dlq!r}",
                    "each is a message the worker gave up on, with the reason in its headers",
                    f"faststream-retry dlq list {route.queue}; fix the cause, then "
                    f"faststream-retry dlq replay {route.queue}",
                )
            )
    return findings
