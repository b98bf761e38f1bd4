"""The page's broker, chosen by the URL's scheme, before any server is asked: names a store
cannot follow are a 404, RabbitMQ's management API is refused on NATS and Redis, and a
purge's confirmation is the name the page shows."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from faststream_retry.web import create_app
from faststream_retry.web.brokers import broker_for

pytest.importorskip("nats")
pytest.importorskip("redis")


@pytest.mark.parametrize(
    ("url", "name"),
    [("nats://127.0.0.1:1", "a%20b"), ("nats://127.0.0.1:1", "a%2A"), ("redis://127.0.0.1:1", "a%7Db")],
)  # fmt: skip
def test_a_name_no_dead_letters_can_follow_from_is_a_404(url: str, name: str) -> None:
    """Refused before a connection is tried (the server at port 1 is not there)."""
    client = TestClient(
        create_app(url, trusted_proxies=()),
        base_url="http://127.0.0.1:8765",
        client=("127.0.0.1", 50000),
    )
    answer = client.get(f"/api/queues/{name}/dead-letters")
    page = client.get(f"/queues/{name}")
    assert answer.status_code == page.status_code == 404, (answer.text, page.text)
    assert "cannot reach" not in answer.text


@pytest.mark.parametrize("url", ["nats://127.0.0.1:1", "redis://127.0.0.1:1"])
def test_the_management_api_is_rabbitmqs(url: str) -> None:
    with pytest.raises(ValueError, match="RabbitMQ's management API"):
        create_app(url, management_url="http://127.0.0.1:15672")


def test_the_dead_letters_each_broker_names() -> None:
    """What the page shows and a purge's confirmation must be, per broker."""
    rabbit = broker_for("amqp://127.0.0.1:1/", app=None, management_url=None, prefix="retry")
    nats = broker_for("nats://127.0.0.1:1", app=None, management_url=None, prefix="shop")
    redis = broker_for("redis://127.0.0.1:1", app=None, management_url=None, prefix="retry")
    assert (rabbit.system, rabbit.dlq("orders")) == ("rabbitmq", "orders.dlq")
    assert rabbit.work_queue("orders.dlq") == "orders"
    assert nats.dlq("orders.billing") == "shop.dlq.orders.billing"
    assert nats.dlq("orders") == "shop-dlq-orders"
    assert redis.dlq("orders") == "{orders}.dlq"
    assert redis.dlq("{orders}.dlq") == "{orders}.dlq"
    assert redis.target_problem("{tenant}.orders") is None, "a hash tag is a Redis name"
    assert rabbit.target_problem("{tenant}.orders") is not None
    assert nats.shown_url() == "nats://127.0.0.1:1"
    assert broker_for(
        "nats://tok@h:4222", app=None, management_url=None, prefix="r"
    ).shown_url() == ("nats://***@h:4222")
