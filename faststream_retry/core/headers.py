r"""The wire format: every header the plugin reads or writes, and nothing else, lives here.

Headers are untrusted input. Every reader here returns a safe value for anything a
hostile or buggy producer can put on the wire and never raises. Rules:

=========================  ===============================================================
``retry-version``          format version; written as 1, never trusted for anything
``retry-attempt``          failed handler calls so far; not a non-negative int below
                           2**31: treated as 0 (the count restarts; it is rewritten valid)
``retry-due``              epoch ms when the message is due back; missing or unreadable:
                           due now; beyond now + max_delay + one tick: dead-lettered as
                           ``invalid`` (rewriting it would cycle for ever)
``retry-first-failed-at``  epoch ms of the first failure; unreadable: replaced by now
``retry-last-failed-at``   epoch ms of the latest failure (written, never read)
``retry-history``          the last ``HISTORY_LIMIT`` failures, each a table; anything
                           that is not such a list is dropped and the history restarts
``retry-reason``           on dead letters: ``permanent``, ``exhausted``, ``invalid`` or
                           ``stuck``; the retry worker also writes ``poison``, ``expired``,
                           ``maxlen``
``retry-exception``        on dead letters: the exception's qualified type name
``retry-error``            on dead letters: ``str(exception)``, truncated; an exception
                           whose ``str()`` raises reads ``<unprintable Name: str() raised
                           Error>``
``retry-traceback``        on dead letters: the traceback's tail, truncated (each frame
                           and the message first, so the frames stay)
``retry-origin-queue``     on dead letters: the queue the message failed in (information
                           only: the plugin never routes by a header)
``retry-replayed``         written by ``faststream-retry dlq replay``: the story of each
                           earlier life of the message (the last ``REPLAYED_LIMIT``), each
                           a table: when it was replayed, and the reason, attempts,
                           exception, error, failure times, origin queue and history it
                           had in the dead-letter queue. Carried unchanged; the plugin
                           never reads it to decide anything
=========================  ===============================================================

RabbitMQ's own ``x-death``, ``x-first-death-*``, ``x-last-death-*`` and the counts a
quorum queue sets on each delivery (``BROKER_COUNTS``: facts about one delivery from one
queue, not about the message) are removed on every republish, and so are ``CC`` and
``BCC`` (sender-selected routing, which would send the copy to other queues too). The
bytes the plugin adds are bounded (``MAX_ADDED_BYTES``). Every text the plugin writes is
valid UTF-8: a lone surrogate (``"\udc80"``, from bytes decoded with ``surrogateescape``)
is written as the six characters ``\udc80``, never dropped.

Describing an exception runs the application's code (``__str__``, a metaclass, the
traceback's ``__notes__``); ``exception_name``, ``error_text`` and ``traceback_text`` never
raise, whatever that code does.
"""

from __future__ import annotations

import decimal
import math
import time
import traceback as tb
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from faststream_retry.core.topology import MAX_NAME_BYTES

__all__ = [
    "ATTEMPT",
    "DUE",
    "ERROR",
    "EXCEPTION",
    "FIRST_FAILED_AT",
    "FORMAT_VERSION",
    "HISTORY",
    "HISTORY_LIMIT",
    "LAST_FAILED_AT",
    "MAX_ADDED_BYTES",
    "ORIGIN_QUEUE",
    "REASON",
    "REPLAYED",
    "REPLAYED_LIMIT",
    "RETRY_STATE",
    "TRACEBACK",
    "VERSION",
    "FailureRecord",
    "carry_over",
    "dead_letter_headers",
    "error_text",
    "exception_name",
    "expired_from",
    "now_ms",
    "read_attempt",
    "read_due",
    "read_history",
    "read_ms",
    "read_text",
    "replayed_headers",
    "retry_headers",
    "sanitize",
    "traceback_text",
    "truncate",
    "truncate_tail",
]

FORMAT_VERSION = 1

VERSION = "retry-version"
ATTEMPT = "retry-attempt"
DUE = "retry-due"
FIRST_FAILED_AT = "retry-first-failed-at"
LAST_FAILED_AT = "retry-last-failed-at"
HISTORY = "retry-history"
REASON = "retry-reason"
EXCEPTION = "retry-exception"
ERROR = "retry-error"
TRACEBACK = "retry-traceback"
ORIGIN_QUEUE = "retry-origin-queue"
REPLAYED = "retry-replayed"
RETRY_STATE = (
    VERSION,
    ATTEMPT,
    DUE,
    FIRST_FAILED_AT,
    LAST_FAILED_AT,
    HISTORY,
    REASON,
    EXCEPTION,
    ERROR,
    TRACEBACK,
    ORIGIN_QUEUE,
)
"""Every header of a message's retry state: what a replay resets."""

HISTORY_LIMIT = 10
REPLAYED_LIMIT = 3
ERROR_LIMIT = 1024
HISTORY_ERROR_LIMIT = 200
EXCEPTION_LIMIT = 200
TRACEBACK_LIMIT = 4096
QUEUE_LIMIT = MAX_NAME_BYTES
"""An origin queue is a queue name: at most the bytes AMQP allows one."""
MAX_ADDED_BYTES = 12 * 1024
"""Upper bound of what the plugin adds to a message's headers, history included."""

_MAX_ATTEMPT = 2**31
_MAX_MS = 2**53
# A due time is compared, never stored: any int64 is readable, and one far in the
# future is then "impossible" (dead-lettered as invalid), not "unreadable".
_MAX_DUE = 2**63

# The broker's death records, and RabbitMQ's sender-selected distribution (CC, BCC): a
# copy that kept those would be routed to those queues too, at every publish and every
# dead-lettering out of a tier.
_DROPPED_HEADERS = ("x-death", "CC", "BCC")
_BROKER_DEATH_PREFIXES = ("x-first-death-", "x-last-death-")


def now_ms() -> int:
    """Return the wall clock in epoch milliseconds (the unit of ``retry-due``)."""
    return time.time_ns() // 1_000_000


# The descriptors type itself reads a class's names with: a metaclass cannot override
# them, and they return what the class statement (or type()) set.
_QUALNAME = type.__dict__["__qualname__"]
_MODULE = type.__dict__["__module__"]


def exception_name(exc: BaseException) -> str:
    """Return what ``retry-exception`` says of ``exc``: its qualified type name; never raises."""
    cls = type(exc)  # type(), not exc.__class__, which a class can make a property
    name: str = _QUALNAME.__get__(cls)
    try:
        module = _MODULE.__get__(cls)
    except AttributeError:  # a class whose namespace lost its __module__
        module = None
    if not issubclass(type(module), str):  # a class body may set __module__ to anything
        return truncate(name, EXCEPTION_LIMIT)
    module = str.__str__(module)  # a plain str: a subclass may override == and format
    return truncate(name if module == "builtins" else f"{module}.{name}", EXCEPTION_LIMIT)


def error_text(exc: BaseException, limit: int = ERROR_LIMIT, problem: str | None = None) -> str:
    """Return ``str(exc)`` as ``retry-error`` carries it, cut to ``limit`` bytes; never raises.

    An exception whose ``str()`` raises (``__str__`` reading an argument it was not
    given, say) is described as ``<unprintable Name: str() raised Error>``. A
    ``problem`` (why the plugin overruled what the exception asked for) comes first.
    """
    try:
        # str() passes on a str subclass __str__ returns: str.__str__ makes it a plain
        # str, whose encoding no application code overrides.
        text = str.__str__(str(exc))
    except Exception as raised:  # the application's __str__: anything can happen
        text = f"<unprintable {exception_name(exc)}: str() raised {exception_name(raised)}>"
    return truncate(text if problem is None else f"{problem} ({text})", limit)


def traceback_text(exc: BaseException, limit: int = TRACEBACK_LIMIT) -> str:
    """Return the traceback of ``exc``, its last ``limit`` bytes at most; never raises.

    Each part of it (a frame, the exception's line, a note) is cut to ``ERROR_LIMIT``
    bytes first: the tail of a traceback whose message is megabytes long still names
    the frames. ``traceback`` calls the exception's ``str()`` and reads its
    ``__notes__`` and its chained causes; if any of that raises, the text is the
    exception's own frames, its name and message, and what raised.
    """
    try:
        text = "".join(map(_part, tb.TracebackException.from_exception(exc).format()))
    except Exception as problem:  # see error_text: application code runs in here
        text = _frames(exc) + (
            f"{exception_name(exc)}: {error_text(exc)}\n"
            f"(no full traceback: formatting it raised {exception_name(problem)})\n"
        )
    return truncate_tail(text, limit)


def exception_only_text(exc: BaseException) -> str:
    """Return the last part of ``traceback_text(exc)``: the exception's own line(s).

    Without its frames: for an exception with no chain or notes, ``traceback_text`` is
    its frames' text followed by this (before the tail is cut to its limit).
    """
    return "".join(map(_part, tb.format_exception_only(exc)))


def _part(text: str) -> str:
    cut = truncate(text, ERROR_LIMIT)
    return cut if cut.endswith("\n") else cut + "\n"


def _frames(exc: BaseException) -> str:
    """The frames of ``exc`` alone: no message, notes or chain, which may be what raised."""
    try:
        frames = tb.format_list(tb.extract_tb(exc.__traceback__))
    except Exception:  # a property named __traceback__, a source loader that raises
        return ""
    if not frames:
        return ""
    return "Traceback (most recent call last):\n" + "".join(map(_part, frames))


def _utf8(text: str) -> bytes:
    # str.encode itself: a str subclass may override encode(); lone surrogates become
    # the text "\udc80" (a str() of bytes decoded with surrogateescape has them).
    return str.encode(text, errors="backslashreplace")


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes, marking the cut; surrogates escaped."""
    raw = _utf8(text)
    if len(raw) <= limit:
        return raw.decode()
    return raw[: limit - 3].decode(errors="ignore") + "..."


def _int(value: object, upper: int) -> int | None:  # noqa: PLR0911 - one case per type
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < upper else None
    if isinstance(value, (float, decimal.Decimal)):
        try:
            if not math.isfinite(value) or not 0 <= value < upper:
                return None
            return int(value)
        except (ArithmeticError, ValueError, TypeError):
            return None
    if isinstance(value, (str, bytes, bytearray)):
        text = value.strip()
        # str.isdigit() also takes digits int() refuses ("²"); the length bounds int()'s work.
        if not text.isascii() or not text.isdigit() or len(text) > 20:
            return None
        return _int(int(text), upper)
    return None


def read_attempt(headers: Mapping[str, Any] | None) -> int:
    """Return the failed calls so far; 0 when missing or unreadable."""
    if not headers:
        return 0
    return _int(headers.get(ATTEMPT), _MAX_ATTEMPT) or 0


BROKER_COUNTS = frozenset({"x-delivery-count", "x-acquired-count"})
"""Where RabbitMQ counts a quorum queue's returned deliveries, set again on each delivery:
``x-delivery-count`` (3.x, 4.0: every return; 4.3: the returns that spend the delivery
limit) and ``x-acquired-count`` (4.3: every return). A classic queue sets neither. Every
republish (a copy, a replay, an import, a pass) drops them."""


def without_broker_counts(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return ``headers`` without the counts RabbitMQ sets on a delivery (``BROKER_COUNTS``)."""
    return {k: v for k, v in (headers or {}).items() if k not in BROKER_COUNTS}


def read_requeues(headers: Mapping[str, Any] | None) -> int:
    """Return how often the broker says this delivery came back to its queue before; 0 if never.

    The larger of the counts RabbitMQ keeps (``BROKER_COUNTS``); unreadable counts
    as 0. Forged by a publisher it can only move its own message to its own DLQ early.
    """
    if not headers:
        return 0
    return max(_int(headers.get(key), _MAX_ATTEMPT) or 0 for key in BROKER_COUNTS)


def read_due(headers: Mapping[str, Any] | None) -> int | None:
    """Return the due time in epoch ms, or ``None`` when missing or unreadable."""
    if not headers:
        return None
    value = headers.get(DUE)
    if isinstance(value, datetime):
        try:
            return _int(round(value.timestamp() * 1000), _MAX_DUE)
        except (OverflowError, OSError, ValueError):
            return None
    return _int(value, _MAX_DUE)


def expired_from(headers: Mapping[str, Any] | None) -> str | None:
    """Return the queue the message last expired out of, per RabbitMQ's ``x-death``.

    ``None`` when the newest death record is missing, unreadable or not an expiry.
    Only reporting reads it (a release the broker made from a tier): it routes nothing,
    so a forged record can at worst add a line to the metrics.
    """
    deaths = headers.get("x-death") if headers else None
    if not isinstance(deaths, (list, tuple)) or not deaths:
        return None
    newest = deaths[0]  # RabbitMQ puts the most recent death first
    if not isinstance(newest, Mapping) or _text(newest.get("reason")) != "expired":
        return None
    return _text(newest.get("queue")) or None


def read_ms(headers: Mapping[str, Any] | None, key: str) -> int | None:
    """Return the epoch-ms timestamp under ``key``, or ``None`` when missing or unreadable."""
    if not headers:
        return None
    return _int(headers.get(key), _MAX_MS)


def read_text(headers: Mapping[str, Any] | None, key: str, limit: int = ERROR_LIMIT) -> str:
    """Return the text under ``key`` cut to ``limit`` bytes; ``""`` when missing or not text."""
    if not headers:
        return ""
    return truncate(_text(headers.get(key)), limit)


def read_history(headers: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Return the failure history, each entry checked; ``[]`` when missing or unreadable."""
    if not headers:
        return []
    return _read_history(headers)


# What a replay resets: the retry state (carry_over drops the broker's delivery count).
_RESET = RETRY_STATE


def replayed_headers(headers: Mapping[str, Any] | None, at_ms: int) -> dict[str, Any]:
    """Return the headers of a dead letter sent back to work: a fresh retry state.

    The attempt count, due time and failure fields go, so the message gets every
    attempt of its policy again; what they said moves into a ``retry-replayed``
    record, so the story is not lost. Earlier records stay, the newest last, at most
    ``REPLAYED_LIMIT``. The traceback is not kept (it is the largest field, and the
    history names each failure).
    """
    kept = {k: v for k, v in carry_over(headers).items() if k not in _RESET}
    record = {
        "at": at_ms,
        "reason": read_text(headers, REASON, EXCEPTION_LIMIT),
        "attempts": read_attempt(headers),
        "exception": read_text(headers, EXCEPTION, EXCEPTION_LIMIT),
        "error": read_text(headers, ERROR, HISTORY_ERROR_LIMIT),
        "first-failed-at": read_ms(headers, FIRST_FAILED_AT) or 0,
        "last-failed-at": read_ms(headers, LAST_FAILED_AT) or 0,
        "origin-queue": read_text(headers, ORIGIN_QUEUE, QUEUE_LIMIT),
        "history": read_history(headers),
    }
    earlier = kept.get(REPLAYED)
    records = [r for r in earlier if isinstance(r, Mapping)] if isinstance(earlier, list) else []
    kept[REPLAYED] = [*records, record][-REPLAYED_LIMIT:]
    return kept


def _read_history(headers: Mapping[str, Any]) -> list[dict[str, Any]]:
    value = headers.get(HISTORY)
    if not isinstance(value, (list, tuple)):
        return []
    entries = []
    for item in value[-HISTORY_LIMIT:]:
        if not isinstance(item, Mapping):
            return []
        entry = {
            "attempt": _int(item.get("attempt"), _MAX_ATTEMPT) or 0,
            "at": _int(item.get("at"), _MAX_MS) or 0,
            "exception": truncate(_text(item.get("exception")), EXCEPTION_LIMIT),
            "error": truncate(_text(item.get("error")), HISTORY_ERROR_LIMIT),
            "delay": _int(item.get("delay"), _MAX_MS) or 0,
        }
        entries.append(entry)
    return entries


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode(errors="replace")
    return ""


def _dropped(key: str) -> bool:
    """Whether a copy leaves ``key`` out: the broker's death records, counts and routing headers."""
    return key in _DROPPED_HEADERS or key in BROKER_COUNTS or key.startswith(_BROKER_DEATH_PREFIXES)


def sanitize(value: Any) -> Any:  # noqa: ANN401 - header values are any AMQP field value
    """Return ``value`` in a form the AMQP encoder takes back.

    Decoded byte arrays come in as ``bytes``, but pamqp encodes only ``bytearray``.
    """
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, Mapping):
        return {str(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    return value


def carry_over(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return the headers a republished copy keeps.

    All but the broker's death records and the ``CC`` / ``BCC`` routing headers: the
    plugin alone says where a copy goes.
    """
    if not headers:
        return {}
    return {k: sanitize(v) for k, v in headers.items() if isinstance(k, str) and not _dropped(k)}


class FailureRecord:
    """One failed handler call, as the headers record it."""

    __slots__ = ("at_ms", "attempt", "delay_ms", "error", "exception")

    def __init__(
        self,
        *,
        attempt: int,
        at_ms: int,
        exception: str,
        error: str,
        delay_ms: int = 0,
    ) -> None:
        """Keep the fields; strings are truncated to the history's bounds."""
        self.attempt = attempt
        self.at_ms = at_ms
        self.exception = truncate(exception, EXCEPTION_LIMIT)
        self.error = error
        self.delay_ms = delay_ms

    @classmethod
    def of(
        cls,
        exc: BaseException,
        *,
        attempt: int,
        at_ms: int,
        delay_ms: int = 0,
        problem: str | None = None,
    ) -> FailureRecord:
        """Describe ``exc``, the failure of handler call ``attempt``; never raises.

        ``problem`` is as in ``error_text``.
        """
        return cls(
            attempt=attempt,
            at_ms=at_ms,
            exception=exception_name(exc),
            error=error_text(exc, problem=problem),
            delay_ms=delay_ms,
        )

    def as_entry(self) -> dict[str, Any]:
        """Return the history table of this failure."""
        return {
            "attempt": self.attempt,
            "at": self.at_ms,
            "exception": self.exception,
            "error": truncate(self.error, HISTORY_ERROR_LIMIT),
            "delay": self.delay_ms,
        }


def _failure_headers(incoming: Mapping[str, Any] | None, failure: FailureRecord) -> dict[str, Any]:
    headers = carry_over(incoming)
    first = _int(headers.get(FIRST_FAILED_AT), _MAX_MS) or failure.at_ms
    history = _read_history(headers)
    history.append(failure.as_entry())
    headers[VERSION] = FORMAT_VERSION
    headers[ATTEMPT] = failure.attempt
    headers[FIRST_FAILED_AT] = first
    headers[LAST_FAILED_AT] = failure.at_ms
    headers[HISTORY] = history[-HISTORY_LIMIT:]
    return headers


def retry_headers(
    incoming: Mapping[str, Any] | None, failure: FailureRecord, due_ms: int
) -> dict[str, Any]:
    """Return the headers of the copy that waits in the delay tiers."""
    headers = _failure_headers(incoming, failure)
    headers[DUE] = due_ms
    for key in (REASON, EXCEPTION, ERROR, TRACEBACK, ORIGIN_QUEUE):
        headers.pop(key, None)
    return headers


def dead_letter_headers(
    incoming: Mapping[str, Any] | None,
    failure: FailureRecord,
    *,
    reason: str,
    origin_queue: str,
    traceback: str = "",
) -> dict[str, Any]:
    """Return the headers of the copy that goes to ``<queue>.dlq``."""
    headers = _failure_headers(incoming, failure)
    headers.pop(DUE, None)
    headers[REASON] = str(reason)  # a plain str on the wire, whatever enum came in
    headers[EXCEPTION] = failure.exception
    headers[ERROR] = truncate(failure.error, ERROR_LIMIT)
    headers[TRACEBACK] = truncate_tail(traceback, TRACEBACK_LIMIT)
    headers[ORIGIN_QUEUE] = truncate(origin_queue, QUEUE_LIMIT)
    return headers


def truncate_tail(text: str, limit: int) -> str:
    """Keep the last ``limit`` UTF-8 bytes: a traceback's end names the failing line."""
    raw = _utf8(text)
    if len(raw) <= limit:
        return raw.decode()
    return "..." + raw[-(limit - 3) :].decode(errors="ignore")
