"""mkdocs hooks: the version in the site's name, and pages generated from the code.

``{{ worker_config_schema }}`` in a page becomes the tables of the retry worker's config,
rendered from ``faststream_retry.worker_config_schema()``, so the page cannot drift from
what ``load_worker_config`` accepts. ``{{ cli_reference }}`` becomes every command with
its arguments and options, by typer's own generator (mkdocs-click sees no option of a
typer command: typer brings its own click).
"""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Not mkdocs's own types: mypy also runs where only the test and lint groups are
    # installed (the floors), and the hook needs only a mapping.
    from collections.abc import MutableMapping

PLACEHOLDER = "{{ worker_config_schema }}"
CLI = "{{ cli_reference }}"


DURATION = (
    'A *duration* is seconds (a number) or a string such as `"250ms"`, `"5s"`, `"10m"`, '
    '`"2h"`, `"1d"`, or several (`"1h 30m"`).'
)


def on_config(config: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Name the site with the installed version (``pyproject.toml``'s, the one place it is)."""
    config["site_name"] = f"faststream-retry {version('faststream-retry')}"
    return config


def on_page_markdown(markdown: str, **_: object) -> str:
    """Replace the placeholders with the worker config's tables and the CLI reference."""
    if PLACEHOLDER in markdown:
        from faststream_retry import worker_config_schema  # noqa: PLC0415

        markdown = markdown.replace(PLACEHOLDER, render(worker_config_schema()))
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_reference())
    return markdown


def cli_reference() -> str:
    """Markdown for every command of ``faststream-retry``, its arguments and options."""
    import typer.main  # noqa: PLC0415 - the docs build's, not the package's import
    from typer.cli import get_docs_for_click  # noqa: PLC0415

    from faststream_retry.cli._app import app  # noqa: PLC0415

    command = typer.main.get_command(app)
    context = typer.Context(command)
    text = get_docs_for_click(obj=command, ctx=context, name="faststream-retry", title=None)
    # One heading level down (the page has its own title), and a help text's <queue>
    # or <prefix> shown as written, not taken for an HTML tag.
    text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.MULTILINE)
    lines, fenced = [], False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        lines.append(line if fenced or line.startswith("```") else _escape_tags(line))
    return "\n".join(lines)


def _escape_tags(line: str) -> str:
    """Escape ``<`` outside code spans, where markdown would read an HTML tag."""
    parts = line.split("`")
    for index in range(0, len(parts), 2):  # even parts are outside backticks
        parts[index] = parts[index].replace("<", "&lt;")
    return "`".join(parts)


def _type(spec: dict[str, Any]) -> str:  # noqa: PLR0911 - one return per kind of schema
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "const" in spec:
        return f'`"{spec["const"]}"`'
    if "enum" in spec:
        return " or ".join(f'`"{value}"`' for value in spec["enum"])
    options = spec.get("anyOf") or spec.get("oneOf")
    if options:
        kinds = [_type(option) for option in options]
        if "pattern" in json.dumps(spec) and "duration" in spec.get("description", ""):
            return "duration"
        return " or ".join(dict.fromkeys(kind for kind in kinds if kind != "null")) or "null"
    if spec.get("type") == "array":
        return f"list of {_type(spec.get('items', {}))}"
    if spec.get("type") == "string" and "pattern" in spec:
        return "duration"
    return str(spec.get("type", "any"))


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _table(name: str, spec: dict[str, Any], heading: str) -> list[str]:
    lines = [f"{heading} {name}", ""]
    if spec.get("description"):
        lines += [_cell(spec["description"]).replace("``", "`"), ""]
    if "enum" in spec:
        return [*lines, "One of " + _type(spec) + ".", ""]
    required = set(spec.get("required", []))
    rows = []
    for key, prop in spec.get("properties", {}).items():
        kind = _type(prop)
        default = "required" if key in required else _default(prop.get("default"), kind)
        described = prop.get("description", "")
        if described.startswith("a duration:"):
            described = ""  # the type says it, and the page says what a duration is
        rows.append((f"`{key}`", kind, default, _cell(described).replace("``", "`")))
    # A column of what each key is only where the schema says it: the commented
    # retry.toml above the tables says it for every key.
    said = any(row[3] for row in rows)
    lines += ["| key | type | default |" + (" what it is |" if said else "")]
    lines += ["|---|---|---|" + ("---|" if said else "")]
    lines += ["| " + " | ".join(row if said else row[:3]) + " |" for row in rows]
    return [*lines, ""]


def _default(value: object, kind: str) -> str:
    """A default as a TOML file would give it: a duration as "1d", not 86400.0 seconds."""
    if kind == "duration" and isinstance(value, int | float):
        from faststream_retry.core.durations import format_ms  # noqa: PLC0415

        return f'`"{format_ms(round(value * 1000))}"`'
    return "none" if value is None else f"`{json.dumps(value)}`"


def render(schema: dict[str, Any]) -> str:
    """Markdown tables for a JSON schema: its root object first, then each definition."""
    lines = _table("The file", schema, "##")
    lines[2:2] = [DURATION, ""]
    for name, spec in schema.get("$defs", {}).items():
        lines += _table(name, spec, "###")
    return "\n".join(lines)
