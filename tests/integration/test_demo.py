"""The demo runs and balances: what the newcomer's first command shows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.rabbit


def test_demo_settles_every_message_and_draws_the_trace(rabbit_url: str) -> None:
    """sent = delivered + dead-lettered on both queues, and n5's trace is drawn."""
    result = subprocess.run(
        [sys.executable, "-m", "examples.notifications.run"],
        cwd=ROOT,
        # Piped, as `./scripts/demo | tee demo.log` runs it: no terminal, no COLUMNS.
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"RABBITMQ_URL": rabbit_url},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "sent = delivered + dead-lettered for every queue: yes" in out
    assert "│ email-queue   │    8 │         7 │" in out
    assert "1 exhausted, 3 permanent" in out
    assert "webhook-queue dead-letter ERROR  attempt=4" in out
    # It ends as an operator would start: the dead letters, listed by the command.
    assert "$ faststream-retry dlq list webhook-queue" in out
    assert "email-queue.dlq: 1 dead letter (times in UTC)" in out
    assert "webhook-queue.dlq: 4 dead letters" in out
    assert "InvalidAddressError" in out
    # Each dead letter's row is one line, as the command printed it, not wrapped at 80.
    (row,) = [line for line in out.splitlines() if {"n5", "exhausted"} <= set(line.split())]
    assert "eve@example.com" in row
