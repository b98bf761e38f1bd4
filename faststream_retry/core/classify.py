"""Exception classification: transient (retry later) or permanent (dead-letter).

Precedence, first match wins:

1. explicit: ``PermanentError``, ``TransientError`` / ``RetryLater`` raised by the handler;
   ``RetryConfigError`` (``RetryLater`` given an invalid delay) is permanent: a bug in
   the handler, whatever the lists below say;
2. handler: the ``permanent`` / ``transient`` types of ``@retry_policy``;
3. default: the ``permanent`` / ``transient`` types of the middleware's default policy;
4. builtin: ``BUILTIN_PERMANENT`` and ``BUILTIN_TRANSIENT`` below, and the classes
   ``BUILTIN_PERMANENT_NAMES`` names (FastAPI's ``RequestValidationError``), matched by
   qualified name so that the core never imports FastAPI;
5. fallback: transient (retries are bounded, so an unknown error still ends in the DLQ).

Within one level the most specific listed class wins (the exception's MRO is walked),
so listing ``OSError`` as permanent and ``ConnectionError`` as transient does what it
reads like.

Classifying never raises: the exception's own class is read with ``type()``, never through
``__class__`` (which a class can turn into a property), and an exception whose classes
cannot even be compared (a metaclass whose ``__eq__`` or ``__hash__`` raises) falls back
to transient.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from faststream_retry.core.events import Rule, Verdict
from faststream_retry.errors import PermanentError, RetryConfigError, TransientError

__all__ = [
    "BUILTIN_PERMANENT",
    "BUILTIN_PERMANENT_NAMES",
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

BUILTIN_PERMANENT_NAMES: frozenset[str] = frozenset({"fastapi.exceptions.RequestValidationError"})
"""Permanent by the qualified name of a class in the exception's MRO: a body FastAPI's
router (``faststream.rabbit.fastapi`` or ``faststream-fastapi``) cannot validate."""

_BUILTIN = dict.fromkeys(BUILTIN_TRANSIENT, Verdict.TRANSIENT) | dict.fromkeys(
    BUILTIN_PERMANENT, Verdict.PERMANENT
)
_QUALNAME = type.__dict__["__qualname__"]


def _builtin(cls: type) -> Verdict | None:
    verdict = _BUILTIN.get(cls)
    if verdict is not None:
        return verdict
    # Read as type() reads them: a metaclass cannot fake a name it does not have.
    module = cls.__dict__.get("__module__")
    if type(module) is str and f"{module}.{_QUALNAME.__get__(cls)}" in BUILTIN_PERMANENT_NAMES:
        return Verdict.PERMANENT
    return None


def _match(
    exc_type: type[BaseException],
    transient: tuple[type[BaseException], ...],
    permanent: tuple[type[BaseException], ...],
) -> Verdict | None:
    if not transient and not permanent:
        return None
    for cls in exc_type.__mro__:
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
    try:
        found = _classify(
            type(exc),
            (handler_transient, handler_permanent),
            (default_transient, default_permanent),
        )
    except Exception:  # a class that cannot be compared or hashed: see the docstring
        found = None
    return Classification(Verdict.TRANSIENT, Rule.FALLBACK) if found is None else found


def _classify(
    cls: type[BaseException],
    handler: tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]],
    default: tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]],
) -> Classification | None:
    if issubclass(cls, (PermanentError, RetryConfigError)):
        return Classification(Verdict.PERMANENT, Rule.EXPLICIT)
    if issubclass(cls, TransientError):
        return Classification(Verdict.TRANSIENT, Rule.EXPLICIT)
    verdict = _match(cls, *handler)
    if verdict is not None:
        return Classification(verdict, Rule.HANDLER)
    verdict = _match(cls, *default)
    if verdict is not None:
        return Classification(verdict, Rule.DEFAULT)
    for base in cls.__mro__:
        builtin = _builtin(base)
        if builtin is not None:
            return Classification(builtin, Rule.BUILTIN)
    return None
