"""Startup checks: reading RabbitMQ's version and its 406 replies, and work-queue advice."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from faststream.rabbit import QueueType, RabbitQueue

from faststream_retry import RetryPolicy, RetryTopologyError
from faststream_retry.amqp.declare import (
    check_broker,
    parse_mismatch,
    parse_version,
    work_queue_findings,
)
from faststream_retry.policy import HandlerPolicy
from faststream_retry.topology import Handler, Route, TopologyOptions, plan


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3.10.8", (3, 10)),
        (b"4.0.5", (4, 0)),
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
        await check_broker(
            connection, plan([], RetryPolicy(), TopologyOptions("p", 60_000, "quorum"))
        )


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
