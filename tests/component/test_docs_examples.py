"""The documentation's examples (examples/docs/) run, in memory: what a page shows is what the code does.

The real-broker ones are in tests/integration/test_docs_examples.py; tests/unit/test_docs.py
checks that every page takes its Python from these files.
"""

from __future__ import annotations

import importlib
from email.message import Message
from pathlib import Path
from smtplib import SMTPException
from typing import Any
from urllib.error import HTTPError

import pytest
from faststream.rabbit import TestRabbitBroker

from examples.docs import outage, publishers, service

# The tests the testing page shows are collected here too. The dead letter's one pins the
# fix of a `body: bytes` parameter, which pydantic refused for a JSON dead letter: the
# alert never ran.
from examples.docs.test_dead_letters import test_a_dead_letter_reaches_the_alert  # noqa: F401
from examples.docs.test_redis_orders import (  # noqa: F401
    test_a_warehouse_outage_is_retried,
    test_an_order_without_a_sku_reaches_the_dead_letter_stream,
)
from examples.docs.test_service import (  # noqa: F401
    test_bad_address_is_dead_lettered,
    test_bad_address_is_dead_lettered_and_raises,
    test_bad_address_raises,
    test_smtp_outage_is_retried,
)
from examples.docs.test_with_fixture import (  # noqa: F401
    retries,
    test_bad_address_goes_to_the_dlq,
)
from faststream_retry import load_worker_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "docs"

# What the publishing handlers of examples/docs/publishers.py publish.
receipts: list[dict[str, Any]] = []


@publishers.broker.subscriber("orders-done")
@publishers.broker.subscriber("refunds-done")
async def _receipt(body: dict[str, Any]) -> None:
    receipts.append(body)


async def test_quickstart_waits_as_long_as_retry_after_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 429 with Retry-After: 30 is retried in 30 s, whatever the backoff; a 200 ends it."""
    answers = [None, HTTPError("https://example.com/hook", 429, "Too Many", _retry_after(30), None)]

    async def post(url: str, body: object) -> None:
        if (answer := answers.pop()) is not None:
            raise answer

    monkeypatch.setattr(service, "post", post)
    async with TestRabbitBroker(service.broker) as br:
        with service.retry.testing() as recorder:
            await br.publish({"url": "https://example.com/hook"}, queue="webhook-queue")
    assert [e.delay_ms for e in recorder.scheduled] == [30_000]
    assert recorder.dead_letters == []


def _retry_after(seconds: int) -> Message:
    headers = Message()
    headers["Retry-After"] = str(seconds)
    return headers


async def test_quickstart_dead_letters_an_smtp_outage_after_eight_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handler's policy (8 attempts) overrides the default (5); delays double from 1 s."""

    async def deliver(to: str, text: str) -> None:
        raise SMTPException("connection refused")

    monkeypatch.setattr(service, "deliver", deliver)
    async with TestRabbitBroker(service.broker) as br:
        with service.retry.testing() as recorder:
            await br.publish({"to": "ada@example.com", "text": "hi"}, queue="email-queue")
    assert [e.delay_ms for e in recorder.scheduled] == [1000, 2000, 4000, 8000, 16000, 32000, 64000]
    assert [(d.reason, d.attempt) for d in recorder.dead_letters] == [("exhausted", 8)]


@pytest.mark.parametrize(("queue", "body"), [("orders", {"id": 7}), ("refunds", {"order_id": 7})])
async def test_a_publishing_handler_is_retried_in_either_decorator_order(
    monkeypatch: pytest.MonkeyPatch, queue: str, body: dict[str, int]
) -> None:
    """Two failures then a receipt: retried twice, and only the success is published."""
    failures = [ConnectionError("payments down"), ConnectionError("payments down")]

    async def charge(order_id: int) -> publishers.Receipt:
        if failures:
            raise failures.pop()
        return publishers.Receipt(id=order_id)

    monkeypatch.setattr(publishers, "charge", charge)
    receipts.clear()
    async with TestRabbitBroker(publishers.broker) as br:
        with publishers.retry.testing() as recorder:
            await br.publish(body, queue=queue)
    assert [e.queue for e in recorder.scheduled] == [queue, queue]
    assert receipts == [{"id": 7}]


async def test_outage_mode_example_starts() -> None:
    async with TestRabbitBroker(outage.broker):
        pass


def test_the_worker_config_example_loads() -> None:
    config = load_worker_config(EXAMPLES / "retry.toml")
    assert config.prefix == "retry"
    assert [q.name or q.pattern for q in config.queues] == ["orders", "billing.*"]


@pytest.mark.fastapi
@pytest.mark.parametrize("module", ["fastapi_app", "fastapi_router"])
async def test_the_fastapi_examples_retry_a_failed_order(
    monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    example = importlib.import_module(f"examples.docs.{module}")
    failures = [ConnectionError("inventory down")]

    async def reserve_stock(order: Any) -> None:
        if failures:
            raise failures.pop()

    monkeypatch.setattr(example, "reserve_stock", reserve_stock)
    broker = example.broker if hasattr(example, "broker") else example.router.broker
    async with TestRabbitBroker(broker) as br:
        with example.retry.testing() as recorder:
            await br.publish({"id": 1}, queue="orders")
    assert len(recorder.scheduled) == 1
    assert recorder.dead_letters == []


async def test_a_manual_ack_handler_that_raises_unsettled_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two failures without a settlement are two scheduled retries; the third call acks."""
    from examples.docs import manual_acks  # noqa: PLC0415

    failures = [ConnectionError("database down"), ConnectionError("database down")]
    stored: list[dict[str, int]] = []

    async def store(body: dict[str, int]) -> None:
        if failures:
            raise failures.pop()
        stored.append(body)

    monkeypatch.setattr(manual_acks, "store", store)
    async with TestRabbitBroker(manual_acks.broker) as br:
        with manual_acks.retry.testing() as recorder:
            await br.publish({"amount": 5}, queue="payments")
    assert len(recorder.scheduled) == 2
    assert stored == [{"amount": 5}]


async def test_the_smallest_app_retries_with_the_default_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five attempts, 1 s doubling: four retries, then the DLQ as exhausted."""
    from examples.docs import smallest  # noqa: PLC0415

    async def save(order: str) -> None:
        raise ConnectionError("the database is restarting")

    monkeypatch.setattr(smallest, "save", save)
    async with TestRabbitBroker(smallest.broker) as br:
        with smallest.retry.testing() as recorder:
            await br.publish("order-1", queue="orders")
    assert [e.delay_ms for e in recorder.scheduled] == [1000, 2000, 4000, 8000]
    assert [d.reason for d in recorder.dead_letters] == ["exhausted"]


def test_the_quorum_work_queue_example_draws_no_warning_at_start() -> None:
    """The start-up check of quorum work queues finds nothing to say about this declaration."""
    from examples.docs.quorum_work_queue import orders  # noqa: PLC0415
    from faststream_retry import RetryPolicy  # noqa: PLC0415
    from faststream_retry.core.advice import work_queue_findings  # noqa: PLC0415
    from faststream_retry.core.policy import HandlerPolicy  # noqa: PLC0415
    from faststream_retry.core.topology import Handler, Route  # noqa: PLC0415

    arguments = {"x-queue-type": "quorum", **(orders.arguments or {})}
    route = Route("orders", (Handler(HandlerPolicy({})),), arguments)
    for version in [(3, 13), (4, 0), (4, 3)]:
        assert work_queue_findings([route], RetryPolicy(), version) == []


def test_the_asyncapi_example_documents_each_covered_dlq() -> None:
    """The page's app: orders.dlq and billing.invoices.dlq with the headers, no audit.dlq."""
    from examples.docs import asyncapi  # noqa: PLC0415 - one test's example

    doc = asyncapi.app.schema.to_specification().to_jsonable()

    # FastStream 0.7.5 writes a channel's name (<queue>:_:<Name>) as its address.
    addresses = {str(c.get("address")).split(":_:")[0] for c in doc["channels"].values()}
    assert {"orders.dlq", "billing.invoices.dlq"} <= addresses
    assert "audit.dlq" not in addresses
    headers = doc["components"]["schemas"]["FastStreamRetryDeadLetterHeaders"]
    assert "retry-reason" in headers["properties"]
    assert doc["info"]["title"] == "Orders"


@pytest.mark.fastapi
def test_the_mounted_page_answers_under_its_prefix_and_asks_for_its_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No broker needed: the token is asked for before the broker is."""
    from starlette.testclient import TestClient  # noqa: PLC0415

    monkeypatch.setenv("DEAD_LETTERS_TOKEN", "s3cret")
    example = importlib.reload(importlib.import_module("examples.docs.web_mount"))
    client = TestClient(example.api, client=("203.0.113.7", 50000))
    assert client.get("/dead-letters/static/style.css").status_code == 200
    refused = client.get("/dead-letters/api/status")
    assert refused.status_code == 401
    assert "token" in refused.json()["error"]
    login = client.get("/dead-letters/login?token=s3cret", follow_redirects=False)
    assert login.headers["location"] == "/dead-letters/"
    assert "Path=/dead-letters;" in login.headers["set-cookie"]


@pytest.mark.fastapi
@pytest.mark.parametrize(
    "headers",
    [{}, {"X-Forwarded-For": "127.0.0.1"}, {"X-Forwarded-For": "127.0.0.1, 192.0.2.2"}],
)
def test_the_mounted_page_without_its_token_serves_no_one(
    monkeypatch: pytest.MonkeyPatch, headers: dict[str, str]
) -> None:
    """As written, with DEAD_LETTERS_TOKEN unset: the service may be behind any proxy
    (``uvicorn --forwarded-allow-ips '*'`` makes X-Forwarded-For the client), so the page
    shows nothing to anyone, this machine included, until it has a token."""
    from starlette.testclient import TestClient  # noqa: PLC0415
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware  # noqa: PLC0415

    monkeypatch.delenv("DEAD_LETTERS_TOKEN", raising=False)
    monkeypatch.setenv("DEAD_LETTERS_ACTIONS", "1")
    example = importlib.reload(importlib.import_module("examples.docs.web_mount"))
    for client in (
        TestClient(example.api, base_url="http://127.0.0.1", client=("127.0.0.1", 50000)),
        TestClient(
            ProxyHeadersMiddleware(example.api, trusted_hosts="*"),  # type: ignore[arg-type]
            base_url="http://127.0.0.1",
            client=("192.0.2.2", 50000),
        ),
    ):
        for path in ("/dead-letters/", "/dead-letters/api/status"):
            refused = client.get(path, headers=headers)
            assert refused.status_code == 401, (path, refused.text)
            assert "token" in refused.text
        purge = client.post(
            "/dead-letters/api/queues/orders/purge", json={"confirm": "orders.dlq"}, headers=headers
        )
        assert purge.status_code == 401
