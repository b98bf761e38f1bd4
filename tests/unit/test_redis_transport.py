"""The Redis transport's pure parts: key naming, FastStream's envelope, a claim's step, server checks."""

from __future__ import annotations

import asyncio
import json

import pytest
from faststream.redis.parser import BinaryMessageFormatV1
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from faststream_retry.core import headers as h
from faststream_retry.core.policy import Fixed, RetryPolicy
from faststream_retry.errors import RetryConfigError
from faststream_retry.redis import envelope, lua
from faststream_retry.redis.checks import Server, problems
from faststream_retry.redis.claimer import CONSUMER_LOST, claimed_step
from faststream_retry.redis.keys import hash_tag, stream_keys
from faststream_retry.redis.steps import StreamEntry


@given(st.text(alphabet="ab{}.:-", max_size=12) | st.text(max_size=12))
def test_every_key_of_a_stream_is_in_its_slot_or_the_name_is_refused(name: str) -> None:
    """Whatever the name: all keys one step touches share the stream's slot, or it is refused."""
    if name == "" or ("}" in name and hash_tag(name) is None):
        with pytest.raises(RetryConfigError):
            stream_keys(name)
        return
    keys = stream_keys(name)
    slot = key_slot(name.encode())
    for key in (keys.schedule, keys.data, keys.dlq):
        assert key_slot(key.encode()) == slot, key


@pytest.mark.parametrize(
    ("stream", "schedule"),
    [
        ("orders", "{orders}.retry"),
        ("{tenant}.orders", "{tenant}.orders.retry"),
        ("a{b", "{a{b}.retry"),
    ],
)
def test_keys_follow_the_documented_names(stream: str, schedule: str) -> None:
    """The names docs/explanation/redis-design.md gives."""
    keys = stream_keys(stream)
    assert keys.schedule == schedule
    assert keys.data == schedule + ".data"
    assert keys.dlq == schedule.removesuffix(".retry") + ".dlq"
    assert keys.wake == schedule + ".wake"


@pytest.mark.parametrize("stream", ["a}b", "{}x"])
def test_a_name_no_tag_can_follow_is_refused_with_the_fix(stream: str) -> None:
    """The error names the stream and both fixes."""
    with pytest.raises(RetryConfigError, match="Rename the stream") as refused:
        stream_keys(stream)
    assert repr(stream) in str(refused.value)
    assert "hash tag" in str(refused.value)


def test_a_copy_reads_back_in_faststream_with_non_ascii_headers() -> None:
    """The copy's headers (an error text in Greek, a history table) arrive intact in FastStream."""
    failure = h.FailureRecord(attempt=2, at_ms=1, exception="E", error="σφάλμα ☃", delay_ms=5)
    headers = h.retry_headers({"content-type": "application/json"}, failure, 6)
    wire = envelope.to_wire(headers)
    raw = envelope.build(b'{"id": 1}', wire)
    body, parsed = BinaryMessageFormatV1.parse(raw)
    assert body == b'{"id": 1}'
    assert parsed == wire
    back = envelope.from_wire(parsed)
    assert h.read_attempt(back) == 2
    assert h.read_history(back)[0]["error"] == "σφάλμα ☃"
    assert h.read_due(back) == 6


def test_faststreams_own_writer_garbles_a_non_ascii_header() -> None:
    """Why the transport writes copies itself: FastStream 0.7.8 counts characters, not bytes.

    Its parser then gives up and hands over the raw entry with no headers. When this
    fails, FastStream has fixed it; the transport's own writer is right either way.
    """
    raw = asyncio.run(
        BinaryMessageFormatV1.encode(
            message=b"body", reply_to=None, headers={"e": "é"}, correlation_id="c"
        )
    )
    body, headers = BinaryMessageFormatV1.parse(raw)
    assert (body, headers) == (raw, {})


def test_faststreams_own_envelopes_are_read_as_faststream_reads_them() -> None:
    """Binary (FastStream's writer), the JSON envelope, and a plain producer's fields."""
    raw = asyncio.run(
        BinaryMessageFormatV1.encode(
            message={"id": 1}, reply_to=None, headers={"k": "v"}, correlation_id="c"
        )
    )
    binary = envelope.parse({envelope.DATA_FIELD: raw})
    assert (json.loads(binary.body), binary.headers["k"]) == ({"id": 1}, "v")
    legacy = json.dumps({"data": "x", "headers": {"retry-attempt": 3}}).encode()
    assert envelope.parse({envelope.DATA_FIELD: legacy}) == envelope.Envelope(
        b"x", {"retry-attempt": 3}
    )
    plain = envelope.parse({b"a": b"1"})
    assert (json.loads(plain.body), plain.headers) == ({"a": "1"}, {})
    garbage = envelope.parse({envelope.DATA_FIELD: b"\x89BIN\r\n\x1a\n\x00\x01\xff"})
    assert garbage == envelope.Envelope(b"\x89BIN\r\n\x1a\n\x00\x01\xff", {})


@given(st.binary(max_size=64))
def test_any_entry_parses_without_raising(data: bytes) -> None:
    """Hostile bytes in ``__data__`` never raise: at worst the entry is its own body."""
    envelope.parse({envelope.DATA_FIELD: data})
    envelope.parse({envelope.DATA_FIELD: envelope._MAGIC + data})


def test_a_header_longer_than_the_format_holds_is_refused() -> None:
    """FastStream's binary format counts a header in 16 bits."""
    with pytest.raises(envelope.EnvelopeTooLarge):
        envelope.build(b"", {"k": "x" * 70_000})


POLICY = RetryPolicy(max_attempts=3, backoff=Fixed(2))


def test_a_claimed_entry_counts_as_an_attempt_and_is_retried() -> None:
    """A first delivery lost with its consumer: attempt 1, retried after the backoff."""
    step = claimed_step({}, stream="s", policy=POLICY, idle_ms=1000, now_ms=10)
    assert not step.dead_letter
    assert step.delay_ms == 2000
    assert h.read_attempt(step.headers) == 1
    assert h.read_due(step.headers) == 2010
    assert h.read_history(step.headers)[0]["exception"] == CONSUMER_LOST


def test_a_claimed_entry_on_its_last_attempt_is_dead_lettered() -> None:
    """Two failures before, lost on the third: exhausted, with the consumer's loss recorded."""
    step = claimed_step({h.ATTEMPT: "2"}, stream="s", policy=POLICY, idle_ms=1000, now_ms=10)
    assert step.dead_letter
    assert step.headers[h.REASON] == "exhausted"
    assert step.headers[h.EXCEPTION] == CONSUMER_LOST
    assert step.headers[h.ORIGIN_QUEUE] == "s"


def _server(**changes: object) -> Server:
    fields: dict[str, object] = {
        "flavour": "redis",
        "version": (7, 0),
        "maxmemory_policy": "noeviction",
        "role": "master",
        "scripting": None,
        "groups": {"s": 1},
    }
    fields.update(changes)
    return Server(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"version": (6, 2)}, "Redis 7.0 or later"),
        ({"flavour": "valkey", "version": (7, 0)}, "Valkey 7.2 or later"),
        ({"version": None}, "an unknown version"),
        ({"scripting": "NOPERM"}, "+@scripting"),
        ({"maxmemory_policy": "allkeys-lru"}, "noeviction"),
        ({"role": "slave"}, "the primary"),
        ({"groups": {"s": 2}}, "a stream of its own"),
    ],
)
def test_each_server_problem_is_named_with_its_fix(changes: dict[str, object], says: str) -> None:
    """One problem each, its fix in the text; a fine server has none."""
    assert problems(_server()) == []
    (found,) = problems(_server(**changes))
    assert says in found


def test_an_entry_is_read_from_faststreams_raw_message() -> None:
    """What a stream subscriber's ``msg.raw_message`` holds, as FastStream 0.7 builds it."""
    raw = {"type": "stream", "channel": "s", "message_ids": [b"1-2"], "data": {b"a": b"1"}}
    entry = StreamEntry.from_raw(raw, "g")
    assert (entry.stream, entry.group, entry.id, entry.fields) == ("s", "g", "1-2", {b"a": b"1"})
    assert entry.incoming_headers() == {}


@pytest.mark.timeout(10)
async def test_a_task_that_swallows_a_cancellation_is_stopped_all_the_same() -> None:
    """redis-py's client and Python 3.11's wait_for can eat a cancel: stop_tasks cancels again."""
    from faststream_retry.redis.tasks import stop_tasks  # noqa: PLC0415

    swallowed: list[int] = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:  # noqa: PERF203 - the loop is the point
                if len(swallowed) >= 2:
                    raise
                swallowed.append(1)  # as a command in flight would: the loop goes on

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_tasks([task]), 5)
    assert task.cancelled()
    assert len(swallowed) == 2


@given(
    due=st.integers(min_value=0, max_value=10**13),
    outcome=st.sampled_from([lua.WRITTEN, lua.FROM_MEMORY, lua.ALREADY_WRITTEN]),
)
def test_the_retry_script_s_one_integer_reply_splits_into_its_outcome_and_due(
    due: int, outcome: int
) -> None:
    """RETRY_LATER answers ``due * 4 + outcome`` (one reply line): split back exactly, to the
    year 2286; an entry another consumer settled answers 0, nothing scheduled (due -1)."""
    assert lua.split_due(due * 4 + outcome) == (outcome, due)
    assert lua.split_due(0) == (lua.SETTLED_ELSEWHERE, -1)
