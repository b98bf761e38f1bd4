"""The AsyncAPI document of an app with the plugin (``RetryMiddleware.asyncapi()``).

Each document is made as ``faststream docs gen`` makes it: ``app.schema.to_specification()``,
then ``to_jsonable()`` (its JSON) or ``to_yaml()``. No broker runs.
"""

from __future__ import annotations

from typing import Any

import pytest
from faststream import FastStream
from faststream.rabbit import RabbitBroker, RabbitRouter, TestRabbitBroker
from faststream.specification import AsyncAPI
from pydantic import BaseModel

from faststream_retry import RetryMiddleware, retry_policy
from faststream_retry.core import headers as h

HEADERS = (*h.RETRY_STATE, h.REPLAYED)
"""Every header the plugin writes; ``retry-due`` among them (see middleware.header_schema)."""


class Order(BaseModel):
    id: int


def service(retry: RetryMiddleware, *, install: bool) -> RabbitBroker:
    """A broker with a covered queue, a prefixed router's queue and an opted-out queue."""
    broker = RabbitBroker("amqp://guest:guest@localhost:5672/", middlewares=[retry], logger=None)
    router = RabbitRouter(prefix="billing.")

    @broker.subscriber("orders")
    async def take_order(order: Order) -> None: ...

    @broker.subscriber("audit")
    @retry_policy(enabled=False)
    async def audit(body: str) -> None: ...

    @router.subscriber("invoices")
    async def invoice(body: str) -> None: ...

    broker.include_router(router)
    if install:
        retry.install(broker)
    return broker


def document(app: FastStream) -> dict[str, Any]:
    """Return the JSON document ``faststream docs gen app`` writes."""
    result: dict[str, Any] = app.schema.to_specification().to_jsonable()
    return result


def resolve(doc: dict[str, Any], ref: dict[str, str]) -> dict[str, Any]:
    node: Any = doc
    for part in ref["$ref"].removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return dict(node)


def channel_of(doc: dict[str, Any], queue: str) -> dict[str, Any] | None:
    """Return the channel that carries ``queue``'s messages (3.0: address; 2.6: the queue binding).

    FastStream 0.7.5 writes a 3.0 channel's name as its address, ``<queue>:_:<Name>``.
    """
    for key, channel in doc["channels"].items():
        if channel.get("address") == queue:
            return dict(channel)
        if channel.get("address") == key and key.split(":_:")[0] == queue:
            return dict(channel)
        if (
            doc["asyncapi"].startswith("2.6")
            and channel["bindings"]["amqp"]["queue"]["name"] == queue
        ):
            return dict(channel)
    return None


def message_of(doc: dict[str, Any], channel: dict[str, Any]) -> dict[str, Any]:
    """Return the component message of a channel, in either version."""
    if doc["asyncapi"].startswith("3."):
        (ref,) = channel["messages"].values()
    else:
        ref = (channel.get("subscribe") or channel["publish"])["message"]
    return resolve(doc, ref)


@pytest.mark.parametrize("install", [False, True], ids=["no-install", "install"])
@pytest.mark.parametrize("version", ["3.0.0", "2.6.0"])
def test_each_covered_queue_has_its_dlq_with_the_retry_headers(install: bool, version: str) -> None:
    """The .dlq of each covered queue (router prefix included), with the plugin's headers."""
    retry = RetryMiddleware()
    broker = service(retry, install=install)
    app = FastStream(broker, specification=retry.asyncapi(AsyncAPI(schema_version=version)))

    doc = document(app)

    for queue in ("orders", "billing.invoices"):
        dlq = channel_of(doc, f"{queue}.dlq")
        assert dlq is not None, f"{queue}.dlq is not in the document"
        assert dlq["servers"] == channel_of(doc, queue)["servers"]  # type: ignore[index]
        message = message_of(doc, dlq)
        # The dead letter is the failed message: the work queue's payload.
        assert message["payload"] == message_of(doc, channel_of(doc, queue))["payload"]  # type: ignore[arg-type]
        headers = resolve(doc, message["headers"])
        assert headers["type"] == "object"
        assert set(headers["properties"]) == set(HEADERS)
        assert set(headers["properties"]["retry-reason"]["enum"]) >= {"permanent", "exhausted"}
    assert channel_of(doc, "billing.invoices") is not None
    # Retries off: FastStream's, no .dlq; and nothing unprefixed.
    assert channel_of(doc, "audit") is not None
    assert channel_of(doc, "audit.dlq") is None
    assert channel_of(doc, "invoices.dlq") is None


def test_the_service_sends_to_the_dlq() -> None:
    """AsyncAPI 3: an operation of the service's, ``send`` to the .dlq, persistent."""
    retry = RetryMiddleware()
    app = FastStream(service(retry, install=False), specification=retry.asyncapi())

    doc = document(app)

    sends = [op for op in doc["operations"].values() if op["action"] == "send"]
    assert sorted(op["bindings"]["amqp"]["cc"][0] for op in sends) == [
        "billing.invoices.dlq",
        "orders.dlq",
    ]
    assert {op["bindings"]["amqp"]["deliveryMode"] for op in sends} == {2}


def test_the_yaml_has_them_too() -> None:
    """``docs gen --yaml``: the document goes back through FastStream's own model."""
    retry = RetryMiddleware()
    app = FastStream(service(retry, install=False), specification=retry.asyncapi())

    text = app.schema.to_specification().to_yaml()

    assert "address: orders.dlq" in text
    assert "retry-origin-queue:" in text


def test_a_middleware_on_a_router_only_covers_the_broker() -> None:
    """As at start: the plugin covers every subscriber of the broker it runs on."""
    retry = RetryMiddleware()
    broker = RabbitBroker(logger=None)
    router = RabbitRouter(prefix="shop.", middlewares=[retry])

    @broker.subscriber("plain")
    async def plain(body: str) -> None: ...

    @router.subscriber("carts")
    async def carts(body: str) -> None: ...

    broker.include_router(router)
    app = FastStream(broker, specification=retry.asyncapi())

    doc = document(app)

    assert channel_of(doc, "shop.carts.dlq") is not None
    assert channel_of(doc, "plain.dlq") is not None


def test_left_out_of_the_document_means_its_dlq_too() -> None:
    retry = RetryMiddleware()
    broker = RabbitBroker(middlewares=[retry], logger=None)

    @broker.subscriber("hidden", include_in_schema=False)
    async def hidden(body: str) -> None: ...

    @broker.subscriber("shown")
    async def shown(body: str) -> None: ...

    doc = document(FastStream(broker, specification=retry.asyncapi()))

    assert channel_of(doc, "shown.dlq") is not None
    assert channel_of(doc, "hidden.dlq") is None


def test_the_dlq_is_on_its_queues_virtual_host() -> None:
    retry = RetryMiddleware()
    broker = RabbitBroker(middlewares=[retry], virtualhost="tenant", logger=None)

    @broker.subscriber("orders")
    async def orders(body: str) -> None: ...

    doc = document(
        FastStream(broker, specification=retry.asyncapi(AsyncAPI(schema_version="2.6.0")))
    )

    amqp = channel_of(doc, "orders.dlq")["bindings"]["amqp"]  # type: ignore[index]
    # As FastStream writes the work queue's: the broker URL's path.
    assert amqp["queue"]["vhost"] == amqp["exchange"]["vhost"] == "/tenant"


def test_a_broker_without_the_middleware_is_documented_as_before() -> None:
    """Another broker of the app, or a middleware passed nowhere: the document is FastStream's."""
    retry = RetryMiddleware()
    broker = RabbitBroker(logger=None)

    @broker.subscriber("orders")
    async def orders(body: str) -> None: ...

    wrapped = document(FastStream(broker, specification=retry.asyncapi()))
    plain = AsyncAPI(broker).to_specification().to_jsonable()

    assert wrapped == plain


def test_the_wrapped_factory_keeps_its_settings() -> None:
    retry = RetryMiddleware()
    broker = RabbitBroker(middlewares=[retry], logger=None)
    spec = retry.asyncapi(AsyncAPI(title="Orders", version="2.1.0"))
    spec.description = "what the orders service does"

    doc = document(FastStream(broker, specification=spec))

    assert doc["info"] == {
        "title": "Orders",
        "version": "2.1.0",
        "description": "what the orders service does",
    }


async def test_documenting_registers_nothing_on_the_broker() -> None:
    """No publisher for the document: under TestRabbitBroker it would get a fake .dlq subscriber."""
    retry = RetryMiddleware()
    broker = service(retry, install=False)
    app = FastStream(broker, specification=retry.asyncapi())
    subscribers, publishers = list(broker.subscribers), list(broker.publishers)

    document(app)
    async with TestRabbitBroker(broker):
        pass

    assert list(broker.subscribers) == subscribers
    assert list(broker.publishers) == publishers == []
