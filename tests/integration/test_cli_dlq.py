"""The dlq commands, run as the real console script against a real broker.

Dead letters are made by a real app (a handler that fails) or published into a
``.dlq`` with the plugin's own headers; every count is by message id.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from aiormq.exceptions import ChannelLockedResource, ChannelNotFoundEntity

from faststream_retry import Fixed, RetryPolicy, retry_policy
from faststream_retry.core import headers
from faststream_retry.core.topology import lock_name
from faststream_retry.ops.wire import read_line
from tests.cli import environment, run_cli, script
from tests.rabbit import App, eventually, headers_of, queue_depth, unique

if TYPE_CHECKING:
    from pathlib import Path

    from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

pytestmark = pytest.mark.rabbit

BINARY = bytes(range(256))


async def declare(amqp: AbstractRobustConnection, name: str, queue_type: str) -> None:
    channel = await amqp.channel()
    await channel.declare_queue(name, durable=True, arguments={"x-queue-type": queue_type})
    await channel.close()


async def delete(amqp: AbstractRobustConnection, *names: str) -> None:
    channel = await amqp.channel()
    for name in names:
        await channel.queue_delete(name)
    await channel.close()


def dead_letter_headers(
    reason: str, attempt: int, exc: BaseException, queue: str
) -> dict[str, Any]:
    record = headers.FailureRecord.of(exc, attempt=attempt, at_ms=headers.now_ms())
    return headers.dead_letter_headers(
        {"app-header": "kept"}, record, reason=reason, origin_queue=queue, traceback="Traceback..."
    )


async def seed(
    amqp: AbstractRobustConnection,
    queue: str,
    letters: list[tuple[str, str, bytes, str | None]],
) -> None:
    """Publish ``(id, reason, body, content type)`` dead letters into ``queue``.dlq, confirmed."""
    channel = await amqp.channel()
    for message_id, reason, body, content_type in letters:
        await channel.default_exchange.publish(
            aio_pika.Message(
                body,
                message_id=message_id,
                content_type=content_type,
                headers=dead_letter_headers(
                    reason, 3, TimeoutError(f"{message_id} timed out"), queue
                ),
                correlation_id=f"corr-{message_id}",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=f"{queue}.dlq",
        )
    await channel.close()


async def take_all(amqp: AbstractRobustConnection, name: str) -> list[AbstractIncomingMessage]:
    """Consume and ack every message in ``name``, head first."""
    channel = await amqp.channel()
    queue = await channel.get_queue(name)
    taken = []
    while (message := await queue.get(fail=False, no_ack=True)) is not None:
        taken.append(message)
    await channel.close()
    return taken


async def ids_in(amqp: AbstractRobustConnection, name: str) -> list[str]:
    return [m.message_id or "" for m in await take_all(amqp, name)]


@pytest.fixture(params=["classic", "quorum"])
def queue_type(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def work_queue(amqp: AbstractRobustConnection, queue_type: str) -> Any:
    name = unique("cli")
    await declare(amqp, name, "classic")
    await declare(amqp, f"{name}.dlq", queue_type)
    yield name
    await delete(amqp, name, f"{name}.dlq")


async def test_list_and_show_read_json_and_binary_dead_letters_and_leave_them_in_place(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    """Listing twice changes nothing: same order, and a quorum DLQ's delivery count stays 0."""
    await seed(
        amqp,
        work_queue,
        [
            ("j1", "permanent", b'{"order": 1, "sku": "A-1"}', "application/json"),
            ("b1", "exhausted", BINARY, "application/x-protobuf"),
            ("t1", "exhausted", "naïve text".encode(), "text/plain"),
        ],
    )
    for _ in range(2):
        listed = await run_cli("dlq", "list", work_queue, "--json", url=rabbit_url)
        assert listed.status == 0, listed.stderr
        rows = listed.rows()
        assert [r["message_id"] for r in rows] == ["j1", "b1", "t1"]
    json_row, binary_row, text_row = rows
    assert json_row["reason"] == "permanent"
    assert json_row["attempts"] == 3
    assert json_row["exception"] == "TimeoutError"
    assert json_row["error"] == "j1 timed out"
    assert json_row["body_kind"] == "json"
    assert json.loads(json_row["body_preview"]) == {"order": 1, "sku": "A-1"}
    assert binary_row["body_kind"] == "hex"
    assert binary_row["body_preview"].startswith("00 01 02 03")
    assert text_row["body_kind"] == "text"
    assert text_row["body_preview"] == "naïve text"

    table = await run_cli("dlq", "list", work_queue, url=rabbit_url)
    assert table.status == 0
    assert "3 dead letters" in table.stdout
    assert "j1" in table.stdout
    assert "b1" in table.stdout

    shown = await run_cli("dlq", "show", work_queue, "b1", "--json", url=rabbit_url)
    assert shown.status == 0, shown.stderr
    details = shown.json()
    assert details["body"] == " ".join(f"{b:02x}" for b in BINARY)
    assert details["traceback"] == "Traceback..."
    assert details["headers"]["app-header"] == "kept"
    assert details["properties"]["correlation_id"] == "corr-b1"
    assert [e["attempt"] for e in details["history"]] == [3]
    human = await run_cli("dlq", "show", work_queue, "j1", url=rabbit_url)
    assert human.status == 0
    assert '"sku": "A-1"' in human.stdout
    assert "Traceback..." in human.stdout
    missing = await run_cli("dlq", "show", work_queue, "nope", url=rabbit_url)
    assert missing.status == 3
    assert "no dead letter 'nope'" in missing.stderr

    left = await take_all(amqp, f"{work_queue}.dlq")
    assert [m.message_id for m in left] == ["j1", "b1", "t1"]
    assert [m.body for m in left][1] == BINARY
    # Nothing was spent: a quorum queue counts every requeue (4.3 in x-acquired-count).
    assert {headers.read_requeues(m.headers) for m in left} == {0}


async def test_a_decoder_hook_renders_what_the_built_in_ways_cannot(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str, tmp_path: Path
) -> None:
    (tmp_path / "mydecoder.py").write_text(
        "def decode(body, content_type, headers):\n"
        "    return {'length': len(body), 'type': content_type}\n"
    )
    await seed(amqp, work_queue, [("b1", "permanent", BINARY, "application/x-protobuf")])
    listed = await run_cli(
        "dlq",
        "list",
        work_queue,
        "--decoder",
        "mydecoder:decode",
        "--json",
        url=rabbit_url,
        cwd=tmp_path,
    )
    assert listed.status == 0, listed.stderr
    assert listed.rows()[0]["body_kind"] == "decoder"
    assert '"length": 256' in listed.rows()[0]["body_preview"]
    bad = await run_cli("dlq", "list", work_queue, "--decoder", "nothere:x", url=rabbit_url)
    assert bad.status == 3
    assert "cannot import decoder module 'nothere'" in bad.stderr


async def test_a_list_right_after_a_list_sees_every_dead_letter(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    """A classic DLQ takes back what a pass held a moment after it ends: the next pass waits.

    Before, the second of two lists in a row counted the queue while some of the
    first's messages were not back yet, and showed (and replayed) fewer.
    """
    from faststream_retry.ops.common import connect  # noqa: PLC0415
    from faststream_retry.ops.dlq import list_dead_letters  # noqa: PLC0415

    sent = [f"m{i}" for i in range(900)]
    await seed(amqp, work_queue, [(i, "exhausted", b"{}", "application/json") for i in sent])
    async with connect(rabbit_url) as connection:
        for _ in range(3):
            found = await list_dead_letters(connection, work_queue, limit=None)
            assert [letter.key for letter in found.taken] == sent


async def test_dry_run_moves_nothing(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    await seed(
        amqp, work_queue, [(f"m{i}", "exhausted", b"{}", "application/json") for i in range(3)]
    )
    dry = await run_cli("dlq", "replay", work_queue, "--dry-run", "--json", url=rabbit_url)
    assert dry.status == 0, dry.stderr
    assert dry.json()["selected"] == ["m0", "m1", "m2"]
    assert dry.json()["moved"] == 0
    assert await queue_depth(amqp, work_queue) == 0
    assert await ids_in(amqp, f"{work_queue}.dlq") == ["m0", "m1", "m2"]


async def test_replay_by_reason_and_by_id_resets_the_retry_state_and_keeps_the_rest_in_order(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    await seed(
        amqp,
        work_queue,
        [
            ("p1", "permanent", b"1", None),
            ("e1", "exhausted", b"2", None),
            ("p2", "permanent", b"3", None),
            ("e2", "exhausted", b"4", None),
            ("p3", "permanent", b"5", None),
        ],
    )
    by_reason = await run_cli("dlq", "replay", work_queue, "--reason", "exhausted", url=rabbit_url)
    assert by_reason.status == 0, by_reason.stderr
    by_id = await run_cli("dlq", "replay", work_queue, "--id", "p2", "--json", url=rabbit_url)
    assert by_id.status == 0, by_id.stderr
    assert by_id.json()["moved"] == 1
    replayed = await take_all(amqp, work_queue)
    assert [m.message_id for m in replayed] == ["e1", "e2", "p2"]
    for message in replayed:
        sent = headers_of(message)
        assert headers.ATTEMPT not in sent
        assert headers.REASON not in sent
        assert headers.HISTORY not in sent
        assert sent["app-header"] == "kept"
        (story,) = sent[headers.REPLAYED]
        assert story["attempts"] == 3
        assert story["exception"] == "TimeoutError"
        assert story["reason"] in {"exhausted", "permanent"}
        assert message.correlation_id == f"corr-{message.message_id}"
    assert await ids_in(amqp, f"{work_queue}.dlq") == ["p1", "p3"]


async def test_a_replayed_message_succeeds_or_gets_every_attempt_again(
    make_app: Any, amqp: AbstractRobustConnection, rabbit_url: str
) -> None:
    """The first failure after a replay is attempt 1 again, not attempt 5 of 4."""
    app: App = make_app(default=RetryPolicy(max_attempts=3, backoff=Fixed(0.1)))
    queue = unique("replayed")
    broken = {"on": True}
    calls: dict[str, int] = {}

    @app.broker.subscriber(queue)
    @retry_policy(max_attempts=3, backoff=Fixed(0.1))
    async def handle(body: str) -> None:
        calls[body] = calls.get(body, 0) + 1
        if body == "bad" or broken["on"]:
            raise ConnectionError(f"{body} failed")

    await app.start()
    channel = await amqp.channel()
    for body in ("good", "bad"):
        await channel.default_exchange.publish(
            aio_pika.Message(body.encode(), message_id=body), routing_key=queue
        )
    await eventually(
        lambda: calls.get("good") == 3 and calls.get("bad") == 3, what="both exhausted"
    )
    dlq = f"{queue}.dlq"
    await eventually_depth(amqp, dlq, 2)
    broken["on"] = False
    replay = await run_cli("dlq", "replay", queue, "--json", url=rabbit_url)
    assert replay.status == 0, replay.stderr
    assert replay.json()["moved"] == 2
    # "good" now succeeds at once; "bad" fails again, and gets its three attempts.
    await eventually(lambda: calls.get("good") == 4 and calls.get("bad") == 6, what="replayed")
    await eventually_depth(amqp, dlq, 1)
    (dead,) = await take_all(amqp, dlq)
    assert dead.message_id == "bad"
    assert headers_of(dead)[headers.ATTEMPT] == 3
    assert headers_of(dead)[headers.REASON] == "exhausted"
    assert len(headers_of(dead)[headers.REPLAYED]) == 1
    await channel.close()


async def eventually_depth(amqp: AbstractRobustConnection, queue: str, depth: int) -> None:
    deadline = time.monotonic() + 20
    while (seen := await queue_depth(amqp, queue)) != depth:
        if time.monotonic() > deadline:
            pytest.fail(f"{queue} holds {seen}, not {depth}")
        await asyncio.sleep(0.05)


async def test_replay_keeps_to_the_rate(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    """10 at --rate 20: the first and last arrive at least 9/20 s apart."""
    await seed(amqp, work_queue, [(f"m{i}", "exhausted", b"x", None) for i in range(10)])
    arrivals: list[float] = []
    channel = await amqp.channel()
    queue = await channel.get_queue(work_queue)

    async def arrived(_message: AbstractIncomingMessage) -> None:
        arrivals.append(time.monotonic())

    tag = await queue.consume(arrived, no_ack=True)
    replay = await run_cli("dlq", "replay", work_queue, "--rate", "20", url=rabbit_url)
    assert replay.status == 0, replay.stderr
    await eventually(lambda: len(arrivals) == 10, what="10 replayed")
    await queue.cancel(tag)
    await channel.close()
    assert arrivals[-1] - arrivals[0] >= 9 / 20 * 0.9


async def test_export_purge_import_restores_every_byte_and_header(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str, tmp_path: Path
) -> None:
    channel = await amqp.channel()
    odd_headers: dict[str, Any] = {
        "bytes": bytearray(b"\x00\xff"),
        "int": 2**40,
        "negative": -70_000,  # pamqp 3 cannot encode a small negative int
        "float": 1.25,
        "bool": True,
        "none": None,
        "list": [1, "two", {"three": 3}],
        "table": {"$looks-like-a-tag": "x", "nested": {"deep": [True]}},
        "text": "ünïcode",
    }
    sent = [
        aio_pika.Message(
            BINARY,
            message_id="bin",
            content_type="application/octet-stream",
            content_encoding="identity",
            headers={
                **dead_letter_headers("permanent", 1, ValueError("x"), work_queue),
                **odd_headers,
            },
            priority=3,
            correlation_id="c1",
            reply_to="replies",
            type="order.created",
            app_id="shop",
            timestamp=1_700_000_000,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        ),
        aio_pika.Message(b'{"a": 1}', message_id="json", content_type="application/json"),
    ]
    for message in sent:
        await channel.default_exchange.publish(message, routing_key=f"{work_queue}.dlq")
    await channel.close()
    before = await snapshot(amqp, f"{work_queue}.dlq")
    saved = tmp_path / "dead.jsonl"

    export = await run_cli("dlq", "export", work_queue, str(saved), url=rabbit_url)
    assert export.status == 0, export.stderr
    assert len(saved.read_text().splitlines()) == 2
    refused = await run_cli("dlq", "purge", work_queue, url=rabbit_url)
    assert refused.status == 3
    assert "--yes" in refused.stderr
    purge = await run_cli("dlq", "purge", work_queue, "--yes", "--json", url=rabbit_url)
    assert purge.status == 0, purge.stderr
    assert purge.json()["selected"] == ["bin", "json"]
    assert purge.json()["removed"] == 2
    assert await queue_depth(amqp, f"{work_queue}.dlq") == 0
    imported = await run_cli("dlq", "import", str(saved), url=rabbit_url)
    assert imported.status == 0, imported.stderr

    assert await snapshot(amqp, f"{work_queue}.dlq") == before


async def snapshot(amqp: AbstractRobustConnection, name: str) -> list[dict[str, Any]]:
    """Read every message in ``name`` without removing any: body, properties, headers."""
    channel = await amqp.channel()
    queue = await channel.get_queue(name)
    seen = []
    while (m := await queue.get(fail=False)) is not None:
        hdrs = headers.without_broker_counts(m.headers)
        seen.append(
            {
                "body": m.body,
                "headers": hdrs,
                **{
                    k: getattr(m, k)
                    for k in (
                        "message_id",
                        "content_type",
                        "content_encoding",
                        "priority",
                        "correlation_id",
                        "reply_to",
                        "type",
                        "app_id",
                        "timestamp",
                        "delivery_mode",
                        "expiration",
                        "user_id",
                    )
                },
            }
        )
    await channel.close()  # unacked: back in place
    return seen


async def test_purge_takes_only_what_matches(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    await seed(
        amqp,
        work_queue,
        [(f"m{i}", "permanent" if i % 2 else "exhausted", b"x", None) for i in range(6)],
    )
    purge = await run_cli(
        "dlq", "purge", work_queue, "--reason", "permanent", "--yes", url=rabbit_url
    )
    assert purge.status == 0, purge.stderr
    assert await ids_in(amqp, f"{work_queue}.dlq") == ["m0", "m2", "m4"]


async def test_a_replay_killed_mid_way_loses_nothing(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    """SIGKILL during a paced replay: every dead letter is in the DLQ or the work queue, one twice at most.

    A paced pass keeps one copy in flight, so the bound holds however slow the
    broker's confirms are on a loaded machine (a pipelined one left 10 twice here).
    """
    ids = [f"m{i:03}" for i in range(300)]
    await seed(amqp, work_queue, [(i, "exhausted", i.encode(), None) for i in ids])
    process = await asyncio.create_subprocess_exec(
        *script(),
        "dlq",
        "replay",
        work_queue,
        # 6 s for 300: the kill lands after 60 with 4.8 s to spare on a loaded machine.
        "--rate",
        "50",
        env=environment(rabbit_url),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while await queue_depth(amqp, work_queue) < 60:
        assert time.monotonic() < deadline, "the replay did not start"
        await asyncio.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    await process.wait()
    # The broker requeues what the dead connection held unacked.
    await eventually_depth_at_least(amqp, work_queue, f"{work_queue}.dlq", len(ids))
    moved = await ids_in(amqp, work_queue)
    stayed = await ids_in(amqp, f"{work_queue}.dlq")
    assert 60 <= len(moved) < len(ids)
    assert set(moved) | set(stayed) == set(ids)
    # The copy in flight when it died, confirmed or not, may be in both places.
    assert len(moved) + len(stayed) - len(ids) <= 1
    assert len(set(moved)) == len(moved)


async def eventually_depth_at_least(
    amqp: AbstractRobustConnection, first: str, second: str, total: int
) -> None:
    deadline = time.monotonic() + 20
    while (await queue_depth(amqp, first)) + (await queue_depth(amqp, second)) < total:
        if time.monotonic() > deadline:
            pytest.fail(f"{first} and {second} hold fewer than {total}")
        await asyncio.sleep(0.05)


async def test_a_missing_queue_or_broker_is_an_error_that_says_so(rabbit_url: str) -> None:
    missing = await run_cli("dlq", "list", unique("nothing-here"), url=rabbit_url)
    assert missing.status == 3
    assert "does not exist" in missing.stderr
    unreachable = await run_cli("dlq", "list", "q", url="amqp://guest:secret@127.0.0.1:1/")
    assert unreachable.status == 3
    assert "cannot connect to amqp://guest:***@127.0.0.1:1/" in unreachable.stderr
    assert "secret" not in unreachable.stderr


async def test_replay_to_a_missing_queue_moves_nothing_and_says_why(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    await seed(amqp, work_queue, [("m1", "exhausted", b"x", None), ("m2", "exhausted", b"y", None)])
    gone = unique("gone")
    replay = await run_cli("dlq", "replay", work_queue, "--to", gone, url=rabbit_url)
    assert replay.status == 3
    assert f"cannot replay to queue '{gone}': it does not exist" in replay.stderr
    assert await ids_in(amqp, f"{work_queue}.dlq") == ["m1", "m2"]


async def test_a_failed_replay_leaves_each_dead_letter_as_it_was(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    """The dead letter a failed move keeps still says why it died, and claims no replay.

    The target exists but refuses every message (full: ``x-max-length`` 0 with
    ``reject-publish``), so the first move fails mid-pass.
    """
    await seed(amqp, work_queue, [("m1", "exhausted", b"x", None), ("m2", "exhausted", b"y", None)])
    full = unique("full")
    channel = await amqp.channel()
    await channel.declare_queue(
        full, durable=True, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    replay = await run_cli("dlq", "replay", work_queue, "--to", full, url=rabbit_url)
    await channel.queue_delete(full)
    await channel.close()
    assert replay.status == 3
    assert "refused the message" in replay.stderr
    kept = await take_all(amqp, f"{work_queue}.dlq")
    assert [m.message_id for m in kept] == ["m1", "m2"]
    for message in kept:
        hdrs = headers_of(message)
        assert hdrs[headers.REASON] == "exhausted"
        assert hdrs[headers.ATTEMPT] == 3
        assert headers.REPLAYED not in hdrs


async def test_a_position_names_one_dead_letter_even_when_ids_repeat(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    await seed(
        amqp, work_queue, [("same", "permanent", b"1", None), ("same", "exhausted", b"2", None)]
    )
    shown = await run_cli("dlq", "show", work_queue, "#2", "--json", url=rabbit_url)
    assert shown.status == 0, shown.stderr
    assert shown.json()["reason"] == "exhausted"
    replay = await run_cli("dlq", "replay", work_queue, "--id", "#2", url=rabbit_url)
    assert replay.status == 0, replay.stderr
    assert [m.body for m in await take_all(amqp, work_queue)] == [b"2"]
    assert [m.body for m in await take_all(amqp, f"{work_queue}.dlq")] == [b"1"]


async def test_one_command_at_a_time_goes_through_a_queue(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    """A second pass would take the first one's kept copies for new dead letters."""
    await seed(amqp, work_queue, [(f"m{i}", "exhausted", b"x", None) for i in range(40)])
    slow = await asyncio.create_subprocess_exec(
        *script(),
        "dlq",
        "replay",
        work_queue,
        "--rate",
        "20",
        env=environment(rabbit_url),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    # A running command holds the lock ...
    await eventually_exists(amqp, lock_name(f"{work_queue}.dlq"))
    assert await slow.wait() == 0
    assert sorted(await ids_in(amqp, work_queue)) == sorted(f"m{i}" for i in range(40))
    # ... and the lock went with its command.
    again = await run_cli("dlq", "list", work_queue, url=rabbit_url)
    assert again.status == 0, again.stderr
    # While another command holds it (here the test, so that no race with a command's own
    # start decides the outcome on a loaded machine), a second one is refused.
    holder = await amqp.channel()
    try:
        await holder.declare_queue(lock_name(f"{work_queue}.dlq"), exclusive=True, auto_delete=True)
        second = await run_cli("dlq", "list", work_queue, url=rabbit_url)
    finally:
        await holder.close()
    assert second.status == 3
    assert "another faststream-retry command is going through" in second.stderr


async def eventually_exists(amqp: AbstractRobustConnection, name: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        channel = await amqp.channel()
        try:
            await channel.declare_queue(name, passive=True)
        except ChannelLockedResource:
            return  # exclusive to the connection that declared it: it exists
        except ChannelNotFoundEntity:
            if time.monotonic() > deadline:
                pytest.fail(f"{name} never appeared")
            await asyncio.sleep(0.02)
        else:
            return
        finally:
            if not channel.is_closed:
                await channel.close()


async def test_sigterm_stops_a_pass_cleanly(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    """A closed terminal (SIGHUP) or a SIGTERM finishes what is in flight: nothing twice."""
    ids = [f"m{i:04}" for i in range(1500)]
    await seed(amqp, work_queue, [(i, "exhausted", b"x", None) for i in ids])
    process = await asyncio.create_subprocess_exec(
        *script(),
        "dlq",
        "list",
        work_queue,
        "--limit",
        "5000",
        "--json",
        env=environment(rabbit_url),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    await eventually_exists(amqp, f"faststream-retry.lock.{work_queue}.dlq")
    process.send_signal(signal.SIGTERM)
    _, err = await process.communicate()
    assert process.returncode in {0, 130}, err.decode()
    assert "Traceback" not in err.decode()
    await eventually_depth(amqp, f"{work_queue}.dlq", len(ids))
    left = await ids_in(amqp, f"{work_queue}.dlq")
    assert sorted(left) == ids  # every one, once


async def test_a_replay_takes_each_dead_letter_once_while_replayed_ones_fail_again(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str
) -> None:
    """What fails again during a replay lands behind it and is not replayed twice."""
    ids = [f"m{i:04}" for i in range(600)]
    await seed(amqp, work_queue, [(i, "exhausted", b"x", None) for i in ids])
    arrivals: list[str] = []
    channel = await amqp.channel()
    await channel.set_qos(prefetch_count=100)
    queue = await channel.get_queue(work_queue)

    async def fail_again(message: AbstractIncomingMessage) -> None:
        # As the app would: straight back into the dead-letter queue.
        arrivals.append(message.message_id or "")
        await channel.default_exchange.publish(
            aio_pika.Message(
                message.body,
                message_id=message.message_id,
                headers={**dead_letter_headers("exhausted", 3, TimeoutError("again"), work_queue)},
            ),
            routing_key=f"{work_queue}.dlq",
        )
        await message.ack()

    tag = await queue.consume(fail_again)
    replay = await run_cli("dlq", "replay", work_queue, "--json", url=rabbit_url)
    assert replay.status == 0, replay.stderr
    assert replay.json()["moved"] == len(ids)
    await eventually(lambda: len(arrivals) >= len(ids), what="every replayed message")
    await queue.cancel(tag)
    await channel.close()
    twice = sorted({i for i in arrivals if arrivals.count(i) > 1})
    missing = sorted(set(ids) - set(arrivals))
    assert (twice, missing) == ([], [])  # each once, none twice, none skipped
    await eventually_depth(amqp, f"{work_queue}.dlq", len(ids))


async def test_an_import_of_a_damaged_file_publishes_nothing(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str, tmp_path: Path
) -> None:
    await seed(amqp, work_queue, [(f"m{i}", "exhausted", b"x", None) for i in range(3)])
    saved = tmp_path / "dead.jsonl"
    export = await run_cli("dlq", "export", work_queue, str(saved), url=rabbit_url)
    assert export.status == 0, export.stderr
    lines = saved.read_text().splitlines()
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join([lines[0], lines[1], lines[2][:40]]) + "\n")
    imported = await run_cli("dlq", "import", str(damaged), "--to", work_queue, url=rabbit_url)
    assert imported.status == 3
    assert f"{damaged}:3: not an exported message" in imported.stderr
    assert await queue_depth(amqp, work_queue) == 0


async def test_bad_input_is_one_line_naming_the_fix(rabbit_url: str) -> None:
    since = await run_cli("dlq", "list", "q", "--since", "yesterday", url=rabbit_url)
    assert since.status == 3
    assert "or an age (30m, 2h, 7d), got 'yesterday'" in since.stderr
    assert "Traceback" not in since.stderr
    http = await run_cli("dlq", "list", "q", url="http://127.0.0.1:15672")
    assert http.status == 3
    assert "starts amqp:// or amqps://" in http.stderr
    vhost = await run_cli("dlq", "list", "q", url=rabbit_url.rstrip("/") + "/no-such-vhost")
    assert vhost.status == 3
    assert "check the user, the password and the vhost" in vhost.stderr


async def test_dead_letters_arriving_during_a_pass_leave_nothing_twice(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str, tmp_path: Path
) -> None:
    """An app dead-letters while an operator exports: every message stays, once."""
    old = [f"old{i:04}" for i in range(1000)]
    new = [f"new{i:04}" for i in range(300)]
    await seed(amqp, work_queue, [(i, "exhausted", b"x", None) for i in old])

    async def dead_lettering() -> None:
        channel = await amqp.channel()
        for message_id in new:
            await channel.default_exchange.publish(
                aio_pika.Message(b"y", message_id=message_id),
                routing_key=f"{work_queue}.dlq",
            )
            await asyncio.sleep(1 / 300)
        await channel.close()

    arriving = asyncio.create_task(dead_lettering())
    export = await run_cli("dlq", "export", work_queue, str(tmp_path / "d.jsonl"), url=rabbit_url)
    await arriving
    assert export.status == 0, export.stderr
    exported = [
        json.loads(line)["properties"]["message_id"] for line in (tmp_path / "d.jsonl").open()
    ]
    assert len(exported) == len(set(exported))
    assert set(old) <= set(exported)
    left = await ids_in(amqp, f"{work_queue}.dlq")
    assert sorted(left) == sorted(old + new)  # each once


async def test_purge_from_an_export_removes_exactly_what_it_holds_while_letters_keep_coming(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str, tmp_path: Path
) -> None:
    """Export 20, then 10 more arrive that failed before the export's time, a letter with an
    exported id but other content, and a byte-for-byte duplicate of an exported one.

    ``purge --from-export`` removes the 20 and leaves the 12 others; the old advice,
    ``--until`` the export's time, would have taken the 10 late ones too.
    """
    dlq = f"{work_queue}.dlq"
    failed_at = headers.now_ms() - 60_000
    channel = await amqp.channel(publisher_confirms=True)

    async def dead_letter(message_id: str, body: bytes, at_ms: int) -> None:
        record = headers.FailureRecord.of(TimeoutError("slow"), attempt=3, at_ms=at_ms)
        letter = headers.dead_letter_headers(
            {}, record, reason="exhausted", origin_queue=work_queue
        )
        await channel.default_exchange.publish(
            aio_pika.Message(body, message_id=message_id, headers=letter),
            routing_key=dlq,
        )

    exported = [f"e{n}" for n in range(20)]
    for message_id in exported:
        await dead_letter(message_id, b'{"n": "%s"}' % message_id.encode(), failed_at)
    saved = tmp_path / "dead.jsonl"
    export = await run_cli("dlq", "export", work_queue, str(saved), url=rabbit_url)
    assert export.status == 0, export.stderr
    assert f"dlq purge {work_queue} --from-export {saved}" in export.stderr
    lines = saved.read_text().splitlines()
    assert len(lines) == 20
    late = [f"late-{n}" for n in range(10)]
    for message_id in late:  # they failed before the export, and arrive after it
        await dead_letter(message_id, b"{}", failed_at + 1)
    await dead_letter("e3", b'{"n": "other"}', failed_at)
    twin = read_line(next(line for line in lines if '"message_id":"e5"' in line), "twin")
    await channel.default_exchange.publish(
        aio_pika.Message(twin.body, message_id="e5", headers=twin.properties.headers or {}),
        routing_key=dlq,
    )
    await channel.close()

    exported_at = json.loads(lines[-1])["exported_at"]
    old_advice = await run_cli(
        "dlq", "list", work_queue, "--until", exported_at, "--json", url=rabbit_url
    )
    assert set(late) <= {row["message_id"] for row in old_advice.rows()}

    refused = await run_cli(
        "dlq",
        "purge",
        work_queue,
        "--from-export",
        str(saved),
        "--reason",
        "exhausted",
        url=rabbit_url,
    )
    assert refused.status == 3
    assert "leave out --id, --reason" in refused.stderr
    purge = await run_cli(
        "dlq", "purge", work_queue, "--from-export", str(saved), "--yes", "--json", url=rabbit_url
    )
    assert purge.status == 0, purge.stderr
    assert sorted(purge.json()["selected"]) == sorted(exported)
    assert (purge.json()["removed"], purge.json()["not_found"]) == (20, 0)
    left = await take_all(amqp, dlq)
    assert sorted(m.message_id or "" for m in left) == sorted([*late, "e3", "e5"])
    assert next(m for m in left if m.message_id == "e3").body == b'{"n": "other"}'

    again = await run_cli(
        "dlq", "purge", work_queue, "--from-export", str(saved), "--yes", url=rabbit_url
    )
    assert again.status == 0, again.stderr
    assert "removed 0 dead letters" in again.stdout
    assert "20 of the dead letters in" in again.stderr


async def test_an_export_of_another_queue_purges_nothing(
    amqp: AbstractRobustConnection, rabbit_url: str, work_queue: str, tmp_path: Path
) -> None:
    await seed(amqp, work_queue, [("a", "exhausted", b"{}", None)])
    saved = tmp_path / "dead.jsonl"
    export = await run_cli("dlq", "export", work_queue, str(saved), url=rabbit_url)
    assert export.status == 0, export.stderr
    other = unique("cli-other")
    await declare(amqp, f"{other}.dlq", "classic")
    try:
        refused = await run_cli(
            "dlq", "purge", other, "--from-export", str(saved), "--yes", url=rabbit_url
        )
        assert refused.status == 3
        assert f"was exported from {work_queue}.dlq, not {other}.dlq" in refused.stderr
    finally:
        await delete(amqp, f"{other}.dlq")
    assert await ids_in(amqp, f"{work_queue}.dlq") == ["a"]


async def test_the_purge_refusal_names_the_exact_way_not_a_time(rabbit_url: str) -> None:
    refused = await run_cli("dlq", "purge", "any-queue", url=rabbit_url)
    assert refused.status == 3
    assert "--from-export FILE" in refused.stderr
    assert "--until" not in refused.stderr
