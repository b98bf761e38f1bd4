"""The RabbitMQ versions the plugin needs, read from a server's properties (pure)."""

from __future__ import annotations

import re

__all__ = ["MIN_VERSION", "parse_version", "too_old"]

MIN_VERSION = {"classic": (3, 8), "quorum": (3, 10)}
"""Oldest RabbitMQ per queue type: quorum queues need 3.10 for message TTL and
at-least-once dead-lettering."""


def parse_version(text: object) -> tuple[int, int] | None:
    """Return ``(major, minor)`` from a server ``version`` property, or ``None``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return None
    match = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def too_old(version_text: str, queue_type: str) -> str:
    """Return the error text for a server older than ``queue_type`` needs, with the fix."""
    need = ".".join(map(str, MIN_VERSION[queue_type]))
    text = (
        f"RabbitMQ {version_text} is too old for queue_type={queue_type!r}: "
        f"it needs {need} or later. "
    )
    if queue_type == "quorum":
        return text + (
            'Upgrade RabbitMQ, or pass RetryMiddleware(queue_type="classic") to use '
            "classic queues (RabbitMQ >= 3.8; they dead-letter at most once, so a broker "
            "crash or restart can lose a message waiting in a tier)"
        )
    return text + "Upgrade RabbitMQ"
