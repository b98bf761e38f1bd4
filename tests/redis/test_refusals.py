"""What the plugin refuses at start on a ``RedisBroker`` beyond a subscriber's own kind, and
``doctor`` saying the same: covered streams whose keys would be shared, and FastStream's
own claiming of pending entries beside the plugin's claimer. The start's checks need no
server (the first tests); doctor runs on the test server, as an operator runs it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from faststream.redis import RedisBroker, StreamSub

from faststream_retry import RetryConfigError, RetryMiddleware, retry_policy
from faststream_retry.redis.keys import stream_keys
from tests.cli import run_cli
from tests.redis.test_doctor import APP, by_check

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


def refused(*subs: StreamSub, off: tuple[str, ...] = ()) -> str:
    """The start's refusal of a broker reading ``subs`` (``off``: retries off); ``""``: none."""
    broker = RedisBroker("redis://127.0.0.1:1")  # never reached: checked before any network
    for sub in subs:

        async def handle(body: Any) -> None: ...

        if sub.name in off:
            handle = retry_policy(enabled=False)(handle)
        broker.subscriber(stream=sub)(handle)
    retry = RetryMiddleware()
    broker.insert_middleware(retry)
    try:
        retry.runtime(broker).check(retry)
    except RetryConfigError as exc:
        return str(exc)
    return ""


def sub(name: str, **options: Any) -> StreamSub:
    return StreamSub(name, group="g", consumer="c", **options)


@pytest.mark.parametrize(
    ("first", "second"), [("orders", "{orders}"), ("a{b", "{a{b}"), ("{t}.o", "{t}.o")]
)
def test_two_covered_streams_that_would_share_their_keys_are_refused(
    first: str, second: str
) -> None:
    """``orders`` and ``{orders}`` get the same schedule, copies and dead letters: each one's
    mover would move the other's copies into its own stream, and equal entry ids overwrite a
    copy. Refused, both named, with the fix; one of them with retries off passes, and a
    stream read by two subscribers is one stream, not a clash.

    Found in review: nothing refused them (the proof test built the engine: did not raise).
    """
    assert stream_keys(first).schedule == stream_keys(second).schedule
    text = refused(sub(first), sub(second))
    if first == second:
        assert text == ""
        return
    one, two = sorted((first, second))
    assert f"streams {one!r} and {two!r} are both covered" in text
    assert f"would share their retry keys ('{stream_keys(first).schedule}'" in text
    assert "Rename one of them" in text
    assert len(text.splitlines()) == 2, text
    assert refused(sub(first), sub(second), off=(second,)) == ""


def test_a_covered_stream_named_as_another_ones_key_is_refused() -> None:
    """A covered ``{orders}.dlq`` would get the dead letters of ``orders`` (and a dlq purge of
    ``orders`` would delete its messages); ``{orders}.retry.data`` is the hash of its copies.
    A stream merely ending ``.dlq`` (``orders.dlq``) is nobody's key: it passes."""
    text = refused(sub("orders"), sub("{orders}.dlq"), sub("{orders}.retry.data"))
    assert (
        "streams 'orders' and '{orders}.dlq' are both covered, and '{orders}.dlq' is the "
        "dead-letter stream of 'orders'"
    ) in text
    assert "a dlq purge of 'orders' would delete the messages of '{orders}.dlq'" in text
    assert "'{orders}.retry.data' is the hash of retry copies of 'orders'" in text
    assert "Rename '{orders}.dlq'" in text
    assert len(text.splitlines()) == 3, text
    assert refused(sub("orders"), sub("orders.dlq")) == ""


@pytest.mark.parametrize("option", ["min_idle_time", "claim_min_idle_time"])
def test_a_covered_stream_that_faststream_claims_itself_is_refused(option: str) -> None:
    """FastStream's ``StreamSub(min_idle_time=...)`` (``XAUTOCLAIM``) or
    ``claim_min_idle_time`` (``XREADGROUP ... CLAIM``) beside the plugin's claimer: two
    claimers, and FastStream's takes entries a live replica holds in its read-ahead, so they
    are handled twice, with no attempt counted. Refused with the fix; with retries off the
    stream is not covered and passes.

    Found in review: neither option was read.
    """
    text = refused(sub("orders", **{option: 30_000}))
    assert "the subscriber of stream 'orders' claims pending entries itself " in text
    assert f"(StreamSub({option}=30000))" in text
    assert f"Leave {option} out" in text
    assert "RetryMiddleware(claim_idle=...)" in text
    assert refused(sub("orders", **{option: 30_000}), off=("orders",)) == ""


async def test_doctor_says_what_the_start_refuses(
    redis_url: str, stream: str, tmp_path: Path
) -> None:
    """doctor on an app covering ``S`` and ``{S}``, and one claiming with min_idle_time: the
    start's refusal as an action (exit 1), every stream still examined."""
    app = (
        APP.format(url=redis_url, stream=stream)
        + f"""

@broker.subscriber(stream=StreamSub({"{" + stream + "}"!r}, group="ship", consumer="c1"))
async def tagged(body: str) -> None: ...


@broker.subscriber(stream=StreamSub({stream + "-claims"!r}, group="ship", consumer="c1",
                                    min_idle_time=1000))
async def claims(body: str) -> None: ...
"""
    )
    (tmp_path / "shop.py").write_text(app)

    done = await run_cli("doctor", "shop:app", "--json", url=None, cwd=tmp_path)

    assert done.status == 1, done.stderr
    found = by_check(done.json())
    (wiring,) = found["wiring"]
    assert wiring["severity"] == "action"
    assert f"streams {stream!r} and {'{' + stream + '}'!r} are both covered" in wiring["what"]
    assert f"stream '{stream}-claims' claims pending entries itself" in wiring["what"]
    assert len(found["stream"]) == 3
