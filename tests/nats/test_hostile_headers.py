"""Hostile headers on NATS (the RabbitMQ fault suite's S1, on a real nats-server).

Generated header sets (forged ``retry-*`` values, JSON of anything, numbers JSON cannot
hold, text of any kind) arrive at a covered subject, and again at its subscriber's ready
subject as if the re-check had released them. Every message ends handled or in its
dead-letter stream, once; a subscriber of another stream gets none of them; nothing is
left in the delay stream or pending on the consumer.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from faststream.nats import JStream, NatsBroker, NatsMessage
from hypothesis import strategies as st
from nats.js.errors import NotFoundError

from faststream_retry import Fixed, RetryPolicy
from faststream_retry.middleware.middleware import RetryMiddleware
from faststream_retry.nats import naming
from tests.nats.helpers import drained, running, stream_messages
from tests.rabbit import eventually
from tests.rabbit import eventually_async as until
from tests.strategies import draw, header_texts, shown, text_header_names

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(300)]

EXAMPLES = 150

HAND_PICKED: list[dict[str, str]] = [
    {"retry-attempt": "2147483655", "retry-due": "0"},
    {"retry-attempt": "-5", "retry-due": "-1"},
    {"retry-attempt": '"1e9"', "retry-due": '"soon"'},
    {"retry-due": str(2**80), "retry-attempt": "1"},
    {"retry-history": '[{"attempt": "x"}, 5, null]'},
    {"retry-history": "[" * 5000},
    {"retry-subject": '"other.subject"', "retry-origin-queue": '"OTHER.d"'},
    {"retry-subject": '"a b"'},
    {"traceparent": "00-zz-yy-01", "tracestate": "\u00ff"},
    {"retry-version": "99", "retry-reason": '"permanent"'},
]


def sendable(headers: dict[str, str]) -> dict[str, str]:
    """The set as nats-py can send it: one line each, no surrounding blanks (the protocol's)."""
    return {
        k: v.strip()
        for k, v in headers.items()
        if "\r" not in v and "\n" not in v and v.strip() and v.isprintable()
    }


def cases() -> list[dict[str, str]]:
    generated = draw(st.dictionaries(text_header_names, header_texts, max_size=8), EXAMPLES)
    return [sendable(c) for c in HAND_PICKED + generated]


async def test_hostile_headers_never_crash_misroute_or_lose(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Each set reaches the handler or the dead letters, once, and nowhere else."""
    stream, subject = names.stream(), names.subject()
    other_stream, other_subject = names.stream("O"), names.subject("other")
    broker = NatsBroker(
        nats_url,
        middlewares=[
            RetryMiddleware(
                RetryPolicy(max_attempts=3, backoff=Fixed(timedelta(milliseconds=200))),
                prefix=names.prefix,
                tick=timedelta(milliseconds=100),
                max_delay=2,
            )
        ],
        logger=None,
    )
    failed_once: set[str] = set()
    processed: list[str] = []
    strays: list[str] = []

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: str, msg: NatsMessage) -> None:
        if body not in failed_once:
            failed_once.add(body)
            raise ConnectionError("the first delivery fails, so the headers are read")
        processed.append(body)

    @broker.subscriber(
        other_subject, stream=JStream(other_stream, subjects=[other_subject]), durable="d"
    )
    async def sibling(body: str) -> None:
        strays.append(body)

    sets = cases()
    ready = naming.ready_subject(names.prefix, naming.key_of(stream, "d", subject))
    sent: list[str] = []
    dlq = naming.dlq_stream(names.prefix, stream)
    async with running(broker):
        for i, headers in enumerate(sets):
            await js.publish(subject, f"w{i:04d}".encode(), headers=headers or None)
            sent.append(f"w{i:04d}")

        async def delay_stream_made() -> bool:
            try:
                await js.stream_info(naming.delay_stream(names.prefix))
            except NotFoundError:
                return False  # without install(), the plugin starts at the first message
            return True

        await until(delay_stream_made, 15, "the plugin's delay stream")
        for i, headers in enumerate(sets):
            await js.publish(ready, f"r{i:04d}".encode(), headers=headers or None)
            sent.append(f"r{i:04d}")
        dead: list[str] = []

        async def settled() -> bool:
            dead[:] = [body.decode() for _, body, _ in await stream_messages(js, dlq)]
            return len(set(processed) | set(dead)) >= len(sent)

        try:
            await until(settled, 120, f"{len(sent)} messages handled or dead-lettered")
        except pytest.fail.Exception:
            lost = sorted(set(sent) - set(processed) - set(dead))
            pytest.fail(
                f"lost, with their headers: {[(m, shown(sets[int(m[1:])])) for m in lost]!r}"
            )
        # The re-check and hand-over still work: a plain retry after the storm comes back.
        await js.publish(subject, b"after")
        sent.append("after")
        await eventually(lambda: "after" in processed, 15, "a retry after the storm")
        await drained(js, names.prefix, timeout=30)
        info = await js.consumer_info(stream, "d")
        assert info.num_ack_pending == 0
        assert info.num_pending == 0
    dead = [body.decode() for _, body, _ in await stream_messages(js, dlq)]
    assert sorted(processed + dead) == sorted(sent), "each message once, handled or dead"
    assert strays == []
    reasons = {headers.get("retry-reason") for _, _, headers in await stream_messages(js, dlq)}
    assert reasons <= {"exhausted", "invalid"}, reasons
