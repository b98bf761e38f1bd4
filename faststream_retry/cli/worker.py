"""``faststream-retry worker --config retry.toml``: the standalone retry worker."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path  # noqa: TC003 - typer reads the annotation at runtime
from typing import TYPE_CHECKING, Annotated
from urllib.parse import unquote, urlsplit

import typer

from faststream_retry.cli._common import (
    EXIT_ACTION,
    EXIT_USAGE,
    Json,
    err,
    fail,
    out,
    print_json,
    run,
)
from faststream_retry.cli.doctor import render
from faststream_retry.core.durations import format_ms
from faststream_retry.core.topology import intake_dlq_name
from faststream_retry.core.worker_config import (
    WorkerConfig,
    load_worker_config,
    policy_command,
    worker_config_schema,
)
from faststream_retry.errors import RetryConfigError, RetryWorkerError
from faststream_retry.ops import connect
from faststream_retry.ops.worker_doctor import worker_doctor
from faststream_retry.reporting.log import log
from faststream_retry.worker.tracing import tracing_from_environment
from faststream_retry.worker.worker import RetryWorker

if TYPE_CHECKING:
    from faststream_retry.ops.diagnosis import Report

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command to ``app``."""
    app.command(name="worker")(worker_command)


def worker_command(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help=(
                "The worker's TOML config: "
                "https://faststream-retry.readthedocs.io/en/latest/reference/worker-config/"
            ),
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            envvar="RABBITMQ_URL",
            help="The broker's AMQP URL; else RABBITMQ_URL, else the config's url.",
        ),
    ] = None,
    print_policy: Annotated[
        bool,
        typer.Option(
            "--print-policy",
            help="Print the rabbitmqctl command that opts the configured queues in, and exit.",
        ),
    ] = False,
    log_level: Annotated[
        str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR.")
    ] = "INFO",
    schema: Annotated[
        bool,
        typer.Option(
            "--schema",
            help="Print the config file's JSON Schema (for editors), and exit; no --config.",
        ),
    ] = False,
    doctor: Annotated[
        bool,
        typer.Option(
            "--doctor",
            help=(
                "Check the worker's topology on the live broker, changing nothing, and exit: "
                "above all, whether each named queue dead-letters into the intake. Exit "
                "status 1: something needs action."
            ),
        ),
    ] = False,
    json: Json = False,
    declare: Annotated[
        bool,
        typer.Option(
            "--declare",
            help=(
                "Declare the intake, the delay tiers and each named queue's .retry and .dlq, "
                "and exit: run it before any consumer rejects (a deploy step). Safe to repeat."
            ),
        ),
    ] = False,
) -> None:
    """Retry the dead letters of consumers in any language (runs until SIGTERM or Ctrl-C).

    Work queues opt in by dead-lettering into the intake exchange <prefix>.intake:
    declared with x-dead-letter-exchange, or, for queues that exist already, by a
    policy (--print-policy prints it). A consumer rejects (requeue=false) what it
    could not handle; the worker sends it back to that queue only, after the
    config's backoff, and to <queue>.dlq once its attempts are spent. Any number
    of workers may run at once.

    Run it with --declare first, before any consumer rejects: until the intake
    exists, RabbitMQ drops what a queue dead-letters into it.

    The broker's URL is the one setting the environment gives (RABBITMQ_URL);
    the rest is the config file's, the same for every worker. Traces: the
    standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME,
    ...), with the otel extra installed.
    """
    if schema:
        print_json(worker_config_schema())
        return
    if config is None:
        fail("give the worker's config: --config retry.toml (--schema prints what it takes)")
    if doctor and declare:
        fail("--doctor looks and changes nothing, --declare declares: give one", EXIT_USAGE)
    try:
        settings = load_worker_config(config)
    except RetryConfigError as exc:
        fail(str(exc))
    if print_policy:
        vhost = _vhost(url or settings.url)
        out.print(policy_command(settings, vhost=vhost), markup=False)
        err.print(
            "A queue takes one policy (the highest priority): if one applies to these "
            'queues already, add "dead-letter-exchange" to it instead. A queue declared '
            "with its own x-dead-letter-exchange keeps that one.",
            markup=False,
        )
        return
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        fail(f"--log-level is DEBUG, INFO, WARNING or ERROR, got {log_level!r}")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if doctor:
        _doctor(settings, url, as_json=json)
    elif declare:
        _declare(settings, url)
    else:
        _run(settings, url)


def _run(settings: WorkerConfig, url: str | None) -> None:
    tracing = tracing_from_environment()
    if tracing.problem:
        log.warning("faststream-retry worker: no traces: %s", tracing.said)
    else:
        log.log(
            logging.DEBUG if tracing.provider is None else logging.INFO,
            "faststream-retry worker: %s",
            tracing.said,
        )
    try:
        worker = RetryWorker(settings, url=url, tracer_provider=tracing.provider)
        asyncio.run(worker.run())
    except (RetryConfigError, RetryWorkerError) as exc:  # each text names the fix
        fail(str(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        if tracing.provider is not None:
            tracing.provider.shutdown()  # exports what is batched


def _doctor(settings: WorkerConfig, url: str | None, *, as_json: bool) -> None:
    target = url or settings.url
    if not target:
        fail(f"no broker to check: give --url, set RABBITMQ_URL, or set url in {settings.source}")

    async def check() -> Report:
        async with connect(target) as connection:
            return await worker_doctor(connection, settings)

    report = run(check())
    if as_json:
        print_json(report.as_dict())
    else:
        render(report)
    if report.status == "action":
        raise typer.Exit(EXIT_ACTION)


def _declare(settings: WorkerConfig, url: str | None) -> None:
    try:
        plan = asyncio.run(RetryWorker(settings, url=url).declare())
    except (RetryConfigError, RetryWorkerError) as exc:  # each text names the fix
        fail(str(exc))
    tiers = plan.tiers
    queues = [name for route in plan.routes.values() for name in (route.retry_queue, route.dlq)]
    out.print(
        f"declared {settings.intake} (exchange and queue) and "
        f"{intake_dlq_name(settings.prefix)}, {len(tiers.ttls_ms)} delay tiers up to "
        f"{format_ms(tiers.ttls_ms[-1])}" + (f", {', '.join(queues)}" if queues else ""),
        markup=False,
        soft_wrap=True,
    )
    out.print(
        f"Queues that dead-letter into {settings.intake} lose nothing from now on: their "
        "dead letters wait in it until a worker runs.",
        markup=False,
    )


def _vhost(url: str | None) -> str:
    if not url:
        return "/"
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"
