"""The skeleton of the engine's consumers: each delivery settled as its copy says, a stop drains.

Against fakes of aio-pika's queue and messages: what is acked, what is requeued (after the
pause), what a raising step or an interruption leaves, and what a stop waits for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from faststream_retry.rabbit.consumer import Consumer
from faststream_retry.rabbit.publisher import Outcome

Callback = Callable[[Any], Awaitable[None]]


class Channel:
    """A channel; reading it off a message raises once it is closed (as aio-pika does)."""

    closed = False


class Message:
    def __init__(self, tag: int, channel: Channel) -> None:
        self.delivery_tag = tag
        self.message_id = f"m{tag}"
        self._channel = channel
        self.settled: list[str] = []

    @property
    def channel(self) -> Channel:
        if self._channel.closed:
            raise RuntimeError("channel closed")  # aio-pika's ChannelInvalidStateError
        return self._channel

    async def ack(self, multiple: bool = False) -> None:
        self.settled.append("ack multiple" if multiple else "ack")

    async def nack(self, requeue: bool = True) -> None:
        self.settled.append("requeue" if requeue else "reject")


class Queue:
    def __init__(self) -> None:
        self.callback: Callback | None = None
        self.cancelled: list[str] = []

    async def consume(self, callback: Callback, timeout: float) -> str:
        self.callback = callback
        return "tag-1"

    async def cancel(self, tag: str, timeout: float) -> None:
        self.cancelled.append(tag)


def acting(*outcomes: Outcome, then: BaseException | None = None) -> Any:
    async def act(message: Any, seen: list[Outcome]) -> None:
        seen.extend(outcomes)
        if then is not None:
            raise then

    return act


async def start(consumer: Consumer, act: Any, queue: Queue | None = None) -> Queue:
    """Consume ``queue`` (a new one unless given) as ``orders``, each delivery's step ``act``."""
    queue = queue or Queue()
    fake: Any = queue
    await consumer.consume("orders", fake, act, what="a test delivery")
    return queue


async def deliver(consumer: Consumer, act: Any, message: Message) -> None:
    queue = await start(consumer, act)
    assert queue.callback is not None
    await queue.callback(message)


@pytest.mark.parametrize(
    ("outcomes", "settled"),
    [
        ((Outcome.CONFIRMED,), ["ack"]),
        ((Outcome.TOO_LARGE, Outcome.CONFIRMED), ["ack"]),
        ((Outcome.REFUSED,), ["requeue"]),
        ((), ["requeue"]),
    ],
)
async def test_a_delivery_is_acked_once_a_copy_is_confirmed_else_requeued(
    outcomes: tuple[Outcome, ...], settled: list[str]
) -> None:
    message = Message(1, Channel())
    await deliver(Consumer(pause_s=0), acting(*outcomes), message)
    assert message.settled == settled


async def test_the_requeue_waits_the_pause_the_ack_does_not() -> None:
    loop = asyncio.get_running_loop()
    consumer = Consumer(pause_s=0.2)
    started = loop.time()
    await deliver(consumer, acting(Outcome.CONFIRMED), Message(1, Channel()))
    assert loop.time() - started < 0.2
    await deliver(consumer, acting(Outcome.FAILED), Message(2, Channel()))
    assert loop.time() - started >= 0.2


async def test_a_step_that_raises_is_logged_and_settled_as_its_copy_says(
    caplog: pytest.LogCaptureFixture,
) -> None:
    confirmed, lost = Message(1, Channel()), Message(2, Channel())
    consumer = Consumer(pause_s=0)
    await deliver(consumer, acting(Outcome.CONFIRMED, then=ValueError("hook")), confirmed)
    await deliver(consumer, acting(then=ValueError("hostile")), lost)
    assert (confirmed.settled, lost.settled) == (["ack"], ["requeue"])
    assert caplog.text.count("a test delivery failed") == 2


@pytest.mark.parametrize("ack_runs", [False, True])
async def test_an_interruption_after_the_confirm_acks_first(ack_runs: bool) -> None:
    message = Message(1, Channel())
    consumer = Consumer(pause_s=10, ack_runs=ack_runs)
    act = acting(Outcome.CONFIRMED, then=asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await deliver(consumer, act, message)
    assert message.settled == ["ack"]  # at once, not in a run nor after the pause


async def test_an_interruption_before_the_confirm_requeues_at_once() -> None:
    message = Message(1, Channel())
    with pytest.raises(KeyboardInterrupt):
        await deliver(Consumer(pause_s=10), acting(then=KeyboardInterrupt()), message)
    assert message.settled == ["requeue"]


async def test_with_ack_runs_confirmed_deliveries_are_acked_in_one_frame() -> None:
    channel = Channel()
    consumer = Consumer(pause_s=0, ack_runs=True)
    messages = [Message(tag, channel) for tag in (1, 2, 3)]
    queue = await start(consumer, acting(Outcome.CONFIRMED))
    assert queue.callback is not None
    await asyncio.gather(*(queue.callback(m) for m in messages))
    await consumer.stop(1)  # drains the acks on their way
    assert [m.settled for m in messages] == [[], [], ["ack multiple"]]


async def test_with_ack_runs_a_requeue_is_passed_over_by_the_run() -> None:
    channel = Channel()
    consumer = Consumer(pause_s=0, ack_runs=True)
    queue = Queue()
    first, second = Message(1, channel), Message(2, channel)
    await start(consumer, acting(Outcome.REFUSED), queue)
    assert queue.callback is not None
    await queue.callback(first)
    await start(consumer, acting(Outcome.CONFIRMED), queue)
    await queue.callback(second)
    await consumer.stop(1)
    assert (first.settled, second.settled) == (["requeue"], ["ack multiple"])


async def test_with_ack_runs_a_delivery_of_a_closed_channel_is_left_to_the_broker() -> None:
    channel = Channel()
    message = Message(1, channel)
    channel.closed = True
    await deliver(Consumer(pause_s=0, ack_runs=True), acting(Outcome.CONFIRMED), message)
    assert message.settled == []  # the broker delivers it again; an ack would fail


async def test_a_stop_cancels_the_consumers_and_waits_for_the_deliveries_in_flight() -> None:
    release = asyncio.Event()

    async def slow(message: Any, seen: list[Outcome]) -> None:
        await release.wait()
        seen.append(Outcome.CONFIRMED)

    consumer = Consumer(pause_s=0)
    queue = await start(consumer, slow)
    assert ("orders" in consumer, consumer.tag("orders"), consumer.tags) == (
        True,
        "tag-1",
        ["tag-1"],
    )
    assert queue.callback is not None
    message = Message(1, Channel())
    in_flight = asyncio.ensure_future(queue.callback(message))
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(consumer.stop(5))
    await asyncio.sleep(0.05)
    assert queue.cancelled == ["tag-1"]
    assert not stopping.done()  # still waiting for the delivery in flight
    release.set()
    await stopping
    await in_flight
    assert message.settled == ["ack"]
    assert "orders" not in consumer


async def test_a_stop_waits_no_longer_than_it_is_given() -> None:
    async def stuck(message: Any, seen: list[Outcome]) -> None:
        await asyncio.Event().wait()

    consumer = Consumer(pause_s=0)
    queue = await start(consumer, stuck)
    assert queue.callback is not None
    in_flight = asyncio.ensure_future(queue.callback(Message(1, Channel())))
    await asyncio.sleep(0)
    await asyncio.wait_for(consumer.stop(0.05), 1)
    in_flight.cancel()


async def test_cancel_and_forget() -> None:
    consumer = Consumer(pause_s=0)
    queue = await start(consumer, acting())
    await consumer.cancel("orders")
    await consumer.cancel("orders")  # a second time: nothing to cancel
    assert queue.cancelled == ["tag-1"]
    await start(consumer, acting(), queue)
    consumer.forget()  # its channel closed: nothing to cancel on stop
    await consumer.stop(1)
    assert queue.cancelled == ["tag-1"]
    assert consumer.tags == []


async def test_a_stop_takes_no_new_delivery_and_returns_once_the_cancels_are_answered() -> None:
    """A delivery that arrives once the stop began is left unacked (the broker takes it back
    when the channel closes); the cancels, a round trip each, run in the background while
    the stop waits for the deliveries in flight, and the stop returns only once they are
    answered: aiormq 6 holds the connection's close for a cancel still waiting (its whole
    timeout, when Python 3.10's wait_for swallows the close's cancellation)."""
    acted: list[int] = []

    async def act(message: Any, seen: list[Outcome]) -> None:
        acted.append(message.delivery_tag)
        seen.append(Outcome.CONFIRMED)

    answered = asyncio.Event()

    class SlowQueue(Queue):
        async def cancel(self, tag: str, timeout: float) -> None:
            await answered.wait()  # a broker that takes its time to answer
            self.cancelled.append(tag)

    consumer = Consumer(pause_s=0)
    queue = await start(consumer, act, SlowQueue())
    assert queue.callback is not None
    stopping = asyncio.ensure_future(consumer.stop(5))
    await asyncio.sleep(0.05)
    late = Message(2, Channel())
    await queue.callback(late)
    assert (acted, late.settled, queue.cancelled) == ([], [], [])
    assert not stopping.done(), "the stop returned with a cancel still waiting for its answer"
    answered.set()
    await asyncio.wait_for(stopping, 1)
    assert queue.cancelled == ["tag-1"]
    await start(consumer, act, queue)  # consuming again (a reopened channel) takes them
    first = Message(3, Channel())
    await queue.callback(first)
    assert (acted, first.settled) == ([3], ["ack"])


async def test_a_cancel_never_answered_holds_the_stop_no_longer_than_it_is_given() -> None:
    class DeafQueue(Queue):
        async def cancel(self, tag: str, timeout: float) -> None:
            await asyncio.Event().wait()  # a half-open channel: no answer, ever

    consumer = Consumer(pause_s=0)
    await start(consumer, acting(), DeafQueue())
    await asyncio.wait_for(consumer.stop(0.1), 1)


class AnsweringChannel(Channel):
    """An open channel that answers a passive declare, in the order of what was written."""

    is_closed = False

    def __init__(self, written: list[str]) -> None:
        self.written = written

    async def exchange_declare(self, exchange: str, *, passive: bool) -> None:
        self.written.append(f"declare {exchange} passive={passive}")


class WrittenMessage(Message):
    def __init__(self, tag: int, channel: AnsweringChannel) -> None:
        super().__init__(tag, channel)
        self.written = channel.written

    async def ack(self, multiple: bool = False) -> None:
        self.written.append(f"ack {self.delivery_tag}" + (" multiple" if multiple else ""))


@pytest.mark.parametrize("ack_runs", [False, True], ids=["acks", "ack runs"])
async def test_a_stop_ends_with_a_round_trip_after_the_acks_of_each_channel(
    ack_runs: bool,
) -> None:
    """aiormq 6 closes a connection without waiting for the broker: acks the broker had not
    processed yet were lost with it, and their messages delivered again (second copies).
    A stop's last word on each channel is a passive declare, answered after those acks."""
    written: list[str] = []
    channel = AnsweringChannel(written)
    consumer = Consumer(pause_s=0, ack_runs=ack_runs)
    queue = await start(consumer, acting(Outcome.CONFIRMED))
    assert queue.callback is not None
    await asyncio.gather(*(queue.callback(WrittenMessage(tag, channel)) for tag in (1, 2)))
    await consumer.stop(1)
    acks = ["ack 2 multiple"] if ack_runs else ["ack 1", "ack 2"]
    assert written == [*acks, "declare amq.direct passive=True"]
