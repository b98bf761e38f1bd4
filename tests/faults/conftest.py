"""The fault suite's figures: each scenario adds a row, printed at the end of the run."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from tests.faults.support import dump_tasks

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from _pytest.terminal import TerminalReporter

    from tests.faults.support import Tally

ROWS: list[dict[str, Any]] = []
NOTES: list[str] = []


class Report:
    """Records one scenario's figures for the end-of-run table."""

    def add(self, scenario: str, faults: str, tally: Tally, seconds: float) -> None:
        ROWS.append(
            {
                "scenario": scenario,
                "messages": len(tally.sent),
                "faults": faults,
                "processed": len(set(tally.processed)),
                "dead-lettered": len(set(tally.dead)),
                "lost": len(tally.lost),
                "duplicates": tally.duplicates,
                "settled after the last fault, s": f"{seconds:.1f}",
            }
        )

    def note(self, text: str) -> None:
        NOTES.append(text)


@pytest.fixture
def report() -> Report:
    return Report()


# Seconds before pytest-timeout fires at which the watchdog prints the tasks.
WATCHDOG_LEAD_S = 30.0


@pytest.fixture(autouse=True)
async def watchdog(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Dump the pending tasks shortly before the test's timeout, then let it fire."""
    marker = request.node.get_closest_marker("timeout")
    seconds = float(marker.args[0]) if marker else float(request.config.getini("timeout"))
    handle = asyncio.get_running_loop().call_later(max(seconds - WATCHDOG_LEAD_S, 1.0), dump_tasks)
    yield
    handle.cancel()


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    if not ROWS and not NOTES:
        return
    columns = list(ROWS[0]) if ROWS else []
    terminalreporter.section("fault suite figures")
    terminalreporter.write_line("| " + " | ".join(columns) + " |")
    terminalreporter.write_line("|" + "---|" * len(columns))
    for row in ROWS:
        terminalreporter.write_line("| " + " | ".join(str(row[c]) for c in columns) + " |")
    for text in NOTES:
        terminalreporter.write_line(text)
