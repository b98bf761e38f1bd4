"""Nothing an operator types destroys data, and every answer is whole or says it is not.

The console script against a real broker: an export that fails in any way (a wrong
queue name, the broker gone mid-way, a ``kill -9``) leaves an existing file byte for byte
as it was and no new one; ``dlq list --json`` marks a cut list; a replay's target is
checked before anything moves, for a dry run as for a real one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from faststream_retry.web import create_app
from tests.cli import environment, run_cli, script
from tests.faults.proxy import CuttingProxy
from tests.integration.test_cli_dlq import declare, delete, ids_in, seed
from tests.integration.test_cli_web import serving
from tests.rabbit import unique

if TYPE_CHECKING:
    from pathlib import Path

    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

OLD = b'{"an": "earlier export", "the only copy": true}\n' * 1000


@pytest.fixture
async def dead(amqp: AbstractRobustConnection) -> Any:
    """A work queue with a quorum ``.dlq`` (a pass republishes every message: the slow kind)."""
    name = unique("safe")
    await declare(amqp, name, "classic")
    await declare(amqp, f"{name}.dlq", "quorum")
    yield name
    await delete(amqp, name, f"{name}.dlq")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name)


async def test_a_failed_export_leaves_an_existing_file_as_it_was_and_makes_no_new_one(
    rabbit_url: str, tmp_path: Path
) -> None:
    """The issue's repro: a mistyped queue used to truncate the file before anything was checked."""
    keep = tmp_path / "keep.jsonl"
    keep.write_bytes(OLD)
    for force in ([], ["--force"]):
        wrong = await run_cli(
            "dlq", "export", unique("invoicez"), str(keep), *force, url=rabbit_url
        )
        assert wrong.status == 3, wrong.stderr
        assert keep.read_bytes() == OLD
    new = tmp_path / "new.jsonl"
    wrong = await run_cli("dlq", "export", unique("invoicez"), str(new), url=rabbit_url)
    assert wrong.status == 3
    assert "does not exist" in wrong.stderr
    assert not new.exists()
    assert leftovers(tmp_path) == []


async def test_an_existing_file_is_replaced_only_when_asked(
    amqp: AbstractRobustConnection, rabbit_url: str, dead: str, tmp_path: Path
) -> None:
    """Refused before the broker is asked anything; with --force, replaced once complete."""
    await seed(amqp, dead, [("m1", "exhausted", b"x", None)])
    keep = tmp_path / "keep.jsonl"
    keep.write_bytes(OLD)
    refused = await run_cli("dlq", "export", dead, str(keep), url="amqp://guest:guest@127.0.0.1:1/")
    assert refused.status == 3
    assert "exists" in refused.stderr
    assert "--force" in refused.stderr
    assert "cannot connect" not in refused.stderr  # refused before connecting
    assert keep.read_bytes() == OLD
    replaced = await run_cli("dlq", "export", dead, str(keep), "--force", url=rabbit_url)
    assert replaced.status == 0, replaced.stderr
    assert [line for line in keep.read_text().splitlines() if '"m1"' in line]
    assert len(keep.read_text().splitlines()) == 1
    assert await ids_in(amqp, f"{dead}.dlq") == ["m1"]  # an export moves nothing


async def _export_in_background(url: str, queue: str, target: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *script(),
        "dlq",
        "export",
        queue,
        str(target),
        "--force",
        env=environment(url, PYTHONFAULTHANDLER="1"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def _partial_has_data(folder: Path, process: asyncio.subprocess.Process) -> None:
    """Wait until the export has written a first part of its temporary file."""
    deadline = time.monotonic() + 60
    while not any((folder / name).stat().st_size > 0 for name in leftovers(folder)):
        assert process.returncode is None, "the export ended before it was interrupted"
        assert time.monotonic() < deadline, "the export never started writing"
        await asyncio.sleep(0.01)


async def _stderr_within(process: asyncio.subprocess.Process, seconds: float) -> str:
    """The process's stderr once it exits; if it hangs, its threads' stacks in the failure."""
    try:
        _, err = await asyncio.wait_for(process.communicate(), seconds)
    except asyncio.TimeoutError:
        process.send_signal(signal.SIGABRT)  # faulthandler (PYTHONFAULTHANDLER) dumps stacks
        _, err = await process.communicate()
        pytest.fail(f"the export did not exit within {seconds} s:\n{err.decode()}")
    return err.decode()


@pytest.fixture
async def big(amqp: AbstractRobustConnection, dead: str, tmp_path: Path) -> tuple[list[str], Path]:
    """3,000 dead letters in ``dead``'s quorum .dlq (an export of a few seconds), and an
    earlier export at ``keep.jsonl``."""
    ids = [f"m{i:04}" for i in range(3000)]
    await seed(amqp, dead, [(i, "exhausted", i.encode() * 40, None) for i in ids])
    keep = tmp_path / "keep.jsonl"
    keep.write_bytes(OLD)
    return ids, keep


async def test_a_broker_gone_mid_export_leaves_the_old_file(
    amqp: AbstractRobustConnection,
    rabbit_url: str,
    dead: str,
    tmp_path: Path,
    big: tuple[list[str], Path],
) -> None:
    ids, keep = big
    parts = urlsplit(rabbit_url)
    assert parts.port is not None
    proxy = CuttingProxy(parts.port)
    await proxy.start()
    try:
        via_proxy = urlunsplit(
            parts._replace(netloc=f"{parts.netloc.rsplit(':', 1)[0]}:{proxy.port}")
        )
        process = await _export_in_background(via_proxy, dead, keep)
        await _partial_has_data(tmp_path, process)
        proxy.cut_all()
        err = await _stderr_within(process, 60)
    finally:
        await proxy.close()
    assert process.returncode == 3, err
    assert "connection to the broker broke" in err
    # One line that says what happened, not aiormq's unretrieved futures under it.
    assert "Traceback" not in err, err
    assert keep.read_bytes() == OLD
    assert leftovers(tmp_path) == []
    # What the pass had in flight may now be there twice; nothing is lost.
    assert set(await ids_in(amqp, f"{dead}.dlq")) == set(ids)


async def test_a_kill_9_mid_export_leaves_the_old_file(
    rabbit_url: str, dead: str, tmp_path: Path, big: tuple[list[str], Path]
) -> None:
    _, keep = big
    process = await _export_in_background(rabbit_url, dead, keep)
    await _partial_has_data(tmp_path, process)
    os.kill(process.pid, signal.SIGKILL)
    await process.wait()
    assert keep.read_bytes() == OLD
    # The half-written file keeps a name of its own, never the target's.
    assert [name.startswith(".keep.jsonl.partial-") for name in leftovers(tmp_path)] == [True]


async def test_list_json_says_whether_it_is_whole(
    amqp: AbstractRobustConnection, rabbit_url: str, dead: str
) -> None:
    """250 dead letters: the default 100 are marked as cut; a limit above them is whole."""
    ids = [f"m{i:03}" for i in range(250)]
    await seed(amqp, dead, [(i, "exhausted", b"x", None) for i in ids])
    cut = await run_cli("dlq", "list", dead, "--json", url=rabbit_url)
    assert cut.status == 0, cut.stderr
    assert cut.json()["complete"] is False
    assert cut.json()["limit"] == 100
    assert cut.json()["in_queue_before"] == 250
    assert [r["message_id"] for r in cut.json()["dead_letters"]] == ids[:100]
    assert "only the first 100" in cut.stderr
    for limit in ("250", "1000"):
        whole = await run_cli("dlq", "list", dead, "--json", "--limit", limit, url=rabbit_url)
        assert whole.status == 0, whole.stderr
        assert [r["message_id"] for r in whole.rows()] == ids
        assert "only the first" not in whole.stderr
    none = await run_cli("dlq", "list", dead, "--json", "--reason", "permanent", url=rabbit_url)
    assert none.rows() == []
    assert await ids_in(amqp, f"{dead}.dlq") == ids


async def test_a_dry_run_to_a_missing_queue_fails_as_the_real_run_does(
    amqp: AbstractRobustConnection, rabbit_url: str, dead: str
) -> None:
    await seed(amqp, dead, [("m1", "exhausted", b"x", None), ("m2", "exhausted", b"y", None)])
    answers = {}
    for target in (unique("no-such-queue"), "q" * 300):
        for dry in ([], ["--dry-run"]):
            run = await run_cli(
                "dlq", "replay", dead, "--id", "m1", "--to", target, *dry, url=rabbit_url
            )
            answers[target, bool(dry)] = (run.status, run.stderr)
            assert run.status == 3, run.stderr
            assert "nothing was replayed" in run.stderr or "bytes" in run.stderr
            assert len(run.stderr) < 400  # a 300-character name is not printed whole
        assert answers[target, True] == answers[target, False]
    # The work queue itself gone: its dead letters have nowhere to go back to.
    await delete(amqp, dead)
    for dry in ([], ["--dry-run"]):
        run = await run_cli("dlq", "replay", dead, *dry, url=rabbit_url)
        assert run.status == 3
        assert f"cannot replay to queue '{dead}': it does not exist" in run.stderr
    assert await ids_in(amqp, f"{dead}.dlq") == ["m1", "m2"]


async def test_the_page_checks_a_replays_target_as_the_command_does(
    amqp: AbstractRobustConnection, rabbit_url: str, dead: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 200,000-character ``to`` fails at once, its answer and audit line bounded."""
    await seed(amqp, dead, [("m1", "exhausted", b"x", None)])
    app = create_app(rabbit_url, allow_actions=True, trusted_proxies=())
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1", timeout=60
    ) as client:
        client.cookies.set("fsr_csrf", "k" * 43)
        for to, dry in (("t" * 200_000, True), ("t" * 200_000, False), (unique("gone"), True)):
            with caplog.at_level("INFO", logger="faststream_retry.web.audit"):
                answer = await client.post(
                    f"/api/queues/{dead}/replay",
                    json={"ids": ["m1"], "to": to, "dry_run": dry},
                    headers={"X-CSRF-Token": "k" * 43},
                )
            # A name AMQP cannot carry is a bad request, refused before the broker is asked.
            assert answer.status_code == (400 if len(to) > 255 else 409), answer.text
            assert len(answer.text) < 400
            assert (
                "nothing was replayed" in answer.json()["error"]
                or "bytes" in answer.json()["error"]
            )
    assert all(len(record.getMessage()) < 400 for record in caplog.records)
    assert await ids_in(amqp, f"{dead}.dlq") == ["m1"]


APP = """
from faststream import FastStream
from faststream.rabbit import RabbitBroker
from faststream_retry import RetryMiddleware

broker = RabbitBroker({url!r}, middlewares=[RetryMiddleware(prefix={prefix!r})], logger=None)
app = FastStream(broker)


@broker.subscriber({queue!r})
async def handle(body: str) -> None:
    pass
"""


async def test_app_commands_examine_the_apps_own_broker(rabbit_url: str, tmp_path: Path) -> None:
    """With no --url and no RABBITMQ_URL, doctor, status --app and web --app use the app's broker.

    The issue's repro: the app on another port than 5672, and doctor checked localhost:5672.
    Each says which broker it examined; --url still wins.
    """
    queue, prefix = unique("invoicing"), unique("p")
    (tmp_path / "invoicing.py").write_text(APP.format(url=rabbit_url, prefix=prefix, queue=queue))
    shown = rabbit_url.replace("guest:guest@", "guest:***@")
    doctor = await run_cli("doctor", "invoicing:app", url=None, cwd=tmp_path)
    assert doctor.status in {0, 1}, doctor.stderr
    assert f"broker {shown} (the broker of invoicing:app)" in doctor.stdout
    status = await run_cli("status", "--app", "invoicing:app", url=None, cwd=tmp_path)
    assert status.status == 0, status.stderr
    assert f"broker {shown} (the broker of invoicing:app)" in status.stdout
    as_json = await run_cli("status", "--app", "invoicing:app", "--json", url=None, cwd=tmp_path)
    assert as_json.json()["broker"] == shown
    elsewhere = "amqp://guest:guest@127.0.0.1:1/"
    for command in (["doctor", "invoicing:app"], ["status", "--app", "invoicing:app"]):
        flag = await run_cli(*command, "--url", elsewhere, url=None, cwd=tmp_path)
        assert flag.status == 3
        assert "cannot connect to amqp://guest:***@127.0.0.1:1/" in flag.stderr
        env = await run_cli(*command, url=elsewhere, cwd=tmp_path)  # RABBITMQ_URL
        assert env.status == 3
        assert "127.0.0.1:1" in env.stderr
    async with serving(None, "--app", "invoicing:app", cwd=tmp_path) as (port, lines):
        assert any(f"for the broker {shown} (the broker of invoicing:app)" in x for x in lines)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            answer = await client.get("/api/status")
            assert answer.status_code == 200, answer.text
            assert answer.json()["broker"] == shown  # as status --json says it
            assert [row["queue"] for row in answer.json()["queues"]] == [queue]
