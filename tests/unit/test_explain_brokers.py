"""``faststream-retry explain`` of a NATS and a Redis app: the RabbitMQ shape, told plainly.

The policy, classification and schedule are the same functions' on every broker; what
the plugin makes differs, and what has no meaning on a broker is null or empty, with a
note, never RabbitMQ's queues and tiers invented for it. No broker is needed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from faststream_retry.nats import naming
from tests.unit.test_cli_nats import command

if TYPE_CHECKING:
    from pathlib import Path

pytest.importorskip("faststream.nats", reason="faststream[nats], a test dependency")
pytest.importorskip("faststream.redis", reason="faststream[redis], a test dependency")

POLICY = """
from datetime import timedelta
from faststream_retry import Exponential, RetryMiddleware, RetryPolicy

retry = RetryMiddleware(
    RetryPolicy(max_attempts=3, backoff=Exponential(initial=timedelta(seconds=1))),
    prefix="shop",
)
"""
APPS = {
    "rabbitapp": POLICY
    + """
from faststream.rabbit import RabbitBroker
broker = RabbitBroker("amqp://guest:secret@127.0.0.1:1/", middlewares=[retry])

@broker.subscriber("orders")
async def bill(body: str) -> None: ...
""",
    "natsapp": POLICY
    + """
from faststream.nats import JStream, NatsBroker
broker = NatsBroker("nats://127.0.0.1:1", middlewares=[retry])

@broker.subscriber("orders.new", stream=JStream("orders", subjects=["orders.>"]), durable="billing")
async def bill(body: str) -> None: ...
""",
    "redisapp": POLICY
    + """
from faststream.redis import RedisBroker, StreamSub
broker = RedisBroker("redis://:secret@127.0.0.1:1", middlewares=[retry])

@broker.subscriber(stream=StreamSub("orders", group="g", consumer="c"))
async def bill(body: str) -> None: ...
""",
}


def explained(folder: Path, app: str, *more: str) -> dict[str, Any]:
    (folder / f"{app}.py").write_text(APPS[app])
    done = command(folder, "explain", f"{app}:broker", *more)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return dict(json.loads(done.stdout)) if more else {"text": done.stdout}


@pytest.fixture
def rabbit(tmp_path: Path) -> dict[str, Any]:
    return explained(tmp_path, "rabbitapp", "--json")


def keys(found: dict[str, Any]) -> set[str]:
    return set(found)


def test_nats_has_the_shape_its_tiers_and_its_streams(
    tmp_path: Path, rabbit: dict[str, Any]
) -> None:
    """Same keys at every level; tiers are delay subjects; objects are NATS's; no queue_type."""
    found = explained(tmp_path, "natsapp", "--json")
    assert keys(found) == keys(rabbit)
    assert found["system"] == "nats"
    assert rabbit["system"] == "rabbitmq"
    assert found["queue_type"] is None
    assert found["prefix"] == "shop"
    (queue,) = found["queues"]
    (rabbit_queue,) = rabbit["queues"]
    assert set(queue) == set(rabbit_queue)
    assert queue["queue"] == "orders.billing"
    assert queue["home_from_tier"] is None
    (handler,) = queue["handlers"]
    assert set(handler) == set(rabbit_queue["handlers"][0])
    assert [s["delay_min_ms"] for s in handler["schedule"]] == [1000, 2000, 0]
    first = handler["schedule"][0]
    assert first["legs_min"] == [{"tier_ms": 1000, "to": "shop.ready.orders.billing"}]
    kinds = {(o["kind"], o.get("name") or o.get("durable")) for o in queue["objects"]}
    assert kinds == {
        ("stream", "shop-dlq-orders"),
        ("consumer", naming.ready_durable("shop", "orders.billing")),
    }
    shared = {o.get("name") or o.get("durable") for o in found["shared_objects"]}
    assert "shop-delay" in shared
    assert "shop.queues" not in shared, "no RabbitMQ registry on NATS"
    assert all(o["kind"] in {"stream", "consumer"} for o in found["shared_objects"])
    assert found["notes"]
    text = explained(tmp_path, "natsapp")["text"]
    assert "NATS JetStream" in str(text)
    assert "fanout" not in str(text)


def test_redis_has_the_shape_no_tiers_no_prefix_and_its_keys(
    tmp_path: Path, rabbit: dict[str, Any]
) -> None:
    """Same keys; no tiers, no legs, prefix and queue_type null; the stream's keys listed."""
    found = explained(tmp_path, "redisapp", "--json")
    assert keys(found) == keys(rabbit)
    assert found["system"] == "redis"
    assert found["prefix"] is None
    assert found["queue_type"] is None
    assert found["tiers"] == []
    assert found["shared_objects"] == []
    (queue,) = found["queues"]
    assert queue["queue"] == "orders"
    (handler,) = queue["handlers"]
    assert [s["delay_min_ms"] for s in handler["schedule"]] == [1000, 2000, 0]
    assert all(s["legs_min"] == [] == s["legs_max"] for s in handler["schedule"])
    assert [o["name"] for o in queue["objects"]] == [
        "{orders}.retry",
        "{orders}.retry.data",
        "{orders}.dlq",
    ]
    assert any("no tiers" in note for note in found["notes"])
    text = str(explained(tmp_path, "redisapp")["text"])
    assert "Redis Streams" in text
    assert "tiers (" not in text
    assert "secret" not in text
