"""The operator commands on a Redis app, before any server answers: each takes it (``doctor``
also a ``redis://`` URL alone); ``migrate``, RabbitMQ's only, says so; never a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from faststream_retry.cli._common import broker_of
from faststream_retry.ops import load_app
from tests.unit.test_cli_nats import command

if TYPE_CHECKING:
    from pathlib import Path

pytest.importorskip("faststream.redis", reason="faststream[redis], a test dependency")

APP = """
from faststream.redis import RedisBroker, StreamSub
from faststream_retry import RetryMiddleware

broker = RedisBroker("redis://:secret@127.0.0.1:1/3", middlewares=[RetryMiddleware()])


@broker.subscriber(stream=StreamSub("orders", group="g", consumer="c"))
async def handle(body: str) -> None: ...
"""


def test_migrate_is_rabbitmqs_only_and_says_what_to_use(tmp_path: Path) -> None:
    """Exit 3, one line: why migrate has no meaning on Redis, and the commands that do work."""
    done = command(
        tmp_path, "migrate", "orders", "--queue-type", "classic", "--url",
        "redis://:secret@127.0.0.1:1", "--yes",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "works on RabbitMQ only" in done.stderr
    assert "status, explain, doctor, dlq and web take --url redis://" in done.stderr
    assert "Traceback" not in done.stderr
    assert "secret" not in done.stderr


def test_status_of_the_apps_own_server_not_there_is_one_line(tmp_path: Path) -> None:
    """status reads the app's RedisBroker(url) (not RABBITMQ_URL): not there, exit 3, no password."""
    (tmp_path / "redisapp.py").write_text(APP)
    done = command(tmp_path, "status", "--app", "redisapp:broker", "--json")
    assert done.returncode == 3, done.stderr
    assert "127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr
    assert "secret" not in done.stderr


def test_doctor_examines_the_apps_own_server_not_rabbitmq_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's ``RedisBroker(url)``, its password kept for the connection; RABBITMQ_URL
    names a RabbitMQ and is ignored; ``--url`` wins."""
    (tmp_path / "redisapp.py").write_text(APP)
    loaded = load_app("redisapp:broker", cwd=tmp_path, redis=True)
    assert loaded.redis
    assert broker_of(None, loaded) == (
        "redis://:secret@127.0.0.1:1/3",
        "the broker of redisapp:broker",
    )
    monkeypatch.setenv("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:1/")
    assert (
        broker_of("amqp://guest:guest@127.0.0.1:1/", loaded)[1] == "the broker of redisapp:broker"
    )
    assert broker_of("redis://other:6379", loaded) == ("redis://other:6379", "--url")


def test_doctor_says_an_unreachable_server_without_its_password(tmp_path: Path) -> None:
    """Exit 3, the URL shown without the password, no traceback."""
    (tmp_path / "redisapp.py").write_text(APP)
    done = command(tmp_path, "doctor", "redisapp:broker")
    assert done.returncode == 3, done.stderr
    assert "cannot reach the Redis server at redis://***@127.0.0.1:1/3" in done.stderr
    assert "secret" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


CLUSTER = """
from faststream.redis import RedisClusterBroker, StreamSub
from faststream_retry import RetryMiddleware

broker = RedisClusterBroker(middlewares=[RetryMiddleware()])
"""


def test_doctor_asks_for_the_server_of_a_cluster_app(tmp_path: Path) -> None:
    """A cluster broker names no one server: doctor asks for --url, not localhost's."""
    (tmp_path / "clusterapp.py").write_text(CLUSTER)
    done = command(tmp_path, "doctor", "clusterapp:broker")
    assert done.returncode == 3, done.stderr
    assert "give one with --url redis://host:6379" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("doctor",), "give the app (module:attribute); only on Redis"),
        (("doctor", "--url", "amqp://127.0.0.1:1/"), "only on Redis (--url redis://...)"),
        (
            ("doctor", "redisapp:broker", "--url", "amqp://127.0.0.1:1/"),
            "is not a Redis URL: give the app's server (--url redis://host:6379)",
        ),
        (
            ("doctor", "--url", "redis://127.0.0.1:1", "--management-url", "http://x:15672"),
            "--management-url is RabbitMQ's management API: leave it out on Redis",
        ),
    ],
)
def test_doctor_refuses_what_cannot_be_checked_with_the_fix(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    (tmp_path / "redisapp.py").write_text(APP)
    done = command(tmp_path, *args)
    assert done.returncode == 3, done.stderr
    assert said in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
