"""What the NATS and Redis retry benches share: the handler's bookkeeping and the tables.

A burst: N messages published before the consumer starts, each failing once and
succeeding on its retry after DELAY s. From the handler's calls alone (the same for
every variant, whatever carries the copy):

- *retried msg/s*: messages that succeeded, over first call to last success;
- *fail path msg/s*: first attempts a second, counted only before the first retry comes
  back (pure failures: each turned into a confirmed copy and the original settled);
- *first pass s*: first call to the last first attempt;
- *lateness*: second call minus first call minus DELAY, in ms (queueing included).

The happy path: N good messages, first call to last call.
"""

from __future__ import annotations

import asyncio
import math
import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

SIZE = 512
"""Bytes of each message's body, as the RabbitMQ referee (bench-peers) sends."""


def body(i: int) -> bytes:
    """A SIZE-byte body whose first 8 bytes name the message."""
    return f"{i:08d}".encode().ljust(SIZE, b"x")


def key(data: bytes) -> bytes:
    """The message a body names (every attempt has the same body)."""
    return bytes(data[:8])


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


@dataclass
class Recorder:
    """Every handler call's time, by message; fails each message's first `fails` calls."""

    expected: int
    fails: int = 0
    calls: dict[bytes, list[float]] = field(default_factory=lambda: defaultdict(list))
    n_ok: int = 0
    first: float = 0.0
    last_ok: float = 0.0
    started_at: float = math.inf
    """When ``broker.start()`` returned (``started``); never: every call is before it."""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def call(self, data: bytes) -> bool:
        """Record a call; True when this call must fail."""
        now = time.perf_counter()
        if not self.first:
            self.first = now
        mine = self.calls[key(data)]
        mine.append(now)
        if len(mine) <= self.fails:
            return True
        self.n_ok += 1
        self.last_ok = now
        if self.n_ok >= self.expected:
            self.done.set()
        return False

    async def wait(self, timeout: float) -> None:
        """Until every message succeeded; raise TimeoutError naming how far it got."""
        try:
            await asyncio.wait_for(self.done.wait(), timeout)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            msg = f"only {self.n_ok}/{self.expected} succeeded in {timeout:.0f} s"
            raise TimeoutError(msg) from None

    def started(self) -> None:
        """Mark the moment the broker's start returned (the plugin's start included)."""
        self.started_at = time.perf_counter()

    def happy(self) -> dict[str, float]:
        """The happy path's rate: first call to last; and from the start's return to last.

        The second leaves out what a start does once while the first messages are
        handled: FastStream's subscribers consume before ``broker.start()`` returns, and
        a plugin's start goes on beside them (NATS: its consumers are made then).
        """
        after = sorted(t for v in self.calls.values() for t in v if t >= self.started_at)
        steady = (len(after) - 1) / (after[-1] - after[0]) if len(after) > 1 else math.nan
        return {
            "msg/s": (self.n_ok - 1) / (self.last_ok - self.first),
            "msg/s after start": steady,
        }

    def burst(self, delay: float) -> dict[str, float]:
        """The burst's figures (module docstring); extra calls (duplicates) counted."""
        firsts = sorted(v[0] for v in self.calls.values())
        back = min((v[1] for v in self.calls.values() if len(v) > 1), default=math.inf)
        pre = [t for t in firsts if t < back]
        late = [(v[1] - v[0] - delay) * 1000 for v in self.calls.values() if len(v) > 1]
        return {
            "retried msg/s": self.n_ok / (self.last_ok - self.first),
            "fail path msg/s": (len(pre) - 1) / (pre[-1] - pre[0]) if len(pre) > 1 else math.nan,
            "first pass s": firsts[-1] - self.first,
            "lateness p50 ms": pct(late, 50),
            "lateness p99 ms": pct(late, 99),
            "extra calls": float(sum(len(v) for v in self.calls.values()) - 2 * len(self.calls)),
        }


def cpu_self() -> float:
    """This process' CPU seconds (user + sys)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_of(pid: int | None) -> float:
    """CPU seconds (user + sys) of process `pid` so far (Linux); 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> float:
    """The machine's 1-minute load average (the bench runs on shared machines)."""
    return os.getloadavg()[0]


@dataclass
class Results:
    """Each variant's figures, round by round."""

    rows: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)

    def add(self, variant: str, figures: dict[str, float]) -> None:
        """Keep one round's figures of `variant`."""
        mine = self.rows.setdefault(variant, {})
        for name, value in figures.items():
            mine.setdefault(name, []).append(value)

    def median(self, variant: str, figure: str) -> float:
        """The median of `figure` over the rounds."""
        return statistics.median(self.rows[variant][figure])

    def print(self, title: str, baseline: str) -> None:
        """One table: each variant's median (min - max) per figure, then each ratio to `baseline`.

        A ratio row gives the ratio of the medians and, in brackets, the range of the
        per-round ratios (each round's variants ran back to back): how noisy it is.
        """
        if baseline not in self.rows:  # BENCH_ONLY left it out
            baseline = next(iter(self.rows))
        console = Console()
        console.print(
            f"[bold]{title}[/]; load average (1 min) at each round: "
            + " / ".join(f"{x:.1f}" for x in self.loads)
        )
        figures = list(self.rows[baseline])
        table = Table()
        table.add_column("variant")
        for figure in figures:
            better = "" if "msg/s" in figure else " (lower is better)"
            table.add_column(figure + better, justify="right")
        for variant, values in self.rows.items():
            table.add_row(variant, *(summary(values[f]) for f in figures))
        for variant, values in self.rows.items():
            if variant == baseline:
                continue
            cells = []
            for figure in figures:
                base = self.median(baseline, figure)
                paired = [
                    x / y
                    for x, y in zip(values[figure], self.rows[baseline][figure], strict=True)
                    if y
                ]
                cells.append(
                    f"{statistics.median(values[figure]) / base:.2f} "
                    f"[{min(paired):.2f}-{max(paired):.2f}]"
                    if base and paired
                    else "-"
                )
            table.add_row(f"{variant} / {baseline}", *cells)
        console.print(table)


async def interleaved(
    variants: list[str], rounds: int, run: Callable[[str], Awaitable[dict[str, float]]]
) -> Results:
    """`run` each variant once a round, the order turned every round (ABAB...)."""
    results = Results()
    for round_ in range(rounds):
        results.loads.append(loadavg())
        for variant in only(variants if round_ % 2 == 0 else variants[::-1]):
            figures = await run(variant)
            results.add(variant, figures)
            print(f"round {round_ + 1} {variant}: {figures}", file=sys.stderr)
    return results


def only(variants: list[str]) -> list[str]:
    """`variants`, or those of them BENCH_ONLY names (comma-separated): to profile one alone."""
    wanted = os.environ.get("BENCH_ONLY")
    return [v for v in variants if wanted is None or v in wanted.split(",")]


def rounds_arg(argv: list[str], default_n: int, default_rounds: int) -> tuple[int, int]:
    """`[N] [ROUNDS]` from the command line."""
    args = [int(a) for a in argv if a.isdigit()]
    return (args[0] if args else default_n, args[1] if len(args) > 1 else default_rounds)


def extra_args(argv: list[str]) -> list[str]:
    """The scenario names given (anything that is not a number)."""
    return [a for a in argv if not a.isdigit()]


def summary(values: list[float]) -> str:
    """Median (min - max) of `values`."""
    mid = statistics.median(values)
    digits = 0 if abs(mid) >= 100 else 2
    return f"{mid:,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"
