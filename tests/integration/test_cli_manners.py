"""The command's manners, as its neighbours (typer, FastStream's CLI) have them.

--version, shell completion, -y, --json errors a script can read, tables that keep their
width in a pipe, usage errors (2) told from failed operations (3), and apps built by a
factory (--factory, as `faststream run` takes them). No broker: an unreachable URL or
`explain` (which imports the app, not starting it) is enough. Here, not in tests/unit:
the runs import the package from the checkout, and from a directory of their own, which
mutmut's mutated tree (it runs tests/unit) cannot serve.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.cli import ROOT, script

UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/"
LONG_QUEUE = "orders-" + "x" * 110

APP = f"""
from faststream import FastStream
from faststream.rabbit import RabbitBroker

from faststream_retry import RetryMiddleware


def make() -> FastStream:
    retry = RetryMiddleware()
    broker = RabbitBroker(middlewares=[retry])

    @broker.subscriber("{LONG_QUEUE}")
    async def handle(body: str) -> None: ...

    return FastStream(broker)
"""


def cli(
    *args: str, cwd: Path = ROOT, columns: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    env.pop("RABBITMQ_URL", None)
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run(
        [*script(), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_version_prints_the_installed_version() -> None:
    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"faststream-retry {version('faststream-retry')}"


def test_shell_completion_is_offered() -> None:
    done = cli("--show-completion", "bash")
    assert done.returncode == 0, done.stderr
    assert "complete" in done.stdout
    assert "--install-completion" in cli("--help").stdout


def test_purge_takes_y_for_yes() -> None:
    """-y is taken (a usage error would exit 2): the purge goes on to the broker, and fails there."""
    done = cli("dlq", "purge", "orders", "-y", "--url", UNREACHABLE)
    assert done.returncode == 3, done.stderr
    assert "cannot connect" in done.stderr


def test_a_usage_error_and_a_failed_operation_exit_differently() -> None:
    assert cli("dlq", "list", "orders", "--no-such-option").returncode == 2
    assert cli("dlq", "list", "orders", "--url", UNREACHABLE).returncode == 3


@pytest.mark.parametrize(
    "args",
    [
        ["dlq", "list", "orders"],
        ["dlq", "replay", "orders"],
        ["dlq", "purge", "orders", "--yes"],
        ["dlq", "export", "orders", "out.jsonl"],
        ["status", "orders"],
    ],
)
def test_under_json_an_error_is_a_json_document_on_stdout(args: list[str], tmp_path: Path) -> None:
    done = cli(*args, "--json", "--url", UNREACHABLE, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    error = json.loads(done.stdout)
    assert error["status"] == 3
    assert error["error"].startswith("cannot connect to amqp://guest:***@127.0.0.1:1/")


def test_import_takes_json(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    done = cli("dlq", "import", "empty.jsonl", "--json", "--url", UNREACHABLE, cwd=tmp_path)
    assert done.returncode == 3
    assert json.loads(done.stdout)["status"] == 3


def test_export_refuses_json_when_stdout_carries_the_export() -> None:
    done = cli("dlq", "export", "orders", "-", "--json", "--url", UNREACHABLE)
    assert done.returncode == 3
    assert "give a file" in json.loads(done.stdout)["error"]


def test_factory_apps_load_as_faststream_run_loads_them(tmp_path: Path) -> None:
    (tmp_path / "factory_app.py").write_text(APP)
    built = cli("explain", "factory_app:make", "--factory", "--json", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert [q["queue"] for q in json.loads(built.stdout)["queues"]] == [LONG_QUEUE]
    unbuilt = cli("explain", "factory_app:make", cwd=tmp_path)
    assert unbuilt.returncode == 3
    assert "function" in unbuilt.stderr


def test_a_piped_table_keeps_its_width(tmp_path: Path) -> None:
    """Rich cuts a table to 80 columns when stdout is no terminal; a pipe gets every character."""
    (tmp_path / "factory_app.py").write_text(APP)
    piped = cli("explain", "factory_app:make", "--factory", cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    cut = re.compile(r"orders-x+…")
    assert f"→ {LONG_QUEUE} (1 hop) │" in piped.stdout
    assert not cut.search(piped.stdout)
    narrow = cli("explain", "factory_app:make", "--factory", cwd=tmp_path, columns="80")
    assert cut.search(narrow.stdout)  # COLUMNS still rules when it is set


def test_the_help_says_what_each_exit_status_means() -> None:
    text = " ".join(cli("--help").stdout.split())
    for meaning in [
        "0 done",
        "1 done and something needs action",
        "2 a usage error",
        "3 could not do",
    ]:
        assert meaning in text
    assert sys.executable  # the script runs on this interpreter's environment
