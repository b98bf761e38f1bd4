"""What ``migrate`` may move, the arguments it gives, and how it resumes (pure parts)."""

from __future__ import annotations

import pytest

from faststream_retry.core.policy import RetryPolicy
from faststream_retry.core.topology import Handler, Route, TopologyOptions, migrating_name, plan
from faststream_retry.ops.migration import (
    ROUTING_KEY_HEADER,
    Owned,
    copy_headers,
    owned,
    restored_headers,
    steps,
    target_spec,
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("retry.delay.100", Owned("retry.delay.100", "tier", ttl_ms=100)),
        ("orders.retry", Owned("orders.retry", "retry", queue="orders")),
        ("orders.dlq", Owned("orders.dlq", "dlq", queue="orders")),
        ("a.b.dlq", Owned("a.b.dlq", "dlq", queue="a.b")),
    ],
)
def test_the_plugins_own_queues_are_told_by_name(name: str, expected: Owned) -> None:
    assert owned(name, "retry") == expected


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("orders", "is not a queue the plugin owns"),
        (".dlq", "is not a queue the plugin owns"),
        ("other.delay.100", "is not a queue the plugin owns"),
        ("retry.delay.0", "is not a queue the plugin owns"),
        ("retry.delay.abc", "is not a queue the plugin owns"),
        ("retry.queues", "registry"),
        ("orders.dlq.migrating", "run migrate on 'orders.dlq'"),
    ],
)
def test_other_names_are_refused_with_the_reason(name: str, why: str) -> None:
    """A work queue is its application's; the registry is classic by design; a temporary
    queue is finished by migrating the queue it belongs to."""
    reason = owned(name, "retry")
    assert isinstance(reason, str)
    assert why in reason


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_target_arguments_are_exactly_what_the_plan_declares(queue_type: str) -> None:
    """Whatever the role, migrate declares what the app would: no 406 at its next start."""
    options = TopologyOptions("p", 800, queue_type, delivery_limit=7, tick_ms=100)  # type: ignore[arg-type]
    planned = plan([Route("orders", (Handler(None),))], RetryPolicy(), options)
    for spec in planned.queues:
        role = owned(spec.name, "p")
        assert isinstance(role, Owned)
        assert target_spec(role, queue_type, "p", 7) == spec  # type: ignore[arg-type]


def test_the_temporary_queue_is_derived_from_the_name() -> None:
    """A second run finds what the first left."""
    assert migrating_name("orders.dlq") == "orders.dlq.migrating"


@pytest.mark.parametrize(
    ("source", "temp_exists", "expected"),
    [
        ("other", False, ("drain", "replace", "back", "cleanup")),
        ("other", True, ("drain", "replace", "back", "cleanup")),  # killed while moving out
        ("missing", True, ("replace", "back", "cleanup")),  # killed between delete and declare
        ("target", True, ("back", "cleanup")),  # killed while moving back
        ("target", False, ()),  # done already
    ],
)
def test_what_is_left_follows_from_what_exists(
    source: str, temp_exists: bool, expected: tuple[str, ...]
) -> None:
    assert steps(source, temp_exists) == expected  # type: ignore[arg-type]


def test_nothing_to_migrate_is_an_error() -> None:
    with pytest.raises(ValueError, match="neither"):
        steps("missing", temp_exists=False)


def test_the_routing_key_waits_in_a_header_and_comes_back() -> None:
    """A tier dead-letters by the routing key; the delivery count is the broker's, not the message's."""
    headers = {"retry-attempt": 2, "x-delivery-count": 1, "x-acquired-count": 1}
    copied = copy_headers(headers, "orders.retry")
    assert copied == {"retry-attempt": 2, ROUTING_KEY_HEADER: "orders.retry"}
    assert restored_headers(copied) == ({"retry-attempt": 2}, "orders.retry")
    assert restored_headers({ROUTING_KEY_HEADER: b"q.retry"}) == ({}, "q.retry")
    assert restored_headers(None) == ({}, None)
    assert copy_headers(None, "") == {ROUTING_KEY_HEADER: ""}
