"""``faststream-retry dlq ... --url redis://`` on a real server, counted by id.

The app dead-letters its messages (PermanentError while ``broken``); the commands list,
show, replay, purge, export and import them. Listing changes nothing (the same entries
before and after, no group on the dead-letter stream); a replay puts each dead letter
back in its stream, removed in the same script, and the app handles every id once.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from faststream_retry import PermanentError, RetryMiddleware
from faststream_retry.core import headers as h
from faststream_retry.ops import dlq_store
from faststream_retry.ops.common import OperationError
from faststream_retry.ops.redis_dlq import RedisStore
from faststream_retry.redis import envelope
from faststream_retry.redis.keys import stream_keys
from tests.cli import run_cli
from tests.redis.support import until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path


pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]


class App:
    """A Redis app whose handler dead-letters every message while ``broken``."""

    def __init__(self, url: str, stream: str) -> None:
        self.stream = stream
        self.dlq = stream_keys(stream).dlq
        self.broken = True
        self.done: Counter[int] = Counter()
        self.broker = RedisBroker(url, middlewares=[RetryMiddleware()], logger=None)  # type: ignore[arg-type]

        @self.broker.subscriber(stream=StreamSub(stream, group="g", consumer="c1"))
        async def handle(body: dict[str, Any]) -> None:
            if self.broken:
                raise PermanentError(f"message {body['id']}")
            self.done[int(body["id"])] += 1

    async def send(self, n: int) -> None:
        for i in range(n):
            await self.broker.publish(
                {"id": i},
                stream=self.stream,
                headers={"x-app": f"v{i}", "message_id": f"m{i}"},
            )


@pytest.fixture
async def app(redis_url: str, stream: str) -> AsyncIterator[App]:
    made = App(redis_url, stream)
    await made.broker.start()
    try:
        yield made
    finally:
        await made.broker.stop()


async def dead(client: Redis, app: App, n: int) -> None:
    async def enough() -> bool:
        return int(await client.xlen(app.dlq)) >= n

    await until(enough, 60, f"{n} dead letters in {app.dlq}")


async def cli(redis_url: str, *args: str) -> Any:
    done = await run_cli(*args, "--url", redis_url, "--json", url=None)
    assert done.status == 0, (done.stdout, done.stderr)
    return done.json()


async def entries(client: Redis, key: str) -> list[dict[bytes, bytes]]:
    """The fields of every entry of ``key``, oldest first (their ids left out)."""
    found: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(key)  # type: ignore[assignment]
    return [fields for _, fields in found]


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["message_id"] for row in rows]


async def test_list_reads_without_consuming_and_says_when_it_is_not_whole(
    redis_url: str, client: Redis, app: App
) -> None:
    """250 dead letters: complete false at 100, true at 300; the entries unchanged."""
    await app.send(250)
    await dead(client, app, 250)
    before = await client.xrange(app.dlq)
    first = await cli(redis_url, "dlq", "list", app.stream)
    assert first["format"] == 1
    assert first["queue"] == app.dlq
    assert first["complete"] is False
    assert first["limit"] == 100
    assert ids(first["dead_letters"]) == [f"m{i}" for i in range(100)]
    assert first["in_queue_before"] == 250
    assert first["dead_letters"][0]["reason"] == "permanent"
    assert first["dead_letters"][0]["origin_queue"] == app.stream
    whole = await cli(redis_url, "dlq", "list", app.dlq, "--limit", "300")
    assert whole["complete"] is True
    assert ids(whole["dead_letters"]) == [f"m{i}" for i in range(250)]
    exact = await cli(redis_url, "dlq", "list", app.stream, "--limit", "250")
    assert exact["complete"] is True
    assert await client.xrange(app.dlq) == before, "nothing moved, nothing removed"
    assert await client.xinfo_groups(app.dlq) == [], "no group reads the dead letters"
    shown = await cli(redis_url, "dlq", "show", app.stream, "m7")
    assert shown["body"] == {"id": 7}
    assert shown["headers"]["x-app"] == "v7"


async def test_replay_puts_each_back_once(redis_url: str, client: Redis, app: App) -> None:
    """300 replayed by two commands at once: the stream empties, every id is handled once."""
    await app.send(300)
    await dead(client, app, 300)
    app.broken = False
    dry = await cli(redis_url, "dlq", "replay", app.stream, "--dry-run")
    assert len(dry["selected"]) == 300
    assert int(await client.xlen(app.dlq)) == 300, "a dry run moves nothing"
    # Two operators at once: each dead letter goes back once (one script removes and adds).
    one, two = await asyncio.gather(
        cli(redis_url, "dlq", "replay", app.stream), cli(redis_url, "dlq", "replay", app.stream)
    )
    assert one["to"] == two["to"] == app.stream
    assert one["moved"] + two["moved"] == 300

    async def handled() -> bool:
        return sum(app.done.values()) >= 300

    await until(handled, 60, "300 replayed messages handled")
    assert int(await client.xlen(app.dlq)) == 0
    assert app.done == dict.fromkeys(range(300), 1), "each id once, none twice"


async def test_replay_keeps_to_the_rate(redis_url: str, client: Redis, app: App) -> None:
    """10 at --rate 20: the first and last copies are added at least 9/20 s apart (their
    entry ids are the server's milliseconds), as on RabbitMQ."""
    await app.send(10)
    await dead(client, app, 10)
    app.broken = False
    replayed = await cli(redis_url, "dlq", "replay", app.stream, "--rate", "20")
    assert replayed["moved"] == 10
    added: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(app.stream)  # type: ignore[assignment]
    copies = [int(entry_id.split(b"-")[0]) for entry_id, _ in added[-10:]]
    assert copies[-1] - copies[0] >= 9 / 20 * 1000 * 0.9


async def test_replay_to_a_stream_that_does_not_exist_is_refused(
    redis_url: str, client: Redis, app: App
) -> None:
    """--to a missing stream: exit 3, nothing replayed, no stream made."""
    await app.send(3)
    await dead(client, app, 3)
    done = await run_cli(
        "dlq", "replay", app.stream, "--to", f"{app.stream}-typo", "--url", redis_url, url=None
    )
    assert done.status == 3
    assert "nothing was replayed" in done.stderr
    assert int(await client.xlen(app.dlq)) == 3
    assert not await client.exists(f"{app.stream}-typo")


async def test_purge_and_export_import_round_trip(
    redis_url: str, client: Redis, app: App, tmp_path: Path
) -> None:
    """Export, purge from the export, import: byte-identical entries back."""
    await app.send(20)
    await dead(client, app, 20)
    before = await entries(client, app.dlq)
    file = tmp_path / "dead.jsonl"
    exported = await cli(redis_url, "dlq", "export", app.stream, str(file))
    assert len(exported["exported"]) == 20
    purged = await run_cli(
        "dlq", "purge", app.stream, "--from-export", str(file), "--yes", "--json",
        "--url", redis_url, url=None,
    )  # fmt: skip
    assert purged.status == 0, purged.stderr
    assert purged.json()["not_found"] == 0
    assert int(await client.xlen(app.dlq)) == 0
    imported = await cli(redis_url, "dlq", "import", str(file))
    assert imported["published"] == 20
    after = await entries(client, app.dlq)
    assert after == before, "byte-identical entries, in order"
    some = await cli(redis_url, "dlq", "purge", app.stream, "--id", "m3", "--yes")
    assert some["removed"] == 1
    assert int(await client.xlen(app.dlq)) == 19


async def test_a_failed_export_leaves_the_old_file(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """An export that fails (the key holds no stream) never touches FILE."""
    await client.set(stream_keys(stream).dlq, "not a stream")
    file = tmp_path / "old.jsonl"
    file.write_text("old\n")
    done = await run_cli(
        "dlq", "export", stream, str(file), "--force", "--url", redis_url, url=None
    )
    assert done.status == 3, done.stderr
    assert file.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["old.jsonl"]
    await client.delete(stream_keys(stream).dlq)


async def test_a_replay_whose_copy_is_refused_keeps_its_dead_letter(
    redis_url: str, client: Redis, stream: str
) -> None:
    """An operator's user denied XADD: the replay fails and the dead letter is still there.

    Redis keeps a script's writes when a later command fails: a replay that removed the
    letter before adding its copy lost it (found in review: XLEN 0 after the refusal).
    """
    keys = stream_keys(stream)
    await client.xadd(stream, {"seed": "1"})
    letter = envelope.build(b'{"id": 1}', {h.ORIGIN_QUEUE: stream, h.ATTEMPT: "3"})
    await client.xadd(keys.dlq, {envelope.DATA_FIELD: letter})
    user = f"ops-{stream}"
    await client.acl_setuser(
        user, enabled=True, nopass=True, keys=["*"], channels=["*"], commands=["+@all", "-xadd"]
    )
    operator = Redis.from_url(redis_url, username=user)
    try:
        store = RedisStore(operator, stream)
        await store.open()
        with pytest.raises(Exception):  # noqa: B017 - the server's refusal, however wrapped
            await dlq_store.replay_dead_letters(store)
    finally:
        await operator.aclose()
        await client.acl_deluser(user)
    assert await client.xlen(keys.dlq) == 1, "the refused replay deleted the dead letter"


def letter(origin: str | None, n: int) -> bytes:
    """A dead letter as the plugin writes it, ``origin`` in its ``retry-origin-queue``."""
    headers = {h.ATTEMPT: "3", "message_id": f"m{n}"}
    if origin is not None:
        headers[h.ORIGIN_QUEUE] = origin
    return envelope.build(b'{"id": %d}' % n, headers)


async def test_a_stream_named_like_a_dead_letter_key_is_never_taken_for_one(
    redis_url: str, client: Redis, stream: str
) -> None:
    """``payments.dlq`` is a stream like any other: its dead letters are in
    ``{payments.dlq}.dlq``, and list and purge never touch its own entries. A key that is
    some stream's ``P.dlq`` but that a consumer group reads is refused: an app consumes it.

    Found in review: any name ending ``.dlq`` was taken as a dead-letter key, and
    ``dlq purge payments.dlq`` deleted the live messages.
    """
    live = f"{stream}.dlq"
    for n in range(3):
        await client.xadd(live, {envelope.DATA_FIELD: letter(None, n)})
    await client.xadd(stream_keys(live).dlq, {envelope.DATA_FIELD: letter(live, 9)})
    listed = await cli(redis_url, "dlq", "list", live)
    assert listed["queue"] == "{" + live + "}.dlq"
    assert ids(listed["dead_letters"]) == ["m9"]
    purged = await cli(redis_url, "dlq", "purge", live, "--yes")
    assert purged["removed"] == 1
    assert await client.xlen(live) == 3, "the stream's own entries were purged"
    # {S}.dlq is S's dead-letter key; read by a group, it is a stream an app consumes.
    tagged = stream_keys(stream).dlq
    await client.xgroup_create(tagged, "g", id="$", mkstream=True)
    await client.xadd(tagged, {envelope.DATA_FIELD: letter(stream, 1)})
    done = await run_cli("dlq", "purge", tagged, "--yes", "--url", redis_url, url=None)
    assert done.status == 3, done.stderr
    assert "read by consumer group 'g'" in done.stderr
    assert await client.xlen(tagged) == 1


async def test_a_replay_goes_back_to_the_stream_whose_key_holds_the_letter(
    redis_url: str, client: Redis, stream: str
) -> None:
    """The target is the stream whose ``.dlq`` holds the letter, never one its header names:
    a letter whose ``retry-origin-queue`` names another stream is refused (nothing moves)
    unless ``--to``; one with no origin, or the plugin's truncated one of a long name, goes
    back to the key's stream.

    Found in review: the header was the target, so a letter written into ``{S}.dlq`` by
    anyone was replayed into whatever stream it named.
    """
    other = f"{stream}-other"
    await client.xadd(other, {"seed": "1"})
    await client.xadd(stream, {"seed": "1"})
    dlq = stream_keys(stream).dlq
    await client.xadd(dlq, {envelope.DATA_FIELD: letter(stream, 1)})
    await client.xadd(dlq, {envelope.DATA_FIELD: letter(other, 2)})
    await client.xadd(dlq, {envelope.DATA_FIELD: letter(None, 3)})
    done = await run_cli("dlq", "replay", dlq, "--url", redis_url, url=None)
    assert done.status == 3, done.stderr
    assert f"says it came from stream '{other}'" in done.stderr
    assert "nothing was replayed" in done.stderr
    assert await client.xlen(dlq) == 3
    assert await client.xlen(other) == 1
    mine = await cli(redis_url, "dlq", "replay", stream, "--id", "m1", "--id", "m3")
    assert (mine["to"], mine["moved"]) == (stream, 2)
    assert await client.xlen(stream) == 3
    forced = await cli(redis_url, "dlq", "replay", dlq, "--to", stream)
    assert (forced["to"], forced["moved"]) == (stream, 1)
    assert (await client.xlen(stream), await client.xlen(other)) == (4, 1)
    # A name past the header's bound: the plugin wrote its origin cut short.
    long = stream + "-" + "x" * 300
    await client.xadd(long, {"seed": "1"})
    cut = h.truncate(long, h.QUEUE_LIMIT)
    assert cut != long
    await client.xadd(stream_keys(long).dlq, {envelope.DATA_FIELD: letter(cut, 4)})
    back = await cli(redis_url, "dlq", "replay", long)
    assert back["moved"] == 1
    assert await client.xlen(long) == 2


async def test_import_to_checks_its_target_as_replay_does(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """``import --to`` a stream that does not exist, or a key that is no stream: refused,
    nothing imported, nothing made (a typo would make a new stream).

    Found in review: the letters were XADDed into any key, created if missing.
    """
    dlq = stream_keys(stream).dlq
    await client.xadd(dlq, {envelope.DATA_FIELD: letter(stream, 1)})
    file = tmp_path / "dead.jsonl"
    await cli(redis_url, "dlq", "export", stream, str(file))
    await client.set(f"{stream}-hash", "x")
    for wrong, why in ((f"{stream}-typo", "it does not exist"), (f"{stream}-hash", "a string")):
        done = await run_cli(
            "dlq", "import", str(file), "--to", wrong, "--url", redis_url, url=None
        )
        assert done.status == 3, done.stderr
        assert why in done.stderr
        assert "nothing was imported" in done.stderr
    assert not await client.exists(f"{stream}-typo")
    await client.xadd(stream, {"seed": "1"})
    done = await run_cli("dlq", "import", str(file), "--to", stream, "--url", redis_url, url=None)
    assert done.status == 0, done.stderr
    assert await client.xlen(stream) == 2


async def test_an_import_stopped_part_way_says_where_to_go_on(
    redis_url: str, client: Redis, stream: str
) -> None:
    """The server refuses the third entry (out of memory): the error says 2 went in and to go
    on from line 3, never to run the whole import again (that would add the first two twice).

    Found in review: it said "none was lost; run the command again".
    """
    dlq = stream_keys(stream).dlq
    lines = [
        json.dumps(
            {
                "format": 1,
                "queue": dlq,
                "system": "redis",
                "headers": {"message_id": f"m{n}"},
                "body": base64.b64encode(b"x").decode(),
            }
        )
        for n in range(5)
    ]
    operator = Redis.from_url(redis_url)
    store = RedisStore(operator, dlq)
    admin = SyncRedis.from_url(redis_url)

    def full(published: int) -> None:
        if published == 2:  # the progress callback runs between two XADDs
            admin.config_set("maxmemory", "1")

    try:
        await store.open()
        with pytest.raises(OperationError) as stopped:
            await dlq_store.import_messages(store, lines, source="dead.jsonl", progress=full)
    finally:
        admin.config_set("maxmemory", "0")
        admin.close()
        await operator.aclose()
    text = str(stopped.value)
    assert "2 imported" in text
    assert "import from line 3 on" in text
    assert "run the command again" not in text
    assert await client.xlen(dlq) == 2


async def test_an_import_reads_its_file_or_stdin_line_by_line_and_a_damaged_one_adds_nothing(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """The file is read twice, a line at a time (every line checked, then each added), stdin
    through a temporary copy: both import every letter in order; a file damaged on its last
    line adds nothing, and names the line."""
    dlq = stream_keys(stream).dlq
    for n in range(5):
        await client.xadd(dlq, {envelope.DATA_FIELD: letter(stream, n)})
    before = await entries(client, dlq)
    file = tmp_path / "dead.jsonl"
    await cli(redis_url, "dlq", "export", stream, str(file))
    await client.delete(dlq)
    assert (await cli(redis_url, "dlq", "import", str(file)))["published"] == 5
    assert await entries(client, dlq) == before
    await client.delete(dlq)
    piped = await run_cli(
        "dlq", "import", "-", "--json", "--url", redis_url, url=None, stdin=file.read_text()
    )
    assert piped.status == 0, piped.stderr
    assert piped.json()["published"] == 5
    assert await entries(client, dlq) == before
    await client.delete(dlq)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text(
        file.read_text() + json.dumps({"format": 1, "queue": dlq, "system": "redis"}) + "\n"
    )
    done = await run_cli("dlq", "import", str(damaged), "--url", redis_url, url=None)
    assert done.status == 3, done.stderr
    assert "damaged.jsonl:6: not an exported message" in done.stderr
    assert not await client.exists(dlq)
