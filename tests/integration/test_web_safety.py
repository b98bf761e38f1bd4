"""The dead-letter page on a real broker, as an attacker and a hostile producer meet it:
no GET moves or reads a message, hostile ``retry-*`` headers render everywhere (page,
API, command), a registry record or a URL no client can name breaks nothing, and an
export is streamed, never built whole in memory."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import decimal
import json
import re
import socket
import tracemalloc
from typing import TYPE_CHECKING, Any

import aio_pika
import httpx
import pytest
from typer.testing import CliRunner

from faststream_retry.cli._app import app as cli
from faststream_retry.core import headers as h
from faststream_retry.core.topology import lock_name, registry_name
from faststream_retry.web import create_app
from tests.cli import run_cli
from tests.integration.test_cli_dlq import declare, delete, ids_in, seed
from tests.integration.test_web_actions import csrf_in, page_client, read
from tests.rabbit import eventually, unique

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from aio_pika.abc import AbstractRobustConnection

uvicorn = pytest.importorskip("uvicorn")

pytestmark = pytest.mark.rabbit

FAR = 2**53 - 1
"""The largest time ``read_ms`` lets through: year 285,428."""


async def pair(amqp: AbstractRobustConnection, name: str, dlq_type: str) -> str:
    """A classic work queue named after ``name`` and its ``.dlq`` of ``dlq_type``."""
    queue = unique(name)
    await declare(amqp, queue, "classic")
    await declare(amqp, f"{queue}.dlq", dlq_type)
    return queue


# ---------------------------------------------------------------------- GETs that act
async def prime(amqp: AbstractRobustConnection, dlq: str, queue_type: str) -> bool:
    """Mark each message so a pass through the queue would show; return the mark to expect.

    Quorum: each is delivered and given back once (``redelivered``); a pass republishes
    it, and the copy is a first delivery again. Classic: each is put back never
    delivered; a pass holds it and hands it back, and it comes back ``redelivered``.
    """
    channel = await amqp.channel()
    queue = await channel.get_queue(dlq)
    messages = []
    while (message := await queue.get(fail=False, no_ack=queue_type == "classic")) is not None:
        messages.append(message)
    if queue_type == "quorum":
        for message in messages:
            await message.nack(requeue=True)
    else:
        for message in messages:
            await channel.default_exchange.publish(
                aio_pika.Message(
                    message.body, message_id=message.message_id, headers=message.headers
                ),
                routing_key=dlq,
            )
    await channel.close()
    return queue_type == "quorum"


async def marks(amqp: AbstractRobustConnection, dlq: str) -> list[bool]:
    """Each message's ``redelivered``, taking none (the channel closes without acks)."""
    channel = await amqp.channel()
    queue = await channel.get_queue(dlq)
    found = []
    while (message := await queue.get(fail=False, no_ack=False)) is not None:
        found.append(bool(message.redelivered))
    await channel.close()
    return found


@contextlib.asynccontextmanager
async def holding_the_lock(rabbit_url: str, dlq: str) -> AsyncIterator[None]:
    """Hold ``dlq``'s lock, as an operator's ``dlq replay`` does while it runs."""
    connection = await aio_pika.connect(rabbit_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(lock_name(dlq), exclusive=True, auto_delete=True)
        yield
    finally:
        await connection.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_no_get_reads_or_moves_a_message(
    amqp: AbstractRobustConnection, rabbit_url: str, queue_type: str
) -> None:
    """Every view, page and API, as often as anyone likes: not one message passed through.

    A cross-site ``<img>`` is such a GET. The views show the last read, even while an
    operator's command holds the queue's lock.
    """
    queue = await pair(amqp, "web-get", queue_type)
    dlq = f"{queue}.dlq"
    try:
        await seed(
            amqp, queue, [(f"g{n}", "permanent", b"{}", "application/json") for n in range(3)]
        )
        async with page_client(rabbit_url) as client:
            listed = await read(client, queue)
            group = re.findall(r'data-group="([0-9a-f]+)"', listed)[0]
            expected = await prime(amqp, dlq, queue_type)
            async with holding_the_lock(rabbit_url, dlq):
                for _ in range(3):
                    for path in (
                        f"/queues/{queue}",
                        f"/queues/{dlq}",
                        f"/queues/{queue}/groups/{group}",
                        f"/queues/{queue}/messages/g1",
                        f"/api/queues/{queue}/dead-letters",
                        f"/api/queues/{queue}/groups",
                        f"/api/queues/{queue}/messages/g1",
                    ):
                        answer = await client.get(path)
                        assert answer.status_code == 200, (path, answer.text)
                        assert "g1" in answer.text or "data-group" in answer.text, path
                    for path in (
                        f"/queues/{queue}/export",
                        f"/queues/{queue}/read",
                        f"/queues/{queue}/purge",
                    ):
                        assert (await client.get(path)).status_code == 405, path
                    assert (await client.get("/")).status_code == 200
        assert await marks(amqp, dlq) == [expected] * 3
        assert await ids_in(amqp, dlq) == ["g0", "g1", "g2"]
    finally:
        await delete(amqp, queue, dlq)


async def test_a_read_is_asked_for_and_shared_by_every_view(
    amqp: AbstractRobustConnection, rabbit_url: str
) -> None:
    """One read, shown to the next viewer with its time; a replay from the page drops it."""
    queue = await pair(amqp, "web-read", "quorum")
    try:
        await seed(
            amqp, queue, [("r1", "permanent", b"{}", None), ("r2", "permanent", b"{}", None)]
        )
        async with page_client(rabbit_url) as client:
            before = (await client.get(f"/queues/{queue}")).text
            assert "Not read yet" in before
            assert "Holds 2 dead letter(s) now" in before
            assert (await client.get(f"/api/queues/{queue}/dead-letters")).status_code == 404
            listing = await read(client, queue, api=True)
            assert '"read_at":"' in listing
            assert '"r1"' in listing
            # Another viewer (no cookie of the first) sees the same read.
            app = client._transport.app  # type: ignore[attr-defined]
            other = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 40001)),
                base_url="http://127.0.0.1",
            )
            async with other:
                shown = (await other.get(f"/api/queues/{queue}/dead-letters")).json()
                assert [x["message_id"] for x in shown["dead_letters"]] == ["r1", "r2"]
                token = csrf_in((await client.get(f"/queues/{queue}")).text)
                replayed = await client.post(
                    f"/api/queues/{queue}/replay",
                    json={"ids": ["r1"]},
                    headers={"X-CSRF-Token": token},
                )
                assert replayed.status_code == 200, replayed.text
                gone = await other.get(f"/api/queues/{queue}/dead-letters")
                assert gone.status_code == 404  # positions may have moved: read again
                assert "POST /api/queues/" in gone.json()["error"]
                after = (await other.get(f"/queues/{queue}")).text
                assert "Not read since a replay from this page at" in after
                assert "Holds 1 dead letter(s) now" in after
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


# ---------------------------------------------------------------------- hostile headers
RETRY_HEADERS = [
    h.VERSION, h.ATTEMPT, h.DUE, h.FIRST_FAILED_AT, h.LAST_FAILED_AT, h.HISTORY, h.REASON,
    h.EXCEPTION, h.ERROR, h.TRACEBACK, h.ORIGIN_QUEUE, h.REPLAYED,
]  # fmt: skip
HOSTILE: list[Any] = [
    FAR,
    253_402_300_800_000,  # 10000-01-01
    2**63 - 1,
    -1_000,  # (-128 to -1 would do, but pamqp 3, Python 3.10's, cannot send them)
    3.0e38,  # (RabbitMQ closes the connection of a publish with a NaN or infinite float)
    -0.5,
    decimal.Decimal("12.5"),
    "[/bold]<b>x</b>\x1b[31m\n\u202e",
    bytearray(b"\xff\x00[/]"),
    [FAR, {"at": "x"}, None, bytearray(b"\x00")],
    {"at": FAR, "n": {"deep": [1]}},
    True,
    None,
    "x" * 100_000,  # one per message: the headers fit in a frame
    dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc),
    [{"attempt": "1", "at": FAR, "delay": FAR, "exception": bytearray(b"\xff"), "error": 5}] * 10,
]


async def seed_hostile(amqp: AbstractRobustConnection, dlq: str) -> list[str]:
    """One message per kind of value; across them, every ``retry-*`` header gets every kind."""
    channel = await amqp.channel(publisher_confirms=True)
    ids = []
    for m in range(len(HOSTILE)):
        headers = {name: HOSTILE[(i + m) % len(HOSTILE)] for i, name in enumerate(RETRY_HEADERS)}
        ids.append(f"hostile-{m}")
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"n": 1}', message_id=ids[-1], headers=headers), routing_key=dlq
        )
    await channel.close()
    return ids


async def test_hostile_retry_headers_render_in_every_page_answer_and_command(
    amqp: AbstractRobustConnection, rabbit_url: str
) -> None:
    """Out-of-range times, odd types, huge sizes in each ``retry-*`` header: text, never a crash."""
    queue = await pair(amqp, "web-hostile", "quorum")
    dlq = f"{queue}.dlq"
    try:
        ids = await seed_hostile(amqp, dlq)
        async with page_client(rabbit_url) as client:
            listed = await read(client, queue)
            assert "not a time: " in listed
            groups = re.findall(r'data-group="([0-9a-f]+)"', listed)
            assert groups
            paths = [
                "/",
                "/api/status",
                f"/api/queues/{queue}/dead-letters",
                f"/api/queues/{queue}/groups",
                *(f"/queues/{queue}/groups/{g}" for g in groups),
                *(f"/queues/{queue}/messages/{i}" for i in ids),
                *(f"/api/queues/{queue}/messages/{i}" for i in ids),
            ]
            for path in paths:
                answer = await client.get(path)
                assert answer.status_code == 200, (path, answer.text[:500])
                if "/api/" in path:
                    answer.json()  # strict JSON: no NaN
            token = csrf_in((await client.get(f"/queues/{queue}")).text)
            exported = await client.post(f"/queues/{queue}/export", data={"csrf": token})
            assert exported.status_code == 200
            assert exported.text.count("\n") == len(ids)
        # The console script itself for list and status; dlq show of each in this process
        # (32 of them: a process each would take minutes).
        for args in (
            ("dlq", "list", queue),
            ("dlq", "list", queue, "--json"),
            ("status", queue),
            ("status", queue, "--json"),
        ):
            run = await run_cli(*args, url=rabbit_url)
            assert run.status == 0, (args, run.stderr[-2000:])
            assert "Traceback" not in run.stderr, args
            if "--json" in args:
                run.json()
        for message_id in ids:
            for json_asked in ((), ("--json",)):
                args = ("dlq", "show", queue, message_id, "--url", rabbit_url, *json_asked)
                shown = await asyncio.to_thread(CliRunner().invoke, cli, args)
                assert shown.exit_code == 0, (args, shown.output[-2000:], shown.exception)
                if json_asked:
                    json.loads(shown.stdout)
                elif message_id == ids[12]:  # its retry-last-failed-at: year 285,428
                    assert f"not a time: {FAR}" in shown.stdout
        assert sorted(await ids_in(amqp, dlq)) == sorted(ids)
    finally:
        await delete(amqp, queue, dlq)


# ---------------------------------------------------------------------- names
async def test_a_registry_record_no_client_can_name_breaks_nothing(
    amqp: AbstractRobustConnection, rabbit_url: str
) -> None:
    """Anyone who may publish to the vhost can add a record: it is left out, with a note."""
    prefix = unique("reg")
    registry = registry_name(prefix)
    channel = await amqp.channel()
    await channel.declare_queue(registry, durable=True, arguments={"x-queue-type": "classic"})
    hostile = ["a<b", "line\nbreak", "x" * 252, "caf\u00e9", "fine-queue"]
    for name in hostile:
        await channel.default_exchange.publish(
            aio_pika.Message(name.encode()), routing_key=registry
        )
    try:
        async with page_client(rabbit_url, prefix=prefix) as client:
            overview = await client.get("/")
            assert overview.status_code == 200, overview.text[:500]
            assert "fine-queue" in overview.text
            assert "left out the queue" in overview.text
            status = await client.get("/api/status")
            assert status.status_code == 200
            assert [q["queue"] for q in status.json()["queues"]] == ["fine-queue"]
        for args in (("status", "--prefix", prefix), ("status", "--prefix", prefix, "--json")):
            run = await run_cli(*args, url=rabbit_url)
            assert run.status == 0, run.stderr
            assert "left out the queue" in run.stdout + run.stderr
    finally:
        await channel.queue_delete(registry)
        await channel.close()


@pytest.mark.parametrize("name", ["a<b", "a%0Ab", "x" * 300, "caf%C3%A9"])
async def test_a_url_naming_a_queue_no_client_can_name_is_a_404(rabbit_url: str, name: str) -> None:
    async with page_client(rabbit_url) as client:
        for path in (f"/queues/{name}", f"/api/queues/{name}/dead-letters"):
            answer = await client.get(path)
            assert answer.status_code == 404, (path, answer.text[:300])
        token = "k" * 43
        # In a header, not the jar: the GETs above set the page's own cookie, and on
        # Python 3.10 the jar then sends both.
        client.cookies.clear()
        for path in (f"/api/queues/{name}/read", f"/api/queues/{name}/export"):
            answer = await client.post(
                path, headers={"X-CSRF-Token": token, "Cookie": f"fsr_csrf={token}"}
            )
            assert answer.status_code == 404, (path, answer.text[:300])
            assert "can exist" in answer.json()["error"]


# ---------------------------------------------------------------------- an export
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_export_streams_from_a_spool_not_a_string(
    amqp: AbstractRobustConnection, rabbit_url: str
) -> None:
    """30 MB of dead letters exported: the page's memory stays far below the export's size."""
    queue = await pair(amqp, "web-export", "classic")
    body = b"y" * 100_000
    count = 300
    try:
        await seed(amqp, queue, [(f"e{n}", "permanent", body, None) for n in range(count)])
        port = free_port()
        app = create_app(rabbit_url, trusted_proxies=())
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        )
        task = asyncio.create_task(server.serve())
        try:
            await eventually(lambda: server.started, what="the page's server to start")
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=120
            ) as client:
                token = csrf_in((await client.get(f"/queues/{queue}")).text)
                tracemalloc.start()
                size = lines = 0
                async with client.stream(
                    "POST", f"/queues/{queue}/export", data={"csrf": token}
                ) as answer:
                    assert answer.status_code == 200
                    async for chunk in answer.aiter_bytes():
                        size += len(chunk)
                        lines += chunk.count(b"\n")
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 10)
        assert lines == count
        assert size > 30_000_000
        assert peak < size / 3, f"peak {peak:,} bytes for an export of {size:,}"
        assert len(await ids_in(amqp, f"{queue}.dlq")) == count
    finally:
        await delete(amqp, queue, f"{queue}.dlq")
