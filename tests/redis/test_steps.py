"""The atomic steps and the movers on a real server, without FastStream: never twice, never lost."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from faststream_retry.core import headers as h
from faststream_retry.redis import envelope
from faststream_retry.redis.engine import RedisRetryEngine
from faststream_retry.redis.steps import StreamEntry
from tests.rabbit import eventually
from tests.redis.support import read_stream, until

if TYPE_CHECKING:
    from collections.abc import Sequence

pytestmark = pytest.mark.redis

GROUP = "g"


async def pending_entries(client: Redis, stream: str, n: int) -> list[StreamEntry]:
    """Add ``n`` FastStream-encoded messages ``{"id": i}`` and read them into group g's pending list."""
    await client.xgroup_create(stream, GROUP, id="$", mkstream=True)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        body = json.dumps({"id": i}).encode()
        pipe.xadd(
            stream,
            {envelope.DATA_FIELD: envelope.build(body, {"content-type": "application/json"})},
        )
    await pipe.execute()
    entries: list[StreamEntry] = []
    while len(entries) < n:
        reply: Any = await client.xreadgroup(GROUP, "c1", {stream: ">"}, count=1000)
        for _, batch in reply:
            entries.extend(StreamEntry(stream, GROUP, i.decode(), f) for i, f in batch)
    return entries


def retry_headers(entry: StreamEntry, delay_ms: int) -> dict[str, object]:
    failure = h.FailureRecord(
        attempt=1, at_ms=h.now_ms(), exception="E", error="e", delay_ms=delay_ms
    )
    return h.retry_headers(entry.incoming_headers(), failure, failure.at_ms + delay_ms)


async def schedule(engine: RedisRetryEngine, entries: Sequence[StreamEntry], delay_ms: int) -> None:
    """Schedule every entry's copy, 50 steps in flight at once (redis-py's pool holds 100)."""
    for start in range(0, len(entries), 50):
        dues = await asyncio.gather(
            *(
                engine.retry_later(e, delay_ms=delay_ms, headers=retry_headers(e, delay_ms))
                for e in entries[start : start + 50]
            )
        )
        assert None not in dues


def copy_ids(stream_entries: list[tuple[str, envelope.Envelope]]) -> Counter[int]:
    return Counter(json.loads(m.body)["id"] for _, m in stream_entries if h.ATTEMPT in m.headers)


async def test_two_movers_move_each_of_10000_due_copies_exactly_once(
    redis_url: str, client: Redis, stream: str
) -> None:
    """10,000 copies due at once, two movers on two connections: each copy in the stream once."""
    n = 10_000
    entries = await pending_entries(client, stream, n)
    clients = [Redis.from_url(redis_url), Redis.from_url(redis_url)]
    engines = [RedisRetryEngine(c, [(stream, GROUP)]) for c in clients]
    try:
        await schedule(engines[0], entries, delay_ms=500)
        keys = engines[0].keys(stream)
        assert await client.zcard(keys.schedule) == n
        for engine in engines:
            await engine.start()

        async def all_moved() -> bool:
            return int(await client.zcard(keys.schedule)) == 0

        await until(all_moved, timeout=60, what="every copy moved")
        copies = copy_ids(await read_stream(client, stream))
        assert len(copies) == n, f"{n - len(copies)} copies lost"
        twice = {i: c for i, c in copies.items() if c > 1}
        assert not twice, f"{len(twice)} copies moved more than once"
        assert await client.hlen(keys.data) == 0
        assert engines[0].mover.moved + engines[1].mover.moved == n
        assert engines[0].mover.moved > 0, "the first mover moved some"
        assert engines[1].mover.moved > 0, "the second mover moved some"
    finally:
        for engine in engines:
            await engine.stop()
        for c in clients:
            await c.aclose()


async def test_a_step_on_an_entry_another_consumer_settled_writes_nothing(
    client: Redis, stream: str
) -> None:
    """Acknowledged by another consumer (still in the stream): no copy scheduled, no letter."""
    entries = await pending_entries(client, stream, 2)
    engine = RedisRetryEngine(client, [(stream, GROUP)])
    keys = engine.keys(stream)
    settled, other = entries
    assert await client.xack(stream, GROUP, settled.id) == 1
    assert await engine.retry_later(settled, delay_ms=0, headers=retry_headers(settled, 0)) is None
    assert await engine.dead_letter(settled, headers={h.REASON: "exhausted"}) is False
    assert await client.zcard(keys.schedule) == 0
    assert await client.hlen(keys.data) == 0
    assert not await client.exists(keys.dlq)
    # A second, different step on one delivery (a claimer's after the handler's): nothing.
    assert await engine.retry_later(other, delay_ms=60_000, headers=retry_headers(other, 0))
    assert await engine.retry_later(other, delay_ms=0, headers=retry_headers(other, 5)) is None
    assert await engine.dead_letter(other, headers={h.REASON: "exhausted"}) is False
    assert await client.zcard(keys.schedule) == 1
    assert not await client.exists(keys.dlq)


async def test_a_step_sent_again_after_its_reply_was_lost_reports_what_it_wrote_once(
    client: Redis, stream: str
) -> None:
    """redis-py sends a script again when the connection drops before its reply: the second
    run finds its own copy or letter and says so (the failure is reported), writing nothing."""
    later, dead = await pending_entries(client, stream, 2)
    engine = RedisRetryEngine(client, [(stream, GROUP)])
    keys = engine.keys(stream)
    headers = retry_headers(later, 60_000)
    due = await engine.retry_later(later, delay_ms=60_000, headers=headers)
    assert due is not None
    assert await engine.retry_later(later, delay_ms=60_000, headers=headers) == due
    letter = {h.REASON: "exhausted", h.ATTEMPT: 3}
    assert await engine.dead_letter(dead, headers=letter) is True
    assert await engine.dead_letter(dead, headers=letter) is True
    assert await client.zcard(keys.schedule) == 1
    assert await client.hlen(keys.data) == 1
    assert await client.xlen(keys.dlq) == 1


async def test_a_failure_on_an_entry_trimmed_while_held_is_still_written(
    client: Redis, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A live replica holds entries of one read; the producer's MAXLEN trims them while they
    wait. Any claimer pass (XAUTOCLAIM, idle or not) then drops them from the pending list:
    the handler's copy is the only one left, so its failure's copy and letter are written
    from it, and the pass says once how many it dropped."""
    later, dead = await pending_entries(client, stream, 2)
    await client.xtrim(stream, maxlen=0)  # the user's XADD ... MAXLEN
    engine = RedisRetryEngine(client, [(stream, GROUP)], claim_idle_ms=60_000)
    assert engine.claimer is not None
    keys = engine.keys(stream)
    with caplog.at_level(logging.WARNING, logger="faststream_retry.redis"):
        assert await engine.claimer.claim_once(keys, GROUP) == 0  # nothing is idle 60 s
    dropped = [r.getMessage() for r in caplog.records if "gone from the stream" in r.message]
    assert len(dropped) == 1
    assert dropped[0].startswith(f"2 entries of {stream} ")
    assert (await client.xpending(stream, GROUP))["pending"] == 0
    assert await engine.retry_later(later, delay_ms=0, headers=retry_headers(later, 0))
    assert await engine.dead_letter(dead, headers={h.REASON: "exhausted"}) is True
    moved, _, _ = await engine.mover.move_once(keys)
    assert moved == 1
    ((_, copy),) = await read_stream(client, stream)
    assert json.loads(copy.body) == {"id": 0}
    ((_, letter),) = await read_stream(client, keys.dlq)
    assert json.loads(letter.body) == {"id": 1}


async def test_failures_of_many_trimmed_entries_say_so_once_not_once_each(
    client: Redis, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer's MAXLEN below its backlog trims every entry a handler holds: each dead
    letter is still written from the handler's copy, and the log says it once a minute per
    stream (with how many more at the next line), not once per letter."""
    entries = await pending_entries(client, stream, 5)
    await client.xtrim(stream, maxlen=0)
    engine = RedisRetryEngine(client, [(stream, GROUP)], claim_idle_ms=60_000)
    assert engine.claimer is not None
    await engine.claimer.claim_once(engine.keys(stream), GROUP)  # drops them from the PEL
    with caplog.at_level(logging.WARNING, logger="faststream_retry.redis"):
        for entry in entries:
            assert await engine.dead_letter(entry, headers={h.REASON: "exhausted"}) is True
    said = [r for r in caplog.records if "when its failure was settled" in r.message]
    assert len(said) == 1
    assert await client.xlen(engine.keys(stream).dlq) == 5


async def test_copies_due_to_a_stream_whose_group_was_deleted_wait_in_the_schedule(
    client: Redis, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator's XGROUP DESTROY: a group made again starts at $, so a copy moved into the
    stream meanwhile would never be read. The copies wait, said once, and move once it is back."""
    (entry,) = await pending_entries(client, stream, 1)
    engine = RedisRetryEngine(client, [(stream, GROUP)])
    keys = engine.keys(stream)
    assert await engine.retry_later(entry, delay_ms=0, headers=retry_headers(entry, 0))
    await client.xgroup_destroy(stream, GROUP)
    with caplog.at_level(logging.WARNING, logger="faststream_retry.redis"):
        assert (await engine.mover.move_once(keys))[0] == 0
        assert (await engine.mover.move_once(keys))[0] == 0
    assert len([r for r in caplog.records if "is missing" in r.message]) == 1
    assert await client.zcard(keys.schedule) == 1
    await client.delete(stream)
    assert (await engine.mover.move_once(keys))[0] == 0, "nor into a deleted stream"
    assert not await client.exists(stream)
    await client.xgroup_create(stream, GROUP, id="$", mkstream=True)
    assert (await engine.mover.move_once(keys))[0] == 1
    reply: Any = await client.xreadgroup(GROUP, "c2", {stream: ">"}, count=10)
    assert [len(batch) for _, batch in reply] == [1], "the moved copy is read"


async def test_a_new_head_wakes_a_sleeping_mover_at_its_due_time(
    redis_url: str, client: Redis, stream: str
) -> None:
    """A mover asleep for its 5 s cap moves a copy due in 300 ms on time: the nudge woke it.

    And it does not poll meanwhile: a handful of scripts, not one per few milliseconds.
    """
    (entry,) = await pending_entries(client, stream, 1)
    mover_client = Redis.from_url(redis_url)
    engine = RedisRetryEngine(mover_client, [(stream, GROUP)], cap_s=5.0)
    try:
        await engine.start()
        await asyncio.wait_for(engine.mover.listening.wait(), 10)
        # Its look once subscribed: then it sleeps its cap, the schedule being empty.
        await eventually(lambda: engine.mover.wakes >= 2, what="the mover's look once subscribed")
        start = asyncio.get_running_loop().time()
        assert await engine.retry_later(entry, delay_ms=300, headers=retry_headers(entry, 300))
        await eventually(lambda: engine.mover.moved == 1, timeout=3.0, what="the copy moved")
        waited = asyncio.get_running_loop().time() - start
        assert waited >= 0.3
        assert engine.mover.wakes <= 5, f"{engine.mover.wakes} scripts for one copy"
    finally:
        await engine.stop()
        await mover_client.aclose()


async def test_a_server_that_forgot_the_scripts_is_sent_them_again(
    client: Redis, stream: str
) -> None:
    """After SCRIPT FLUSH (a restart, a failover) EVALSHA's NOSCRIPT loads the script again."""
    entries = await pending_entries(client, stream, 2)
    engine = RedisRetryEngine(client, [(stream, GROUP)])
    assert await engine.retry_later(entries[0], delay_ms=0, headers=retry_headers(entries[0], 0))
    await client.script_flush()
    assert await engine.retry_later(entries[1], delay_ms=0, headers=retry_headers(entries[1], 0))
    moved, head, _ = await engine.mover.move_once(engine.keys(stream))
    assert (moved, head) == (2, -1)


@pytest.mark.parametrize("denied", ["hset", "xadd"])
async def test_a_step_stopped_part_way_leaves_the_entry_pending(
    redis_url: str, client: Redis, stream: str, denied: str
) -> None:
    """A script that stops before its write (here an ACL user denied HSET or XADD) acks nothing.

    Redis keeps what a script wrote before a command failed: were the XACK first, the
    entry would be acknowledged with no copy or letter stored, and the message lost.
    """
    user = f"no-{denied}-{stream}"
    await client.acl_setuser(
        user,
        enabled=True,
        nopass=True,
        keys=["*"],
        channels=["*"],
        commands=["+@all", f"-{denied}"],
    )
    limited = Redis.from_url(redis_url, username=user)
    try:
        (entry,) = await pending_entries(client, stream, 1)
        engine = RedisRetryEngine(limited, [(stream, GROUP)])
        step = (
            engine.retry_later(entry, delay_ms=0, headers=retry_headers(entry, 0))
            if denied == "hset"
            else engine.dead_letter(entry, headers={h.REASON: "exhausted"})
        )
        with pytest.raises(ResponseError):  # the server names the command it refused
            await step
        assert (await client.xpending(stream, GROUP))["pending"] == 1, "the entry was acked"
    finally:
        await limited.aclose()
        await client.acl_deluser(user)


async def test_a_keep_alive_pass_leaves_a_fresh_read_alone_and_resets_it_half_a_pass_later(
    client: Redis, stream: str
) -> None:
    """A read FastStream has just made (idle 0 ms) costs a pass nothing: not listed, not
    XCLAIMed; half a pass later the same entries are reset, long before the idle time.
    With an entry abandoned on the stream every pending one is listed (``seen``), fresh or
    not, so the abandoned one is not forgotten."""
    from faststream_retry.redis.claimer import Claimer  # noqa: PLC0415
    from faststream_retry.redis.keys import stream_keys  # noqa: PLC0415

    entries = await pending_entries(client, stream, 30)
    keys = stream_keys(stream)

    async def settle(_: StreamEntry) -> None:
        raise AssertionError("nothing is idle enough to be claimed")

    claimer = Claimer(client, [(keys, GROUP)], consumer="x", idle_ms=1000, settle=settle, born=0)
    with claimer.holding(stream, "c1", entries[0].id):
        seen: set[str] = set()
        assert await claimer.keep_alive_once(keys, GROUP, "c1", seen) == 0, "a fresh read"
        assert seen == set()
        await asyncio.sleep(0.2)  # a pass is 250 ms here: idle for half of one or more
        assert await claimer.keep_alive_once(keys, GROUP, "c1") == 30
        rows = await client.xpending_range(stream, GROUP, min="-", max="+", count=100)
        assert all(int(r["time_since_delivered"]) < 100 for r in rows), "reset by the pass"
        claimer.abandon(stream, entries[5].id)
        seen = set()
        assert await claimer.keep_alive_once(keys, GROUP, "c1", seen) == 29, "not the abandoned"
        assert seen == {e.id for e in entries}, "every pending one listed, fresh or not"
