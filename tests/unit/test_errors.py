"""The plugin's own errors share a root; a handler's control exceptions stand apart (pure)."""

from __future__ import annotations

import pytest

from faststream_retry import (
    CopyNotConfirmed,
    FastStreamRetryError,
    HeadersTooLarge,
    InvalidDueTime,
    PermanentError,
    RetryConfigError,
    RetryLater,
    RetryTopologyError,
    RetryWorkerError,
    TransientError,
)
from faststream_retry.ops import OperationError


@pytest.mark.parametrize(
    "error", [RetryConfigError, RetryTopologyError, RetryWorkerError, OperationError]
)
def test_every_error_of_the_plugins_own_is_caught_by_the_root(
    error: type[FastStreamRetryError],
) -> None:
    assert issubclass(error, FastStreamRetryError)


@pytest.mark.parametrize(
    "control",
    [TransientError, PermanentError, RetryLater, InvalidDueTime, HeadersTooLarge, CopyNotConfirmed],
)
def test_a_handlers_control_exceptions_are_not_the_plugins_errors(
    control: type[Exception],
) -> None:
    """``except FastStreamRetryError`` around a handler never swallows what steers its message."""
    assert not issubclass(control, FastStreamRetryError)


def test_each_error_is_still_what_callers_caught_before() -> None:
    """A config error is a ValueError and the worker's a ConnectionError, as they were."""
    assert issubclass(RetryConfigError, ValueError)
    assert issubclass(RetryTopologyError, RetryConfigError)
    assert issubclass(RetryWorkerError, ConnectionError)


def test_a_config_error_about_an_argument_names_its_owner_and_option() -> None:
    error = RetryConfigError.argument("Fixed", "delay", "must be positive")
    assert str(error) == "Fixed(delay=...) must be positive"
    assert (error.option, error.problem) == ("delay", "must be positive")
    assert type(error) is RetryConfigError
    topology = RetryTopologyError.argument("Plan", "tick", "is off")
    assert type(topology) is RetryTopologyError


def test_a_config_error_about_nothing_in_particular() -> None:
    error = RetryConfigError("prefix must be a short non-empty str, got ''")
    assert error.option is None
    assert error.problem == str(error) == "prefix must be a short non-empty str, got ''"
    assert RetryConfigError("x", option="y").problem == "x"
    assert RetryConfigError("x", option="y", problem="z").problem == "z"


def test_the_causes_recorded_on_dead_letters_are_named_by_their_public_path() -> None:
    """``retry-exception`` carries these names; they must stay what the docs say."""
    from faststream_retry.core.headers import exception_name  # noqa: PLC0415

    names = [exception_name(e()) for e in (InvalidDueTime, HeadersTooLarge, CopyNotConfirmed)]
    assert names == [
        "faststream_retry.InvalidDueTime",
        "faststream_retry.HeadersTooLarge",
        "faststream_retry.CopyNotConfirmed",
    ]
