"""Helpers for tests against a real RabbitMQ: unique names, a running app, polling, draining.

The fixtures built on them (``amqp``, ``make_app``) live in ``tests/conftest.py``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aio_pika
import pytest
from aiormq.exceptions import ChannelNotFoundEntity
from faststream.rabbit import RabbitBroker

from faststream_retry import RetryMiddleware
from faststream_retry.core.topology import registry_name
from faststream_retry.core.versions import parse_version

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection


async def eventually(
    condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition"
) -> None:
    """Wait until ``condition()`` holds, failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


LATE_SLACK_MS = 3000
"""What a loaded 2-core machine may add to a release, on top of the delay itself."""


def on_time(lateness_ms: float, delay_ms: float) -> bool:
    """Never early, and late by less than the delay plus slack.

    The exact release time is the pure re-check step's business (unit tests pin it);
    on a real broker the suite checks only what load cannot break: a message is not
    released before it is due, nor held a second time over.
    """
    return 0 <= lateness_ms < delay_ms + LATE_SLACK_MS


def series_of(connection: AbstractRobustConnection) -> tuple[int, int]:
    """Return the ``(major, minor)`` RabbitMQ series ``connection`` talks to.

    For what a series words or counts differently (4.x reports a classic queue's
    ``x-queue-type``, 4.3 names the permission it refused); what the plugin does is the
    same on every series.
    """
    assert connection.transport is not None, "the connection is not open"
    version = parse_version(connection.transport.connection.server_properties.get("version"))
    assert version is not None, "the broker did not say its version"
    return version


def headers_of(message: AbstractIncomingMessage) -> dict[str, Any]:
    """Return the headers of ``message``, typed for reading nested values in asserts."""
    return dict(message.headers or {})


def script_broker_ctl(url: str) -> Path | None:
    """Return rabbitmqctl for the broker at ``url`` if scripts/rabbitmq/start.sh runs it.

    The script keeps a ``ctl`` wrapper in its state dir, ``RMQ_BASE`` or
    ``$TMPDIR/rabbitmq-test-<port>``; another broker (Docker, a developer's own) has none.
    """
    parts = urlsplit(url)
    if parts.hostname not in {"127.0.0.1", "localhost"} or parts.port is None:
        return None
    base = (
        os.environ.get("RMQ_BASE")
        or f"{os.environ.get('TMPDIR', '/tmp')}/rabbitmq-test-{parts.port}"  # noqa: S108 - start.sh's dir
    )
    ctl = Path(base) / "ctl"
    return ctl if ctl.exists() else None


CTL_NODE_UNREACHED = {69: "EX_UNAVAILABLE", 75: "EX_TEMPFAIL"}
"""The exits of a rabbitmqctl that did not get through to its node.

A CLI run is an Erlang VM of its own that connects to the node; on a loaded machine it
now and then fails to (69, or 75 when the connection or the call timed out) while the
node is up. A run that did reach the node exits with anything else.
"""


def run_ctl(
    ctl: Path, *args: str, check: bool = True, within: float = 20.0, pause: float = 1.0
) -> subprocess.CompletedProcess[str]:
    """Run ``ctl -q args``; run it again while it exits as if it did not reach the node.

    Attempts start until ``within`` seconds have passed since the first, ``pause``
    seconds apart. With ``check``, any exit but 0 in the end fails the test with the
    command's status and output; without it the last run is returned as it ended (for
    best-effort cleanup that must not hide the test's own failure).

    Retried only on :data:`CTL_NODE_UNREACHED`: a 69 is a node the CLI never reached, so
    the command did nothing; a 75 can be a call that timed out after it took effect, in
    which case the run again answers what the command says of a done thing (a user that
    already exists, say), and that fails the test by name rather than hiding.
    """
    command = [str(ctl), "-q", *args]
    start = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        unreached = done.returncode in CTL_NODE_UNREACHED
        if not unreached or time.monotonic() + pause > start + within:
            break
        time.sleep(pause)
    if check and done.returncode != 0:
        how = (
            f" ({CTL_NODE_UNREACHED[done.returncode]}), the last of {attempts} attempts "
            f"in {time.monotonic() - start:.1f} s"
            if unreached
            else ""
        )
        pytest.fail(
            f"{' '.join(command)} exited {done.returncode}{how}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
    return done


async def close_all_connections(ctl: Path, why: str) -> None:
    """Have the broker close every client connection, as a failover or an operator would.

    Every test's: one that calls this is marked ``exclusive``, which scripts/test runs
    alone, never beside others in parallel workers.
    """
    assert "PYTEST_XDIST_WORKER" not in os.environ, (
        "closing every connection breaks the tests in the other workers: mark the test "
        "@pytest.mark.exclusive"
    )
    await asyncio.to_thread(run_ctl, ctl, "close_all_connections", why)


def unique(name: str) -> str:
    """Return ``name`` made unique to this test run."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def drain(
    connection: AbstractRobustConnection, queue: str, expect: int, timeout: float = 15.0
) -> list[AbstractIncomingMessage]:
    """Get every message in ``queue``: wait for ``expect`` of them, then take all the rest.

    "The rest" ends at a marker published to the queue once ``expect`` arrived: every copy
    the plugin confirmed before that is ahead of the marker and counted. A copy made
    later (a redelivery after a pause, say) is not; count those where they come from.
    """
    channel = await connection.channel(publisher_confirms=True)
    got: list[AbstractIncomingMessage] = []
    deadline = time.monotonic() + timeout
    q = await channel.get_queue(queue, ensure=True)
    while len(got) < expect and time.monotonic() < deadline:
        message = await q.get(fail=False, no_ack=True)
        if message is None:
            await asyncio.sleep(0.02)
        else:
            got.append(message)
    marker = unique("end-of-drain")
    await channel.default_exchange.publish(
        aio_pika.Message(b"", message_id=marker), routing_key=queue
    )
    while True:
        message = await q.get(fail=False, no_ack=True)
        if message is None:
            if time.monotonic() > deadline + timeout:
                pytest.fail(f"the end-of-drain marker never came back from {queue}")
            await asyncio.sleep(0.02)
        elif message.message_id == marker:
            break
        else:
            got.append(message)
    await channel.close()
    return got


async def queue_depth(connection: AbstractRobustConnection, queue: str) -> int:
    """Return how many ready messages ``queue`` holds."""
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count or 0
    finally:
        await channel.close()


async def eventually_async(
    condition: Callable[[], Awaitable[bool]], timeout: float = 15.0, what: str = "condition"
) -> None:
    """Like ``eventually``, for a condition that asks the broker (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def depth_reaches(
    connection: AbstractRobustConnection, queue: str, count: int, what: str | None = None
) -> None:
    """Wait until ``queue`` holds ``count`` ready messages (15 s at most).

    A message arrives a moment after what sent it returns: a publish's confirm, or a
    closed channel's close-ok, after which the broker requeues its unacked messages.
    """

    async def there() -> bool:
        return await queue_depth(connection, queue) == count

    await eventually_async(there, what=what or f"{count} in {queue}")


async def consumers(connection: AbstractRobustConnection, queue: str, timeout: float = 10.0) -> int:
    """Return how many consumers ``queue`` has, once the count stops changing for 0.3 s.

    A cancel or a consume reaches the broker's count a moment after the call returns;
    the count is read until it is the same three times in a row, within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    seen: list[int] = []
    channel = await connection.channel()
    try:
        while time.monotonic() < deadline:
            declared = await channel.declare_queue(queue, passive=True)
            seen.append(declared.declaration_result.consumer_count or 0)
            if len(seen) >= 3 and len(set(seen[-3:])) == 1:
                return seen[-1]
            await asyncio.sleep(0.1)
    finally:
        await channel.close()
    pytest.fail(f"the consumer count of {queue} kept changing: {seen}")


class App:
    """A broker with the plugin installed, on names private to one test."""

    def __init__(
        self,
        url: str,
        prefix: str | None = None,
        broker_options: dict[str, Any] | None = None,
        outer_middlewares: tuple[Any, ...] = (),
        **retry_options: Any,
    ) -> None:
        self.prefix = prefix or unique("t")
        retry_options.setdefault("tick", 0.1)
        retry_options.setdefault("max_delay", 60)
        retry_options.setdefault("publish_failure_pause", 0.2)
        self.retry = RetryMiddleware(prefix=self.prefix, **retry_options)
        self.broker = RabbitBroker(
            url,
            middlewares=[*outer_middlewares, self.retry],
            logger=None,
            **(broker_options or {}),
        )
        self.retry.install(self.broker)
        self.events: list[Any] = []
        self.retry.add_hook(self.events.append)
        self.running = False

    async def start(self) -> None:
        await self.broker.start()
        self.running = True

    async def stop(self) -> None:
        if self.running:
            await self.broker.stop()
            self.running = False

    def retry_queues(self, queue: str) -> list[str]:
        """Return where copies of ``queue``'s messages wait: every delay tier and ``.retry``."""
        plan = self.retry.runtime(self.broker).plan
        return [plan.tier(ttl) for ttl in plan.tiers.ttls_ms] + [f"{queue}.retry"]

    async def waiting(self, connection: AbstractRobustConnection, queue: str) -> int:
        """Return how many copies wait for a retry: in every delay tier and in ``<queue>.retry``.

        A queue someone deleted holds nothing.
        """
        total = 0
        for name in self.retry_queues(queue):
            with contextlib.suppress(ChannelNotFoundEntity):
                total += await queue_depth(connection, name)
        return total

    async def cleanup(self, connection: AbstractRobustConnection) -> None:
        await delete_declared(connection, self.retry, self.broker)


async def delete_declared(
    connection: AbstractRobustConnection, retry: RetryMiddleware, broker: RabbitBroker
) -> None:
    """Delete every queue and exchange the plugin planned for ``broker``, work queues included."""
    topology = retry.runtime(broker).plan
    channel = await connection.channel()
    names = [spec.name for spec in topology.queues]
    names += [route.queue for route in topology.routes.values()]
    names.append(registry_name(topology.options.prefix))
    for name in names:
        with contextlib.suppress(Exception):
            await channel.queue_delete(name)
    for exchange in topology.exchanges:
        with contextlib.suppress(Exception):
            await channel.exchange_delete(exchange)
    with contextlib.suppress(Exception):
        await channel.close()
