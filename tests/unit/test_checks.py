"""Startup checks: reading RabbitMQ's version and its 406 replies, and work-queue advice."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiormq.exceptions import ChannelAccessRefused, ChannelPreconditionFailed
from faststream.rabbit import QueueType, RabbitQueue

from faststream_retry import RetryPolicy, RetryTopologyError
from faststream_retry.amqp.declare import (
    Mismatch,
    Refusal,
    check_broker,
    mismatch_text,
    owns,
    parse_mismatch,
    parse_refusal,
    parse_version,
    refused,
    too_old,
    work_queue_findings,
)
from faststream_retry.core.policy import HandlerPolicy
from faststream_retry.core.topology import Handler, Route, TopologyOptions, plan


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


@pytest.mark.parametrize(
    ("reply", "argument", "wanted", "current"),
    [
        (
            (
                "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q.retry' in "
                "vhost '/': received 'quorum' but current is 'classic'"
            ),
            "x-queue-type",
            "quorum",
            "classic",
        ),
        (
            (
                "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'retry.delay.100'"
                " in vhost '/': received the value '100' of type 'byte' but current is none"
            ),
            "x-message-ttl",
            "100",
            "none",
        ),
        (
            (
                "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'retry.delay.100' in "
                "vhost '/': received 'fanout' but current is 'direct'"
            ),
            "type",
            "fanout",
            "direct",
        ),
    ],
)
def test_406_replies_name_the_argument(
    reply: str, argument: str, wanted: str, current: str
) -> None:
    """The texts are the ones RabbitMQ 3.10.8 sent in this repository's tests."""
    mismatch = parse_mismatch(reply, "queue", "fallback")
    assert (mismatch.argument, mismatch.wanted, mismatch.current) == (argument, wanted, current)


def test_an_unknown_406_text_is_kept_whole() -> None:
    """A future wording still reaches the user, with the object's name."""
    mismatch = parse_mismatch("PRECONDITION_FAILED - something new", "queue", "q.dlq")
    assert (mismatch.name, mismatch.current) == ("q.dlq", "PRECONDITION_FAILED - something new")


async def test_too_old_a_broker_is_refused_before_anything_is_declared() -> None:
    """Quorum tiers need message TTL and at-least-once dead-lettering (3.10)."""
    amqp = SimpleNamespace(server_properties={"version": b"3.9.29"})
    connection: Any = SimpleNamespace(transport=SimpleNamespace(connection=amqp))
    with pytest.raises(RetryTopologyError, match=r"3\.9\.29 is too old.*quorum.*3\.10"):
        await check_broker(connection, plan([], RetryPolicy(), TopologyOptions("p", 60_000)))


def route(arguments: dict[str, Any], max_attempts: int = 5) -> Route:
    return Route("orders", (Handler(HandlerPolicy({"max_attempts": max_attempts})),), arguments)


def texts(findings: list[tuple[int, str]], level: int) -> list[str]:
    return [text for lvl, text in findings if lvl == level]


def test_quorum_work_queue_without_a_limit_is_warned_about_on_3x() -> None:
    """On 3.x nothing bounds a message that crashes its consumer every time."""
    args = RabbitQueue("orders", queue_type=QueueType.QUORUM).arguments
    findings = work_queue_findings([route(dict(args))], RetryPolicy(), (3, 10))
    (warning,) = texts(findings, logging.WARNING)
    assert "no x-delivery-limit" in warning
    assert "orders.dlq" in warning
    assert work_queue_findings([route(dict(args))], RetryPolicy(), (4, 0)) == []


def test_a_limit_without_dead_letter_exchange_drops_messages() -> None:
    """RabbitMQ drops a message at the limit when no DLX is set."""
    args = {"x-queue-type": "quorum", "x-delivery-limit": 10}
    (warning,) = texts(work_queue_findings([route(args)], RetryPolicy(), (3, 10)), logging.WARNING)
    assert "drops a message at the limit" in warning


def test_a_limit_below_max_attempts_is_explained_not_refused() -> None:
    """Retries are new copies: the limit bounds crash redeliveries only."""
    args = {"x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": ""}
    findings = work_queue_findings([route(args, max_attempts=5)], RetryPolicy(), (3, 10))
    assert texts(findings, logging.WARNING) == []
    (info,) = texts(findings, logging.INFO)
    assert "x-delivery-limit=2 is below max_attempts=5" in info


def test_classic_work_queues_need_no_advice() -> None:
    assert work_queue_findings([route({"x-queue-type": "classic"})], RetryPolicy(), (3, 10)) == []


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


HEAD = (
    "faststream-retry cannot use queues that exist with other arguments "
    "(RabbitMQ would refuse with 406 PRECONDITION_FAILED):"
)
COMMAND = (
    "faststream-retry migrate <queue> --queue-type quorum --prefix retry (the cli extra) "
    "moves its messages to a temporary queue and back, with confirms, declaring it as the "
    "plugin does"
)
QUEUE_MIGRATION = f"it may hold messages: stop the services that consume it, then {COMMAND}"
TIER_MIGRATION = (
    "a tier holds a message for one tier period only: stop the services that use prefix "
    "'retry', wait until the tier is empty, delete it (rabbitmqctl delete_queue) and "
    "start again; or choose a new prefix=, whose tiers are new queues, and let the old "
    "tiers drain into their .retry queues; or, with the services stopped, "
    f"{COMMAND} (its messages wait their tier period again)"
)


def test_a_queue_of_the_old_classic_default_names_both_fixes() -> None:
    """It matches what queue_type="classic" declares: keep classic, or migrate."""
    found = Mismatch("queue", "orders.dlq", "x-queue-type", "quorum", "none", fits="classic")
    assert mismatch_text([found], "retry").splitlines() == [
        HEAD,
        (
            "- queue 'orders.dlq': argument 'x-queue-type' is unset on the broker, the plugin "
            "declares 'quorum'"
        ),
        (
            'It is what queue_type="classic" declares (the plugin\'s default before "quorum"; it '
            'dead-letters at most once). To keep it: pass RetryMiddleware(queue_type="classic"), '
            "for every queue the plugin declares."
        ),
        "To migrate instead, for each queue:",
        f"- 'orders.dlq': {QUEUE_MIGRATION}",
    ]


def test_quorum_queues_where_classic_is_asked_for_say_quorum_is_the_default() -> None:
    """The tryout's case: tiers, a .retry and a .dlq; one line per difference, not per queue."""
    tiers = [
        Mismatch(
            "queue",
            f"retry.delay.{100 * 2**k}",
            "x-dead-letter-strategy",
            "none",
            "at-least-once",
            fits="quorum",
        )
        for k in range(3)
    ]
    others = [
        Mismatch("queue", "q.retry", "x-dead-letter-exchange", "none", "", fits="quorum"),
        Mismatch("queue", "q.dlq", "x-queue-type", "classic", "quorum", fits="quorum"),
    ]
    assert mismatch_text(tiers + others, "retry").splitlines() == [
        HEAD,
        (
            "- queues 'retry.delay.100', 'retry.delay.200', 'retry.delay.400': argument "
            "'x-dead-letter-strategy' is 'at-least-once' on the broker, the plugin declares unset"
        ),
        (
            "- queue 'q.retry': argument 'x-dead-letter-exchange' is '' on the broker, the plugin "
            "declares unset"
        ),
        (
            "- queue 'q.dlq': argument 'x-queue-type' is 'quorum' on the broker, the plugin "
            "declares 'classic'"
        ),
        (
            'All of them are what the default queue_type="quorum" declares. To keep them: drop '
            'queue_type="classic" (or pass queue_type="quorum"), for every queue the plugin '
            "declares."
        ),
        "To migrate instead, for each queue:",
        f"- the tiers (retry.delay.*): {TIER_MIGRATION}",
        f"- 'q.retry', 'q.dlq': {QUEUE_MIGRATION}",
    ]


def test_some_queues_fitting_the_other_type_are_named() -> None:
    """Not all of them fit: those that do are named, one or several."""
    one = Mismatch("queue", "a.dlq", "x-queue-type", "quorum", "classic", fits="classic")
    two = Mismatch("queue", "b.dlq", "x-queue-type", "quorum", "classic", fits="classic")
    other = Mismatch("queue", "c.dlq", "x-max-length", "none", "5")
    lines = mismatch_text([one, other], "p").splitlines()
    assert lines[3].startswith("'a.dlq' is what queue_type=\"classic\" declares")
    assert "To keep it: pass" in lines[3]
    lines = mismatch_text([one, two, other], "p").splitlines()
    assert lines[1] == (
        "- queues 'a.dlq', 'b.dlq': argument 'x-queue-type' is 'classic' on the broker, "
        "the plugin declares 'quorum'"
    )
    assert lines[3].startswith("'a.dlq', 'b.dlq' are what queue_type=\"classic\" declares")
    assert "To keep them: pass" in lines[3]
    assert lines[4] == "To migrate instead, for each queue:"


def test_a_queue_no_queue_type_declares_gets_the_migration_only() -> None:
    tier = Mismatch("queue", "p.delay.100", "x-max-length", "5", "none")
    assert mismatch_text([tier], "p").splitlines()[2:] == [
        "To migrate, for each queue:",
        "- the tiers (p.delay.*): "
        + TIER_MIGRATION.replace("'retry'", "'p'").replace("--prefix retry", "--prefix p"),
    ]
    dlq = Mismatch("queue", "p.dlq", "x-max-length", "5", "none")
    assert mismatch_text([dlq], "p").endswith(
        "To migrate, for each queue:\n- 'p.dlq': "
        + QUEUE_MIGRATION.replace("--prefix retry", "--prefix p")
    )
    # A queue of another prefix's shape is not one of this plugin's tiers.
    assert "- 'q.delay.100': " in mismatch_text([replace(tier, name="q.delay.100")], "p")


async def test_a_mismatched_queue_is_tried_with_the_other_queue_types_arguments() -> None:
    """Only a queue that takes the other type's declaration is said to fit it."""
    reply = (
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue '{}' in "
        "vhost '/': received '' but current is none"
    )
    live = {"q.retry": {"x-queue-type": "classic"}, "q.dlq": {"x-queue-type": "stream"}}
    declared: list[tuple[str, dict[str, Any]]] = []

    class Channel:
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
    assert [name for name, _ in declared] == ["p.delay.100", "q.retry", "q.retry", "q.dlq", "q.dlq"]
    assert declared[2] == ("q.retry", {"x-queue-type": "classic"})


def test_a_403_reply_names_the_permission_and_the_object() -> None:
    """A text that names the permission and the object wins over the guess.

    RabbitMQ 3.10.8 names the object only ("access to exchange 'x' in vhost '/' refused
    for user 'u'"); a wording with the permission in front is read too.
    """
    reply = (
        "ACCESS_REFUSED - configure access to exchange 'retry.delay.200' in vhost '/' "
        "refused for user 'app'"
    )
    refusal = parse_refusal(reply, "queue", "guess", "write permission", "declare")
    assert refusal == Refusal(
        "exchange", "retry.delay.200", "configure permission", "declare", reply
    )
    # A refused read names no permission: the object is read, the guess stands.
    read = "ACCESS_REFUSED - access to queue 'q.retry' in vhost '/' refused for user 'app'"
    unnamed = parse_refusal(read, "queue", "a .retry", "read permission", "consume")
    assert unnamed == Refusal("queue", "q.retry", "read permission", "consume", read)
    unknown = parse_refusal("ACCESS_REFUSED - new words", "queue", "q", "read x", "consume")
    assert unknown == Refusal("queue", "q", "read x", "consume", "ACCESS_REFUSED - new words")


def test_refusals_are_one_error_naming_each_object() -> None:
    error = refused(
        [
            Refusal("exchange", "retry.delay.200", "configure permission", "declare", "r1"),
            Refusal("queue", "q.retry", "read permission", "consume", "r2"),
        ]
    )
    assert isinstance(error, RetryTopologyError)
    assert str(error) == (
        "faststream-retry's RabbitMQ user lacks permissions it needs (403 ACCESS_REFUSED):\n"
        "- exchange 'retry.delay.200': to declare it, the user needs configure permission. "
        "RabbitMQ said: r1\n"
        "- queue 'q.retry': to consume it, the user needs read permission. RabbitMQ said: r2\n"
        "Grant them with rabbitmqctl set_permissions; the README's 'Permissions' section "
        "lists the configure, write and read patterns the plugin needs"
    )


async def test_each_refused_operation_guesses_what_it_needs() -> None:
    """When RabbitMQ's text names no permission, the error says what the operation needs."""

    def refuse(name: str) -> ChannelAccessRefused:
        return ChannelAccessRefused(f"ACCESS_REFUSED - refused for {name}")

    class Channel:
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


def test_the_plugin_owns_its_tiers_retry_and_dead_letter_queues_only() -> None:
    """A missing work queue is its application's: never declared again by the plugin."""
    topology = plan(
        [Route("orders", (Handler(None),))],
        RetryPolicy(),
        TopologyOptions("p", 200, tick_ms=100),
    )
    assert owns(topology, "p.delay.100", "orders.retry")
    assert owns(topology, "p.delay.200", "anything")
    assert not owns(topology, "p.delay.400", "orders.retry")
    assert owns(topology, "", "orders.retry")
    assert owns(topology, "", "orders.dlq")
    assert not owns(topology, "", "orders")
    assert not owns(topology, "", "other.dlq")
    assert not owns(topology, "amq.direct", "orders.dlq")
