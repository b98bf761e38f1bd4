"""The rule that deselects a test whose requirement has no wheel for this Python yet.

``tests/conftest.py``'s NO_WHEEL: a test marked ``requires("faststream[cli]")`` is
deselected only where what is missing is a distribution NO_WHEEL names, on that Python or
a later one; it runs again by itself once the install succeeds.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError

import pytest

from tests import conftest

CLI_EXTRA = [
    "typer>=0.9,!=0.12,<=0.27.1 ; extra == 'cli'",
    "watchfiles>=0.15.0,<1.2.0 ; extra == 'cli'",
    "prometheus-client>=0.20.0,<0.30.0 ; extra == 'prometheus'",
    "anyio>=3.7.1,<5",
]


def installed(versions: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend exactly ``versions`` (and faststream, with FastStream 0.7.8's requirements)."""

    def version(name: str) -> str:
        if name not in versions:
            raise PackageNotFoundError(name)
        return versions[name]

    def requires(name: str) -> list[str]:
        if name == "faststream":
            return CLI_EXTRA
        version(name)
        return []

    monkeypatch.setattr(conftest, "version", version)
    monkeypatch.setattr(conftest, "requires", requires)


def test_an_extra_installed_as_it_asks_misses_nothing_so_its_tests_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed({"typer": "0.27.1", "watchfiles": "1.1.1", "anyio": "4.16.0"}, monkeypatch)
    assert conftest.missing_for("faststream[cli]") == []
    assert conftest.no_wheel_reason("faststream[cli]", (3, 15)) is None


def test_what_an_extra_pulls_is_missing_when_absent_or_outside_its_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed({"typer": "0.29.2", "anyio": "4.16.0"}, monkeypatch)
    assert conftest.missing_for("faststream[cli]") == [
        "typer 0.29.2 (not !=0.12,<=0.27.1,>=0.9)",
        "watchfiles",
    ]
    assert conftest.missing_for("faststream") == []  # no extra: what every install has
    assert conftest.missing_for("no-such-distribution") == ["no-such-distribution"]


def test_a_distribution_with_no_wheel_excuses_its_tests_from_its_first_python_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed({"typer": "0.29.2", "anyio": "4.16.0"}, monkeypatch)
    monkeypatch.setattr(conftest, "NO_WHEEL", {"watchfiles": ((3, 15), "needs Rust")})
    reason = conftest.no_wheel_reason("faststream[cli]", (3, 15))
    assert reason == (
        "faststream[cli] needs watchfiles, which has no wheel for Python 3.15 yet (needs Rust)"
    )
    assert conftest.no_wheel_reason("faststream[cli]", (3, 16)) == reason
    # Before its first Python a missing watchfiles is no excuse: the tests skip, and fail
    # under CI=true.
    assert conftest.no_wheel_reason("faststream[cli]", (3, 14)) is None


def test_only_a_distribution_no_wheel_names_excuses(monkeypatch: pytest.MonkeyPatch) -> None:
    installed({"watchfiles": "1.1.1", "anyio": "4.16.0"}, monkeypatch)
    monkeypatch.setattr(conftest, "NO_WHEEL", {"watchfiles": ((3, 15), "needs Rust")})
    assert conftest.missing_for("faststream[cli]") == ["typer"]
    assert conftest.no_wheel_reason("faststream[cli]", (3, 15)) is None
