"""``faststream-retry explain``: an app's policies, schedules and topology, with no broker.

The app is a module written into ``tmp_path`` whose broker URL points at a closed port,
and the command is run as an operator runs it (a subprocess): nothing connects.
"""

from __future__ import annotations

import socket
import subprocess
import textwrap
from typing import TYPE_CHECKING

import pytest

from tests.cli import environment, run_cli, script

if TYPE_CHECKING:
    from pathlib import Path

APP = """
from faststream import FastStream
from faststream.rabbit import RabbitBroker

from faststream_retry import Exponential, Fixed, RetryMiddleware, RetryPolicy, retry_policy


class InvalidAddress(Exception):
    pass


retry = RetryMiddleware(
    RetryPolicy(max_attempts=3, backoff=Fixed(2)), prefix="shop", max_delay=60
)
broker = RabbitBroker("{url}", middlewares=[retry])
retry.install(broker)
app = FastStream(broker)


@broker.subscriber("emails")
@retry_policy(
    max_attempts=5,
    immediate=1,
    backoff=Exponential(initial=1, factor=2, maximum=10, jitter=0.5),
    transient=(OSError,),
    permanent=(InvalidAddress,),
)
async def send_email(body: str) -> None: ...


@broker.subscriber("audit")
@retry_policy(enabled=False)
async def audit(body: str) -> None: ...
"""

TIER_ARGUMENTS = {
    "x-queue-type": "quorum",
    "x-dead-letter-exchange": "",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}


def closed_port_url() -> str:
    """Return an AMQP URL on a local port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def write_app(folder: Path, name: str, source: str = APP) -> str:
    url = closed_port_url()
    (folder / f"{name}.py").write_text(textwrap.dedent(source).format(url=url))
    return url


async def test_explain_json_states_the_exact_schedule_tiers_and_objects_with_no_broker(
    tmp_path: Path,
) -> None:
    """Jitter 0.5 on 1 s x 2^(n-1), one immediate retry, tick 1 s (the GCD of 1, 2 and 10 s).

    Each delay is its jitter range rounded up to the tick, as the middleware rounds it;
    the broker URL (the app's and --url) is a closed port, so nothing connected.
    """
    url = write_app(tmp_path, "shop_json")
    result = await run_cli("explain", "shop_json:app", "--json", url=url, cwd=tmp_path)
    assert result.status == 0, result.stderr
    data = result.json()
    assert data["format"] == 1
    assert (data["app"], data["prefix"], data["queue_type"]) == ("shop_json:app", "shop", "quorum")
    assert (data["tick_ms"], data["max_delay_ms"]) == (1000, 60000)
    ttls = [1000, 2000, 4000, 8000, 16000, 32000]
    assert data["tiers"] == [{"name": f"shop.delay.{t}", "ttl_ms": t} for t in ttls]
    expected_shared = []
    for ttl in ttls:
        name = f"shop.delay.{ttl}"
        expected_shared += [
            {"kind": "exchange", "name": name, "type": "fanout", "durable": True},
            {
                "kind": "queue",
                "name": name,
                "durable": True,
                "arguments": {**TIER_ARGUMENTS, "x-message-ttl": ttl},
            },
            {"kind": "binding", "exchange": name, "queue": name, "routing_key": ""},
        ]
    expected_shared.append(
        {
            "kind": "queue",
            "name": "shop.queues",
            "durable": True,
            "arguments": {"x-queue-type": "classic"},
        }
    )
    assert data["shared_objects"] == expected_shared

    audit, emails = data["queues"]  # sorted by name
    assert (emails["queue"], emails["covered"], emails["home_from_tier"]) == ("emails", True, True)
    assert emails["objects"] == [
        {
            "kind": "queue",
            "name": "emails.retry",
            "durable": True,
            "arguments": {
                "x-queue-type": "quorum",
                "x-delivery-limit": 20,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "emails.dlq",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
        },
        {
            "kind": "queue",
            "name": "emails.dlq",
            "durable": True,
            "arguments": {"x-queue-type": "quorum"},
        },
    ]
    (handler,) = emails["handlers"]
    assert {k: handler[k] for k in ("handler", "retries", "own_policy")} == {
        "handler": "send_email",
        "retries": True,
        "own_policy": True,
    }
    assert (handler["max_attempts"], handler["immediate"]) == (5, 1)
    assert handler["backoff"] == {
        "kind": "exponential",
        "initial_ms": 1000,
        "factor": 2.0,
        "maximum_ms": 10000,
        "jitter": 0.5,
        "text": "exponential 1 s x 2^(n-1), at most 10 s, jitter ±50%",
    }
    rows = [
        (
            s["attempt"],
            s["action"],
            s["delay_min_ms"],
            s["delay_max_ms"],
            s["elapsed_min_ms"],
            s["elapsed_max_ms"],
        )
        for s in handler["schedule"]
    ]
    # Delayed retry n waits 1000 * 2^(n-1) * [0.5, 1.5), rounded up to the 1 s tick.
    assert rows == [
        (1, "retry_now", 0, 0, 0, 0),
        (2, "retry_later", 1000, 2000, 1000, 2000),
        (3, "retry_later", 1000, 3000, 2000, 5000),
        (4, "retry_later", 2000, 6000, 4000, 11000),
        (5, "dead_letter", 0, 0, 4000, 11000),
    ]
    legs = [(s["legs_min"], s["legs_max"]) for s in handler["schedule"]]
    assert legs == [
        ([], []),
        ([{"tier_ms": 1000, "to": "emails"}], [{"tier_ms": 2000, "to": "emails"}]),
        (
            [{"tier_ms": 1000, "to": "emails"}],
            [{"tier_ms": 2000, "to": "emails.retry"}, {"tier_ms": 1000, "to": "emails"}],
        ),
        (
            [{"tier_ms": 2000, "to": "emails"}],
            [{"tier_ms": 4000, "to": "emails.retry"}, {"tier_ms": 2000, "to": "emails"}],
        ),
        ([], []),
    ]
    assert (handler["dead_letter_after_min_ms"], handler["dead_letter_after_max_ms"]) == (
        4000,
        11000,
    )
    classification = handler["classification"]
    assert classification["handler"] == {
        "transient": ["OSError"],
        "permanent": ["shop_json.InvalidAddress"],
    }
    assert classification["default"] == {"transient": [], "permanent": []}
    assert "ConnectionError" in classification["builtin"]["transient"]
    assert "UnicodeDecodeError" in classification["builtin"]["permanent"]
    assert classification["unknown"] == {"verdict": "transient", "rule": "fallback"}

    assert audit == {
        "queue": "audit",
        "covered": False,
        "home_from_tier": True,
        "handlers": [{"handler": "audit", "retries": False, "own_policy": True}],
        "objects": [],
    }


async def test_explain_prints_the_schedule_table_for_people(tmp_path: Path) -> None:
    url = write_app(tmp_path, "shop_text")
    result = await run_cli("explain", "shop_text:app", url=url, cwd=tmp_path)
    assert result.status == 0, result.stderr
    text = result.stdout
    assert "tick 1 s, max_delay 1 min" in text
    assert "handler send_email (@retry_policy)" in text
    assert "max_attempts 5, 1 immediate (in-process)" in text
    # The schedule table: attempt, then, delay, elapsed, tiers.
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines()]
    assert ["3", "retry later", "1 s to 3 s", "2 s to 5 s", "1000 → emails (1 hop)"] in rows, text
    assert "2000 + 1000 → emails (2 hops)" in text
    assert "dead-lettered 4 s to 11 s after the first failure" in text
    assert "retries off for every handler" in text
    assert "emails.retry" in text
    assert "x-dead-letter-routing-key=emails.dlq" in text


def test_piped_without_columns_its_rules_stay_short(tmp_path: Path) -> None:
    """Piped, tables keep their width (1,000 columns), and a queue's rule is 100 wide, not 3,000."""
    url = write_app(tmp_path, "shop_piped")
    env = {k: v for k, v in environment(url).items() if k != "COLUMNS"}
    done = subprocess.run(
        [*script(), "explain", "shop_piped:app"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rules = [line for line in done.stdout.splitlines() if line.startswith("emails ─")]
    assert rules
    assert all(len(line) == 100 for line in rules), [len(line) for line in rules]


async def test_a_bad_app_spec_exits_2_naming_the_problem(tmp_path: Path) -> None:
    write_app(tmp_path, "shop_bad")
    (tmp_path / "broken_app.py").write_text("raise RuntimeError('no config file')\n")
    (tmp_path / "no_retry.py").write_text(
        "from faststream.rabbit import RabbitBroker\nbroker = RabbitBroker()\n"
    )
    cases = {
        "shop_bad": "module:attribute",
        "missing_module:app": "cannot import 'missing_module'",
        "shop_bad:nothing": "has no attribute 'nothing'",
        "shop_bad:InvalidAddress": "not a FastStream app",
        "broken_app:app": "importing 'broken_app' raised RuntimeError: no config file",
        "no_retry:broker": "the broker has no RetryMiddleware",
    }
    for spec, message in cases.items():
        result = await run_cli("explain", spec, url=None, cwd=tmp_path)
        assert result.status == 3, (spec, result)
        assert message in " ".join(result.stderr.split()), (spec, result.stderr)
        assert "Traceback" not in result.stderr


@pytest.mark.fastapi
async def test_explain_takes_a_faststream_api_app_as_the_readme_wires_one(tmp_path: Path) -> None:
    """faststream-fastapi's FastStreamAPI keeps its brokers in _brokers only."""
    source = textwrap.dedent(
        f"""
        from fastapi import FastAPI
        from faststream.rabbit import RabbitBroker
        from faststream_fastapi import FastStreamAPI

        from faststream_retry import RetryMiddleware

        retry = RetryMiddleware()
        broker = RabbitBroker({closed_port_url()!r}, middlewares=[retry])


        @broker.subscriber("api-orders")
        async def handle(body: str) -> None: ...


        app = FastStreamAPI(broker, application=FastAPI())
        """
    )
    (tmp_path / "apiapp.py").write_text(source)
    done = await run_cli("explain", "apiapp:app", "--json", url=closed_port_url(), cwd=tmp_path)
    assert done.status == 0, done.stderr
    assert [q["queue"] for q in done.json()["queues"]] == ["api-orders"]
