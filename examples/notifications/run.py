"""Run the notification demo: publish a batch, narrate every retry, summarise.

python -m examples.notifications.run        (scripts/demo does this for you)

Every notification is one trace. Set OTEL_EXPORTER_OTLP_ENDPOINT (for example
http://127.0.0.1:4318, Jaeger's OTLP/HTTP port) to export the spans; the demo prints
each message's trace id, and at the end the span tree of one message that was retried
and then dead-lettered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from typing import Any, cast

import aio_pika
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console
from rich.table import Table

from examples.notifications import app
from faststream_retry import EventKind, RetryEvent

# Piped (`./scripts/demo | tee demo.log`), lines keep their length: rich would wrap at 80.
console = Console(
    highlight=False,
    soft_wrap=True,
    width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 1_000,
)
START = time.monotonic()

NOTIFICATIONS = [
    {"id": 1, "email": "ada@example.com", "webhook_url": "https://hooks.example.com/ada"},
    {"id": 2, "email": "bob@example.com", "webhook_url": "https://busy.example.com/bob"},
    {"id": 3, "email": "cy@example.com", "webhook_url": "not a url"},
    {"id": 4, "email": "dee@nowhere.invalid", "webhook_url": "https://hooks.example.com/dee"},
    {"id": 5, "email": "eve@example.com", "webhook_url": "https://down.example.com/eve"},
    {"id": 6, "email": "fay@example.com", "webhook_url": None},
    {"id": 7, "email": "gus@example.com", "webhook_url": "https://broken.example.com/gus"},
    {"id": 8, "email": "hal@example.com", "webhook_url": "https://hooks.example.com/hal"},
]
QUEUES = ("email-queue", "webhook-queue")

events: list[RetryEvent] = []


def clock() -> str:
    return f"[dim]+{time.monotonic() - START:5.2f}s[/]"


def why(event: RetryEvent) -> str:
    kind = (event.exception or "").rsplit(".", 1)[-1]
    first_line = (event.error or "").splitlines()[0] if event.error else ""
    return f"{kind}: {first_line[:70]}"


def narrate(event: RetryEvent) -> None:
    """Print one event in plain words (a hook: called by the plugin as it happens)."""
    events.append(event)
    who = f"{event.queue:<13} {event.message_id or '?':<3}"
    if event.kind is EventKind.SCHEDULED:
        due = (
            datetime.fromtimestamp((event.due_ms or 0) / 1000, tz=timezone.utc)
            .astimezone()
            .strftime("%H:%M:%S.%f")[:-3]
        )
        console.print(
            f"{clock()} [yellow]retry[/]     {who} attempt {event.attempt}/{event.max_attempts} "
            f"failed ({why(event)})\n{'':33}-> retry in {event.delay_ms} ms, due {due}"
        )
    elif event.kind is EventKind.RELEASED:
        console.print(
            f"{clock()} [cyan]released[/]  {who} due, back in its queue, "
            f"{event.lateness_ms} ms late"
        )
    elif event.kind is EventKind.DEAD_LETTERED:
        console.print(
            f"{clock()} [red]dead[/]      {who} -> {event.queue}.dlq ({event.reason}, "
            f"attempt {event.attempt}): {why(event)}"
        )


def setup_tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    """An SDK provider: spans kept in memory for the tree, and exported if asked."""
    service = os.environ.get("OTEL_SERVICE_NAME", "notifications")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider, memory


TREE_FACTS = (
    "faststream_retry.attempt",
    "faststream_retry.delay_ms",
    "faststream_retry.tier_ms",
    "faststream_retry.lateness_ms",
    "faststream_retry.reason",
)


def print_tree(spans: list[ReadableSpan], trace_id: int) -> None:
    """Draw one trace as a tree: offset from the root's start, duration, name."""
    mine = sorted(
        (s for s in spans if s.context and s.context.trace_id == trace_id),
        key=lambda s: s.start_time or 0,
    )
    if not mine:
        return
    ids = {s.context.span_id for s in mine if s.context}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in mine:
        parent = span.parent.span_id if span.parent and span.parent.span_id in ids else None
        children.setdefault(parent, []).append(span)
    start = mine[0].start_time or 0

    def walk(span: ReadableSpan, depth: int) -> None:
        offset = ((span.start_time or 0) - start) / 1e6
        took = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
        attributes = span.attributes or {}
        facts = " ".join(
            f"{key.rsplit('.', 1)[-1]}={attributes[key]!s}"
            for key in TREE_FACTS
            if key in attributes
        )
        status = " [red]ERROR[/]" if span.status.status_code.name == "ERROR" else ""
        console.print(
            f"  {offset:7.0f} ms {took:5.1f} ms  {'  ' * depth}{span.name}{status}"
            + (f"  [dim]{facts}[/]" if facts else "")
        )
        for child in children.get(span.context.span_id if span.context else None, []):
            walk(child, depth + 1)

    for root in children.get(None, []):
        walk(root, 0)


def settled(queue: str) -> int:
    dead = sum(1 for e in events if e.kind is EventKind.DEAD_LETTERED and e.queue == queue)
    return len(app.world.delivered[queue]) + dead


async def purge_leftovers(connection: aio_pika.abc.AbstractConnection) -> None:
    """Start from no queues, so the counts below are this run's only.

    Deleted rather than purged: a run of an older version may have declared them with
    other arguments (classic queues, before quorum became the default).
    """
    channel = await connection.channel()
    for queue in QUEUES:
        for name in (queue, f"{queue}.retry", f"{queue}.dlq"):
            await channel.queue_delete(name)
    await channel.close()


def list_dead_letters() -> None:
    """End as an operator would start: the dead letters, listed by the operator command."""
    for queue in QUEUES:
        console.print(f"\n[bold]$ faststream-retry dlq list {queue}[/]")
        # On a terminal the table fits it; piped, it keeps its full width (the command's
        # own rule), and is written as it came: this console would wrap it at 80.
        width = {"COLUMNS": str(console.width)} if console.is_terminal else {}
        listed = subprocess.run(
            [sys.executable, "-m", "faststream_retry", "dlq", "list", queue],
            env={**os.environ, "RABBITMQ_URL": app.RABBITMQ_URL, **width},
            capture_output=True,
            text=True,
            check=False,
        )
        console.file.flush()
        sys.stdout.write((listed.stdout.rstrip() or listed.stderr.rstrip()) + "\n")
        sys.stdout.flush()


async def main(timeout: float = 60.0) -> int:
    # The plugin logs one line per decision; the narration below says the same.
    logging.getLogger("faststream_retry").setLevel(logging.ERROR)
    provider, memory = setup_tracing()
    app.retry.add_hook(narrate)  # the demo narrates through a hook
    connection = await aio_pika.connect_robust(app.RABBITMQ_URL)
    await purge_leftovers(connection)
    await app.broker.start()
    app.world.on_delivered = lambda queue, id_: console.print(
        f"{clock()} [green]delivered[/] {queue:<13} n{id_:<3}"
    )
    app.world.reset()  # the SMTP outage starts now
    console.print(
        f"[bold]notification-exchange[/] (fanout) -> email-queue, webhook-queue. "
        f"SMTP is down for the first 2.5 s. Publishing {len(NOTIFICATIONS)} notifications.\n"
    )
    tracer = trace.get_tracer("notifications-demo")
    trace_ids: dict[str, int] = {}
    for notification in NOTIFICATIONS:
        name = f"n{notification['id']}"
        with tracer.start_as_current_span(f"notify {name}") as span:
            trace_ids[name] = span.get_span_context().trace_id
            await app.broker.publish(notification, exchange=app.notifications, message_id=name)
    console.print(
        "[dim]trace ids: "
        + ", ".join(f"{name} {trace_id:032x}" for name, trace_id in trace_ids.items())
        + "[/]\n"
    )
    deadline = time.monotonic() + timeout
    while any(settled(q) < len(NOTIFICATIONS) for q in QUEUES):
        if time.monotonic() > deadline:
            console.print("[red]timed out waiting for every message to settle[/]")
            break
        await asyncio.sleep(0.05)
    await app.broker.stop()

    table = Table(title="\nSummary")
    for column in ("queue", "sent", "delivered", "retries", "dead-lettered", "lateness p50/max"):
        table.add_column(column, justify="right" if column != "queue" else "left")
    ok = True
    for queue in QUEUES:
        mine = [e for e in events if e.queue == queue]
        dead = Counter(e.reason for e in mine if e.kind is EventKind.DEAD_LETTERED)
        lateness = [e.lateness_ms or 0 for e in mine if e.kind is EventKind.RELEASED]
        delivered = len(app.world.delivered[queue])
        ok &= delivered + sum(dead.values()) == len(NOTIFICATIONS)
        table.add_row(
            queue,
            str(len(NOTIFICATIONS)),
            str(delivered),
            str(sum(e.kind is EventKind.SCHEDULED for e in mine)),
            ", ".join(f"{n} {r}" for r, n in sorted(dead.items())) or "0",
            f"{statistics.median(lateness):.0f} / {max(lateness)} ms" if lateness else "-",
        )
    console.print(table)
    console.print(
        "sent = delivered + dead-lettered for every queue: "
        + ("[green]yes[/]" if ok else "[red]NO[/]")
    )
    await connection.close()
    provider.force_flush()
    console.print(
        f"\n[bold]The trace of n5[/] ({trace_ids['n5']:032x}): its email is retried until "
        "SMTP is back; its webhook endpoint is down, so it is retried, then dead-lettered.\n"
        "  offset     took  span"
    )
    print_tree(list(memory.get_finished_spans()), trace_ids["n5"])
    list_dead_letters()
    # Typed in newer SDKs only; this keeps the oldest supported one checkable too.
    cast("Any", provider).shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
