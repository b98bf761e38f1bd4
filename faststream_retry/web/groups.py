"""Dead letters grouped the way an operator reads them: by cause.

A group is the dead letters of one queue with the same exception type, reason and
error text once what varies from message to message (numbers, ids, quoted values) is
taken out: ``order 42 not found`` and ``order 97 not found`` are one group.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from faststream_retry.ops.records import DeadLetter

__all__ = ["Group", "group", "normalise"]

_UUID = r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}"
_VARYING = [
    (re.compile(_UUID), "<uuid>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b[0-9a-fA-F]{16,}\b"), "<hex>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
]  # fmt: skip
_ERROR_CHARS = 300


def normalise(error: str) -> str:
    """Return ``error`` with what varies between messages of one cause replaced."""
    text = " ".join(error.split())[:_ERROR_CHARS]
    for pattern, placeholder in _VARYING:
        text = pattern.sub(placeholder, text)
    return text


@dataclass(slots=True)
class Group:
    """Dead letters of one cause: same exception type, reason and normalised error."""

    exception: str
    reason: str
    error: str
    letters: list[DeadLetter] = field(default_factory=list)

    @property
    def key(self) -> str:
        """A short stable id for the group, safe in a URL."""
        whole = f"{self.exception}\x00{self.reason}\x00{self.error}"
        return hashlib.sha256(whole.encode("utf-8", "replace")).hexdigest()[:12]

    @property
    def count(self) -> int:
        """How many dead letters the group has."""
        return len(self.letters)

    @property
    def first_ms(self) -> int | None:
        """When the earliest of them last failed (epoch ms), if any says."""
        times = [t for t in (_when(letter) for letter in self.letters) if t is not None]
        return min(times) if times else None

    @property
    def last_ms(self) -> int | None:
        """When the latest of them last failed (epoch ms), if any says."""
        times = [t for t in (_when(letter) for letter in self.letters) if t is not None]
        return max(times) if times else None

    @property
    def example(self) -> str:
        """The error text of the group's first dead letter, as it was written."""
        return self.letters[0].error if self.letters else ""

    @property
    def ids(self) -> list[str]:
        """The names the operations select them by (message id, or ``#position``)."""
        return [letter.key for letter in self.letters]

    def to_json(self) -> dict[str, Any]:
        """Return the group as JSON-able data (its letters as ``dlq list --json`` rows)."""
        return {
            "key": self.key,
            "exception": self.exception,
            "reason": self.reason,
            "error": self.error,
            "example": self.example,
            "count": self.count,
            "first_failed_ms": self.first_ms,
            "last_failed_ms": self.last_ms,
            "ids": self.ids,
        }


def _when(letter: DeadLetter) -> int | None:
    return letter.last_failed_ms or letter.first_failed_ms


def group(letters: Iterable[DeadLetter]) -> list[Group]:
    """Return the groups of ``letters``, the largest first (then the most recent)."""
    groups: dict[tuple[str, str, str], Group] = {}
    for letter in letters:
        key = (letter.exception or "-", letter.reason, normalise(letter.error))
        found = groups.get(key)
        if found is None:
            found = groups[key] = Group(*key)
        found.letters.append(letter)
    return sorted(groups.values(), key=lambda g: (-g.count, -(g.last_ms or 0)))
