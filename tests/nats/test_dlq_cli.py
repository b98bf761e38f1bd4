"""``faststream-retry dlq ... --url nats://`` on a real server, counted by id.

The app dead-letters its messages (PermanentError while ``broken``); the commands list,
show, replay, purge, export and import them. Listing changes nothing in the stream (the
same sequences before and after, no consumer made); a replay hands each dead letter to
its own subscriber once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from faststream.nats import JStream, NatsBroker, NatsMessage

from faststream_retry import PermanentError
from faststream_retry.ops.common import OperationError
from faststream_retry.ops.dlq_open import open_store
from faststream_retry.ops.dlq_store import Stored, replay_dead_letters
from faststream_retry.ops.nats_dlq import NatsStore
from tests.cli import run_cli
from tests.nats.helpers import drained, running, stream_count, stream_messages
from tests.nats.test_retries import BULK, middleware
from tests.rabbit import eventually_async as until

if TYPE_CHECKING:
    from pathlib import Path

    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(300)]


class App:
    """A NATS app whose handler dead-letters every message while ``broken``."""

    def __init__(self, url: str, names: Names) -> None:
        self.stream = names.stream()
        self.subject = names.subject()
        self.dlq = f"{names.prefix}-dlq-{self.stream}"
        self.key = f"{self.stream}.d"
        self.broken = True
        self.done: Counter[int] = Counter()
        self.at: list[float] = []
        """When each handled call came (``time.monotonic``)."""
        self.broker = NatsBroker(url, middlewares=[middleware(names)], logger=None)

        @self.broker.subscriber(
            self.subject, stream=JStream(self.stream, subjects=[self.subject]), durable="d"
        )
        async def handle(body: dict[str, Any], message: NatsMessage) -> None:
            if self.broken:
                raise PermanentError(f"message {body['id']}")
            self.done[int(body["id"])] += 1
            self.at.append(time.monotonic())

    async def send(self, n: int) -> None:
        for i in range(n):
            await self.broker.publish(
                {"id": i},
                self.subject,
                stream=self.stream,
                timeout=BULK,
                headers={"message_id": f"m{i}", "x-app": f"v{i}", "x-name": "café: ünï"},
            )


async def dead(js: JetStreamContext, app: App, n: int) -> None:
    async def enough() -> bool:
        return await stream_count(js, app.dlq) >= n

    await until(enough, 60, f"{n} dead letters in {app.dlq}")


async def cli(nats_url: str, names: Names, *args: str) -> Any:
    done = await run_cli(*args, "--url", nats_url, "--prefix", names.prefix, "--json", url=None)
    assert done.status == 0, (done.stdout, done.stderr)
    return done.json()


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["message_id"] for row in rows]


async def test_list_reads_without_consuming_and_says_when_it_is_not_whole(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """250 dead letters: list says complete false at 100, true at 300; the stream unchanged."""
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(250)
        await dead(js, app, 250)
    before = await stream_messages(js, app.dlq)
    consumers_before = (await js.stream_info(app.dlq)).state.consumer_count
    first = await cli(nats_url, names, "dlq", "list", app.stream)
    assert first["format"] == 1
    assert first["queue"] == app.dlq
    assert first["complete"] is False
    assert first["limit"] == 100
    assert ids(first["dead_letters"]) == [f"m{i}" for i in range(100)]
    assert first["in_queue_before"] == 250
    row = first["dead_letters"][0]
    assert row["reason"] == "permanent"
    assert row["origin_queue"] == app.key
    assert row["position"] == 1
    whole = await cli(nats_url, names, "dlq", "list", app.key, "--limit", "300")
    assert whole["complete"] is True
    assert ids(whole["dead_letters"]) == [f"m{i}" for i in range(250)]
    exact = await cli(nats_url, names, "dlq", "list", app.dlq, "--limit", "250")
    assert exact["complete"] is True, "exactly the limit: nothing more"
    assert await stream_messages(js, app.dlq) == before, "nothing moved, nothing removed"
    assert (await js.stream_info(app.dlq)).state.consumer_count == consumers_before == 0
    shown = await cli(nats_url, names, "dlq", "show", app.stream, "m7")
    assert json.loads(json.dumps(shown["body"])) == {"id": 7}
    assert shown["headers"]["x-app"] == "v7"
    assert shown["headers"]["x-name"] == "café: ünï", "a header that is not ASCII, as it was"
    assert shown["reason"] == "permanent"


async def test_replay_hands_each_dead_letter_to_its_subscriber_once(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """300 replayed by two commands at once: the stream empties, every id is handled once."""
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(300)
        await dead(js, app, 300)
        app.broken = False
        dry = await cli(nats_url, names, "dlq", "replay", app.stream, "--dry-run")
        assert len(dry["selected"]) == 300
        assert await stream_count(js, app.dlq) == 300, "a dry run moves nothing"
        # Two operators at once: both publish each copy, with the same Nats-Msg-Id, and the
        # server keeps one; only one of them deletes each dead letter.
        one, two = await asyncio.gather(
            cli(nats_url, names, "dlq", "replay", app.stream),
            cli(nats_url, names, "dlq", "replay", app.stream),
        )
        # One may find nothing left (the other took all): it names no subscriber then.
        assert all(answer["to"] == app.key for answer in (one, two) if answer["moved"])
        assert one["moved"] + two["moved"] == 300

        async def handled() -> bool:
            return sum(app.done.values()) >= 300

        await until(handled, 60, "300 replayed messages handled")
        assert await stream_count(js, app.dlq) == 0
    assert app.done == dict.fromkeys(range(300), 1), "each id once, none twice"


async def test_replay_keeps_to_the_rate(nats_url: str, names: Names, js: JetStreamContext) -> None:
    """10 at --rate 20: the first and last are handled at least 9/20 s apart, as on RabbitMQ."""
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(10)
        await dead(js, app, 10)
        app.broken = False
        replayed = await cli(nats_url, names, "dlq", "replay", app.stream, "--rate", "20")
        assert replayed["moved"] == 10

        async def handled() -> bool:
            return len(app.at) >= 10

        await until(handled, 60, "10 replayed messages handled")
    assert app.done == dict.fromkeys(range(10), 1)
    assert app.at[-1] - app.at[0] >= 9 / 20 * 0.9


async def test_replay_to_a_subscriber_that_never_ran_is_refused(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """--to a key with no hand-over consumer: exit 3, nothing replayed."""
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(3)
        await dead(js, app, 3)
    done = await run_cli(
        "dlq",
        "replay",
        app.stream,
        "--to",
        f"{app.stream}.nobody",
        "--url",
        nats_url,
        "--prefix",
        names.prefix,
        url=None,
    )
    assert done.status == 3
    assert "nothing was replayed" in done.stderr
    assert await stream_count(js, app.dlq) == 3


async def test_purge_and_export_import_round_trip(
    nats_url: str, names: Names, js: JetStreamContext, tmp_path: Path
) -> None:
    """Export, purge from the export, import: the same bodies and headers back."""
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(20)
        await dead(js, app, 20)
    before = await stream_messages(js, app.dlq)
    file = tmp_path / "dead.jsonl"
    exported = await cli(nats_url, names, "dlq", "export", app.stream, str(file))
    assert len(exported["exported"]) == 20
    assert len(file.read_text().splitlines()) == 20
    purged = await run_cli(
        "dlq",
        "purge",
        app.stream,
        "--from-export",
        str(file),
        "--yes",
        "--json",
        "--url",
        nats_url,
        "--prefix",
        names.prefix,
        url=None,
    )
    assert purged.status == 0, purged.stderr
    assert purged.json()["not_found"] == 0
    assert await stream_count(js, app.dlq) == 0
    imported = await cli(nats_url, names, "dlq", "import", str(file))
    assert imported["published"] == 20
    after = await stream_messages(js, app.dlq)

    def same(found: list[tuple[str, bytes, dict[str, Any]]]) -> list[Any]:
        return [(s, b, {k: v for k, v in hs.items() if k != "Nats-Msg-Id"}) for s, b, hs in found]

    assert same(after) == same(before), "byte-identical bodies and headers, same subjects"
    some = await cli(nats_url, names, "dlq", "purge", app.stream, "--id", "m3", "--yes")
    assert some["removed"] == 1
    assert await stream_count(js, app.dlq) == 19


async def test_a_failed_export_leaves_the_old_file(
    nats_url: str, names: Names, js: JetStreamContext, tmp_path: Path
) -> None:
    """An export that fails (no such dead-letter stream) never touches FILE."""
    file = tmp_path / "old.jsonl"
    file.write_text("old\n")
    done = await run_cli(
        "dlq",
        "export",
        "NOSUCH",
        str(file),
        "--force",
        "--url",
        nats_url,
        "--prefix",
        names.prefix,
        url=None,
    )
    assert done.status == 3, done.stderr
    assert file.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["old.jsonl"]


async def test_a_replay_killed_between_a_puback_and_its_delete_duplicates_nothing(
    nats_url: str, names: Names, js: JetStreamContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 10th delete fails after its copy was confirmed; run again, each id is handled once.

    The copy's Nats-Msg-Id is made of the dead letter's place and stored time: the second
    run's copy of the 10th is dropped by the server as a duplicate, then the letter deleted.
    """
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(50)
        await dead(js, app, 50)
        app.broken = False
        real = NatsStore.remove
        calls = 0

        async def dies_at_the_tenth(self: NatsStore, letter: Stored) -> bool:
            nonlocal calls
            calls += 1
            if calls == 10:
                raise OperationError("killed between the PubAck and the delete")
            return await real(self, letter)

        monkeypatch.setattr(NatsStore, "remove", dies_at_the_tenth)
        async with open_store(nats_url, app.stream, prefix=names.prefix) as store:
            with pytest.raises(OperationError, match="9 replayed before it"):
                await replay_dead_letters(store)
        assert await stream_count(js, app.dlq) == 41, "the 10th stays, its copy is out"
        monkeypatch.setattr(NatsStore, "remove", real)
        async with open_store(nats_url, app.stream, prefix=names.prefix) as store:
            again = await replay_dead_letters(store)
        assert again.done is not None
        assert again.done.moved == 41

        async def handled() -> bool:
            return sum(app.done.values()) >= 50

        await until(handled, 60, "50 replayed messages handled")
        await drained(js, names.prefix)  # a second copy of the 10th would be there
    assert app.done == dict.fromkeys(range(50), 1), "the 10th once, not twice"
    assert await stream_count(js, app.dlq) == 0
