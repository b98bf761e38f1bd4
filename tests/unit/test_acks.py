"""The re-check consumer's ack runs, against a model of the broker's unacked deliveries."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faststream_retry.rabbit.acks import AckRuns


class Broker:
    """A channel's unacked deliveries, refusing what RabbitMQ refuses."""

    def __init__(self, n: int) -> None:
        self.unacked = set(range(1, n + 1))
        self.ready: set[int] = set()  # the consumer has its copy confirmed
        self.frames: list[tuple[int, bool]] = []

    def ack(self, tag: int, *, multiple: bool) -> None:
        self.frames.append((tag, multiple))
        covered = {t for t in self.unacked if t <= tag} if multiple else {tag}
        assert covered <= self.unacked, f"ack of {tag}: already settled (a channel error)"
        assert covered <= self.ready, f"ack of {tag} covers {sorted(covered - self.ready)} early"
        self.unacked -= covered

    def nack(self, tag: int) -> None:
        assert tag in self.unacked
        self.unacked.discard(tag)


class Delivery:
    def __init__(self, broker: Broker, tag: int) -> None:
        self.broker = broker
        self.delivery_tag = tag
        self.message_id = f"m{tag}"

    async def ack(self, multiple: bool = False) -> None:
        await asyncio.sleep(0)  # the frame goes out after a turn, as aiormq's drain
        self.broker.ack(self.delivery_tag, multiple=multiple)


async def _settle_in(order: list[tuple[int, bool]], turns: list[int], n: int) -> Broker:
    broker = Broker(n)
    runs = AckRuns(channel=object())
    for (tag, ok), pause in zip(order, turns, strict=True):
        delivery = Delivery(broker, tag)
        if ok:
            broker.ready.add(tag)
            runs.ack(delivery)  # type: ignore[arg-type]
        else:
            broker.nack(tag)
            runs.settled(delivery)  # type: ignore[arg-type]
        for _ in range(pause):
            await asyncio.sleep(0)
    await runs.drain()
    return broker


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_ready_delivery_is_acked_once_and_never_one_early(data: st.DataObject) -> None:
    """Any order of confirms and nacks, any timing: each ready delivery acked exactly once.

    A multiple ack never covers a delivery still in flight, and no ack repeats one.
    """
    n = data.draw(st.integers(min_value=1, max_value=30))
    tags = data.draw(st.permutations(range(1, n + 1)))
    nacked = data.draw(st.sets(st.sampled_from(tags)))
    order = [(tag, tag not in nacked) for tag in tags]
    turns = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    broker = asyncio.run(_settle_in(order, turns, n))
    assert broker.unacked == set()


def test_deliveries_confirmed_together_take_one_frame() -> None:
    """Tags 1-50 ready in one turn: a single ack with multiple, up to 50."""
    broker = asyncio.run(_settle_in([(t, True) for t in range(1, 51)], [0] * 50, 50))
    assert broker.frames == [(50, True)]


def test_one_in_flight_keeps_the_others_out_of_the_run() -> None:
    """1 still in flight: 2 and 3 are acked alone; 1 then goes with a run that passes them."""
    broker = asyncio.run(_settle_in([(2, True), (3, True), (1, True)], [0, 2, 2], 3))
    assert broker.frames == [(2, False), (3, False), (1, True)]


@pytest.mark.parametrize("nacked", [1, 2])
def test_a_nacked_delivery_does_not_stop_the_run(nacked: int) -> None:
    """Nacked (requeued) first: the run passes over it and acks the rest in one frame."""
    order = [(nacked, False)] + [(t, True) for t in range(1, 5) if t != nacked]
    broker = asyncio.run(_settle_in(order, [2, 0, 0, 0], 4))
    assert broker.frames == [(4, True)]
