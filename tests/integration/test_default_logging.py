"""What a user sees in the terminal when a handler fails, with FastStream's logging defaults.

Each test runs ``logging_app.py`` in its own process, as a user would (a script calling
``FastStream(broker).run()``, or ``faststream run``), and reads what it printed: the
retry lines and the dead letter's ERROR line, each exactly once, in FastStream's format
when nothing is configured, in the user's when something is; and which of them carry
the handler's traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from faststream.rabbit import RabbitBroker

from faststream_retry import Fixed, RetryMiddleware, RetryPolicy
from tests.rabbit import delete_declared, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

ROOT = Path(__file__).resolve().parents[2]
POLICY = RetryPolicy(max_attempts=3, backoff=Fixed(0.1))
"""logging_app.py's default policy (the app module runs when imported)."""
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# FastStream's broker logger: "<date> <time>,<ms> <LEVEL> - <exchange> | <queue> | <id> - ..."
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"
RETRY = "retry scheduled for message order-1"
DEAD = "dead-lettered message order-1"
TRACEBACK = "Traceback (most recent call last):"
LAST_LINE = "ConnectionError: database down for order-1"


class Printed:
    """What the app printed, colours stripped, split into lines."""

    def __init__(self, stdout: str, stderr: str) -> None:
        self.out = ANSI.sub("", stdout).splitlines()
        self.err = ANSI.sub("", stderr).splitlines()

    def __str__(self) -> str:
        return "\n".join(["--- stdout", *self.out, "--- stderr", *self.err])

    def count(self, text: str) -> int:
        """Return how many lines, on both streams, contain ``text``."""
        return sum(text in line for line in self.out + self.err)

    def traceback_after(self, lines: list[str], text: str) -> bool:
        """Return whether the line holding ``text`` is followed by the handler's traceback."""
        (at,) = [i for i, line in enumerate(lines) if text in line]
        if at + 1 >= len(lines) or lines[at + 1] != TRACEBACK:
            return False
        end = next((i for i in range(at + 1, len(lines)) if re.match(STAMP, lines[i])), len(lines))
        return lines[end - 1] == LAST_LINE


async def run_app(
    rabbit_url: str,
    amqp: AbstractRobustConnection,
    *,
    log_config: str = "",
    retry_traceback: str = "first",
    cli: bool = False,
    huge: bool = False,
    cli_options: tuple[str, ...] = (),
) -> Printed:
    queue, prefix = unique("logged"), unique("logp")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "RABBITMQ_URL": rabbit_url,
        "QUEUE": queue,
        "PREFIX": prefix,
        "LOG_CONFIG": log_config,
        "RETRY_TRACEBACK": retry_traceback,
        "HUGE": "1" if huge else "",
    }
    if cli:
        command = [
            sys.executable,
            "-m",
            "faststream",
            "run",
            "tests.integration.logging_app:app",
            *cli_options,
        ]
    else:
        command = [sys.executable, str(ROOT / "tests" / "integration" / "logging_app.py")]
    try:
        done = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        # The same plan as the app's, to delete what it declared.
        retry = RetryMiddleware(default=POLICY, prefix=prefix)
        broker = RabbitBroker()
        broker.subscriber(queue)(lambda body: None)
        await delete_declared(amqp, retry, broker)
    printed = Printed(done.stdout, done.stderr)
    assert done.returncode == 0, str(printed)
    return printed


@pytest.mark.parametrize(
    "cli",
    [False, pytest.param(True, marks=pytest.mark.requires("faststream[cli]"))],
    ids=["FastStream.run", "faststream run"],
)
async def test_no_logging_configured_prints_through_faststreams_logger(
    rabbit_url: str, amqp: AbstractRobustConnection, cli: bool
) -> None:
    """Retries at INFO (the first with its traceback), the dead letter at ERROR with its own.

    Each exactly once, in FastStream's format (timestamp, level, queue, message id) beside
    its Received/Processed lines; nothing bare from Python's last-resort handler.
    """
    printed = await run_app(rabbit_url, amqp, cli=cli)
    out = printed.out
    line = rf"^{STAMP} (?P<level>[A-Z]+)\s+- .*\| order-1\s+- "
    first = [m for m in (re.match(line + RETRY + ".*attempt=1/3", s) for s in out) if m]
    second = [m for m in (re.match(line + RETRY + ".*attempt=2/3", s) for s in out) if m]
    dead = [m for m in (re.match(line + DEAD + ".*reason=exhausted", s) for s in out) if m]
    assert [m["level"] for m in first + second + dead] == ["INFO", "INFO", "ERROR"], str(printed)
    assert (printed.count(RETRY), printed.count(DEAD)) == (2, 1), str(printed)
    assert printed.traceback_after(out, "attempt=1/3"), str(printed)
    assert not printed.traceback_after(out, "attempt=2/3"), str(printed)
    assert printed.traceback_after(out, DEAD), str(printed)
    assert printed.count(TRACEBACK) == 2, str(printed)


async def test_with_basic_config_each_line_appears_once_in_the_users_format(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """logging.basicConfig(level=INFO): the root handler prints our lines; FastStream's don't."""
    printed = await run_app(rabbit_url, amqp, log_config="basic")
    assert [s for s in printed.err if RETRY in s or DEAD in s] == [
        s
        for s in printed.err
        if s.startswith(("INFO:faststream_retry:", "ERROR:faststream_retry:"))
        and (RETRY in s or DEAD in s)
    ]
    assert (printed.count(RETRY), printed.count(DEAD)) == (2, 1), str(printed)
    assert printed.count("ERROR:faststream_retry:" + DEAD) == 1, str(printed)
    assert printed.count(TRACEBACK) == 2, str(printed)
    assert printed.traceback_after(printed.err, DEAD), str(printed)


async def test_a_handler_on_faststream_retry_gets_every_line_and_only_it(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """A user who configured the ``faststream_retry`` logger keeps getting the lines there."""
    printed = await run_app(rabbit_url, amqp, log_config="own")
    assert printed.count("OWN INFO " + RETRY) == 2, str(printed)
    assert printed.count("OWN ERROR " + DEAD) == 1, str(printed)
    assert (printed.count(RETRY), printed.count(DEAD)) == (2, 1), str(printed)
    assert not [s for s in printed.out if RETRY in s or DEAD in s], str(printed)


@pytest.mark.parametrize(("choice", "tracebacks"), [("every", 3), ("never", 1)])
async def test_log_retry_traceback_chooses_which_retry_lines_carry_it(
    rabbit_url: str, amqp: AbstractRobustConnection, choice: str, tracebacks: int
) -> None:
    """every: each retry line and the dead letter; never: the dead letter's only."""
    printed = await run_app(rabbit_url, amqp, retry_traceback=choice)
    assert printed.count(TRACEBACK) == tracebacks, str(printed)
    assert printed.traceback_after(printed.out, "attempt=2/3") is (choice == "every")
    assert printed.traceback_after(printed.out, DEAD), str(printed)


@pytest.mark.parametrize("log_config", ["", "basic"], ids=["broker's logger", "basicConfig"])
async def test_a_huge_error_makes_bounded_lines(
    rabbit_url: str, amqp: AbstractRobustConnection, log_config: str
) -> None:
    """A 2 MB error and a hook failing on it: every line and traceback cut, none lost.

    Without the bounds each traceback repeats the 2 MB message: the retry's, the dead
    letter's and the three failing hooks' (chained to it), about 10 MB in all.
    """
    printed = await run_app(rabbit_url, amqp, log_config=log_config, huge=True)
    lines = printed.out + printed.err
    assert max(len(s.encode()) for s in lines) < 1200, str(printed)[:20_000]
    assert sum(len(s.encode()) + 1 for s in lines) < 64 * 1024, str(printed)[:20_000]
    assert (printed.count(RETRY), printed.count(DEAD)) == (2, 1), str(printed)[:20_000]
    hooks = printed.count("faststream-retry hook")  # one per event, releases included
    assert hooks >= 3, str(printed)[:20_000]
    assert printed.count("RuntimeError: hook bug on") == hooks, str(printed)[:20_000]
    assert "Logging error" not in str(printed)


@pytest.mark.requires("faststream[cli]")
async def test_faststream_run_log_level_debug_shows_the_re_check_steps(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> None:
    """The broker's logger at DEBUG: the plugin's DEBUG lines (releases, hops) show there too."""
    printed = await run_app(rabbit_url, amqp, cli=True, cli_options=("--log-level", "DEBUG"))
    released = [s for s in printed.out if "re-check released message order-1" in s]
    assert len(released) == 2, str(printed)
    assert all(re.match(rf"^{STAMP} DEBUG ", s) for s in released), str(printed)
    default = await run_app(rabbit_url, amqp, cli=True)
    assert default.count("re-check") == 0, str(default)
