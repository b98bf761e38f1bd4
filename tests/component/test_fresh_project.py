"""The testing how-to, followed in a fresh project: its pyproject.toml, its layout, its tests.

The app is the quickstart's (examples/docs/service.py) as ``myapp/service.py``; the tests
are the page's (examples/docs/test_service.py), importing ``myapp``. pytest runs in a
subprocess from the project's root, with warnings as errors (pytest-asyncio warns when
``asyncio_default_fixture_loop_scope`` is unset) and nothing on PYTHONPATH: the page's
``pythonpath`` is what makes ``myapp`` importable.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cli import ROOT

EXAMPLES = ROOT / "examples" / "docs"
PYTEST = Path(sys.executable).with_name("pytest")


def test_the_testing_how_to_runs_in_a_fresh_project(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text((EXAMPLES / "pytest.toml").read_text())
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "service.py").write_text((EXAMPLES / "service.py").read_text())
    tests = tmp_path / "tests"
    tests.mkdir()
    source = (EXAMPLES / "test_service.py").read_text()
    assert "from examples.docs import service" in source
    (tests / "test_service.py").write_text(source.replace("examples.docs", "myapp"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run(
        # The pytest command, not python -m pytest (which puts the project on the path).
        [
            str(PYTEST),
            "-q",
            "-W",
            "error::pytest.PytestDeprecationWarning",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    tests_on_the_page = source.count("\nasync def test_")
    assert f"{tests_on_the_page} passed" in ran.stdout, ran.stdout
