"""The plugin's two channels, one to publish with confirms and one to consume, kept open.

The plugin reopens its own channels rather than leaving that to aio-pika's robust
channels: after a broker restart, aio-pika 10.2 now and then left a robust channel closed
for good while the connection was back, and every retry publish then failed until the
process restarted (seen in the R1 fault test, about 1 restart in 20). These are plain
channels on the robust connection, watched by a supervisor task: when either closes (a
reconnect, a channel error) or the broker cancels a consumer on them (its queue was
deleted), it waits for the connection, opens both again and calls ``on_open`` with them,
which declares the topology again and restarts the consumers. A channel of the old pair
that is still open is closed only ``wait_s`` later, its consumers cancelled first: the
deliveries in flight on it are handled, and the copies in flight confirmed. A consumer
cancelled because its queue was deleted has deliveries in flight whose queue, and so whose
only other copy, is gone: closing the channels under them lost them (a tryout lost 5 of
300 messages to an operator deleting a ``.retry``, "not confirmed: ChannelClosed").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from aio_pika import Channel

from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from aio_pika.abc import AbstractChannel, AbstractRobustConnection
    from aiormq.abc import AbstractChannel as UnderlayChannel

    OnOpen = Callable[[AbstractChannel, AbstractChannel], Awaitable[None]]

__all__ = ["RPC_TIMEOUT_S", "ChannelPair", "close_quietly"]

RPC_TIMEOUT_S = 30.0
"""Bounds every declare, consume, cancel and close: a broker that does not answer must
not hang a start, a reopen or a shutdown."""

# Between attempts to reopen the channels while the broker is away.
_REOPEN_PAUSE_S = 1.0
# aiormq 6 (aio-pika 9, the stack of Python 3.10) does not report a consumer the broker
# cancelled; the supervisor looks for it this often instead.
_CANCEL_POLL_S = 1.0
# How long the cancelled supervisor has to end before it is cancelled again.
_RECANCEL_S = 0.1


class ChannelPair:
    """A publish channel (confirms) and a consume channel (prefetch), reopened as needed."""

    def __init__(
        self,
        connection: AbstractRobustConnection,
        *,
        prefetch: int,
        wait_s: float,
        on_open: OnOpen,
    ) -> None:
        """Prepare; ``open`` opens. ``wait_s`` bounds a publish's wait for a reopen."""
        self._connection = connection
        self._prefetch = prefetch
        self._wait_s = wait_s
        self._on_open = on_open
        self._publish: AbstractChannel | None = None
        self._consume: AbstractChannel | None = None
        self._consume_underlay: UnderlayChannel | None = None
        self._tags: set[str] = set()
        # Set while both channels are open and on_open has run on them.
        self._up = asyncio.Event()
        # Set when one of them closes; the supervisor then opens both again.
        self._down = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        # Publish channels replaced while still open, closed once their copies are confirmed.
        self._retired: dict[asyncio.Task[None], AbstractChannel] = {}
        self._closed = False
        self.generation = 0
        """How many times the pair has been opened: a reopen makes it grow."""

    @property
    def ready(self) -> bool:
        """Return whether both channels are open and set up."""
        return self._up.is_set() and not self._closed

    @property
    def consume_channel(self) -> AbstractChannel | None:
        """Return the current consume channel."""
        return self._consume

    async def open(self) -> None:
        """Open both channels and run ``on_open``; from then on, keep them open."""
        await self._open()
        self._supervisor = asyncio.create_task(self._supervise(), name="faststream-retry channels")

    def track(self, consumer_tag: str) -> None:
        """Watch a consumer on the consume channel: the broker cancelling it reopens the pair."""
        self._tags.add(consumer_tag)

    def forget_consumers(self) -> None:
        """Stop watching the consumers: they are about to be cancelled on purpose."""
        self._tags.clear()

    async def underlay_for_publish(self) -> UnderlayChannel:
        """Return the publish channel, waiting up to ``wait_s`` while it reopens."""
        publish = self._publish
        if publish is not None and publish.is_closed:
            # Closed by the broker a moment ago (a 404), before its close callback ran.
            self._on_close(publish, None)
        if not self._up.is_set() and not self._closed:  # wait_for costs a task: only if it must
            await asyncio.wait_for(self._up.wait(), self._wait_s)
        channel = self._publish
        if self._closed or channel is None:
            raise ConnectionError("faststream-retry's channels are closed")
        return await channel.get_underlay_channel()

    async def stop_supervising(self) -> None:
        """Stop reopening the channels (they stay open until ``close``)."""
        task, self._supervisor = self._supervisor, None
        # Cancelled again until it ends: before Python 3.12, asyncio.wait_for returns its
        # future's result when a cancellation lands as that future completes (gh-86296),
        # and a supervisor cancelled once would go on reopening; awaited once, it held
        # broker.stop() for ever.
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=_RECANCEL_S)
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.warning(
                "faststream-retry: the channels' supervisor had stopped: %r", task.exception()
            )

    async def close(self) -> None:
        """Stop reopening and close both channels."""
        await self.stop_supervising()
        self._closed = True
        self._up.set()  # wakes publishers waiting for a reopen: they find the pair closed
        retired = list(self._retired.values())
        for task in list(self._retired):
            task.cancel()
        await close_quietly(self._consume, self._publish, *retired)
        self._consume = self._publish = self._consume_underlay = None

    async def _open(self) -> None:
        timeout = RPC_TIMEOUT_S
        publish = Channel(self._connection, publisher_confirms=True)
        consume = Channel(self._connection, publisher_confirms=False)
        try:
            await publish.initialize(timeout=timeout)
            await consume.initialize(timeout=timeout)
            await consume.set_qos(prefetch_count=self._prefetch, timeout=timeout)
            self._tags.clear()
            self._publish, self._consume = publish, consume
            await self._on_open(publish, consume)
        except BaseException:
            await close_quietly(publish, consume)
            raise
        self._down.clear()
        for channel in (publish, consume):
            channel.close_callbacks.add(self._on_close)
        underlay = self._consume_underlay = await consume.get_underlay_channel()
        cancel_callbacks = getattr(underlay, "on_consumer_cancel_callbacks", None)
        if cancel_callbacks is not None:
            cancel_callbacks.add(self._on_cancel)
        if publish.is_closed or consume.is_closed:  # closed before the callbacks were in
            self._down.set()
            return
        self.generation += 1
        self._up.set()

    def _on_close(self, channel: Any, _exc: BaseException | None) -> None:  # noqa: ANN401
        if self._closed:
            return
        if channel is self._publish or channel is self._consume:
            self._up.clear()
            self._down.set()

    def _on_cancel(self, frame: Any) -> None:  # noqa: ANN401 - a pamqp frame
        self._lost(getattr(frame, "consumer_tag", "?"))

    def _lost(self, consumer_tag: object) -> None:
        log.warning("faststream-retry: the broker cancelled consumer %s; reopening", consumer_tag)
        self._up.clear()
        self._down.set()

    async def _wait_down(self) -> None:
        while not self._down.is_set():
            underlay = self._consume_underlay
            if underlay is None or hasattr(underlay, "on_consumer_cancel_callbacks"):
                await self._down.wait()
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._down.wait(), _CANCEL_POLL_S)
            # aiormq 6 drops a cancelled consumer's tag without telling anyone; tags
            # of consumers stopped on purpose are forgotten first (forget_consumers).
            consumers = getattr(underlay, "consumers", {})
            gone = [tag for tag in self._tags if tag not in consumers]
            if gone and not self._down.is_set():
                self._lost(gone[0])

    async def _supervise(self) -> None:
        connection = self._connection
        while True:
            await self._wait_down()
            self._up.clear()
            if _closing(connection):
                return  # the app stops: the channels go with the connection
            await self._retire_pair()
            attempt = 0
            while not _closing(connection):
                attempt += 1
                try:
                    # aio-pika reconnects the connection itself; wait for it.
                    await asyncio.wait_for(connection.ready(), RPC_TIMEOUT_S)
                    await self._open()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # broker still down, or a declare failed
                    log.log(
                        logging.WARNING if attempt % 10 == 1 else logging.DEBUG,
                        "faststream-retry: channels not reopened yet (attempt %d): %r",
                        attempt,
                        exc,
                    )
                    await asyncio.sleep(_REOPEN_PAUSE_S)
                    continue
                log.info("faststream-retry: channels reopened, topology declared again")
                break
            if _closing(connection):
                return

    async def _retire_pair(self) -> None:
        """Close the old pair's open channels ``wait_s`` from now; take no new deliveries."""
        underlay = self._consume_underlay
        if underlay is not None:
            for tag in list(self._tags):
                with contextlib.suppress(Exception):  # the channel may be going, or gone
                    await asyncio.wait_for(underlay.basic_cancel(tag), RPC_TIMEOUT_S)
        for channel in (self._publish, self._consume):
            if channel is not None and not channel.is_closed:
                self._retire(channel)

    def _retire(self, channel: AbstractChannel) -> None:
        async def close_later() -> None:
            await asyncio.sleep(self._wait_s)  # ok: the confirms' wait, not a retry delay
            await close_quietly(channel)

        task = asyncio.create_task(close_later(), name="faststream-retry retired channel")
        self._retired[task] = channel
        task.add_done_callback(lambda done: self._retired.pop(done, None))


def _closing(connection: AbstractRobustConnection) -> bool:
    """Whether ``connection`` is closed or being closed on purpose (the app stops).

    aio-pika says ``is_closed`` only once the close is over: channels reopened meanwhile
    would be RPCs in flight on a closing connection, which aiormq 6 can hold for their
    whole timeout.
    """
    return connection.is_closed or bool(getattr(connection, "close_called", False))


async def close_quietly(*channels: AbstractChannel | None) -> None:
    """Close what is open, within a bound, ignoring what is already gone."""
    for channel in channels:
        if channel is not None and not channel.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.close(), RPC_TIMEOUT_S)
