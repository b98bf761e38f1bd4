"""The scenarios of the peer benchmark, the same for every library (needs only aio-pika).

It runs inside one library's virtualenv, started by ``bench/peers/run.py`` as
``python -m bench.peers.lib_<name> <scenario>``, and prints one JSON line. A library plugs
in with an adapter (``lib_*.py``) that builds an app whose handler does::

    delay = rec.call(message_id)       # None: succeed; else fail, to be retried in `delay` s
    if delay is not None:
        raise <the library's transient error>   # faststream-retry: RetryLater(delay) if explicit

Every message is a 512-byte persistent JSON body with a ``message_id``; one clock
(``time.perf_counter`` in this process) times both the publisher and the handler. The
lateness of a retry is (2nd handler call - 1st handler call - the delay asked for).

Environment (``run.py`` sets these): RABBITMQ_URL, BENCH_NAME (prefix of every broker
object this run creates: all are deleted at the end, listed with RMQ_CTL, a rabbitmqctl
wrapper), BENCH_PREFETCH (100), BENCH_SIZE (512) and the sizes in ``Sizes``.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from subprocess import PIPE
from typing import Any, Protocol

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5673/")
PREFETCH = int(os.environ.get("BENCH_PREFETCH", "100"))
SIZE = int(os.environ.get("BENCH_SIZE", "512"))


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


@dataclass(frozen=True)
class Sizes:
    """Every knob of the scenarios, from the environment (run.py's docstring lists them)."""

    happy_n: int = int(_env("HAPPY_N", 5000))
    burst_n: int = int(_env("BURST_N", 2000))
    paced_n: int = int(_env("PACED_N", 2000))
    paced_rate: float = _env("PACED_RATE", 200)
    delay: float = _env("RETRY_DELAY", 1)
    parked_n: int = int(_env("PARKED_N", 10000))
    parked_delay: float = _env("PARKED_DELAY", 600)
    parked_rate: float = _env("PARKED_RATE", 150)
    parked_seconds: float = _env("PARKED_SECONDS", 15)
    burst10k_n: int = int(_env("BURST10K_N", 10000))
    burst10k_delay: float = _env("BURST10K_DELAY", 5)
    rss_n: int = int(_env("RSS_N", 100000))
    rss_first: int = int(_env("RSS_FIRST", 10000))


@dataclass(frozen=True)
class Spec:
    """The retry an adapter configures: `delay` seconds after a failure.

    explicit: the handler names each message's delay (faststream-retry: RetryLater).
    """

    delay: float
    explicit: bool = False


Plan = Callable[[str, int], "float | None"]  # (message id, failures so far) -> delay or None


class Recorder:
    """Times every handler call; the plan says which calls fail, and with what delay."""

    def __init__(self, plan: Plan, *, keep: bool = True) -> None:
        self.plan = plan
        self.keep = keep  # False: count calls only (the RSS scenario must not grow here)
        self.calls: dict[str, list[float]] = {}
        self.n_calls = 0
        self.n_ok = 0
        self.first: float | None = None
        self.last_ok = 0.0
        # The process's CPU time at its first call and at its latest first attempt: what the
        # consumer spends per message, less noisy than a rate on a shared machine.
        self.cpu_first = 0.0
        self.cpu_last_first = 0.0

    def call(self, mid: str) -> float | None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
            self.cpu_first = time.process_time()
        self.n_calls += 1
        failures = 0
        if self.keep:
            times = self.calls.setdefault(mid, [])
            failures = len(times)
            times.append(now)
            if not failures:
                self.cpu_last_first = time.process_time()
        delay = self.plan(mid, failures)
        if delay is None:
            self.n_ok += 1
            self.last_ok = now
        return delay


class Adapter(Protocol):
    """One library under test (lib_*.py)."""

    name: str
    version: str
    retries: bool  # False: bare FastStream, no retry configured (happy path only)

    def make(self, base: str, queue: str, spec: Spec | None, rec: Recorder) -> Any: ...
    async def start(self, app: Any) -> None: ...
    async def stop(self, app: Any) -> None: ...


def quiet_logging() -> None:
    """No per-message log lines for any library (FastStream's access log, retry WARNINGs).

    Errors still reach stderr, which run.py keeps in a log file.
    """
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")


def body(i: int) -> bytes:
    head = json.dumps({"i": i, "pad": ""})
    return json.dumps({"i": i, "pad": "x" * max(0, SIZE - len(head))}).encode()


async def publish(channel: AbstractChannel, queue: str, ids: Iterable[str]) -> None:
    """Publish persistent messages, with confirms, 500 in flight at a time."""
    pending: list[Awaitable[Any]] = []
    for n, mid in enumerate(ids):
        message = aio_pika.Message(
            body(n),
            message_id=mid,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        pending.append(channel.default_exchange.publish(message, routing_key=queue))
        if len(pending) == 500:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)


async def publish_paced(channel: AbstractChannel, queue: str, ids: list[str], rate: float) -> None:
    start, sent = time.perf_counter(), 0
    while sent < len(ids):
        due = min(len(ids), int((time.perf_counter() - start) * rate) + 1)
        await publish(channel, queue, ids[sent:due])
        sent = due
        await asyncio.sleep(0.02)


async def ready(connection: AbstractConnection, queue: str) -> int:
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        return declared.declaration_result.message_count or 0
    finally:
        await channel.close()


async def drained(connection: AbstractConnection, queue: str, timeout: float = 600) -> None:
    """Wait until `queue` has no ready message."""
    deadline = time.perf_counter() + timeout
    while await ready(connection, queue):
        if time.perf_counter() > deadline:
            return
        await asyncio.sleep(0.05)


async def until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def lateness(rec: Recorder, delay_of: Callable[[str], float]) -> dict[str, Any]:
    """Lateness of each message's first retry, ms; early = retries that came back early."""
    late = [
        (times[1] - times[0] - delay_of(mid)) * 1000
        for mid, times in rec.calls.items()
        if len(times) >= 2
    ]
    if not late:
        return {}
    return {
        "late_p50_ms": round(pct(late, 50), 1),
        "late_p99_ms": round(pct(late, 99), 1),
        "late_min_ms": round(min(late), 1),
        "late_max_ms": round(max(late), 1),
        "early": sum(1 for v in late if v < 0),
    }


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:  # noqa: PTH123 - Linux only
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return math.nan


class Run:
    """One scenario for one library: the connection, the names, the app's lifecycle."""

    def __init__(self, adapter: Adapter, scenario: str) -> None:
        self.adapter = adapter
        self.base = os.environ.get("BENCH_NAME", f"frb-{os.getpid()}-{scenario}")
        self.queue = self.base  # the work queue; the library's own objects share the prefix
        self.out: dict[str, Any] = {"name": adapter.name, "version": adapter.version}
        if hasattr(adapter, "source"):  # where the library was imported from (a checkout)
            self.out["source"] = adapter.source
        self.connection: AbstractConnection
        self.channel: AbstractChannel

    async def open(self) -> None:
        self.connection = await aio_pika.connect(URL)
        self.channel = await self.connection.channel()  # publisher confirms on

    async def close(self) -> None:
        await delete_prefixed(self.connection, self.base)
        await self.connection.close()

    async def declare(self, spec: Spec | None) -> None:
        """Start and stop the library once, so it declares its queues its own way first."""
        app = self.adapter.make(self.base, self.queue, spec, Recorder(lambda _m, _k: None))
        await self.adapter.start(app)
        await asyncio.sleep(0.2)
        await self.adapter.stop(app)

    async def consume(
        self,
        spec: Spec | None,
        rec: Recorder,
        done: Callable[[], bool],
        timeout: float,
        during: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Run the app until `done`, with `during` (a publisher, say) running alongside."""
        app = self.adapter.make(self.base, self.queue, spec, rec)
        await self.adapter.start(app)
        task = asyncio.ensure_future(during()) if during is not None else None
        if not await until(done, timeout):
            self.out["error"] = f"timeout after {timeout:.0f} s: {rec.n_ok} succeeded"
        await asyncio.sleep(0.5)  # a duplicate would show up now
        if task is not None:
            task.cancel()
        await self.adapter.stop(app)


async def delete_prefixed(connection: AbstractConnection, prefix: str) -> list[str]:
    """Delete every queue and exchange whose name starts with `prefix`; return their names.

    They are listed with RMQ_CTL (a rabbitmqctl wrapper); without it only the queue named
    `prefix`, a scenario's work queue, is deleted.
    """
    ctl = os.environ.get("RMQ_CTL")
    found: dict[str, list[str]] = {"queues": [prefix] if not ctl else [], "exchanges": []}
    for kind in found if ctl else ():
        lister = await asyncio.create_subprocess_exec(
            str(ctl), "-q", f"list_{kind}", "name", "--no-table-headers", stdout=PIPE
        )
        listed, _ = await lister.communicate()
        found[kind] = sorted(name for name in listed.decode().split() if name.startswith(prefix))
    channel = await connection.channel()
    for queue in found["queues"]:
        await channel.queue_delete(queue)
    for exchange in found["exchanges"]:
        await channel.exchange_delete(exchange)
    await channel.close()
    return found["queues"] + found["exchanges"]


# ---------------------------------------------------------------- the scenarios
async def happy(run: Run, spec: Spec | None, sizes: Sizes) -> None:
    """N pre-published messages that all succeed: msg/s from the first call to the last."""
    n = sizes.happy_n
    await run.declare(spec)
    await publish(run.channel, run.queue, (f"m{i}" for i in range(n)))
    rec = Recorder(lambda _m, _k: None)
    await run.consume(spec, rec, lambda: rec.n_ok >= n, 60 + n / 100)
    first = rec.first or 0.0
    run.out.update(
        n=n,
        n_ok=rec.n_ok,
        duplicates=rec.n_calls - len(rec.calls),
        msg_s=round((rec.n_ok - 1) / (rec.last_ok - first), 1) if rec.n_ok > 1 else None,
    )


async def fail_once(run: Run, spec: Spec, n: int, rate: float) -> None:
    """N messages that fail once, then succeed; pre-published (rate 0) or paced at `rate`/s."""
    ids = [f"m{i}" for i in range(n)]
    await run.declare(spec)
    if rate <= 0:
        await publish(run.channel, run.queue, ids)
    rec = Recorder(lambda _m, k: spec.delay if k == 0 else None)

    async def paced() -> None:
        await publish_paced(run.channel, run.queue, ids, rate)

    timeout = 120 + spec.delay + (n / rate if rate > 0 else n / 200)
    await run.consume(spec, rec, lambda: rec.n_ok >= n, timeout, paced if rate > 0 else None)
    firsts = sorted(times[0] for times in rec.calls.values())
    first_back = min((t[1] for t in rec.calls.values() if len(t) > 1), default=math.inf)
    before = [t for t in firsts if t < first_back]  # first attempts before any retry is back
    run.out.update(
        n=n,
        delay_s=spec.delay,
        n_ok=rec.n_ok,
        lost=n - rec.n_ok,
        duplicates=sum(max(0, len(t) - 2) for t in rec.calls.values()),
        retried_msg_s=round(rec.n_ok / (rec.last_ok - firsts[0]), 1) if rec.n_ok else None,
        first_attempt_msg_s=(
            round((len(before) - 1) / (before[-1] - before[0]), 1) if len(before) >= 100 else None
        ),
        drain_s=round(firsts[-1] - firsts[0], 3) if firsts else None,
        # every first attempt before any retry is back (a burst): the failure path's CPU
        first_attempt_cpu_us=(
            round((rec.cpu_last_first - rec.cpu_first) / (len(rec.calls) - 1) * 1e6, 1)
            if len(before) == len(rec.calls) >= 100
            else None
        ),
        **lateness(rec, lambda _m: spec.delay),
    )


async def parked(run: Run, sizes: Sizes) -> None:
    """N messages parked with a long RetryLater, then a paced stream failing once (1-5 s)."""
    spec = Spec(delay=1, explicit=True)
    n_stream = int(sizes.parked_rate * sizes.parked_seconds)

    def delay_of(mid: str) -> float:
        return sizes.parked_delay if mid.startswith("park") else 1 + int(mid[1:]) % 5

    def plan(mid: str, failures: int) -> float | None:
        return delay_of(mid) if failures == 0 else None

    await run.declare(spec)
    await publish(run.channel, run.queue, (f"park{i}" for i in range(sizes.parked_n)))
    rec = Recorder(plan)
    stream = [f"s{i}" for i in range(n_stream)]
    parked_at = 0.0

    async def then_stream() -> None:
        nonlocal parked_at
        await until(lambda: rec.n_calls >= sizes.parked_n, 600)
        await drained(run.connection, run.queue)
        parked_at = time.perf_counter()
        await publish_paced(run.channel, run.queue, stream, sizes.parked_rate)

    timeout = 120 + sizes.parked_n / 200 + sizes.parked_seconds
    await run.consume(spec, rec, lambda: rec.n_ok >= n_stream, timeout, then_stream)
    stream_calls = {mid: t for mid, t in rec.calls.items() if mid.startswith("s")}
    parked_calls = [t for mid, t in rec.calls.items() if mid.startswith("park")]
    rec.calls = stream_calls
    run.out.update(
        n_parked=sizes.parked_n,
        parked_delay_s=sizes.parked_delay,
        park_s=round(parked_at - (rec.first or 0.0), 3),
        parked_back_early=sum(1 for t in parked_calls if len(t) > 1),
        n=n_stream,
        n_ok=rec.n_ok,
        lost=n_stream - rec.n_ok,
        duplicates=sum(max(0, len(t) - 2) for t in stream_calls.values()),
        **lateness(rec, delay_of),
    )


async def rss(run: Run, sizes: Sizes) -> None:
    """The consumer's RSS while N messages go into backoff (a long delay), published by a child."""
    spec = Spec(delay=1, explicit=True)  # as in `parked`: tick 1 s, RetryLater(long)
    rec = Recorder(lambda _m, _k: sizes.parked_delay, keep=False)
    samples: dict[str, float] = {}

    async def feed() -> None:
        gc.collect()
        await asyncio.sleep(1)
        samples["rss_start_mb"] = rss_mb()
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.peers.driver", "publish", run.queue, str(sizes.rss_n)
        )
        await until(lambda: rec.n_calls >= sizes.rss_first, 600)
        samples["rss_first_mb"] = rss_mb()
        await child.wait()
        await until(lambda: rec.n_calls >= sizes.rss_n, 600)
        await drained(run.connection, run.queue)
        await asyncio.sleep(1)
        samples["rss_all_mb"] = rss_mb()

    await run.declare(spec)
    timeout = 120 + sizes.rss_n / 100
    await run.consume(spec, rec, lambda: "rss_all_mb" in samples, timeout, feed)
    first_mb, all_mb = samples.get("rss_first_mb", math.nan), samples.get("rss_all_mb", math.nan)
    run.out.update(
        n=sizes.rss_n,
        n_first=sizes.rss_first,
        n_calls=rec.n_calls,
        **{key: round(value, 1) for key, value in samples.items()},
        growth_mb=round(all_mb - first_mb, 1),
    )


SCENARIOS: dict[str, Callable[[Run, Sizes], Awaitable[None]]] = {
    "happy": lambda run, s: happy(run, Spec(s.delay) if run.adapter.retries else None, s),
    "burst": lambda run, s: fail_once(run, Spec(s.delay), s.burst_n, 0),
    "paced": lambda run, s: fail_once(run, Spec(s.delay), s.paced_n, s.paced_rate),
    "burst10k": lambda run, s: fail_once(run, Spec(s.burst10k_delay), s.burst10k_n, 0),
    "parked": parked,
    "rss": rss,
}


async def _run(adapter: Adapter, scenario: str) -> dict[str, Any]:
    started = time.perf_counter()
    run = Run(adapter, scenario)
    run.out["scenario"] = scenario
    await run.open()
    try:
        await SCENARIOS[scenario](run, Sizes())
    except Exception as exc:  # one JSON line whatever happens; the traceback goes to stderr
        logging.disable(logging.NOTSET)
        logging.getLogger("bench").exception("scenario %s failed", scenario)
        run.out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        await run.close()
    run.out["wall_s"] = round(time.perf_counter() - started, 1)
    return run.out


def main(adapter: Adapter) -> None:
    """Entry point of every lib_*.py: run the scenario in argv[1], print one JSON line."""
    quiet_logging()
    print(json.dumps(asyncio.run(_run(adapter, sys.argv[1]))), flush=True)


async def _tool(command: str, args: list[str]) -> None:
    connection = await aio_pika.connect(URL)
    if command == "publish":  # the RSS scenario's publisher, a process of its own
        await publish(await connection.channel(), args[0], (f"m{i}" for i in range(int(args[1]))))
    elif command == "sweep":  # run.py's last step: whatever a crashed scenario left behind
        print(json.dumps(await delete_prefixed(connection, args[0])))
    await connection.close()


if __name__ == "__main__":  # python -m bench.peers.driver publish QUEUE N | sweep PREFIX
    asyncio.run(_tool(sys.argv[1], sys.argv[2:]))
