"""``tests.rabbit.run_ctl``, the suite's one way to run the script broker's rabbitmqctl.

A CLI run that does not get through to a node that is up (exit 69, EX_UNAVAILABLE, or 75,
EX_TEMPFAIL) is run again within a bounded time; any other exit, and one that keeps not
getting through, fails the test with the command's status and output. A fake ``ctl``
stands in for the broker's: each run appends its arguments to a log, then exits with the
next status of a list.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.rabbit import run_ctl

if TYPE_CHECKING:
    from pathlib import Path


def fake_ctl(tmp_path: Path, *statuses: int) -> Path:
    """A ``ctl`` that exits with ``statuses`` in turn (the last one for ever after)."""
    script = tmp_path / "ctl"
    script.write_text(
        "#!/bin/sh\n"
        f'log="{tmp_path}/calls"\n'
        'printf "%s\\n" "$*" >> "$log"\n'
        'run=$(wc -l < "$log")\n'
        'echo "run $run out"\n'
        'echo "run $run err" >&2\n'
        f"set -- {' '.join(map(str, statuses))}\n"
        'while [ "$#" -gt 1 ] && [ "$run" -gt 1 ]; do shift; run=$((run - 1)); done\n'
        'exit "$1"\n'
    )
    script.chmod(0o755)
    return script


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


@pytest.mark.parametrize("unreached", [69, 75])
def test_a_run_that_did_not_reach_the_node_is_run_again_until_it_does(
    tmp_path: Path, unreached: int
) -> None:
    ctl = fake_ctl(tmp_path, unreached, unreached, 0)
    done = run_ctl(ctl, "set_permissions", "-p", "/", "u", ".*", ".*", ".*", pause=0.01)
    assert done.returncode == 0
    assert done.stdout == "run 3 out\n"
    assert calls(tmp_path) == ["-q set_permissions -p / u .* .* .*"] * 3


def test_a_node_never_reached_fails_the_test_in_bounded_time_naming_the_exit_and_output(
    tmp_path: Path,
) -> None:
    ctl = fake_ctl(tmp_path, 69)
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        run_ctl(ctl, "add_user", "u", "secret", within=0.5, pause=0.1)
    assert time.monotonic() - start < 5
    runs = len(calls(tmp_path))
    assert 2 <= runs <= 6
    message = str(failed.value)
    assert f"{ctl} -q add_user u secret exited 69 (EX_UNAVAILABLE)" in message
    assert f"the last of {runs} attempts" in message
    assert f"stdout:\nrun {runs} out\n" in message
    assert f"stderr:\nrun {runs} err\n" in message


def test_any_other_failure_fails_at_once_with_the_commands_output(tmp_path: Path) -> None:
    ctl = fake_ctl(tmp_path, 70, 0)
    with pytest.raises(pytest.fail.Exception) as failed:
        run_ctl(ctl, "add_user", "u", "secret", pause=0.01)
    assert calls(tmp_path) == ["-q add_user u secret"]
    message = str(failed.value)
    assert message.startswith(f"{ctl} -q add_user u secret exited 70\n")
    assert "stdout:\nrun 1 out\n" in message
    assert "stderr:\nrun 1 err\n" in message


def test_unchecked_it_returns_the_last_run_as_it_ended(tmp_path: Path) -> None:
    """For cleanup in a ``finally``: still run again while unreached, never failing."""
    ctl = fake_ctl(tmp_path, 75, 2)
    done = run_ctl(ctl, "clear_policy", "p", check=False, pause=0.01)
    assert (done.returncode, done.stderr) == (2, "run 2 err\n")
    assert len(calls(tmp_path)) == 2
    never = tmp_path / "never"
    never.mkdir()
    gave_up = run_ctl(fake_ctl(never, 69), "x", check=False, within=0.2, pause=0.05)
    assert gave_up.returncode == 69
    assert len(calls(never)) > 1
