"""faststream-retry against its peers: every scenario, every library, one run, one table.

    bash bench/peers/setup.sh                          # once: a virtualenv per library
    RABBITMQ_URL=amqp://guest:guest@127.0.0.1:5673/ python3 -m bench.peers.run
    RABBITMQ_URL=... python3 -m bench.peers.run rss    # the consumer's RSS, 100,000 in backoff
    python3 -m bench.peers.run --report FILE           # the tables again, from a run's JSON lines

Each (scenario, library) runs as a process of its own in that library's virtualenv
(``lib_*.py`` over ``driver.py``, which describes the scenarios); the reps are interleaved,
every scenario of rep 1 for every library, then rep 2, and the libraries' order turns
round from one rep to the next. The table gives medians and ranges (min-max) over the reps.
Only compare figures of one run: on a 2-core machine they move 10-20 % with load.

Arguments: the scenarios to run (default: happy burst paced parked burst10k; rss is its own).
Environment:
    REPS (3); LIBS (default: faststream hand-written rabbitkit easy-faststream faststream-retry)
    FR_CHECKOUT: the faststream-retry checkout measured (default: this repository)
    FR_BEFORE: another checkout (a worktree of an older commit, say): each faststream-retry
        column again, "before", measured from it in the same run
    FR_QUEUE_TYPES ("classic quorum"): faststream-retry's queue_type, one column each, and
        the hand-written retry's (lib_faststream_minimal.py) TTL queue, one column each;
        "classic+tracing" adds a column of the plugin with an SDK tracer provider whose
        exporter drops every span (the cost of its spans)
    BENCH_VENVS (${TMPDIR:-/tmp}/faststream-retry-bench): where setup.sh put the venvs
    RMQ_CTL: a rabbitmqctl wrapper, to list what each scenario created and delete it
        (default: the one scripts/rabbitmq/start.sh writes for RABBITMQ_URL's port)
    OUT: the JSON lines file (default: $BENCH_VENVS/results-<run id>.jsonl, and .log
        beside it for the libraries' stderr)
    Sizes: HAPPY_N (5000), BURST_N (2000), PACED_N (2000), PACED_RATE (200), RETRY_DELAY (1),
        PARKED_N (10000), PARKED_DELAY (600), PARKED_RATE (150), PARKED_SECONDS (15),
        BURST10K_N (10000), BURST10K_DELAY (5), RSS_N (100000), RSS_FIRST (10000),
        BENCH_PREFETCH (100), BENCH_SIZE (512)
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCENARIOS = ["happy", "burst", "paced", "parked", "burst10k"]
RETRYING = {"happy", "burst", "paced", "burst10k"}
# library: (venv, module, the scenarios it can run)
LIBRARIES = {
    "faststream": ("fs", "lib_faststream", {"happy"}),
    "hand-written": ("fs", "lib_faststream_minimal", RETRYING),
    "rabbitkit": ("rk", "lib_rabbitkit", RETRYING),
    "easy-faststream": ("ef", "lib_easy_faststream", RETRYING),
    "faststream-retry": ("fr", "lib_faststream_retry", RETRYING | {"parked", "rss"}),
}
# one column per queue type: the plugin's tiers, and the hand-written retry's TTL queue
PER_QUEUE_TYPE = {"faststream-retry", "hand-written"}
# the names of a run's broker objects: <run>-<rep>-<scenario>-<short><queue type's initial>
SHORT = {
    "faststream": "fs",
    "hand-written": "hw",
    "rabbitkit": "rk",
    "easy-faststream": "ef",
    "faststream-retry": "fr",
}
# (scenario, key, label, format); the cell is the median and the range over the reps
ROWS = [
    ("happy", "msg_s", "happy: msg/s", "{:,.0f}"),
    ("happy", "ratio", "happy: ratio to bare FastStream", "{:.2f}"),
    ("burst", "retried_msg_s", "burst: retried msg/s", "{:,.0f}"),
    ("burst", "first_attempt_msg_s", "burst: first-attempt msg/s", "{:,.0f}"),
    ("burst", "first_attempt_cpu_us", "burst: consumer CPU per first attempt, us", "{:,.0f}"),
    ("burst", "late_p50_ms", "burst: lateness p50, ms", "{:,.0f}"),
    ("burst", "late_p99_ms", "burst: lateness p99, ms", "{:,.0f}"),
    ("paced", "late_p50_ms", "paced: lateness p50, ms", "{:,.0f}"),
    ("paced", "late_p99_ms", "paced: lateness p99, ms", "{:,.0f}"),
    ("parked", "late_p50_ms", "parked: lateness p50, ms", "{:,.0f}"),
    ("parked", "late_p99_ms", "parked: lateness p99, ms", "{:,.0f}"),
    ("parked", "late_min_ms", "parked: lateness min, ms", "{:,.1f}"),
    ("burst10k", "late_p50_ms", "burst10k: lateness p50, ms", "{:,.0f}"),
    ("burst10k", "late_p99_ms", "burst10k: lateness p99, ms", "{:,.0f}"),
    ("burst10k", "drain_s", "burst10k: first attempts drain, s", "{:,.1f}"),
    ("rss", "rss_start_mb", "rss: consumer RSS, none in backoff, MB", "{:,.0f}"),
    ("rss", "rss_first_mb", "rss: consumer RSS, {n_first:,} in backoff, MB", "{:,.0f}"),
    ("rss", "rss_all_mb", "rss: consumer RSS, {n:,} in backoff, MB", "{:,.0f}"),
    ("rss", "growth_mb", "rss: growth from {n_first:,} to {n:,}, MB", "{:,.1f}"),
]
PROBLEMS = ("error", "lost", "duplicates", "early", "parked_back_early")


def columns() -> list[tuple[str, str, dict[str, str]]]:
    """(column, library, extra environment) for each column of the table."""
    chosen = os.environ.get("LIBS", " ".join(LIBRARIES)).split()
    queue_types = os.environ.get("FR_QUEUE_TYPES", "classic quorum").split()
    out: list[tuple[str, str, dict[str, str]]] = []
    for lib in chosen:
        if lib not in PER_QUEUE_TYPE:
            out.append((lib, lib, {}))
            continue
        for variant in queue_types:  # classic, quorum; classic+tracing: the plugin's spans on
            queue_type, _, traced = variant.partition("+")
            if traced and lib != "faststream-retry":
                continue
            extra = {"FR_QUEUE_TYPE": queue_type, "FR_TRACING": "1" if traced else ""}
            out.append((f"{lib} {variant}", lib, extra))
            before = os.environ.get("FR_BEFORE")
            if before and lib == "faststream-retry":  # the same column, another checkout
                out.append((f"{lib} {variant} before", lib, {**extra, "FR_CHECKOUT": before}))
    return out


def ctl_for(url: str) -> str | None:
    if os.environ.get("RMQ_CTL"):
        return os.environ["RMQ_CTL"]
    tmp = os.environ.get("TMPDIR", "/tmp")  # noqa: S108 - where start.sh puts its brokers
    ctl = Path(tmp) / f"rabbitmq-test-{urlparse(url).port}" / "ctl"
    return str(ctl) if ctl.exists() else None


def sh(*args: str) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in sh("lscpu").splitlines()
            if line.startswith("Model name")
        ),
        platform.processor(),
    )
    return f"{os.cpu_count()} cores ({model}), Linux {platform.release()}"


def run_one(
    venvs: Path, lib: str, scenario: str, *, name: str, extra: dict[str, str], log: Path
) -> dict[str, Any]:
    venv, module, _ = LIBRARIES[lib]
    env = {**os.environ, **extra, "BENCH_NAME": name}
    command = [str(venvs / venv / "bin" / "python"), "-m", f"bench.peers.{module}", scenario]
    with log.open("a") as err:
        err.write(f"--- {name}: {' '.join(command)}\n")
        err.flush()
        try:
            done = subprocess.run(
                command,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                timeout=1200,
                check=False,
            )
            lines = done.stdout.strip().splitlines()
            result: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        except (subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
    if not result:
        result = {"error": f"no result (exit {done.returncode}); see {log}"}
    return result


def run(scenarios: list[str]) -> Path:
    url = os.environ.get("RABBITMQ_URL")
    if not url:
        sys.exit("set RABBITMQ_URL (scripts/rabbitmq/start.sh prints one)")
    ctl = ctl_for(url)
    if ctl:
        os.environ["RMQ_CTL"] = ctl
    else:
        print("no RMQ_CTL: only the work queues can be deleted afterwards", file=sys.stderr)
    tmp = os.environ.get("TMPDIR", "/tmp")  # noqa: S108 - scratch space, outside the repository
    venvs = Path(os.environ.get("BENCH_VENVS") or Path(tmp, "faststream-retry-bench"))
    checkout = os.environ.setdefault("FR_CHECKOUT", str(ROOT))
    run_id = f"frb-{time.strftime('%H%M%S')}-{secrets.token_hex(2)}"
    out = Path(os.environ.get("OUT") or venvs / f"results-{run_id}.jsonl")
    log = out.with_suffix(".log")
    reps = int(os.environ.get("REPS", "3"))
    cols = columns()
    started = time.time()
    commit = sh("git", "-C", checkout, "describe", "--always", "--dirty", "--abbrev=7")
    header = {
        "run": run_id,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "rabbitmq": sh(ctl, "-q", "version") if ctl else "?",
        "faststream_retry_checkout": f"{checkout} at {commit}",
        "reps": reps,
        "scenarios": scenarios,
    }
    print(json.dumps(header), file=sys.stderr)
    with out.open("a") as results:
        results.write(json.dumps({"header": header}) + "\n")
        for rep in range(1, reps + 1):
            for scenario in scenarios:
                todo = [c for c in cols if scenario in LIBRARIES[c[1]][2]]
                turn = (rep - 1) % max(1, len(todo))
                for column, lib, extra in todo[turn:] + todo[:turn]:
                    short = SHORT[lib] + extra.get("FR_QUEUE_TYPE", "")[:1]
                    short += "t" if extra.get("FR_TRACING") else ""
                    short += "b" if "FR_CHECKOUT" in extra else ""
                    name = f"{run_id}-{rep}-{scenario}-{short}"
                    result = run_one(venvs, lib, scenario, name=name, extra=extra, log=log)
                    result.update(column=column, scenario=scenario, rep=rep)
                    results.write(json.dumps(result) + "\n")
                    results.flush()
                    print(json.dumps(result), file=sys.stderr)
        python = str(venvs / "fs" / "bin" / "python")
        swept = sh(python, "-m", "bench.peers.driver", "sweep", run_id)
        footer = {"wall_s": round(time.time() - started), "left_behind": swept}
        results.write(json.dumps({"footer": footer}) + "\n")
    print(json.dumps(footer), file=sys.stderr)
    return out


def values(results: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in results if r.get(key) is not None]


def cell(figures: list[float], fmt: str) -> str:
    if not figures:
        return "-"
    median = fmt.format(statistics.median(figures))
    if len(figures) == 1:
        return median
    return f"{median} ({fmt.format(min(figures))}-{fmt.format(max(figures))})"


def within_drain(results: list[dict[str, Any]]) -> str:
    timed = [r for r in results if r.get("late_p99_ms") is not None and r.get("drain_s")]
    if not timed:
        return "-"
    return f"{sum(r['late_p99_ms'] <= 1000 * r['drain_s'] for r in timed)} of {len(timed)}"


def report(path: Path) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    header: dict[str, Any] = next((line["header"] for line in lines if "header" in line), {})
    footer: dict[str, Any] = next((line["footer"] for line in lines if "footer" in line), {})
    runs = [line for line in lines if "scenario" in line]
    by: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for result in runs:
        by[result["scenario"], result["column"]].append(result)
    # the happy path's ratio, rep by rep, to bare FastStream's rate of the same rep
    bare = {r["rep"]: r.get("msg_s") for r in by["happy", "faststream"]}
    for (scenario, _), results in by.items():
        for r in results:
            if scenario == "happy" and r.get("msg_s") and bare.get(r["rep"]):
                r["ratio"] = r["msg_s"] / bare[r["rep"]]
    cols = list(dict.fromkeys(r["column"] for r in runs))
    versions = {r["column"]: r.get("version", "?") for r in runs}
    print(f"{header.get('date')}, {header.get('machine')}, RabbitMQ {header.get('rabbitmq')}")
    print(f"faststream-retry: {header.get('faststream_retry_checkout')}")
    print(
        f"{header.get('reps')} reps, median (min-max); run {header.get('run')} took "
        f"{footer.get('wall_s')} s; left on the broker: {footer.get('left_behind')}\n"
    )
    print("| scenario: figure | " + " | ".join(f"{c} {versions[c]}" for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for scenario, key, label, fmt in ROWS:
        if not any(key in r for c in cols for r in by[scenario, c]):
            continue
        cells = [cell(values(by[scenario, c], key), fmt) for c in cols]
        sizes = next(r for c in cols for r in by[scenario, c] if key in r)
        print(f"| {label.format_map(sizes)} | " + " | ".join(cells) + " |")
        if (scenario, key) == ("burst10k", "drain_s"):  # a retry waits behind first attempts
            cells = [within_drain(by[scenario, c]) for c in cols]
            print("| burst10k: runs with lateness p99 <= drain | " + " | ".join(cells) + " |")
    ok_rows = [
        f"{c} {scenario} rep {r['rep']}: " + ", ".join(f"{k}={r[k]}" for k in PROBLEMS if r.get(k))
        for (scenario, c), results in by.items()
        for r in results
        if any(r.get(k) for k in PROBLEMS)
    ]
    print("\nlost, duplicated, early or failed: " + ("none" if not ok_rows else ""))
    for row in ok_rows:
        print(f"  {row}")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--report"]:
        report(Path(args[1]))
        return
    out = run(args or DEFAULT_SCENARIOS)
    report(out)
    print(f"\n(JSON lines: {out})")


if __name__ == "__main__":
    main()
