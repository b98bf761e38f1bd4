"""A runtime's own count of the requeues it made: what ends a loop on a classic queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faststream_retry.rabbit.requeues import Requeues


@dataclass
class Message:
    """What the count reads of an aio-pika delivery."""

    message_id: str | None = "m1"
    body: bytes = b"body"
    redelivered: bool = True
    headers: dict[str, Any] | None = None
    correlation_id: str | None = None
    timestamp: Any = None
    type: str | None = None


def delivery(**fields: Any) -> Any:
    return Message(**fields)


def test_each_requeue_of_a_message_counts_once_per_queue() -> None:
    requeues = Requeues()
    first = delivery(redelivered=False)
    assert requeues.seen("q", first) == 0
    requeues.requeued("q", first)
    again = delivery()
    assert requeues.seen("q", again) == 1
    requeues.requeued("q", again)
    assert requeues.seen("q", again) == 2
    assert requeues.seen("other", again) == 0
    assert requeues.seen("q", delivery(message_id="m2")) == 0


def test_a_first_delivery_has_never_come_back_whatever_was_counted() -> None:
    """A message published anew under the same id starts from nothing."""
    requeues = Requeues()
    for _ in range(3):
        requeues.requeued("q", delivery())
    assert requeues.seen("q", delivery(redelivered=False)) == 0
    assert requeues.seen("q", delivery()) == 0  # the stale count is gone
    requeues.requeued("q", delivery(redelivered=False))
    assert requeues.seen("q", delivery()) == 1


def test_a_message_without_an_id_is_known_by_what_it_carries() -> None:
    """Its body, properties and headers, but not the broker's counts, which a loop bumps."""
    requeues = Requeues()
    requeues.requeued("q", delivery(message_id=None, body=b"a", headers={"k": 1}))
    again = delivery(message_id=None, body=b"a", headers={"k": 1, "x-acquired-count": 1})
    assert requeues.seen("q", again) == 1
    for other in [
        delivery(message_id=None, body=b"b", headers={"k": 1}),
        delivery(message_id=None, body=b"a", headers={"k": 2}),
        delivery(message_id=None, body=b"a", headers={"k": 1}, correlation_id="c"),
        delivery(message_id="a", body=b"a", headers={"k": 1}),
    ]:
        assert requeues.seen("q", other) == 0


def test_a_settled_message_is_forgotten() -> None:
    requeues = Requeues()
    requeues.requeued("q", delivery())
    requeues.settled("q", delivery())
    assert requeues.seen("q", delivery()) == 0


def test_memory_is_bounded_and_the_longest_untouched_goes_first() -> None:
    requeues = Requeues(capacity=2)
    requeues.requeued("q", delivery(message_id="a"))
    requeues.requeued("q", delivery(message_id="b"))
    requeues.requeued("q", delivery(message_id="a"))  # a loop touches its own entry
    requeues.requeued("q", delivery(message_id="c"))
    assert requeues.seen("q", delivery(message_id="a")) == 2
    assert requeues.seen("q", delivery(message_id="b")) == 0
    assert requeues.seen("q", delivery(message_id="c")) == 1
