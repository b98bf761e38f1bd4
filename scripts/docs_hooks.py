"""mkdocs hooks: the version in the site's name, and pages generated from the code.

``{{ worker_config_schema }}`` in a page becomes the tables of the retry worker's config,
rendered from ``faststream_retry.worker_config_schema()``, so the page cannot drift from
what ``load_worker_config`` accepts.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Not mkdocs's own types: mypy also runs where only the test and lint groups are
    # installed (the floors), and the hook needs only a mapping.
    from collections.abc import MutableMapping

PLACEHOLDER = "{{ worker_config_schema }}"


DURATION = (
    'A *duration* is seconds (a number) or a string such as `"250ms"`, `"5s"`, `"10m"`, '
    '`"2h"`, `"1d"`, or several (`"1h 30m"`).'
)


def on_config(config: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Name the site with the installed version (``pyproject.toml``'s, the one place it is)."""
    config["site_name"] = f"faststream-retry {version('faststream-retry')}"
    return config


def on_page_markdown(markdown: str, **_: object) -> str:
    """Replace the schema placeholder with the worker config's tables."""
    if PLACEHOLDER not in markdown:
        return markdown
    from faststream_retry import worker_config_schema  # noqa: PLC0415

    return markdown.replace(PLACEHOLDER, render(worker_config_schema()))


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
    lines += ["| key | type | default | what it is |", "|---|---|---|---|"]
    for key, prop in spec.get("properties", {}).items():
        default = "required" if key in required else f"`{json.dumps(prop.get('default'))}`"
        described = prop.get("description", "")
        if described.startswith("a duration:"):
            described = ""  # the type says it, and the page says what a duration is
        lines.append(
            f"| `{key}` | {_type(prop)} | {default} | {_cell(described).replace('``', '`')} |"
        )
    return [*lines, ""]


def render(schema: dict[str, Any]) -> str:
    """Markdown tables for a JSON schema: its root object first, then each definition."""
    lines = _table("The file", schema, "##")
    lines[2:2] = [DURATION, ""]
    for name, spec in schema.get("$defs", {}).items():
        lines += _table(name, spec, "###")
    return "\n".join(lines)
