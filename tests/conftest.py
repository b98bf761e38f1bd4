"""The fixtures every suite shares: a real RabbitMQ, a connection to it, apps on it."""

from __future__ import annotations

import os
import subprocess
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from hypothesis import HealthCheck, settings

from tests.rabbit import App

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Generator, Iterator

    from aio_pika.abc import AbstractRobustConnection

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts" / "rabbitmq"

# scripts/mutation runs the suites once per mutant and compares the score with a floor,
# so the examples must be the same every run; mutmut also calls a test from more than one
# pytest session in one process, which the executor check takes for a bug in the test.
settings.register_profile(
    "mutation",
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.differing_executors],
)
if "HYPOTHESIS_PROFILE" in os.environ:  # otherwise hypothesis's own "ci" profile under CI=true
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under ``CI=true`` a scenario that cannot run fails, with the reason it gave for skipping.

    Outside CI a skip is fine (a developer's own broker cannot be restarted by the
    suite), but a green CI run must have run the restart, reconnect and cluster tests.
    """
    report: pytest.TestReport = yield
    if report.skipped and os.environ.get("CI") == "true" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped, and CI=true does not allow that: {reason}"
    return report


@pytest.fixture(scope="session")
def rabbit_url() -> Iterator[str]:
    """The URL of a real broker: ``RABBITMQ_URL``, or one this session starts and stops."""
    url = os.environ.get("RABBITMQ_URL")
    if url:
        yield url
        return
    started = subprocess.run(
        ["bash", str(SCRIPTS / "start.sh")], capture_output=True, text=True, check=False
    )
    if started.returncode != 0:
        pytest.fail(f"could not start RabbitMQ for the tests:\n{started.stderr}")
    # A node that was already running belongs to someone else: leave it up.
    ours = "reusing running node" not in started.stderr
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        if ours:
            subprocess.run(["bash", str(SCRIPTS / "stop.sh")], capture_output=True, check=False)


@pytest.fixture
async def amqp(rabbit_url: str) -> AsyncIterator[AbstractRobustConnection]:
    """A plain aio-pika connection, to look inside queues and publish raw messages."""
    connection = await aio_pika.connect_robust(rabbit_url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def make_app(
    rabbit_url: str, amqp: AbstractRobustConnection
) -> AsyncIterator[Callable[..., App]]:
    """Build apps for a test; stops them and deletes their queues afterwards."""
    apps: list[App] = []

    def build(**retry_options: Any) -> App:
        app = App(rabbit_url, **retry_options)
        apps.append(app)
        return app

    yield build
    for app in apps:
        await app.stop()
        await app.cleanup(amqp)


def _notes_property_in_chain(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(type(exc).__dict__.get("__notes__"), property):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@pytest.fixture(autouse=True)
def notes_getters_raise_on_every_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception class whose ``__notes__`` getter raises breaks ``traceback`` on 3.10-3.12.

    Python 3.13's ``traceback`` catches that itself. The tests of the plugin's fallback
    use such classes; here formatting them fails on every Python, as it does before 3.13.
    """
    original = traceback.TracebackException.from_exception

    def from_exception(exc: BaseException, *args: Any, **kwargs: Any) -> Any:
        if _notes_property_in_chain(exc):
            raise IndexError
        return original(exc, *args, **kwargs)

    monkeypatch.setattr(traceback.TracebackException, "from_exception", from_exception)
