"""Dead letters as an operator reads them: the fields, the body decoded, the filters (pure)."""

from __future__ import annotations

import binascii
import gzip
import importlib
import json
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, TypeAlias

from faststream_retry.core import headers as h
from faststream_retry.core.durations import parse_duration
from faststream_retry.errors import RetryConfigError
from faststream_retry.ops.common import OperationError
from faststream_retry.ops.wire import encode_value

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "Body",
    "DeadLetter",
    "Decoder",
    "Selection",
    "decode_body",
    "iso_time",
    "load_decoder",
    "moment",
    "not_a_time",
    "parse_time",
    "selection",
]

Decoder: TypeAlias = "Callable[[bytes, str | None, Mapping[str, Any]], object]"
"""A ``--decoder``: ``(body, content_type, headers)`` to any JSON-able value or text."""

PREVIEW_CHARS = 60
JSON_FORMAT = 1
"""The ``format`` of the ``dlq`` commands' JSON (and the page's); keys are only ever added."""


@dataclass(frozen=True, slots=True)
class Body:
    """A body made readable: ``kind`` is ``json``, ``text``, ``hex`` or ``decoder``."""

    kind: str
    text: str
    value: object = None
    """The decoded value (JSON, or what a decoder returned), for ``--json`` output."""

    def preview(self, chars: int = PREVIEW_CHARS) -> str:
        """Return the body on one line, cut to ``chars`` characters."""
        line = " ".join(self.text.split())
        return line if len(line) <= chars else line[: chars - 1] + "…"


def _inflate(body: bytes, encoding: str | None) -> bytes:
    """Return ``body`` without its content encoding, when it is one we can undo."""
    try:
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
    except (OSError, zlib.error, EOFError):
        pass  # not what it says it is: show the bytes as they are
    return body


def decode_body(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None = None,
    message_headers: Mapping[str, Any] | None = None,
    decoder: Decoder | None = None,
) -> Body:
    """Make ``body`` readable: a decoder first, then JSON, then UTF-8 text, else hex.

    A decoder that raises falls back to the built-in ways and says so in the text.
    """
    raw = _inflate(body, content_encoding)
    note = ""
    if decoder is not None:
        try:
            value = decoder(raw, content_type, dict(message_headers or {}))
        except Exception as exc:  # the user's code: any failure means show it another way
            note = f"(decoder failed: {type(exc).__name__}: {exc}) "
        else:
            text = value if isinstance(value, str) else _json(value)
            return Body("decoder", text, value)
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json") or not kind:
        try:
            value = json.loads(raw)
        except ValueError:
            pass  # not JSON after all: text or hex below
        else:
            return Body("json", note + _json(value), value)
    try:
        plain = raw.decode()
    except UnicodeDecodeError:
        plain = None
    if plain is not None and _mostly_printable(plain):
        return Body("text", note + plain, plain)
    hexed = binascii.hexlify(raw, " ").decode()
    return Body("hex", note + hexed, raw.hex())


def _mostly_printable(text: str) -> bool:
    return all(c.isprintable() or c in "\n\r\t" for c in text)


def _json(value: object) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def load_decoder(spec: str) -> Decoder:
    """Import a ``module:function`` decoder (protobuf, say), naming what is wrong.

    Raises:
        OperationError: the spec is malformed, the module cannot be imported, or the
            name is not a function.
    """
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise OperationError(f"--decoder takes module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise OperationError(f"cannot import decoder module {module_name!r}: {exc}") from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise OperationError(f"{spec} is not a function (body, content_type, headers) -> value")
    return function  # type: ignore[no-any-return]


_LAST_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the last moment a ``datetime`` holds."""
_NOT_A_TIME_CHARS = 40
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def moment(ms: object) -> datetime | None:
    """Return the UTC moment ``ms`` (epoch milliseconds) names; ``None`` when it names none.

    A time comes from a header, and a producer's own ``retry-*`` headers survive into a
    dead letter: a value of another type, or past year 9999 (which ``read_ms`` lets
    through, up to 2**53), names no moment a calendar can show, and must not break a
    page or a command that shows it.
    """
    if isinstance(ms, bool) or not isinstance(ms, int) or not 0 < ms <= _LAST_MS:
        return None
    # Exact, where ms / 1000 as a float loses the last millisecond near year 9999.
    return _EPOCH + timedelta(milliseconds=ms)


def not_a_time(value: object) -> str:
    """Say that ``value`` (a header's time) names no moment: the value as text, escaped, cut."""
    text = repr(value) if not isinstance(value, int) or isinstance(value, bool) else str(value)
    if len(text) > _NOT_A_TIME_CHARS:
        text = text[: _NOT_A_TIME_CHARS - 1] + "…"
    return f"not a time: {text}"


def iso_time(ms: object) -> str | None:
    """Return ``ms`` (epoch milliseconds) in ISO 8601 UTC; ``None`` when unset (0 or None).

    A value that names no moment (``moment``) is shown as text (``not_a_time``), never
    raised on.
    """
    if ms is None or ms == 0:
        return None
    found = moment(ms)
    return not_a_time(ms) if found is None else found.isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """What the plugin's headers say about one dead letter; every field read safely."""

    position: int
    """1 for the head of the queue when it was read."""
    message_id: str | None
    reason: str
    attempts: int
    exception: str
    error: str
    first_failed_ms: int | None
    last_failed_ms: int | None
    origin_queue: str
    traceback: str
    history: list[dict[str, Any]]
    replayed: list[Any]
    content_type: str | None
    size: int
    body: Body
    properties: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(
        cls,
        position: int,
        body: bytes,
        properties: Mapping[str, Any],
        message_headers: Mapping[str, Any] | None,
        decoder: Decoder | None = None,
    ) -> DeadLetter:
        """Read a dead letter from its body, properties and headers; never raises on them."""
        hdrs = dict(message_headers or {})
        replayed = hdrs.get(h.REPLAYED)
        content_type = properties.get("content_type")
        message_id = properties.get("message_id")
        return cls(
            position=position,
            message_id=str(message_id) if message_id else None,
            reason=h.read_text(hdrs, h.REASON, h.EXCEPTION_LIMIT) or "-",
            attempts=h.read_attempt(hdrs),
            exception=h.read_text(hdrs, h.EXCEPTION, h.EXCEPTION_LIMIT),
            error=h.read_text(hdrs, h.ERROR),
            first_failed_ms=h.read_ms(hdrs, h.FIRST_FAILED_AT),
            last_failed_ms=h.read_ms(hdrs, h.LAST_FAILED_AT),
            origin_queue=h.read_text(hdrs, h.ORIGIN_QUEUE, h.QUEUE_LIMIT),
            traceback=h.read_text(hdrs, h.TRACEBACK, h.TRACEBACK_LIMIT),
            history=h.read_history(hdrs),
            replayed=list(replayed) if isinstance(replayed, list) else [],
            content_type=content_type if isinstance(content_type, str) else None,
            size=len(body),
            body=decode_body(
                body,
                content_type if isinstance(content_type, str) else None,
                properties.get("content_encoding"),
                hdrs,
                decoder,
            ),
            properties=dict(properties),
            headers=hdrs,
        )

    @property
    def key(self) -> str:
        """The id an operator names it by: its message id, or ``#<position>``."""
        return self.message_id or f"#{self.position}"

    def summary(self) -> dict[str, Any]:
        """Return the row of ``dlq list --json``."""
        return {
            "position": self.position,
            "message_id": self.message_id,
            "reason": self.reason,
            "attempts": self.attempts,
            "exception": self.exception,
            "error": self.error,
            "first_failed_at": iso_time(self.first_failed_ms),
            "last_failed_at": iso_time(self.last_failed_ms),
            "origin_queue": self.origin_queue,
            "content_type": self.content_type,
            "size": self.size,
            "body_kind": self.body.kind,
            "body_preview": self.body.preview(),
        }

    def details(self) -> dict[str, Any]:
        """Return everything, for ``dlq show --json``."""
        return {
            "format": JSON_FORMAT,
            **self.summary(),
            "traceback": self.traceback,
            "history": [{**e, "at": iso_time(e["at"])} for e in self.history],
            # As the headers: a producer may have put bytes or decimals in it.
            "replayed": encode_value(self.replayed),
            # Tagged as an export tags them: JSON has no bytes, decimals or timestamps.
            "properties": {k: encode_value(v) for k, v in self.properties.items() if v is not None},
            "headers": encode_value(self.headers),
            "body": self.body.value if self.body.kind != "hex" else self.body.text,
        }


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters an operation takes; an empty selection takes every one."""

    ids: frozenset[str] = frozenset()
    """Message ids, or ``#N`` for the Nth message from the head (as ``dlq list`` numbers)."""
    reasons: frozenset[str] = frozenset()
    exceptions: frozenset[str] = frozenset()
    since_ms: int | None = None
    until_ms: int | None = None

    def matches(self, letter: DeadLetter) -> bool:
        """Return whether ``letter`` is selected: every given filter must hold."""
        if self.ids and not {letter.message_id, f"#{letter.position}"} & self.ids:
            return False
        if self.reasons and letter.reason not in self.reasons:
            return False
        if self.exceptions and not _exception_matches(letter.exception, self.exceptions):
            return False
        when = letter.last_failed_ms or letter.first_failed_ms
        if self.since_ms is not None and (when is None or when < self.since_ms):
            return False
        return not (self.until_ms is not None and (when is None or when > self.until_ms))

    @property
    def everything(self) -> bool:
        """Whether no filter is set."""
        return not (
            self.ids
            or self.reasons
            or self.exceptions
            or self.since_ms is not None
            or self.until_ms is not None
        )


def _exception_matches(name: str, wanted: frozenset[str]) -> bool:
    """Match a qualified type name by its full name or its last part (``TimeoutError``)."""
    return name in wanted or name.rsplit(".", 1)[-1] in wanted


def parse_time(text: str, now: datetime | None = None) -> int:
    """Return epoch ms for ``--since``/``--until``: ISO 8601 (UTC if no zone) or ``2h`` ago.

    An age is a duration as ``core/durations.py`` reads one (``30m``, ``1h 30m``, ``7d``).

    Raises:
        OperationError: neither form.
    """
    try:
        ago = timedelta(milliseconds=parse_duration(text, "an age"))
    except RetryConfigError:
        pass  # not an age: a moment, then
    else:
        return int(((now or datetime.now(timezone.utc)) - ago).timestamp() * 1000)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise OperationError(
            f"a time is ISO 8601 (2026-11-23T14:00:00+00:00) or an age (30m, 2h, 7d), got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def selection(
    ids: Sequence[str] = (),
    reasons: Sequence[str] = (),
    exceptions: Sequence[str] = (),
    since: str | None = None,
    until: str | None = None,
) -> Selection:
    """Build a ``Selection`` from command-line values."""
    return Selection(
        frozenset(ids),
        frozenset(reasons),
        frozenset(exceptions),
        None if since is None else parse_time(since),
        None if until is None else parse_time(until),
    )
