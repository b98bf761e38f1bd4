"""``faststream-retry status`` on NATS: copies waiting and dead letters per subscriber key.

A real app dead-letters some messages and sends the others to wait a minute in the delay
stream; ``status`` (``--url nats://``, and ``--app`` with the app's own server) counts
them in the shape it has on RabbitMQ, without consuming or making anything.
"""

from __future__ import annotations

import json
import textwrap
from typing import TYPE_CHECKING, Any

import pytest
from faststream.nats import JStream, NatsBroker

from faststream_retry import PermanentError, RetryLater
from tests.cli import run_cli
from tests.nats.helpers import running, stream_count, stream_messages
from tests.nats.test_retries import middleware
from tests.rabbit import eventually_async as until

if TYPE_CHECKING:
    from pathlib import Path

    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

STATUS_KEYS = {
    "format",
    "system",
    "prefix",
    "queues_from",
    "tiers_from",
    "queues",
    "tiers",
    "notes",
}
DEPTH_KEYS = {"name", "exists", "messages", "consumers"}


async def failing_app(nats_url: str, names: Names, js: JetStreamContext) -> tuple[str, str]:
    """Run an app until 3 messages are dead letters and 4 wait in the delay stream."""
    stream, subject = names.stream(), names.subject()
    broker = NatsBroker(nats_url, middlewares=[middleware(names)], logger=None)

    @broker.subscriber(subject, stream=JStream(stream, subjects=[subject]), durable="d")
    async def handle(body: dict[str, Any]) -> None:
        if body["id"] < 3:
            raise PermanentError("no")
        raise RetryLater(60)

    async with running(broker):
        for i in range(7):
            await broker.publish({"id": i}, subject, stream=stream)

        async def settled() -> bool:
            dead = await stream_count(js, f"{names.prefix}-dlq-{stream}")
            return dead == 3 and await stream_count(js, f"{names.prefix}-delay") == 4

        await until(settled, 30, "3 dead letters and 4 waiting copies")
    return stream, f"{stream}.d"


async def test_status_counts_waiting_copies_and_dead_letters_per_key(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """The key's row: 0 ready, 4 in .retry, 3 in .dlq; the 60 s tier holds the 4; nothing moved."""
    stream, key = await failing_app(nats_url, names, js)
    dlq = f"{names.prefix}-dlq-{stream}"
    before = await stream_messages(js, dlq)
    done = await run_cli("status", "--url", nats_url, "--prefix", names.prefix, "--json", url=None)
    assert done.status == 0, done.stderr
    found = done.json()
    assert set(found) == STATUS_KEYS | {"broker"}
    assert found["system"] == "nats"
    assert found["prefix"] == names.prefix
    assert found["queues_from"] == ["server"]
    (row,) = found["queues"]
    assert row["queue"] == key
    for part in ("work", "retry", "dlq"):
        assert set(row[part]) == DEPTH_KEYS
        assert row[part]["consumers"] is None, "JetStream does not count readers: null"
    assert row["work"]["messages"] == 0
    assert row["retry"]["messages"] == 4
    assert row["dlq"] == {"name": dlq, "exists": True, "messages": 3, "consumers": None}
    held = {t["ttl_ms"]: t["messages"] for t in found["tiers"] if t["messages"]}
    assert sum(held.values()) == 4, held
    assert all(t["name"] == f"{names.prefix}.delay.{t['ttl_ms']}" for t in found["tiers"])
    assert await stream_messages(js, dlq) == before, "status reads without consuming"
    assert (await js.stream_info(dlq)).state.consumer_count == 0

    named = await run_cli(
        "status", key, "--url", nats_url, "--prefix", names.prefix, "--json", url=None
    )
    assert named.json()["queues"] == found["queues"]
    by_stream = await run_cli(
        "status", stream, "--url", nats_url, "--prefix", names.prefix, "--json", url=None
    )
    assert [r["queue"] for r in by_stream.json()["queues"]] == [key]
    table = await run_cli("status", "--url", nats_url, "--prefix", names.prefix, url=None)
    assert table.status == 0, table.stderr
    assert key in table.stdout
    assert "NATS does not count" in table.stdout


async def test_status_app_reads_its_own_nats_server(
    nats_url: str, names: Names, js: JetStreamContext, tmp_path: Path
) -> None:
    """``status --app`` and ``dlq list --app`` of a NatsBroker app read the app's server,
    plan and prefix (status refused the app; dlq had no --app)."""
    stream, key = await failing_app(nats_url, names, js)
    (tmp_path / "natsapp.py").write_text(
        textwrap.dedent(
            f"""
            from datetime import timedelta
            from faststream.nats import JStream, NatsBroker
            from faststream_retry import RetryMiddleware, RetryPolicy
            retry = RetryMiddleware(
                RetryPolicy(), prefix={names.prefix!r}, tick=timedelta(milliseconds=100),
                max_delay=120,
            )
            broker = NatsBroker({nats_url!r}, middlewares=[retry])

            @broker.subscriber(
                {names.subject()!r}, stream=JStream({stream!r}, subjects=[{names.subject()!r}]),
                durable="d",
            )
            async def handle(body: dict) -> None: ...
            """
        )
    )
    done = await run_cli("status", "--app", "natsapp:broker", "--json", url=None, cwd=tmp_path)
    assert done.status == 0, done.stderr
    found = done.json()
    assert found["queues_from"] == ["app"]
    assert found["tiers_from"] == ["app", "server"]
    assert [r["queue"] for r in found["queues"]] == [key]
    assert found["queues"][0]["dlq"]["messages"] == 3
    listed = await run_cli(
        "dlq", "list", stream, "--app", "natsapp:broker", "--json", url=None, cwd=tmp_path
    )
    assert listed.status == 0, listed.stderr
    assert len(listed.json()["dead_letters"]) == 3, "the app's server and prefix, no --url"
    wrong = await run_cli(
        "status",
        "--app",
        "natsapp:broker",
        "--url",
        "redis://127.0.0.1:1",
        url=None,
        cwd=tmp_path,
    )
    assert wrong.status == 3
    assert "NatsBroker" in wrong.stderr
    assert json.loads(
        (
            await run_cli(
                "status",
                "--app",
                "natsapp:broker",
                "--json",
                "--management-url",
                "http://x",
                url=None,
                cwd=tmp_path,
            )
        ).stdout
    )["error"].startswith("--management-url is RabbitMQ's")
