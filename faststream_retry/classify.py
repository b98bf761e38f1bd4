"""Exception classification: transient (retry later) or permanent (dead-letter).

Precedence, first match wins:

1. explicit: ``PermanentError``, ``TransientError`` / ``RetryLater`` raised by the handler;
2. handler: the ``permanent`` / ``transient`` types of ``@retry_policy``;
3. default: the ``permanent`` / ``transient`` types of the middleware's default policy;
4. builtin: ``BUILTIN_PERMANENT`` and ``BUILTIN_TRANSIENT`` below;
5. fallback: transient (retries are bounded, so an unknown error still ends in the DLQ).

Within one level the most specific listed class wins (the exception's MRO is walked),
so listing ``OSError`` as permanent and ``ConnectionError`` as transient does what it
reads like.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from faststream_retry.errors import PermanentError, TransientError
from faststream_retry.events import Rule, Verdict

__all__ = [
    "BUILTIN_PERMANENT",
    "BUILTIN_TRANSIENT",
    "Classification",
    "Verdict",
    "classify",
]


@dataclass(frozen=True, slots=True)
class Classification:
    """A verdict and the rule that decided it."""

    verdict: Verdict
    rule: Rule


def _validation_errors() -> tuple[type[BaseException], ...]:
    # pydantic is how FastStream validates bodies; it is not a broker import.
    try:
        from pydantic import ValidationError  # noqa: PLC0415
    except ImportError:  # pragma: no cover - faststream depends on pydantic
        return ()
    return (ValidationError,)


BUILTIN_TRANSIENT: tuple[type[BaseException], ...] = (
    TimeoutError,
    asyncio.TimeoutError,  # a distinct class before Python 3.11
    ConnectionError,
)
"""Failures of a dependency: they usually pass."""

BUILTIN_PERMANENT: tuple[type[BaseException], ...] = (
    UnicodeDecodeError,
    json.JSONDecodeError,
    *_validation_errors(),
)
"""A payload that cannot be decoded or validated never will be."""

_BUILTIN = dict.fromkeys(BUILTIN_TRANSIENT, Verdict.TRANSIENT) | dict.fromkeys(
    BUILTIN_PERMANENT, Verdict.PERMANENT
)


def _match(
    exc: BaseException,
    transient: tuple[type[BaseException], ...],
    permanent: tuple[type[BaseException], ...],
) -> Verdict | None:
    if not transient and not permanent:
        return None
    for cls in type(exc).__mro__:
        if cls in permanent:
            return Verdict.PERMANENT
        if cls in transient:
            return Verdict.TRANSIENT
    return None


def classify(
    exc: BaseException,
    *,
    handler_transient: tuple[type[BaseException], ...] = (),
    handler_permanent: tuple[type[BaseException], ...] = (),
    default_transient: tuple[type[BaseException], ...] = (),
    default_permanent: tuple[type[BaseException], ...] = (),
) -> Classification:
    """Classify ``exc`` by the documented precedence (see the module docstring)."""
    if isinstance(exc, PermanentError):
        return Classification(Verdict.PERMANENT, Rule.EXPLICIT)
    if isinstance(exc, TransientError):
        return Classification(Verdict.TRANSIENT, Rule.EXPLICIT)
    verdict = _match(exc, handler_transient, handler_permanent)
    if verdict is not None:
        return Classification(verdict, Rule.HANDLER)
    verdict = _match(exc, default_transient, default_permanent)
    if verdict is not None:
        return Classification(verdict, Rule.DEFAULT)
    for cls in type(exc).__mro__:
        builtin = _BUILTIN.get(cls)
        if builtin is not None:
            return Classification(builtin, Rule.BUILTIN)
    return Classification(Verdict.TRANSIENT, Rule.FALLBACK)
