"""``faststream-retry doctor`` on a real nats-server: the NATS start checks as a report,
changing nothing. The app is a module written into the test's folder, the command a
subprocess, as an operator runs it."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any

import pytest
from nats.js.api import ConsumerConfig, StreamConfig
from nats.js.errors import NotFoundError

from tests.cli import environment, run_cli

if TYPE_CHECKING:
    from pathlib import Path

    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(120)]

APP = """
from faststream import FastStream
from faststream.nats import JStream, NatsBroker, PullSub
from faststream_retry import RetryMiddleware

retry = RetryMiddleware(prefix={prefix!r}, tick=0.1, max_delay=120)
broker = NatsBroker({url!r}, middlewares=[retry], logger=None)
retry.install(broker)
app = FastStream(broker)


@broker.subscriber(
    {subject!r}, stream=JStream({stream!r}, subjects=[{subject!r}]), durable="d", pull_sub=PullSub()
)
async def handle(body: str) -> None: ...
"""

CORE = """

@broker.subscriber({subject!r})
async def pings(body: str) -> None: ...
"""

NOT_RABBIT = "amqp://guest:guest@127.0.0.1:1/"
"""The RabbitMQ the test session's RABBITMQ_URL would name: never the NATS app's server."""


def write_app(
    folder: Path, url: str, names: Names, stream: str, *, core: bool = False, module: str = "app"
) -> str:
    """Write the app module doctor loads; return its ``module:attribute``."""
    text = APP.format(prefix=names.prefix, url=url, subject=names.subject(), stream=stream)
    if core:
        text += CORE.format(subject=names.subject("pings"))
    (folder / f"{module}.py").write_text(text)
    return f"{module}:app"


def by_check(report: dict[str, Any]) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for finding in report["findings"]:
        found.setdefault(finding["check"], []).append(finding)
    return found


async def test_doctor_reports_what_the_start_would_find_and_changes_nothing(
    nats_url: str, names: Names, js: JetStreamContext, tmp_path: Path
) -> None:
    """An existing durable with max_deliver=3 and a dead-letter stream with a 10 s window:
    doctor (the app's own server, RABBITMQ_URL set and ignored) names both with their
    fixes, warnings only (exit 0); the delay stream it finds missing, and does not make."""
    stream = names.stream()
    subject = names.subject()
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(
        stream, ConsumerConfig(durable_name="d", max_deliver=3, filter_subject=subject)
    )
    dlq = f"{names.prefix}-dlq-{stream}"
    await js.add_stream(
        StreamConfig(name=dlq, subjects=[f"{names.prefix}.dlq.{stream}.>"], duplicate_window=10)
    )
    spec = write_app(tmp_path, nats_url, names, stream)
    result = await run_cli("doctor", spec, "--json", url=NOT_RABBIT, cwd=tmp_path)
    assert result.status == 0, result.stderr
    report = result.json()
    assert (report["system"], report["status"], report["broker"]) == ("nats", "warning", nats_url)
    assert report["server_version"].startswith("2.")
    found = by_check(report)
    assert set(found) == {"max-deliver", "duplicate-window", "missing"}, found
    [deliver] = found["max-deliver"]
    assert deliver["subject"] == f"{stream}.d"
    assert "on the server has max_deliver=3" in deliver["what"]
    assert f"nats consumer edit {stream} d" in deliver["fix"]
    [window] = found["duplicate-window"]
    assert window["subject"] == dlq
    assert f"nats stream edit {dlq} --dupe-window" in window["fix"]
    [missing] = found["missing"]
    assert missing["subject"] == f"{names.prefix}-delay"
    with pytest.raises(NotFoundError):
        await js.stream_info(f"{names.prefix}-delay")
    assert (await js.stream_info(stream)).state.consumer_count == 1


async def test_doctor_says_ok_once_the_app_started_and_action_for_a_refusal(
    nats_url: str, names: Names, tmp_path: Path
) -> None:
    """Started once (the plugin made its streams): one ok line and nothing else. A core-NATS
    subscriber with retries on: the start's refusal, as an action (exit 1) in the text."""
    spec = write_app(tmp_path, nats_url, names, names.stream())
    await start_once(tmp_path, spec)
    result = await run_cli("doctor", spec, "--json", url=None, cwd=tmp_path)
    assert result.status == 0, result.stderr
    [ok] = result.json()["findings"]
    assert (ok["severity"], ok["check"]) == ("ok", "consumers")
    assert ok["what"].startswith("1 covered subscriber(s), 1 of their consumers on the server")
    core = write_app(tmp_path, nats_url, names, names.stream("C"), core=True, module="core_app")
    refused = await run_cli("doctor", core, url=None, cwd=tmp_path)
    assert refused.status == 1, refused.stderr
    assert "nats-server 2." in refused.stdout
    assert "ACTION  the subscriber of" in refused.stdout
    assert "is a core-NATS subscriber" in refused.stdout


async def start_once(folder: Path, spec: str) -> None:
    """Start the app's broker once in a process of its own (install(): the plugin makes its
    streams), and stop it."""
    module, _, _ = spec.partition(":")
    code = (
        f"import asyncio\nfrom {module} import broker\n\n\n"
        "async def main() -> None:\n    await broker.start()\n    await broker.stop()\n\n\n"
        "asyncio.run(main())\n"
    )
    (folder / "start_once.py").write_text(code)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "start_once.py", cwd=folder, env=environment(None)
    )
    assert await asyncio.wait_for(process.wait(), 60) == 0
