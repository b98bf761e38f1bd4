"""The plugin's dead-letter log lines, captured, and the place each names (for the broker tests)."""

from __future__ import annotations

import contextlib
import logging
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["DeadLetterLines", "dead_letter_lines"]

_LINE = re.compile(r"dead-lettered message (\S+) from (\S+) to (\S+): reason=")


class DeadLetterLines(logging.Handler):
    """A handler on ``faststream_retry``: each dead-letter line's message id and named place."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.places: dict[str, str] = {}
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        found = _LINE.match(text)
        if found is not None:
            self.lines.append(text)
            self.places[found[1]] = found[3]


@contextlib.contextmanager
def dead_letter_lines() -> Iterator[DeadLetterLines]:
    """Capture the dead-letter lines of ``faststream_retry`` while the block runs."""
    lines = DeadLetterLines()
    logger = logging.getLogger("faststream_retry")
    logger.addHandler(lines)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
