"""The plugin's log lines, on one path: seen with FastStream's defaults, never twice.

Every line the plugin writes goes through ``log``. Where it ends up:

- If logging is configured for the logger ``faststream_retry`` (a handler on it or on
  an ancestor it propagates to: ``logging.basicConfig``, ``dictConfig``, ``faststream
  run --log-config``, pytest's capture), the line goes there and nowhere else: the
  user's handlers, formats and levels rule.
- Otherwise it goes through the logger of the broker the plugin is installed on:
  FastStream's own (the one that prints ``Received`` / ``Processed``, with its
  timestamp, level, exchange, queue and message id columns), at its level, which
  ``faststream run --log-level`` and ``RabbitBroker(log_level=...)`` set;
  ``RabbitBroker(logger=None)`` silences it as it silences FastStream's lines.
  Python's last-resort handler never prints a bare line.

A level set on ``faststream_retry`` applies on both paths. Without one, the broker path
follows the broker logger's level (``faststream run --log-level DEBUG`` shows the
re-check hops), INFO until that logger is set up.

Every line is bounded whatever the application's exception holds: its text (the
message with its arguments) to ``LINE_LIMIT`` bytes, the traceback under it to the
last ``TRACEBACK_LIMIT`` bytes, each frame and message cut first
(``headers.traceback_text``). The traceback is formatted here, never by logging, so an
exception whose formatting raises (a ``__notes__`` property, say) still gets its line;
on the logging path it is the record's ``exc_text`` (``exc_info`` stays ``None``).

This module imports no FastStream: the broker's logger comes in as an ``Outlet``
(``middleware._internals.broker_outlet``), so ``amqp``, ``engine`` and the worker use
it too.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from faststream_retry.core.headers import (
    exception_name,
    exception_only_text,
    traceback_text,
    truncate,
    truncate_tail,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    Outlet = Callable[[int, str, BaseException | None, Mapping[str, Any]], bool]
    """Writes one line to a broker's logger; ``False`` if it could not (broker gone).

    ``PluginLogger`` passes no exception: the traceback is already in the line.
    """

__all__ = [
    "LINE_LIMIT",
    "NAME",
    "TRACEBACK_LIMIT",
    "PluginLogger",
    "Throttle",
    "log",
    "traceback_of",
]

NAME = "faststream_retry"
LINE_LIMIT = 4 * 1024
"""Upper bound, in UTF-8 bytes, of a line's text (without its traceback)."""
TRACEBACK_LIMIT = 8 * 1024
"""Upper bound of the traceback under a line: its last 8 KiB (see ``headers.traceback_text``)."""


class PluginLogger:
    """The ``logging.Logger`` methods the plugin uses, sent where the module docstring says."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        """Write to ``logger`` (``faststream_retry``) when logging is configured for it."""
        self.logger = logging.getLogger(NAME) if logger is None else logger
        self._outlet: Outlet | None = None
        self._outlet_level: Callable[[], int | None] | None = None

    def send_to(self, outlet: Outlet | None, level: Callable[[], int | None] | None = None) -> None:
        """Use ``outlet`` (a broker's logger) while ``name`` has no handler of its own.

        ``level`` reads that logger's level (``None``: not known yet), which the lines
        follow unless a level is set on ``name``.
        """
        self._outlet = outlet
        self._outlet_level = level

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging.Logger's name
        """Return whether a line at ``level`` would be written anywhere."""
        logger = self.logger
        if logger.manager.disable >= level:  # logging.disable() silences both paths
            return False
        if logger.level != logging.NOTSET or logger.hasHandlers() or self._outlet is None:
            return logger.isEnabledFor(level)
        known = None if self._outlet_level is None else self._outlet_level()
        return level >= (logging.INFO if known is None else known)

    def log(
        self,
        level: int,
        msg: str,
        *args: object,
        exc_info: BaseException | bool | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Write one line, with the traceback of ``exc_info`` (``True``: the one handled)."""
        logger = self.logger
        outlet = self._outlet
        to_broker = outlet is not None and not logger.hasHandlers()
        if not (self.isEnabledFor(level) if to_broker else logger.isEnabledFor(level)):
            return
        exception = sys.exc_info()[1] if exc_info is True else exc_info or None
        # Formatted here, never by logging: the application's exception runs its own
        # code as it is formatted (a __notes__ that raises makes logging drop the line
        # with a bare "--- Logging error ---") and may be megabytes long.
        text, exact = _text(msg, args)
        trace = None
        if exception is not None:  # without its last newline, as Formatter.formatException
            trace = traceback_of(exception).removesuffix("\n")
        if to_broker and outlet is not None:
            try:
                if outlet(level, text if trace is None else f"{text}\n{trace}", None, extra or {}):
                    return
            except Exception:  # noqa: S110 - a broken outlet must not lose the line
                pass
            if not logger.isEnabledFor(level):
                return
        if not exact:  # the line as written, since the arguments do not make one
            msg, args = text, ()
        path, line, function = _caller()
        record = logger.makeRecord(logger.name, level, path, line, msg, args, None, function, extra)
        # Formatter.format appends exc_text as it would a formatted exc_info, and JSON
        # formatters read it too: the line looks as logger.exception's would.
        record.exc_text = trace
        logger.handle(record)

    def debug(self, msg: str, *args: object, **kwargs: Any) -> None:  # noqa: ANN401
        """Write at DEBUG."""
        self.log(logging.DEBUG, msg, *args, **kwargs)

    def info(self, msg: str, *args: object, **kwargs: Any) -> None:  # noqa: ANN401
        """Write at INFO."""
        self.log(logging.INFO, msg, *args, **kwargs)

    def warning(self, msg: str, *args: object, **kwargs: Any) -> None:  # noqa: ANN401
        """Write at WARNING."""
        self.log(logging.WARNING, msg, *args, **kwargs)

    def error(self, msg: str, *args: object, **kwargs: Any) -> None:  # noqa: ANN401
        """Write at ERROR."""
        self.log(logging.ERROR, msg, *args, **kwargs)

    def exception(self, msg: str, *args: object, **kwargs: Any) -> None:  # noqa: ANN401
        """Write at ERROR with the traceback of the exception being handled."""
        kwargs.setdefault("exc_info", True)
        self.log(logging.ERROR, msg, *args, **kwargs)


_SEEN_LIMIT = 256
# (the class's id, its frames) -> (the class, the frames' text, the last message, its text)
_seen: dict[tuple[object, ...], tuple[type[BaseException], str, object, str]] = {}


def traceback_of(exception: BaseException) -> str:
    """Return ``traceback_text(exception)``, its frames formatted once per place of failure.

    A burst of messages failing the same way (every one's first failure, in an outage)
    raises the same exception from the same place: formatting each traceback again
    was a fifth of the consumer's CPU, and with tracing on (a span records it too)
    half of it. An exception without a chain or notes is written in full by its type,
    its frames (code and instruction) and its message: the frames' text is kept per
    type and frames, and only the message's line is formatted for each failure (the
    same message gets the same text object).
    """
    key = _kind(exception)
    if key is None:
        return traceback_text(exception, TRACEBACK_LIMIT)
    *place, message = key
    where = tuple(place)
    cls = type(exception)
    seen = _seen.get(where)
    if seen is not None and seen[0] is cls:
        if seen[2] == message:
            return seen[3]
        try:
            text = truncate_tail(seen[1] + exception_only_text(exception), TRACEBACK_LIMIT)
        except Exception:  # the application's exception runs its own code here
            return traceback_text(exception, TRACEBACK_LIMIT)
        _seen[where] = (cls, seen[1], message, text)
        return text
    if len(_seen) >= _SEEN_LIMIT:
        _seen.clear()
    text = traceback_text(exception, TRACEBACK_LIMIT)
    try:
        only = exception_only_text(exception)
    except Exception:  # as above: then this text is not kept
        return text
    if text.endswith(only) and text.startswith("Traceback"):  # whole: its tail was not cut
        # The class is kept with its text: the key names it by id, which a class made
        # after this one is gone could have again.
        _seen[where] = (cls, text[: len(text) - len(only)], message, text)
    return text


def _kind(exception: BaseException) -> tuple[object, ...] | None:
    """Return what decides ``exception``'s traceback text, or ``None`` if more does."""
    try:
        if (
            exception.__cause__ is not None
            or exception.__context__ is not None
            or getattr(exception, "__notes__", None) is not None
        ):
            return None
        frames = []
        trace = exception.__traceback__
        while trace is not None:
            frames.append((trace.tb_frame.f_code, trace.tb_lasti))
            trace = trace.tb_next
        # The class by its id: a metaclass may make hashing or comparing it raise.
        return (id(type(exception)), tuple(frames), str.__str__(str(exception)))
    except Exception:  # the application's exception runs its own code here
        return None


def _text(msg: str, args: tuple[object, ...]) -> tuple[str, bool]:
    """Return the line, bounded, and whether it is exactly ``msg % args``."""
    try:
        text = msg % args if args else msg
    except Exception as problem:  # an argument's __str__ or __repr__ raised
        return truncate(
            f"{msg} (arguments not shown: {exception_name(problem)})", LINE_LIMIT
        ), False
    bounded = truncate(text, LINE_LIMIT)
    return bounded, bounded == text


def _caller() -> tuple[str, int, str]:
    """The plugin's code that wrote the line: the first frame outside this module."""
    frame = sys._getframe(1)  # noqa: SLF001 - what logging.currentframe does
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name


log = PluginLogger()
"""The plugin's one logger (see the module docstring)."""


class Throttle:
    """At most one line per key and interval; the next line says how many were held back.

    A work queue at its length limit refuses every release, and a broker that is away
    fails every copy: one line each would flood the log with what one line says.
    """

    def __init__(
        self,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        """Let one line per key through every ``interval_s`` seconds of ``clock``.

        The lines go to ``logger``, the plugin's own logger (``log``) unless given.
        """
        self._interval_s = interval_s
        self._clock = clock
        self._logger = logger
        self._open_at: dict[object, float] = {}
        self._held: dict[object, int] = {}

    def log(self, level: int, key: object, msg: str, *args: object) -> None:
        """Log ``msg`` at ``level`` unless a line of ``key`` went out less than the interval ago."""
        now = self._clock()
        if now < self._open_at.get(key, 0.0):
            self._held[key] = self._held.get(key, 0) + 1
            return
        if len(self._open_at) > _THROTTLE_KEYS:  # bounded: keys come from queue names
            self._open_at.clear()
        self._open_at[key] = now + self._interval_s
        held = self._held.pop(key, 0)
        if held:
            msg += " (and %d more like it in the last %.0f s)"
            args = (*args, held, self._interval_s)
        (self._logger or log).log(level, msg, *args)


_THROTTLE_KEYS = 1000
