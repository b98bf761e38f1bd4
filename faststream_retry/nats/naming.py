"""Names on NATS: the plugin's streams, subjects, consumers and message ids (pure).

A covered JetStream subscriber is known by its *key*: ``<stream>.<durable>``, or
``<stream>._<hash of its subject and handlers>`` for one without a durable name (stream
and durable names cannot hold ``.``, ``*``, ``>`` or whitespace, so the key is two subject
tokens). The key is the ``queue`` of its route, its events and its dead letters'
``retry-origin-queue``. Where a key goes into a consumer name, whose characters are
fewer, it keeps a hash of itself, so that two keys never share a consumer.
"""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "delay_stream",
    "delay_subject",
    "dlq_stream",
    "dlq_subject",
    "ephemeral_key",
    "key_of",
    "key_stream",
    "msg_id",
    "ready_durable",
    "ready_subject",
    "recheck_durable",
    "split_delay_subject",
    "stream_safe",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def stream_safe(text: str) -> str:
    """Return ``text`` usable in a stream or consumer name (``.``, ``*``, ``>``, spaces out)."""
    return _UNSAFE.sub("_", text)


def key_of(stream: str, durable: str | None, subject: str, handlers: tuple[str, ...] = ()) -> str:
    """Return the key of a JetStream subscriber of ``stream``.

    ``handlers``: the qualified names of its handlers (module included), which tell one
    service's subscriber without a durable name from another's of the same subject.
    """
    if durable:
        return f"{stream}.{durable}"
    return ephemeral_key(stream, subject, handlers)


def ephemeral_key(stream: str, subject: str, handlers: tuple[str, ...] = ()) -> str:
    """The key of a subscriber without a durable name: its subject's and its handlers'.

    The same for every process of one app (they share its waiting retries, as they
    share a durable consumer's); another app's subscriber of the same subject has other
    handlers, so another key: its retries are never handed to this one.
    """
    named = "\n".join((subject, *handlers))
    digest = hashlib.sha256(named.encode()).hexdigest()[:12]
    return f"{stream}._{digest}"


def key_stream(key: str) -> str:
    """Return the stream a key's subscriber consumes."""
    return key.split(".", 1)[0]


def delay_stream(prefix: str) -> str:
    """The one delay stream of ``prefix``: every tier and every ready subject."""
    return f"{stream_safe(prefix)}-delay"


def delay_subject(prefix: str, tier_ms: int, key: str) -> str:
    """Where a copy of ``key``'s subscriber waits out tier ``tier_ms``."""
    return f"{prefix}.delay.{tier_ms}.{key}"


def tier_filter(prefix: str, tier_ms: int) -> str:
    """The filter of tier ``tier_ms``'s re-check consumer: every subscriber's copies."""
    return f"{prefix}.delay.{tier_ms}.>"


_DELAY = re.compile(r"\.delay\.([1-9][0-9]*)\.([^.*>\s]+\.[^.*>\s]+)\Z")


def split_delay_subject(prefix: str, subject: str) -> tuple[int, str] | None:
    """Return the tier and key a delay subject names; ``None``: not one of ``prefix``'s."""
    if not subject.startswith(prefix):
        return None
    match = _DELAY.match(subject, len(prefix))
    if match is None:
        return None
    return int(match[1]), match[2]


def ready_subject(prefix: str, key: str) -> str:
    """Where the re-check releases a due copy of ``key``'s subscriber."""
    return f"{prefix}.ready.{key}"


def recheck_durable(prefix: str, tier_ms: int) -> str:
    """The durable name of tier ``tier_ms``'s re-check consumer (shared by every app)."""
    return f"{stream_safe(prefix)}-recheck-{tier_ms}"


def ready_durable(prefix: str, key: str) -> str:
    """The durable name of the consumer that hands ``key``'s ready copies over.

    The key made readable (``stream_safe``) then a hash of the key itself: ``s_x.d`` and
    ``s.x_d`` read the same, and must not share a consumer (each would take the other's
    retries).
    """
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"{stream_safe(prefix)}-ready-{stream_safe(key)}-{digest}"


def dlq_stream(prefix: str, stream: str) -> str:
    """The dead-letter stream of the covered stream ``stream``."""
    return f"{stream_safe(prefix)}-dlq-{stream}"


def dlq_subject(prefix: str, key: str) -> str:
    """Where the dead letters of ``key``'s subscriber go (in its stream's dead-letter stream)."""
    return f"{prefix}.dlq.{key}"


def dlq_filter(prefix: str, stream: str) -> str:
    """The subjects of ``stream``'s dead-letter stream."""
    return f"{prefix}.dlq.{stream}.>"


def msg_id(stream: str, consumer: str, sequence: int, stored_us: int, kind: str) -> str:
    """The ``Nats-Msg-Id`` of the ``kind`` copy ``consumer`` made of ``stream``'s ``sequence``.

    The same delivery, redelivered after a crash between the PubAck and the ack, makes
    the same id, and the server drops the second copy within the duplicate window. The
    consumer is in it because two consumers of one stream that both fail a message each
    make a copy of their own; the message's stored time (``stored_us``, microseconds)
    because a stream deleted and made again numbers its messages from 1 again.
    """
    return f"{stream}:{consumer}:{sequence}:{stored_us}:{kind}"
