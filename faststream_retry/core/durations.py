"""Durations as people write and read them: one grammar to parse, one form to print (pure).

The grammar, for the worker's config file and the commands' ``--since``/``--until``:

- a number is seconds (``30``, ``0.25``), finite and >= 0; ``True`` is not a number here;
- a string is one or more parts, each a decimal number and a unit, with or without
  spaces between them: ``"250ms"``, ``"5s"``, ``"10m"``, ``"1.5h"``, ``"2 d"``,
  ``"1 min 42.4 s"``, ``"1h30m"``. The units are ``ms``, ``s``, ``m`` or ``min``
  (minutes), ``h``, ``d`` and ``w`` (weeks). A string without a unit (``"30"``) is
  refused: it would be seconds in one place and something else in another.

A duration is whole milliseconds, rounded up: a delay is never shortened. A number's
float noise below a nanosecond is not rounded up (``0.1 * 3`` s is 300 ms); a string's
number is read as the exact decimal it says.

``format_ms`` prints a duration in that grammar, so what a log line or a command says
can be pasted back into a config: ``250 ms``, ``1.5 s``, ``1 min 42.4 s``, ``1 d 2 h``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from faststream_retry.errors import RetryConfigError

__all__ = ["HELP", "PATTERN", "format_ms", "ms_of_seconds", "parse_duration"]

_MS = {"ms": 1, "s": 1000, "min": 60_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_MS["w"] = 7 * _MS["d"]
_PART = r"(\d+(?:\.\d+)?)\s*(ms|s|min|m|h|d|w)"
PATTERN = rf"^\s*(?:{_PART}\s*)+$"
"""The grammar of a duration written as a string, as a regular expression (also JSON Schema's)."""
# ASCII: a digit or a space is what JSON Schema's \d and \s mean too, not any script's.
_PARTS = re.compile(_PART, re.ASCII)
_WHOLE = re.compile(PATTERN, re.ASCII)

HELP = 'seconds (a number) or a string such as "250ms", "5s", "10m", "2h", "1d"'
"""What a duration takes, as an error message says it."""

# The units format_ms writes above a minute, largest first (seconds are written apart).
_LARGE = (("d", _MS["d"]), ("h", _MS["h"]), ("min", _MS["min"]))


def parse_duration(value: object, option: str) -> int:
    """Return ``value`` in whole milliseconds (see the module docstring for the grammar).

    Raises:
        RetryConfigError: ``value`` is not a duration; ``option`` is what it is about
            (the message begins with it).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return ms_of_seconds(value)
        problem = f"must be a duration >= 0, got {value!r}"
    elif isinstance(value, str) and _WHOLE.fullmatch(value):
        exact = sum(Decimal(number) * _MS[unit] for number, unit in _PARTS.findall(value))
        return math.ceil(exact)
    else:
        problem = f"takes {HELP}, got {value!r}"
    raise RetryConfigError(f"{option} {problem}", option=option, problem=problem)


def ms_of_seconds(seconds: float) -> int:
    """Return finite, non-negative ``seconds`` in whole ms, rounded up but not for float noise."""
    return math.ceil(round(seconds * 1000, 6))


def format_ms(ms: int) -> str:
    """Return ``ms`` for people, in the grammar ``parse_duration`` reads back.

    ``0 ms``, ``999 ms``, ``1 s``, ``1.5 s``, ``59.999 s``, ``1 min``, ``10 min 5 s``,
    ``1 min 42.4 s``, ``2 h``, ``1 d 2 h``: milliseconds under a second, then seconds
    (to the millisecond) under a minute, then days, hours and minutes, and the seconds
    left over. Nothing is rounded: ``parse_duration(format_ms(ms))`` is ``ms``.
    """
    if ms < _MS["s"]:
        return f"{ms} ms"
    parts = []
    rest = ms
    for unit, size in _LARGE:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count} {unit}")
    if rest:
        parts.append(f"{rest / 1000:g} s")
    return " ".join(parts)
