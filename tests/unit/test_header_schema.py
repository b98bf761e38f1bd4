"""The JSON Schema of a dead letter's headers (middleware.header_schema) keeps step with the wire format."""

from __future__ import annotations

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason
from faststream_retry.middleware.header_schema import (
    HEADERS_SCHEMA_NAME,
    dead_letter_headers_schema,
)


def test_every_header_the_plugin_writes_is_described() -> None:
    written = {
        value
        for name, value in vars(h).items()
        if name.isupper() and isinstance(value, str) and value.startswith("retry-")
    }
    schema = dead_letter_headers_schema()

    assert set(schema["properties"]) == written
    assert all(prop.get("description") for prop in schema["properties"].values())
    assert schema["title"] == HEADERS_SCHEMA_NAME
    assert "required" not in schema  # a lean or a RabbitMQ-moved dead letter lacks some


def test_every_reason_is_in_the_enum() -> None:
    assert dead_letter_headers_schema()["properties"][h.REASON]["enum"] == [r.value for r in Reason]


def test_each_call_returns_a_schema_of_its_own() -> None:
    first = dead_letter_headers_schema()
    first["properties"][h.HISTORY]["items"]["properties"]["at"]["minimum"] = 5

    assert (
        dead_letter_headers_schema()["properties"][h.HISTORY]["items"]["properties"]["at"][
            "minimum"
        ]
        == 0
    )
