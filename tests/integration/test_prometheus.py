"""Prometheus: the `prometheus` extra's endpoint after real retries and dead letters.

The docs' example app (examples/docs/prometheus_app.py) runs on a real broker beside
FastStream's own Prometheus middleware; its /metrics is scraped over HTTP. The alert
rules in examples/prometheus/ are checked against what is exposed, and run through
Prometheus's own promtool (required under CI=true; scripts/test fetches it).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from faststream_retry import PermanentError
from tests.integration.test_cli_dlq import delete
from tests.rabbit import eventually, eventually_async, queue_depth

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "examples" / "prometheus"

# Every instrument once, through the reader the extra uses, in a process of its own
# (prometheus_client's registry is global): the full exposition, outage metrics included.
EVERY_METRIC = """
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import REGISTRY, generate_latest

from faststream_retry.core.events import EventKind, Reason, RetryEvent, Rule, Verdict
from faststream_retry.reporting.metrics import count
from faststream_retry.reporting.telemetry import ATTR, Telemetry

t = Telemetry(None, MeterProvider(metric_readers=[PrometheusMetricReader()]), max_delay_s=600)
q = "payments"
for kind, extra in [
    (EventKind.SCHEDULED, {"delay_ms": 1500, "rule": Rule.BUILTIN, "classification": Verdict.TRANSIENT}),
    (EventKind.RELEASED, {"lateness_ms": 7}),
    (EventKind.DEAD_LETTERED, {"reason": Reason.INVALID}),
    (EventKind.OUTAGE_STARTED, {}),
    (EventKind.OUTAGE_ENDED, {"duration_ms": 90_000}),
]:
    count(t, RetryEvent(kind=kind, queue=q, message_id="m", attempt=1, at_ms=0, **extra))
t.outage_active.add(1, {ATTR.QUEUE: q})
t.outage_probes.add(1, {ATTR.QUEUE: q})
t.outage_requeued.add(1, {ATTR.QUEUE: q})
t.dlq_depths[q] = 3
print(generate_latest(REGISTRY).decode())
"""


def samples(text: str) -> dict[str, list[Any]]:
    """Each sample name (``_bucket``, ``_total`` included) and its samples."""
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def families(text: str) -> dict[str, str]:
    """Each family's name and type."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def value(found: dict[str, list[Any]], name: str, **labels: str) -> float:
    return float(
        sum(
            s.value
            for s in found.get(name, [])
            if all(s.labels.get(k) == v for k, v in labels.items())
        )
    )


def every_metric() -> str:
    done = subprocess.run(
        [sys.executable, "-c", EVERY_METRIC],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def promtool() -> str | None:
    found = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not found and os.environ.get("CI") == "true":
        pytest.fail("promtool is needed under CI=true (scripts/test fetches it: PROMTOOL)")
    return found or None


def test_every_metric_has_its_prometheus_name_type_and_unit() -> None:
    """Durations in seconds with buckets up to max_delay; counters end in _total."""
    text = every_metric()
    assert {k: v for k, v in families(text).items() if k.startswith("faststream_retry")} == {
        "faststream_retry_failures": "counter",
        "faststream_retry_retries_scheduled": "counter",
        "faststream_retry_retries_released": "counter",
        "faststream_retry_dead_lettered": "counter",
        "faststream_retry_planned_delay_seconds": "histogram",
        "faststream_retry_lateness_seconds": "histogram",
        "faststream_retry_outage_active": "gauge",
        "faststream_retry_outage_entered": "counter",
        "faststream_retry_outage_probes": "counter",
        "faststream_retry_outage_requeued": "counter",
        "faststream_retry_outage_duration_seconds": "histogram",
        "faststream_retry_dlq_messages": "gauge",
    }
    found = samples(text)
    assert value(found, "faststream_retry_planned_delay_seconds_sum") == 1.5
    assert value(found, "faststream_retry_lateness_seconds_sum") == 0.007
    assert value(found, "faststream_retry_outage_duration_seconds_sum") == 90
    assert value(found, "faststream_retry_dlq_messages", faststream_retry_queue="payments") == 3

    def bounds(name: str) -> list[str]:
        return [s.labels["le"] for s in found[f"{name}_bucket"]]

    # max_delay 600 s: the delay and lateness buckets end there, an outage's at a day.
    assert bounds("faststream_retry_planned_delay_seconds")[-3:] == ["300.0", "600.0", "+Inf"]
    assert bounds("faststream_retry_lateness_seconds")[0] == "0.005"
    assert bounds("faststream_retry_outage_duration_seconds")[-2:] == ["86400.0", "+Inf"]
    tool = promtool()
    if tool:  # Prometheus's own lint of names, units and suffixes
        lint = subprocess.run(
            [tool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_alert_rules_name_only_what_is_exposed_and_pass_their_own_tests() -> None:
    """Each series alerts.yml and its tests name is one the plugin exposes, with its labels."""
    found = samples(every_metric())
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())
    labels = {label for series in found.values() for s in series for label in s.labels}
    named: set[str] = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            named |= set(re.findall(r"\bfaststream_retry_\w+", rule["expr"])) - labels
    assert named, "the rules name no metric"
    missing = sorted(name for name in named if name not in found)
    assert not missing, f"alerts.yml names metrics the plugin does not expose: {missing}"
    tests = yaml.safe_load((RULES / "alerts.test.yml").read_text())
    for case in tests["tests"]:
        for series in case["input_series"]:
            match = re.fullmatch(r"(\w+)\{(.*)\}", series["series"])
            assert match, series["series"]
            name, labels = match[1], set(re.findall(r"(\w+)=", match[2]))
            assert name in found, f"alerts.test.yml feeds {name}, which is not exposed"
            # instance and job: what Prometheus adds to every series it scrapes.
            exposed = set().union(*(s.labels for s in found[name]), {"instance", "job"})
            assert labels <= exposed, f"{name}: {labels - exposed} are not its labels"
    tool = promtool()
    if tool:
        for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"]):
            run = subprocess.run(
                [tool, *args], cwd=RULES, capture_output=True, text=True, check=False
            )
            assert run.returncode == 0, run.stdout + run.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def scrape(port: int) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return str(r.read().decode())

    return await asyncio.to_thread(get)


async def test_the_example_app_exposes_retries_dead_letters_and_dlq_depth(
    amqp: AbstractRobustConnection, rabbit_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two failed attempts then success, and one permanent failure, scraped exactly.

    Beside FastStream's middleware (listed after RetryMiddleware), each failed attempt
    is its status="error" and the success its "acked"; the plugin's metrics say which
    failures were retried and which dead-lettered, and how deep the DLQ is.
    """
    port = free_port()
    monkeypatch.setenv("RABBITMQ_URL", rabbit_url)
    monkeypatch.setenv("METRICS_PORT", str(port))
    example = importlib.import_module("examples.docs.prometheus_app")
    calls: dict[int, int] = {}

    async def charge(payment: dict[str, int]) -> None:
        calls[payment["id"]] = calls.get(payment["id"], 0) + 1
        if payment["id"] == 2:
            raise PermanentError("card refused")
        if calls[1] <= 2:
            raise TimeoutError("gateway slow")

    monkeypatch.setattr(example, "charge", charge)
    await delete(amqp, "payments", "payments.dlq", "payments.retry")
    example.serve_metrics()
    await example.broker.start()
    try:
        await example.broker.publish({"id": 1}, queue="payments")
        await example.broker.publish({"id": 2}, queue="payments")
        # The first attempt at 0 s, retries after 1 s and 2 s.
        await eventually(lambda: calls.get(1) == 3, timeout=20, what="the third attempt")
        dlq = await queue_depth(amqp, "payments.dlq")
        assert dlq == 1

        async def dlq_shown() -> bool:
            # A read asks for a sample; a later read shows it.
            found = samples(await scrape(port))
            return value(found, "faststream_retry_dlq_messages") == dlq

        await eventually_async(dlq_shown, timeout=15, what="the DLQ depth on /metrics")
        found = samples(await scrape(port))
    finally:
        await example.broker.stop()
        await delete(amqp, "payments", "payments.dlq", "payments.retry")

    q = {"faststream_retry_queue": "payments"}
    failures = "faststream_retry_failures_total"
    assert value(found, failures, **q, faststream_retry_classification="transient") == 2
    assert value(found, failures, **q, faststream_retry_classification="permanent") == 1
    assert value(found, "faststream_retry_retries_scheduled_total", **q) == 2
    assert value(found, "faststream_retry_retries_released_total", **q) == 2
    dead = "faststream_retry_dead_lettered_total"
    assert value(found, dead, **q, faststream_retry_reason="permanent") == 1
    assert value(found, "faststream_retry_planned_delay_seconds_sum", **q) == 3.0
    # The default max_delay (its last finite bucket) holds every delay.
    planned = {
        s.labels["le"]: s.value for s in found["faststream_retry_planned_delay_seconds_bucket"]
    }
    assert planned["1.0"] == 1
    assert planned["2.5"] == 2
    max_delay_s = example.retry._plugin.config.topology.max_delay_ms / 1000
    assert max(float(le) for le in planned if le != "+Inf") == max_delay_s
    # FastStream's own middleware, side by side.
    handler = {"handler": "default.payments"}
    processed = "faststream_received_processed_messages_total"
    assert value(found, processed, **handler, status="error") == 3
    assert value(found, processed, **handler, status="acked") == 1
