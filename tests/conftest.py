"""The fixtures every suite shares: a real RabbitMQ, a connection to it, apps on it."""

from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import time
import traceback
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest
from hypothesis import HealthCheck, settings
from packaging.requirements import Requirement

from tests.rabbit import App

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Generator, Iterator

    from _pytest.terminal import TerminalReporter
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


def mutant_cpu_budget(nodeid: str) -> float | None:
    """CPU seconds a test may use against a mutant: mutmut's timeout formula, per test.

    mutmut allows a mutant's whole run ``timeout_multiplier * (sum of its tests' times +
    timeout_constant)`` wall-clock seconds, so a mutant that loops in its first, fast test
    held a worker for up to 212 s (``ttl /= 2`` in ``Tiers.build``, which also allocated
    15 GB meanwhile). Here each test gets that formula over its own time, in CPU seconds,
    which a loaded machine does not use up: a slow survivor is never cut short by it.
    ``None`` outside a mutant's run (mutmut's stats, clean and forced-fail runs, any
    other pytest run) or for a test mutmut has no time for.
    """
    if "__mutmut_" not in os.environ.get("MUTANT_UNDER_TEST", ""):
        return None
    mutmut_state, mutmut_config = (
        sys.modules.get("mutmut.state"),
        sys.modules.get("mutmut.configuration"),
    )
    if mutmut_state is None or mutmut_config is None:
        return None
    seconds = mutmut_state.state().duration_by_test.get(nodeid)
    if seconds is None:
        return None
    config = mutmut_config.config()
    return float((seconds + config.timeout_constant) * config.timeout_multiplier)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Against a mutant, a test over its CPU budget ends the run with mutmut's SIGXCPU.

    The same signal and status as mutmut's own CPU limit (a timeout, which
    scripts/mutation_score.py counts as killed), only sooner; that limit stays in force.
    """
    budget = mutant_cpu_budget(item.nodeid)
    if budget is None:
        return (yield)
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    limit = math.ceil(time.process_time() + budget)
    if soft != resource.RLIM_INFINITY:
        limit = min(limit, soft)
    resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
    try:
        return (yield)
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


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


NO_WHEEL: dict[str, tuple[tuple[int, int], str]] = {
    "watchfiles": ((3, 15), "its source build needs a Rust toolchain, which pip cannot fetch"),
}
"""Distributions with no wheel yet for a Python: the first such Python, and why pip fails.

A test marked ``requires("faststream[cli]")`` needs what pip installs for that requirement.
scripts/test tries the install on every run (the ``run`` dependency group); where it did
not succeed because a distribution listed here is missing, on that Python or a later one,
the test is deselected, and the run's summary names it and the distribution. Once a wheel
is out the install succeeds and the tests run again by themselves; drop the line then.
Missing for any other reason, the test skips, which fails it under ``CI=true``.
"""

NO_WHEEL_KEY = pytest.StashKey[list[str]]()


def missing_for(requirement: str) -> list[str]:
    """Return what ``requirement`` (``dist[extra]``) pulls that is not installed as it asks."""
    wanted = Requirement(requirement)
    missing = []
    try:
        needs = requires(wanted.name) or []
    except PackageNotFoundError:
        return [wanted.name]
    for line in needs:
        need = Requirement(line)
        if need.marker is not None and not any(
            need.marker.evaluate({"extra": extra}) for extra in wanted.extras or {""}
        ):
            continue
        try:
            installed = version(need.name)
        except PackageNotFoundError:
            missing.append(need.name)
            continue
        if not need.specifier.contains(installed, prereleases=True):
            missing.append(f"{need.name} {installed} (not {need.specifier})")
    return missing


def no_wheel_reason(requirement: str, python: tuple[int, int] | None = None) -> str | None:
    """Say why ``requirement`` cannot be installed on ``python`` (this one), if NO_WHEEL is why."""
    python = python or (sys.version_info.major, sys.version_info.minor)
    for name in missing_for(requirement):
        if name in NO_WHEEL and python >= NO_WHEEL[name][0]:
            first = ".".join(map(str, NO_WHEEL[name][0]))
            return (
                f"{requirement} needs {name}, which has no wheel for Python {first} yet "
                f"({NO_WHEEL[name][1]})"
            )
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests whose ``requires`` cannot install here for want of a wheel."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    reasons: dict[str, str | None] = {}
    for item in items:
        reason = None
        for marker in item.iter_markers("requires"):
            requirement = marker.args[0]
            if requirement not in reasons:
                reasons[requirement] = no_wheel_reason(requirement)
            reason = reason or reasons[requirement]
        (dropped if reason else keep).append(item)
        if reason:
            config.stash.setdefault(NO_WHEEL_KEY, []).append(f"{item.nodeid}: {reason}")
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller prints them
        workeroutput["no_wheel"] = config.stash.get(NO_WHEEL_KEY, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Gather what the pytest-xdist workers deselected (each collects every test)."""
    lines = node.config.stash.setdefault(NO_WHEEL_KEY, [])
    lines.extend(line for line in node.workeroutput.get("no_wheel", []) if line not in lines)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test whose ``requires`` is missing for a reason NO_WHEEL does not give skips.

    Which fails it under ``CI=true``, as every skip does.
    """
    for marker in item.iter_markers("requires"):
        missing = missing_for(marker.args[0])
        if missing:
            pytest.skip(
                f"needs {marker.args[0]}, which is not installed as it asks: "
                f"{', '.join(missing)} (pip install -e . --group run)"
            )


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    """Name every test deselected for want of a wheel, and why: none is dropped silently."""
    lines = terminalreporter.config.stash.get(NO_WHEEL_KEY, [])
    if lines:
        terminalreporter.section(f"deselected on Python {sys.version.split()[0]}: no wheel yet")
        for line in lines:
            terminalreporter.write_line(line)


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
