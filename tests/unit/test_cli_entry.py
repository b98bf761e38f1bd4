"""The console script without its extra: a message naming the install, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from faststream_retry import worker_config_schema
from tests.cli import ROOT


def test_without_the_cli_extra_the_command_names_the_install() -> None:
    # A None entry in sys.modules makes the import fail as if typer were not installed.
    code = "import sys; sys.modules['typer'] = None; from faststream_retry.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 3
    assert "pip install 'faststream-retry[cli]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_python_dash_m_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "faststream_retry", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for command in ("status", "explain", "doctor", "dlq", "migrate", "worker"):
        assert command in done.stdout


def _worker(*args: str, config: str | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "COLUMNS": "300", "NO_COLOR": "1"}
    given = [] if config is None else ["--config", config]
    return subprocess.run(
        [sys.executable, "-m", "faststream_retry", "worker", *given, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_the_worker_names_a_config_mistake_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "retry.toml"
    path.write_text('[[queues]]\nname = "orders"\nmax_attempts = "three"\n')
    done = _worker(config=str(path))
    assert done.returncode == 3
    assert "Traceback" not in done.stderr
    assert f"{path}: queues[0].max_attempts must be an int >= 1, got 'three'" in done.stderr


def test_the_worker_cannot_start_without_a_broker_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "retry.toml"
    path.write_text('[[queues]]\nname = "orders"\n')
    done = _worker(config=str(path))
    assert done.returncode == 3
    assert "no broker to connect to: give --url" in done.stderr
    refused = _worker("--url", "amqp://guest:secret@127.0.0.1:1/", config=str(path))
    assert refused.returncode == 3
    assert "cannot connect to amqp://guest:***@127.0.0.1:1/" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_worker_prints_its_configs_json_schema_without_a_config() -> None:
    done = _worker("--schema", config=None)
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema == worker_config_schema()
    assert schema["title"] == "faststream-retry worker config"


def test_the_worker_without_a_config_says_what_to_give() -> None:
    done = _worker(config=None)
    assert done.returncode == 3
    assert "give the worker's config: --config retry.toml" in done.stderr
    assert "Traceback" not in done.stderr


def test_print_policy_prints_the_command_for_the_configured_queues(tmp_path: Path) -> None:
    path = tmp_path / "retry.toml"
    path.write_text('prefix = "svc"\n[[queues]]\nname = "orders"\n[[queues]]\npattern = "b.*"\n')
    done = _worker("--print-policy", "--url", "amqp://u:p@h:5672/shop", config=str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "rabbitmqctl set_policy -p 'shop' --apply-to queues 'svc.intake' "
        "'^(?!svc\\.)(?!.*\\.(retry|dlq)$)(orders|b\\..*)$' "
        '\'{"dead-letter-exchange":"svc.intake"}\''
    )
    assert "one policy" in done.stderr


def test_a_replay_into_the_workers_intake_asks_for_a_destination() -> None:
    """The intake refuses what was not dead-lettered into it: without --to it would loop."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "COLUMNS": "300", "NO_COLOR": "1"}
    for queue in ("retry.intake", "retry.intake.dlq"):
        done = subprocess.run(
            [sys.executable, "-m", "faststream_retry", "dlq", "replay", queue],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
        assert done.returncode == 3, done.stderr
        assert "Give --to QUEUE" in done.stderr
        assert "Traceback" not in done.stderr
