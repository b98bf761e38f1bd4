"""``faststream-retry explain module:app``: policies, schedules and topology, with no broker."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from faststream_retry.cli._common import Factory, Json, fail, out, print_json, rule
from faststream_retry.core.topology import retry_queue_name, tier_name
from faststream_retry.ops.app import load_app
from faststream_retry.ops.common import OperationError
from faststream_retry.ops.explain import explain as explain_app
from faststream_retry.ops.explanation import format_ms

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from faststream_retry.ops.explanation import (
        Declared,
        Explanation,
        HandlerExplanation,
        Leg,
        QueueExplanation,
        Rules,
    )

__all__ = ["register"]

AppSpec = Annotated[
    str, typer.Argument(metavar="MODULE:APP", help="The app, as `faststream run` takes it.")
]


def register(app: typer.Typer) -> None:
    """Add the ``explain`` command to ``app``."""
    app.command("explain")(explain)


def explain(spec: AppSpec, json: Json = False, factory: Factory = False) -> None:
    """Show what the plugin does with each queue's failures: policy, schedule, topology.

    Needs no broker: the app is imported, not started. Times leave out how long the
    handler runs and how long each hop takes.
    """
    try:
        explanation = explain_app(
            load_app(spec, cwd=Path.cwd(), factory=factory, nats=True, redis=True)
        )
    except OperationError as exc:
        fail(str(exc))
    if json:
        print_json(explanation.to_json())
        return
    _render(explanation)


def _render(explanation: Explanation) -> None:
    out.print(f"[bold]{escape(explanation.app)}[/bold]")
    tiers = ", ".join(format_ms(ttl) for ttl in explanation.tiers_ms)
    kind = (
        f"{explanation.queue_type} queues"
        if explanation.queue_type is not None
        else {"nats": "NATS JetStream", "redis": "Redis Streams"}.get(explanation.system, "")
    )
    prefix = "" if explanation.prefix is None else f", prefix {escape(explanation.prefix)!r}"
    out.print(
        f"tick {format_ms(explanation.tick_ms)}, max_delay {format_ms(explanation.max_delay_ms)}, "
        f"{kind}{prefix}"
    )
    if explanation.tiers_ms:
        out.print(f"tiers ({len(explanation.tiers_ms)}, shared by every queue): {tiers}")
    for note in explanation.notes:
        out.print(f"note: {escape(note)}", style="dim")
    tier_names = {tier_name(explanation.prefix or "", ttl) for ttl in explanation.tiers_ms}
    others = [
        o
        for o in explanation.shared
        if o.fields.get("name", o.fields.get("exchange")) not in tier_names
    ]
    first = next(
        (o for o in explanation.shared if o.kind == "queue" and o.fields["name"] in tier_names),
        None,
    )
    if first is not None:
        # Every tier is declared alike but for its TTL: one line says it for all of them.
        arguments = {**first.fields["arguments"], "x-message-ttl": "<ms>"}
        prefix = escape(explanation.prefix or "")
        out.print(
            f"each tier: a durable fanout exchange {prefix}.delay.<ms> bound "
            "(routing key '') to a durable queue of the same name with "
            f"{escape(_arguments(arguments))}"
        )
    if others:
        out.print(_objects_table("also declared once per broker", tuple(others)))
    for queue in explanation.queues:
        _render_queue(queue)


def _render_queue(queue: QueueExplanation) -> None:
    out.print()
    rule(f"[bold]{escape(queue.queue)}[/bold]")
    if not queue.covered:
        out.print(
            "retries off for every handler: failures go to FastStream and nothing is declared "
            f"(what still waits in {escape(retry_queue_name(queue.queue))} from before, the plugin "
            "releases)"
        )
        return
    if queue.home_from_tier is False:
        out.print(
            "declared with x-overflow reject-publish: a copy's last tier delivers it to "
            f"{escape(retry_queue_name(queue.queue))}, and the re-check consumer releases it"
        )
    # Redis: no tiers; a copy waits in the stream's schedule, then goes back to the stream.
    waits = next(
        (f"{o.fields['name']} → {queue.queue}" for o in queue.objects if o.kind == "sorted set"),
        None,
    )
    for handler in queue.handlers:
        _render_handler(handler, waits)
    out.print(_objects_table(f"declared for {queue.queue}", queue.objects))


def _render_handler(handler: HandlerExplanation, waits: str | None = None) -> None:
    source = "@retry_policy" if handler.own_policy else "the middleware default"
    name = escape(handler.name)
    if not handler.retries:
        out.print(f"handler [bold]{name}[/bold]: retries off ({source}): failures go to FastStream")
        return
    out.print(f"handler [bold]{name}[/bold] ({source})")
    immediate = f", {handler.immediate} immediate (in-process)" if handler.immediate else ""
    out.print(
        f"  max_attempts {handler.max_attempts}{immediate}; "
        f"backoff {escape(str(handler.backoff['text']))}"
    )
    if handler.rules is not None:
        out.print(_rules_table(handler.rules))
    out.print(_schedule_table(handler, waits))
    out.print(
        f"  dead-lettered {_range(handler.dead_letter_min_ms, handler.dead_letter_max_ms)} "
        "after the first failure if every attempt fails transiently (a RetryLater waits "
        "its own delay instead, up to max_delay); a permanent failure at once"
    )


def _range(low: int, high: int) -> str:
    return format_ms(low) if low == high else f"{format_ms(low)} to {format_ms(high)}"


def _rules_table(rules: Rules) -> Table:
    table = Table(title="classification, first match wins", title_justify="left")
    table.add_column("level")
    table.add_column("transient")
    table.add_column("permanent")
    levels: Sequence[tuple[str, Mapping[str, tuple[str, ...]]]] = (
        ("explicit", rules.explicit),
        ("handler", rules.handler),
        ("default", rules.default),
        ("builtin", rules.builtin),
    )
    for level, lists in levels:
        table.add_row(level, _names(lists["transient"]), _names(lists["permanent"]))
    verdict = rules.unknown
    table.add_row(
        "anything else",
        verdict if verdict == "transient" else "",
        verdict if verdict == "permanent" else "",
    )
    return table


def _names(names: tuple[str, ...]) -> str:
    # The plugin's own exceptions are imported from faststream_retry: their short name says it.
    short = [n.removeprefix("faststream_retry.errors.") for n in names]
    return escape(", ".join(short)) if short else "-"


def _arguments(arguments: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in arguments.items()) or "-"


def _schedule_table(handler: HandlerExplanation, waits: str | None = None) -> Table:
    """The schedule; ``waits``: where a copy waits instead of tiers (Redis)."""
    table = Table(title="schedule", title_justify="left")
    last = "waits in → then" if waits else "tiers (ms) → destination"
    for column in ("attempt", "then", "delay", "elapsed", last):
        table.add_column(column, justify="right" if column == "attempt" else "left")
    for step in handler.schedule:
        then = {
            "retry_now": "retry at once",
            "retry_later": "retry later",
            "dead_letter": "dead letter",
        }[step.action]
        delay = _range(step.delay_min_ms, step.delay_max_ms) if step.delay_max_ms else "-"
        hops = _legs(step.legs_min)
        if waits and step.action == "retry_later":
            hops = escape(waits)
        elif step.legs_max != step.legs_min:
            hops += f"\nup to {_legs(step.legs_max)}"
        table.add_row(
            str(step.attempt),
            then,
            delay,
            _range(step.elapsed_min_ms, step.elapsed_max_ms),
            hops,
        )
    return table


def _legs(legs: tuple[Leg, ...]) -> str:
    if not legs:
        return ""
    path = " + ".join(str(leg.tier_ms) for leg in legs)
    hops = "1 hop" if len(legs) == 1 else f"{len(legs)} hops"
    return escape(f"{path} → {legs[-1].to} ({hops})")


def _objects_table(title: str, objects: tuple[Declared, ...]) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("kind")
    table.add_column("name")
    table.add_column("arguments")
    for obj in objects:
        fields: Mapping[str, Any] = obj.fields
        if obj.kind == "binding":
            name = f"{fields['exchange']} → {fields['queue']}"
            arguments = f"routing_key {fields['routing_key']!r}"
        elif obj.kind == "exchange":
            name, arguments = fields["name"], f"{fields['type']}, durable"
        elif "arguments" in fields:
            name = fields["name"]
            arguments = f"durable, {_arguments(fields['arguments'])}"
        else:  # NATS's streams and consumers, Redis's keys
            name = fields.get("name") or fields.get("durable") or ""
            arguments = ", ".join(
                f"{k} {v}" for k, v in fields.items() if k not in {"name", "durable"}
            )
        table.add_row(obj.kind, escape(name), escape(arguments))
    return table
