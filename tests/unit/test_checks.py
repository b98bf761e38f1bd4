"""Startup checks against the broker: its version, and every object declared once to see."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiormq.exceptions import ChannelAccessRefused, ChannelPreconditionFailed

from faststream_retry import RetryPolicy, RetryTopologyError
from faststream_retry.core.topology import Handler, Route, TopologyOptions, plan
from faststream_retry.core.versions import parse_version, too_old
from faststream_retry.rabbit.checks import check_broker


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3.10.8", (3, 10)),
        (b"4.0.5", (4, 0)),
        (b"4.3.0+\xff\xfe", (4, 3)),  # a server's bytes need not be UTF-8
        ("3.13.0-rc.1", (3, 13)),
        ("garbage", None),
        (None, None),
        (42, None),
    ],
)
def test_version_is_read_leniently(text: object, expected: tuple[int, int] | None) -> None:
    """A version we cannot read is reported as unknown, never as an error."""
    assert parse_version(text) == expected


async def test_too_old_a_broker_is_refused_before_anything_is_declared() -> None:
    """Quorum tiers need message TTL and at-least-once dead-lettering (3.10)."""
    amqp = SimpleNamespace(server_properties={"version": b"3.9.29"})
    connection: Any = SimpleNamespace(transport=SimpleNamespace(connection=amqp))
    with pytest.raises(RetryTopologyError, match=r"3\.9\.29 is too old.*quorum.*3\.10"):
        await check_broker(connection, plan([], RetryPolicy(), TopologyOptions("p", 60_000)))


def test_too_old_for_quorum_names_both_fixes() -> None:
    """Quorum is the default, so the error says how to run on the old broker anyway."""
    assert too_old("3.9.29", "quorum") == (
        "RabbitMQ 3.9.29 is too old for queue_type='quorum': it needs 3.10 or later. "
        'Upgrade RabbitMQ, or pass RetryMiddleware(queue_type="classic") to use classic '
        "queues (RabbitMQ >= 3.8; they dead-letter at most once, so a broker crash or "
        "restart can lose a message waiting in a tier)"
    )


def test_too_old_for_classic_says_upgrade() -> None:
    assert too_old("3.7.1", "classic") == (
        "RabbitMQ 3.7.1 is too old for queue_type='classic': it needs 3.8 or later. "
        "Upgrade RabbitMQ"
    )


async def test_classic_on_a_3_9_broker_is_accepted() -> None:
    """3.8 and 3.9 still host classic queues: the check goes on to declare."""
    declared: list[str] = []

    class Channel:
        is_closed = False

        async def exchange_declare(self, name: str, **_: Any) -> None:
            declared.append(name)

        async def queue_declare(self, name: str, **_: Any) -> None:
            declared.append(name)

        async def queue_bind(self, name: str, exchange: str, **_: Any) -> None:
            declared.append(f"bind {name}")

        async def close(self) -> None:
            pass

    class Amqp:
        server_properties: ClassVar[dict[str, bytes]] = {"version": b"3.9.29"}

        async def channel(self) -> Channel:
            return Channel()

    connection: Any = SimpleNamespace(transport=SimpleNamespace(connection=Amqp()))
    topology = plan([], RetryPolicy(), TopologyOptions("p", 200, "classic", tick_ms=100))
    assert await check_broker(connection, topology) == (3, 9)
    assert declared == [
        "p.delay.100",
        "p.delay.200",
        "p.delay.100",
        "p.delay.200",
        "bind p.delay.100",
        "bind p.delay.200",
    ]


async def test_a_mismatched_queue_is_tried_with_the_other_queue_types_arguments() -> None:
    """Only a queue that takes the other type's declaration is said to fit it."""
    reply = (
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue '{}' in "
        "vhost '/': received '' but current is none"
    )
    live = {"q.retry": {"x-queue-type": "classic"}, "q.dlq": {"x-queue-type": "stream"}}
    declared: list[tuple[str, dict[str, Any]]] = []

    class Channel:
        is_closed = False

        async def exchange_declare(self, name: str, **_: Any) -> None:
            pass

        async def queue_declare(self, name: str, *, arguments: Any, **_: Any) -> None:
            declared.append((name, arguments))
            if name in live and arguments != live[name]:
                raise ChannelPreconditionFailed(reply.format(name))

        async def queue_bind(self, name: str, exchange: str, **_: Any) -> None:
            pass

        async def close(self) -> None:
            pass

    class Amqp:
        server_properties: ClassVar[dict[str, bytes]] = {"version": b"3.10.8"}

        async def channel(self) -> Channel:
            return Channel()

    connection: Any = SimpleNamespace(transport=SimpleNamespace(connection=Amqp()))
    topology = plan(
        [Route("q", (Handler(None),))], RetryPolicy(), TopologyOptions("p", 100, tick_ms=100)
    )
    with pytest.raises(RetryTopologyError) as caught:
        await check_broker(connection, topology)
    text = str(caught.value)
    assert "- queues 'q.retry', 'q.dlq': argument 'x-dead-letter-exchange' is unset" in text
    assert "\n'q.retry' is what queue_type=\"classic\" declares" in text
    assert text.count("what queue_type") == 1
    # The tier fits its own declaration: never tried with the other type's arguments.
    assert [name for name, _ in declared] == ["p.delay.100", "q.retry", "q.dlq", "q.retry", "q.dlq"]
    assert declared[3] == ("q.retry", {"x-queue-type": "classic"})


async def test_each_refused_operation_guesses_what_it_needs() -> None:
    """When RabbitMQ's text names no permission, the error says what the operation needs."""

    def refuse(name: str) -> ChannelAccessRefused:
        return ChannelAccessRefused(f"ACCESS_REFUSED - refused for {name}")

    class Channel:
        is_closed = False

        async def exchange_declare(self, name: str, **_: Any) -> None:
            pass

        async def queue_declare(self, name: str, **_: Any) -> None:
            if not name.endswith(".delay.100"):
                raise refuse(name)

        async def queue_bind(self, name: str, exchange: str, **_: Any) -> None:
            raise refuse(name)

        async def close(self) -> None:
            pass

    class Amqp:
        server_properties: ClassVar[dict[str, bytes]] = {"version": b"3.10.8"}

        async def channel(self) -> Channel:
            return Channel()

    connection: Any = SimpleNamespace(transport=SimpleNamespace(connection=Amqp()))
    topology = plan(
        [Route("q", (Handler(None),))], RetryPolicy(), TopologyOptions("p", 100, tick_ms=100)
    )
    with pytest.raises(RetryTopologyError) as caught:
        await check_broker(connection, topology)
    lines = str(caught.value).splitlines()[1:-1]
    assert [line.split(". RabbitMQ said")[0] for line in lines] == [
        (
            "- queue 'q.retry': to declare it, the user needs configure permission, and read "
            "permission on it and write permission on 'amq.default'"
        ),
        "- queue 'q.dlq': to declare it, the user needs configure permission",
    ]
    # Every declaration allowed: the bindings are tried, and their refusal named.
    topology = plan([], RetryPolicy(), TopologyOptions("p", 100, tick_ms=100))
    with pytest.raises(RetryTopologyError) as caught:
        await check_broker(connection, topology)
    assert (
        str(caught.value)
        .splitlines()[1]
        .startswith(
            "- queue 'p.delay.100': to bind it, the user needs write permission on it and read "
            "permission on exchange 'p.delay.100'. RabbitMQ said: ACCESS_REFUSED"
        )
    )


async def test_declarations_run_side_by_side_and_a_refused_one_costs_only_its_channel() -> None:
    """Eight channels at once; a refusal closes its channel, which is replaced, and every
    object is still declared once, each finding reported in the plan's order."""
    in_flight = [0, 0]  # now, at most

    class Channel:
        def __init__(self) -> None:
            self.is_closed = False
            self.declared: list[str] = []

        async def exchange_declare(self, name: str, **_: Any) -> None:
            await self._declare(name)

        async def queue_declare(self, name: str, **_: Any) -> None:
            await self._declare(name)

        async def _declare(self, name: str) -> None:
            assert not self.is_closed, "declared on a channel the broker closed"
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            await asyncio.sleep(0.001)
            in_flight[0] -= 1
            self.declared.append(name)
            if name in {"q3.retry", "q5.dlq"}:
                self.is_closed = True
                raise ChannelAccessRefused(f"ACCESS_REFUSED - refused for {name}")

        async def queue_bind(self, name: str, exchange: str, **_: Any) -> None:
            raise AssertionError("no binding after a refusal")

        async def close(self) -> None:
            self.is_closed = True

    opened: list[Channel] = []

    class Amqp:
        server_properties: ClassVar[dict[str, bytes]] = {"version": b"3.10.8"}

        async def channel(self) -> Channel:
            opened.append(Channel())
            return opened[-1]

    connection: Any = SimpleNamespace(transport=SimpleNamespace(connection=Amqp()))
    routes = [Route(f"q{i}", (Handler(None),)) for i in range(10)]
    topology = plan(routes, RetryPolicy(), TopologyOptions("p", 800, tick_ms=100))
    with pytest.raises(RetryTopologyError) as caught:
        await check_broker(connection, topology)
    lines = str(caught.value).splitlines()[1:-1]
    assert [line.split("'")[1] for line in lines] == ["q3.retry", "q5.dlq"]
    declared = [name for channel in opened for name in channel.declared]
    assert sorted(declared) == sorted([*topology.exchanges, *(s.name for s in topology.queues)])
    assert in_flight[1] == 8
    assert len(opened) == 8 + 2  # each refusal's channel replaced
