"""The AsyncAPI document of a NATS or Redis app with the plugin: each covered subscriber's
dead letters are a channel the service sends to, named as the plugin publishes them.

Made as ``faststream docs gen`` makes it; no server runs.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pytest
from faststream import FastStream
from faststream.nats import JStream, NatsBroker
from faststream.redis import RedisBroker, StreamSub
from faststream.specification import AsyncAPI
from pydantic import BaseModel

from faststream_retry import RetryMiddleware, retry_policy
from faststream_retry.core import headers as h
from faststream_retry.middleware.header_schema import HEADERS_SCHEMA_NAME


class Order(BaseModel):
    id: int


def document(app: FastStream) -> dict[str, Any]:
    result: dict[str, Any] = app.schema.to_specification().to_jsonable()
    return result


def by_address(doc: dict[str, Any], address: str) -> tuple[str, dict[str, Any]]:
    """The channel whose address (3.0) or binding (2.6) is ``address``: its key and itself."""
    for key, channel in doc["channels"].items():
        bindings = channel.get("bindings", {})
        named = bindings.get("nats", {}).get("subject") or bindings.get("redis", {}).get("channel")
        if address in (channel.get("address"), named):
            return key, channel
    pytest.fail(f"no channel for {address!r} in {sorted(doc['channels'])}")


def the_message(doc: dict[str, Any], dead_key: str) -> dict[str, Any]:
    """The dead-letter channel's message, from the components (2.6 and 3.0 name it alike)."""
    (message,) = [
        m for name, m in doc["components"]["messages"].items() if name.startswith(f"{dead_key}:")
    ]
    return dict(message)


def nats_app(retry: RetryMiddleware, version: str = "3.0.0") -> FastStream:
    broker = NatsBroker(middlewares=[retry], logger=None)

    @broker.subscriber(
        "orders.new", stream=JStream("ORDERS", subjects=["orders.*"]), durable="bill"
    )
    async def bill(order: Order) -> None: ...

    @broker.subscriber("orders.audit", stream="ORDERS", durable="audit")
    @retry_policy(enabled=False)
    async def audit(body: str) -> None: ...

    return FastStream(broker, specification=retry.asyncapi(AsyncAPI(schema_version=version)))


def redis_app(retry: RetryMiddleware) -> FastStream:
    broker = RedisBroker(middlewares=[retry])

    @broker.subscriber(stream=StreamSub("orders", group="g", consumer="c1"))
    async def bill(order: Order) -> None: ...

    @broker.subscriber(stream=StreamSub("{tenant}.mail", group="g", consumer="c1"))
    async def mail(body: str) -> None: ...

    @broker.subscriber(stream=StreamSub("audit", group="g", consumer="c1"))
    @retry_policy(enabled=False)
    async def audit(body: str) -> None: ...

    return FastStream(broker, specification=retry.asyncapi())


@pytest.mark.parametrize("version", ["3.0.0", "2.6.0"])
@pytest.mark.filterwarnings("ignore:The JetStream Push consumer:RuntimeWarning")
def test_a_covered_nats_subscriber_has_its_dead_letter_subject(version: str) -> None:
    """``<prefix>.dlq.<stream>.<durable>``, sent to, with the work payload and retry headers."""
    retry = RetryMiddleware(prefix="pp")
    doc = document(nats_app(retry, version))
    key, channel = by_address(doc, "pp.dlq.ORDERS.bill")
    assert channel["bindings"]["nats"]["subject"] == "pp.dlq.ORDERS.bill"
    assert "pp-dlq-ORDERS" in channel["description"]
    message = the_message(doc, key)
    assert message["headers"] == {"$ref": f"#/components/schemas/{HEADERS_SCHEMA_NAME}"}
    assert set(doc["components"]["schemas"][HEADERS_SCHEMA_NAME]["properties"]) >= {
        h.REASON,
        h.ATTEMPT,
    }
    _, work = by_address(doc, "orders.new")
    assert message["payload"] == the_work_payload(doc, work)
    if version.startswith("3."):
        assert doc["operations"][key]["action"] == "send"
    else:
        assert "subscribe" in channel  # 2.6: the service publishes, users subscribe
    names = [c.get("address", k) for k, c in doc["channels"].items()]
    assert not any("dlq.ORDERS.audit" in n for n in names), "retries off: no dead letters"


def test_a_covered_redis_stream_has_its_dead_letter_stream() -> None:
    """``{<stream>}.dlq`` (a hash tag kept as it is), ``XADD``, with the work payload."""
    doc = document(redis_app(RetryMiddleware()))
    for stream, dlq in (("orders", "{orders}.dlq"), ("{tenant}.mail", "{tenant}.mail.dlq")):
        key, channel = by_address(doc, dlq)
        assert channel["bindings"]["redis"] == {
            "channel": dlq,
            "method": "xadd",
            "bindingVersion": "custom",
        }
        assert doc["operations"][key]["action"] == "send"
        _, work = by_address(doc, stream)
        assert the_message(doc, key)["payload"] == the_work_payload(doc, work)
    assert not any("audit" in k and "dlq" in k for k in doc["channels"])


def the_work_payload(doc: dict[str, Any], work: dict[str, Any]) -> Any:
    """The payload of the work channel's message (a dead letter carries the same body)."""
    refs = [r["$ref"] for r in work.get("messages", {}).values()] or [
        work["publish"]["message"]["$ref"]
    ]
    name = unquote(refs[0]).removeprefix("#/components/messages/")
    return doc["components"]["messages"][name]["payload"]
