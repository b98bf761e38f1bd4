"""The standalone worker imports no FastStream: its modules, its command, its start.

Each runs in a process where importing ``faststream`` or ``fast_depends`` raises. The
start goes as far as the broker (an unreachable one here); the integration suite
(``tests/integration/test_worker.py``) runs a whole retry in such a process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli import ROOT, environment, script
from tests.no_faststream import Refusal, refuse_faststream

WORKER_MODULES = (
    "faststream_retry",
    "faststream_retry.worker",
    "faststream_retry.worker.worker",
    "faststream_retry.worker.consumer",
    "faststream_retry.worker.declare",
    "faststream_retry.rabbit.live",
    "faststream_retry.rabbit.recheck",
    "faststream_retry.rabbit.consumer",
    "faststream_retry.rabbit.step",
    "faststream_retry.outages",
    "faststream_retry.cli.worker",
)


def _run(refusal: Refusal, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=environment(None, PYTHONPATH=refusal.pythonpath),
    )


def test_the_worker_s_modules_import_without_faststream(tmp_path: Path) -> None:
    refusal = refuse_faststream(tmp_path / "refuse")
    code = (
        "import importlib, sys\n"
        f"for name in {WORKER_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "from faststream_retry import RetryWorker, load_worker_config\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'faststream'))\n"
    )
    done = _run(refusal, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    assert refusal.installed
    assert refusal.tried == ""
    assert done.stdout.strip() == "[]"


def test_the_worker_command_starts_without_faststream(tmp_path: Path) -> None:
    refusal = refuse_faststream(tmp_path / "refuse")
    config = tmp_path / "retry.toml"
    config.write_text('[[queues]]\nname = "orders"\n')
    helped = _run(refusal, *script(), "worker", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--config" in helped.stdout
    # The start path as far as a broker: the worker is built, connects, and says why not.
    started = _run(
        refusal, *script(), "worker", "--config", str(config), "--url", "amqp://u:p@127.0.0.1:1/"
    )
    assert started.returncode == 3, started.stderr
    assert "cannot connect to amqp://u:***@127.0.0.1:1/" in started.stderr
    assert "Traceback" not in started.stderr
    assert refusal.installed
    assert refusal.tried == ""
