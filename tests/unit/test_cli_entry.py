"""The console script without its extra: a message naming the install, not a traceback."""

from __future__ import annotations

import subprocess
import sys

from tests.cli import ROOT


def test_without_the_cli_extra_the_command_names_the_install() -> None:
    # A None entry in sys.modules makes the import fail as if typer were not installed.
    code = "import sys; sys.modules['typer'] = None; from faststream_retry.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
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
    for command in ("status", "explain", "doctor", "dlq", "migrate"):
        assert command in done.stdout
