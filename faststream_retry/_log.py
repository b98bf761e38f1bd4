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
drops DEBUG lines (the re-check hops), as a configured root logger at INFO would.

This module imports no FastStream: the broker's logger comes in as an ``Outlet``
(``_faststream.broker_outlet``), so the ``amqp`` parts and the core use it too.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    Outlet = Callable[[int, str, BaseException | None, Mapping[str, Any]], bool]
    """Writes one line to a broker's logger; ``False`` if it could not (broker gone)."""

__all__ = ["NAME", "PluginLogger", "log"]

NAME = "faststream_retry"


class PluginLogger:
    """The ``logging.Logger`` methods the plugin uses, sent where the module docstring says."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        """Write to ``logger`` (``faststream_retry``) when logging is configured for it."""
        self.logger = logging.getLogger(NAME) if logger is None else logger
        self._outlet: Outlet | None = None

    def send_to(self, outlet: Outlet | None) -> None:
        """Use ``outlet`` (a broker's logger) while ``name`` has no handler of its own."""
        self._outlet = outlet

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging.Logger's name
        """Return whether a line at ``level`` would be written anywhere."""
        logger = self.logger
        if logger.level != logging.NOTSET or logger.hasHandlers() or self._outlet is None:
            return logger.isEnabledFor(level)
        return level >= logging.INFO

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
        if outlet is not None and not logger.hasHandlers():
            if not self.isEnabledFor(level):
                return
            exception = sys.exc_info()[1] if exc_info is True else exc_info or None
            try:
                # Formatting can raise too (an argument whose __str__ raises): then the
                # line goes to logging, which reports such errors without raising.
                text = msg % args if args else msg
                if outlet(level, text, exception, extra or {}):
                    return
            except Exception:  # noqa: S110 - a broken outlet must not lose the line
                pass
        logger.log(level, msg, *args, exc_info=exc_info, extra=extra, stacklevel=2)

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


log = PluginLogger()
"""The plugin's one logger (see the module docstring)."""
