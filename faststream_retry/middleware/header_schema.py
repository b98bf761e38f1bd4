"""The JSON Schema of the headers a dead letter in ``<queue>.dlq`` carries, for AsyncAPI.

The AsyncAPI document of an app (``middleware.schema``) gives it as the ``headers`` of
each ``.dlq`` channel's message, so the team that reads a service's contract sees what
a dead letter says about its failure. ``core.headers`` is the wire format itself; this
describes it, and ``tests/unit/test_header_schema.py`` keeps the two in step.

Nothing is ``required``: a dead letter too large for a frame goes lean (no history,
traceback or replay story), one RabbitMQ moved out of ``<queue>.retry`` at its delivery
limit is a retry copy (``retry-due``, no ``retry-reason``), and the retry worker's dead
letters never had a failed handler call.
"""

from __future__ import annotations

from typing import Any

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason

__all__ = ["HEADERS_SCHEMA_NAME", "dead_letter_headers_schema"]

HEADERS_SCHEMA_NAME = "FastStreamRetryDeadLetterHeaders"
"""The name of the schema among an AsyncAPI document's ``components.schemas``."""


def _epoch_ms(description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 0, "description": f"epoch ms: {description}"}


def _failure() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "attempt": {"type": "integer", "minimum": 0, "description": "the failed call"},
            "at": _epoch_ms("when it failed"),
            "exception": {"type": "string", "maxLength": h.EXCEPTION_LIMIT},
            "error": {"type": "string", "description": "str(exception), cut to 200 bytes"},
            "delay": {"type": "integer", "minimum": 0, "description": "the wait it got, ms"},
        },
    }


def _replayed() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "an earlier life of the message, before `faststream-retry dlq replay`",
        "properties": {
            "at": _epoch_ms("when it was replayed"),
            "reason": {"type": "string"},
            "attempts": {"type": "integer", "minimum": 0},
            "exception": {"type": "string"},
            "error": {"type": "string"},
            "first-failed-at": _epoch_ms("the first failure"),
            "last-failed-at": _epoch_ms("the latest failure"),
            "origin-queue": {"type": "string"},
            "history": {"type": "array", "items": _failure()},
        },
    }


def dead_letter_headers_schema() -> dict[str, Any]:
    """Return the JSON Schema of a dead letter's ``retry-*`` headers (a new dict each call)."""
    properties: dict[str, dict[str, Any]] = {
        h.VERSION: {
            "type": "integer",
            "const": h.FORMAT_VERSION,
            "description": "the format version of these headers",
        },
        h.ATTEMPT: {
            "type": "integer",
            "minimum": 0,
            "description": "failed handler calls so far",
        },
        h.DUE: _epoch_ms(
            "when a retry copy was due back; only on a copy RabbitMQ moved here from "
            "<queue>.retry at its delivery limit"
        ),
        h.FIRST_FAILED_AT: _epoch_ms("the first failure"),
        h.LAST_FAILED_AT: _epoch_ms("the latest failure"),
        h.HISTORY: {
            "type": "array",
            "maxItems": h.HISTORY_LIMIT,
            "items": _failure(),
            "description": "the last failures, the newest last",
        },
        h.REASON: {
            "type": "string",
            "enum": [reason.value for reason in Reason],
            "description": "why the message was dead-lettered",
        },
        h.EXCEPTION: {
            "type": "string",
            "description": "the qualified type of the last failure's exception",
        },
        h.ERROR: {
            "type": "string",
            "maxLength": h.ERROR_LIMIT,
            "description": "str() of the last failure's exception",
        },
        h.TRACEBACK: {
            "type": "string",
            "description": "the last failure's traceback, its last 4 KiB",
        },
        h.ORIGIN_QUEUE: {
            "type": "string",
            "description": "the queue it failed in (information only: nothing routes by it)",
        },
        h.REPLAYED: {
            "type": "array",
            "maxItems": h.REPLAYED_LIMIT,
            "items": _replayed(),
            "description": "written by `faststream-retry dlq replay`, the newest last",
        },
    }
    return {
        "title": HEADERS_SCHEMA_NAME,
        "type": "object",
        "description": (
            "What faststream-retry says about a dead letter's failure. The message's "
            "own headers and properties travel unchanged."
        ),
        "properties": properties,
    }
