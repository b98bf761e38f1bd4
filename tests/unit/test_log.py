"""Where the plugin's log lines go: the user's logging when configured, else the broker's logger."""

from __future__ import annotations

import io
import logging
import sys
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from faststream.rabbit import RabbitBroker

from faststream_retry.core.headers import traceback_text
from faststream_retry.middleware import _internals as fs
from faststream_retry.reporting import log as _log
from faststream_retry.reporting.log import LINE_LIMIT, NAME, TRACEBACK_LIMIT, PluginLogger, log

if TYPE_CHECKING:
    from collections.abc import Mapping


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Outlet:
    """A broker's logger, as ``_internals.broker_outlet`` hands it over."""

    def __init__(self, *, answer: bool = True, fail: bool = False) -> None:
        self.lines: list[tuple[int, str, BaseException | None, Mapping[str, Any]]] = []
        self.answer = answer
        self.fail = fail

    def __call__(
        self, level: int, text: str, exc: BaseException | None, extra: Mapping[str, Any]
    ) -> bool:
        if self.fail:
            raise RuntimeError("broken outlet")
        self.lines.append((level, text, exc, extra))
        return self.answer


@pytest.fixture
def unconfigured() -> PluginLogger:
    """A plugin logger whose logging.Logger reaches no handler.

    Outside the logger tree: pytest puts its capture handlers on the root and on
    loggers that do not propagate.
    """
    logger = logging.Logger("unconfigured")  # noqa: LOG001 - outside the tree, on purpose
    logger.parent = logging.Logger("root", logging.WARNING)  # noqa: LOG001 - a stand-in root
    return PluginLogger(logger)


def test_the_plugin_logs_under_its_documented_name() -> None:
    """Users who configured ``faststream_retry`` keep getting the lines there."""
    assert NAME == "faststream_retry"
    assert log.logger is logging.getLogger("faststream_retry")
    assert PluginLogger().logger is logging.getLogger("faststream_retry")
    mine = logging.Logger("mine")  # noqa: LOG001 - any logger
    assert PluginLogger(mine).logger is mine


def test_without_configuration_lines_go_to_the_broker(unconfigured: PluginLogger) -> None:
    """No handler anywhere: the broker's logger gets the formatted line, level and extras."""
    outlet = Outlet()
    unconfigured.send_to(outlet)
    error = ValueError("bad")
    unconfigured.log(
        logging.ERROR, "message %s from %s", "m-1", "q", exc_info=error, extra={"a": 1}
    )
    unconfigured.info("plain %d%%", 5)
    unconfigured.warning("w")
    unconfigured.error("e")
    unconfigured.debug("hidden: DEBUG needs a level set on the logger")
    assert outlet.lines == [
        (
            logging.ERROR,
            f"message m-1 from q\n{traceback_text(error, TRACEBACK_LIMIT)[:-1]}",
            None,
            {"a": 1},
        ),
        (logging.INFO, "plain 5%", None, {}),
        (logging.WARNING, "w", None, {}),
        (logging.ERROR, "e", None, {}),
    ]


def test_a_text_without_arguments_is_taken_as_it_is(unconfigured: PluginLogger) -> None:
    """A percent sign in a line without arguments is not a format."""
    outlet = Outlet()
    unconfigured.send_to(outlet)
    unconfigured.info("100% done")
    assert outlet.lines == [(logging.INFO, "100% done", None, {})]


def test_exception_sends_the_exception_being_handled(unconfigured: PluginLogger) -> None:
    """``log.exception`` inside ``except``: the broker's logger gets that exception."""
    outlet = Outlet()
    unconfigured.send_to(outlet)
    error = KeyError("k")
    try:
        raise error
    except KeyError:
        unconfigured.exception("failed %s", "x")
    trace = traceback_text(error, TRACEBACK_LIMIT).removesuffix("\n")
    assert trace.startswith("Traceback (most recent call last):\n")
    assert outlet.lines == [(logging.ERROR, f"failed x\n{trace}", None, {})]


def test_the_bounds() -> None:
    """What the "Logs and hooks" reference says: 4 KiB of text, 8 KiB of traceback."""
    assert (LINE_LIMIT, TRACEBACK_LIMIT) == (4096, 8192)


class HugeError(Exception):
    """A handler's exception with a 2 MB message and a 1 MB note."""


def huge() -> BaseException:
    try:
        raise HugeError("E" * 2_000_000)
    except HugeError as caught:
        caught.__notes__ = ["N" * 1_000_000]  # type: ignore[attr-defined]
        try:
            raise RuntimeError("R" * 1_000_000) from caught
        except RuntimeError as chained:
            return chained


def test_a_huge_exception_makes_a_bounded_line_on_the_broker_path(
    unconfigured: PluginLogger,
) -> None:
    """A poison message never floods the logs: text and traceback are cut."""
    outlet = Outlet()
    unconfigured.send_to(outlet)
    unconfigured.error("failed: %s", "A" * 1_000_000, exc_info=huge())
    ((level, text, exc, _),) = outlet.lines
    assert (level, exc) == (logging.ERROR, None)
    line, trace = text.split("\n", 1)
    assert line == "failed: " + "A" * (LINE_LIMIT - 3 - len("failed: ")) + "..."
    assert len(trace.encode()) <= TRACEBACK_LIMIT
    assert trace == traceback_text(huge(), TRACEBACK_LIMIT)[:-1]  # as formatException
    # Every part cut, none lost: the frames, both messages, the note, the chain.
    assert trace.startswith("Traceback (most recent call last):\n")
    assert "HugeError: EEE" in trace
    assert "\nNNN" in trace or sys.version_info < (3, 11)  # notes: printed from 3.11
    assert "direct cause" in trace
    assert trace.endswith("RuntimeError: RRR" + "R" * (1024 - 3 - 17) + "...")


def test_a_huge_exception_makes_a_bounded_line_on_the_logging_path(
    unconfigured: PluginLogger,
) -> None:
    """The same bounds with the user's handlers: the record carries the cut text."""
    lines = Lines()
    unconfigured.logger.addHandler(lines)
    unconfigured.send_to(Outlet())
    error = huge()
    unconfigured.error("failed: %s", "A" * 1_000_000, exc_info=error)
    unconfigured.error("kept: %s", "whole", exc_info=error)
    cut, whole = lines.records
    assert (cut.msg, cut.args) == (
        "failed: " + "A" * (LINE_LIMIT - 3 - len("failed: ")) + "...",
        (),
    )
    assert (whole.msg, whole.args) == ("kept: %s", ("whole",))  # untouched when it fits
    for record in lines.records:
        assert record.exc_info is None
        assert record.exc_text == traceback_text(error, TRACEBACK_LIMIT)[:-1]
        assert len(logging.Formatter().format(record).encode()) <= LINE_LIMIT + 1 + TRACEBACK_LIMIT


class NotedError(Exception):
    @property
    def __notes__(self) -> list[str]:
        raise IndexError


def test_an_exception_whose_traceback_raises_still_gets_its_line(
    unconfigured: PluginLogger, capsys: pytest.CaptureFixture[str]
) -> None:
    """logging alone prints "--- Logging error ---" and loses the line; not so here."""
    stream = io.StringIO()
    unconfigured.logger.addHandler(logging.StreamHandler(stream))  # what basicConfig adds
    try:
        raise NotedError("noted")
    except NotedError:
        unconfigured.exception("hook failed")
    outlet = Outlet()
    unconfigured.logger.handlers.clear()
    unconfigured.send_to(outlet)
    unconfigured.error("dead-lettered", exc_info=NotedError("noted"))
    why = "NotedError: noted\n(no full traceback: formatting it raised IndexError)"
    written = stream.getvalue()
    assert written.startswith("hook failed\nTraceback (most recent call last):\n")
    assert written.endswith(why + "\n")
    ((_, text, _, _),) = outlet.lines
    assert text.startswith("dead-lettered\n")
    assert text.endswith(why)
    assert "Logging error" not in capsys.readouterr().err


def test_arguments_that_cannot_be_formatted_still_make_a_line(unconfigured: PluginLogger) -> None:
    """An argument whose __str__ raises: the line says so instead of being lost."""

    class Unprintable:
        def __str__(self) -> str:
            raise LookupError

    lines = Lines()
    unconfigured.logger.addHandler(lines)
    unconfigured.warning("hook %s failed", Unprintable())
    ((record),) = lines.records
    assert record.getMessage() == "hook %s failed (arguments not shown: LookupError)"
    outlet = Outlet()
    unconfigured.logger.handlers.clear()
    unconfigured.send_to(outlet)
    unconfigured.warning("hook %s failed", Unprintable())
    assert outlet.lines == [
        (logging.WARNING, "hook %s failed (arguments not shown: LookupError)", None, {})
    ]


def test_a_record_names_the_plugin_code_that_wrote_it(unconfigured: PluginLogger) -> None:
    """funcName and lineno are the caller's, as logger.info's would be."""
    lines = Lines()
    unconfigured.logger.addHandler(lines)
    unconfigured.warning("here")
    unconfigured.log(logging.WARNING, "and here")
    first, second = lines.records
    assert (first.funcName, first.pathname) == (
        "test_a_record_names_the_plugin_code_that_wrote_it",
        __file__,
    )
    assert second.lineno == first.lineno + 1


def test_a_configured_logger_gets_the_line_and_the_broker_does_not(
    unconfigured: PluginLogger,
) -> None:
    """A handler on the logger (or an ancestor): the user's logging rules, never both."""
    outlet = Outlet()
    unconfigured.send_to(outlet)
    lines = Lines()
    unconfigured.logger.addHandler(lines)
    unconfigured.logger.setLevel(logging.DEBUG)
    unconfigured.info("one %s", "line", extra={"retry": {"queue": "q"}})
    unconfigured.debug("and a debug one")
    assert outlet.lines == []
    assert [(r.levelname, r.getMessage()) for r in lines.records] == [
        ("INFO", "one line"),
        ("DEBUG", "and a debug one"),
    ]
    assert lines.records[0].retry == {"queue": "q"}  # type: ignore[attr-defined]


def test_a_level_set_on_the_logger_applies_to_the_broker_path(unconfigured: PluginLogger) -> None:
    """setLevel without a handler: the level filters, the broker's logger prints."""
    outlet = Outlet()
    unconfigured.send_to(outlet)
    unconfigured.logger.setLevel(logging.WARNING)
    unconfigured.info("dropped")
    unconfigured.warning("kept")
    unconfigured.logger.setLevel(logging.DEBUG)
    unconfigured.debug("now kept")
    assert [(level, text) for level, text, _, _ in outlet.lines] == [
        (logging.WARNING, "kept"),
        (logging.DEBUG, "now kept"),
    ]


def test_is_enabled_for(unconfigured: PluginLogger) -> None:
    """INFO and up by default on the broker path; the logger's own level otherwise."""
    assert not unconfigured.isEnabledFor(logging.INFO)  # no outlet: Python's WARNING default
    assert unconfigured.isEnabledFor(logging.WARNING)
    unconfigured.send_to(Outlet())
    assert unconfigured.isEnabledFor(logging.INFO)
    assert not unconfigured.isEnabledFor(logging.DEBUG)
    unconfigured.logger.setLevel(logging.DEBUG)
    assert unconfigured.isEnabledFor(logging.DEBUG)
    unconfigured.logger.setLevel(logging.NOTSET)
    unconfigured.logger.addHandler(Lines())
    assert not unconfigured.isEnabledFor(logging.INFO)  # root's WARNING rules now


def test_logging_disable_silences_the_broker_path_too(unconfigured: PluginLogger) -> None:
    """logging.disable(WARNING): nothing up to WARNING is formatted or sent to the broker."""
    outlet = Outlet()
    unconfigured.send_to(outlet)
    logging.disable(logging.WARNING)
    try:
        assert not unconfigured.isEnabledFor(logging.WARNING)
        assert unconfigured.isEnabledFor(logging.ERROR)
        unconfigured.warning("dropped")
        unconfigured.error("kept")
    finally:
        logging.disable(logging.NOTSET)
    assert [line[1] for line in outlet.lines] == ["kept"]


@pytest.mark.parametrize("outlet", [Outlet(answer=False), Outlet(fail=True)])
def test_a_broker_that_cannot_log_falls_back_to_logging(
    unconfigured: PluginLogger, outlet: Outlet, capsys: pytest.CaptureFixture[str]
) -> None:
    """Broker gone, logger not set up yet, or a broken outlet: the line is not lost."""
    unconfigured.send_to(outlet)
    unconfigured.warning("kept %s", "anyway")
    assert "kept anyway" in capsys.readouterr().err  # Python's last resort


def test_a_fallback_line_below_the_loggers_level_is_dropped(unconfigured: PluginLogger) -> None:
    """A broker that cannot log and no level for INFO: logging never sees the line."""
    seen: list[logging.LogRecord] = []

    def see(record: logging.LogRecord) -> bool:
        seen.append(record)
        return True

    unconfigured.logger.addFilter(see)
    unconfigured.send_to(Outlet(answer=False))
    unconfigured.info("dropped")
    unconfigured.warning("kept")
    assert [r.getMessage() for r in seen] == ["kept"]


def test_no_outlet_means_plain_logging(
    unconfigured: PluginLogger, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before any install() the lines go to logging as any library's do."""
    unconfigured.warning("plain")
    unconfigured.send_to(None)
    unconfigured.warning("plain again")
    assert capsys.readouterr().err.splitlines() == ["plain", "plain again"]


def test_the_broker_outlet_writes_to_faststreams_logger_once_it_is_set_up() -> None:
    """``BrokerUsecase.config.logger``: nothing before connect, then the broker's logger."""
    mine = logging.getLogger(f"mine.{uuid.uuid4().hex}")
    mine.propagate = False
    lines = Lines()
    mine.addHandler(lines)
    mine.setLevel(logging.DEBUG)
    broker = RabbitBroker(logger=mine)
    outlet = fs.broker_outlet(broker)
    assert outlet(logging.INFO, "too early", None, {}) is False
    broker._setup_logger()  # what connect() does
    error = ValueError("v")
    assert outlet(logging.ERROR, "hello", error, {"queue": "q"}) is True
    ((record),) = lines.records
    assert (record.levelno, record.getMessage(), record.queue) == (  # type: ignore[attr-defined]
        logging.ERROR,
        "hello",
        "q",
    )
    assert record.exc_info is not None
    assert record.exc_info[1] is error


def test_the_broker_path_follows_the_broker_loggers_level(unconfigured: PluginLogger) -> None:
    """``faststream run --log-level DEBUG`` shows the hops; WARNING hides the retry lines."""
    outlet = Outlet()
    broker_level: list[int | None] = [None]
    unconfigured.send_to(outlet, lambda: broker_level[0])
    unconfigured.debug("not yet: the broker's logger is not set up")
    unconfigured.info("INFO while the level is not known")
    broker_level[0] = logging.DEBUG
    unconfigured.debug("hop")
    broker_level[0] = logging.WARNING
    unconfigured.info("hidden")
    unconfigured.warning("shown")
    unconfigured.logger.setLevel(logging.INFO)  # a level on faststream_retry wins
    unconfigured.info("mine")
    assert [text for _, text, _, _ in outlet.lines] == [
        "INFO while the level is not known",
        "hop",
        "shown",
        "mine",
    ]


def test_broker_level_reads_the_level_of_the_brokers_logger() -> None:
    """None until set up; then the logger's, as the CLI sets it; above CRITICAL when
    silenced; None when gone.

    Not checked at start (only DEBUG lines depend on it): this pins it instead.
    """
    mine = logging.getLogger(f"mine.{uuid.uuid4().hex}")
    mine.setLevel(logging.DEBUG)
    broker = RabbitBroker(logger=mine)
    level = fs.broker_level(broker)
    assert level() is None
    broker._setup_logger()
    assert level() == logging.DEBUG
    default = RabbitBroker()
    default._setup_logger()
    default_level = fs.broker_level(default)
    assert default_level() == logging.INFO
    default.config.logger.set_level(logging.DEBUG)  # what faststream run --log-level does
    assert default_level() == logging.DEBUG
    default.config.logger.set_level(logging.INFO)  # FastStream's loggers are shared
    silenced = RabbitBroker(logger=None)
    silenced._setup_logger()
    assert fs.broker_level(silenced)() == fs.SILENCED > logging.CRITICAL
    unset = RabbitBroker()
    unset_level = fs.broker_level(unset)
    del unset
    assert unset_level() is None  # gone


def test_a_silenced_broker_silences_the_plugin_too() -> None:
    """``RabbitBroker(logger=None)``: written nowhere, and not handed to logging either."""
    broker = RabbitBroker(logger=None)
    broker._setup_logger()
    assert fs.broker_outlet(broker)(logging.ERROR, "quiet", None, {}) is True


def test_a_silenced_broker_s_lines_are_not_even_formatted(unconfigured: PluginLogger) -> None:
    """``logger=None``: the plugin formats no line (a retry line with its traceback, once
    per failure) only for the broker's outlet to drop it."""
    broker = RabbitBroker(logger=None)
    broker._setup_logger()
    outlet = Outlet()
    unconfigured.send_to(outlet, fs.broker_level(broker))
    formatted: list[str] = []

    class Spy:
        def __str__(self) -> str:
            formatted.append("formatted")
            return "spy"

    unconfigured.info("retry scheduled for %s", Spy())
    unconfigured.error("failed: %s", Spy())
    assert not unconfigured.isEnabledFor(logging.CRITICAL)
    assert (formatted, outlet.lines) == ([], [])


def test_a_collected_broker_is_not_kept_alive() -> None:
    """The outlet holds the broker weakly: once it is gone, logging takes over."""
    broker = RabbitBroker()
    outlet = fs.broker_outlet(broker)
    del broker
    assert outlet(logging.INFO, "x", None, {}) is False


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _fail_at_one_place(message: str) -> BaseException:
    return _raised(ConnectionError(message))


def test_a_burst_of_one_failure_reuses_its_traceback_text_exactly() -> None:
    """Same type, frames and message: the text is formatted once and equals a fresh format."""
    first, second = _fail_at_one_place("db down"), _fail_at_one_place("db down")
    text = _log.traceback_of(first)
    assert text == traceback_text(first, TRACEBACK_LIMIT)
    assert _log.traceback_of(second) is text


def test_another_message_from_the_same_place_reuses_the_frames_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Messages that name each message (an id, a key) still format their frames once.

    The text equals a fresh format of each; only the first formats the frames.
    """
    first = _fail_at_one_place("order 1 failed")
    expected = traceback_text(_fail_at_one_place("order 2 failed"), TRACEBACK_LIMIT)
    assert _log.traceback_of(first) == traceback_text(first, TRACEBACK_LIMIT)
    formatted: list[BaseException] = []

    def counted(exc: BaseException, *_: object) -> str:
        formatted.append(exc)
        return ""

    monkeypatch.setattr(_log, "traceback_text", counted)
    assert _log.traceback_of(_fail_at_one_place("order 2 failed")) == expected
    assert formatted == []


def test_what_the_text_shows_keeps_tracebacks_apart() -> None:
    """Another message, another place, a chain or notes: each gets its own text."""
    base = _fail_at_one_place("db down")
    other_message = _fail_at_one_place("db still down")
    try:
        raise ConnectionError("db down")
    except ConnectionError as caught:  # raised here: another frame than _raised's
        other_place = caught
    chained = _raised(ConnectionError("db down"))
    chained.__cause__ = ValueError("the cause")
    noted = _fail_at_one_place("db down")
    # add_note() is 3.11's (3.10's traceback prints no notes); setattr works on both
    setattr(noted, "__notes__", ["a note"])  # noqa: B010
    for exc in (base, other_message, other_place, chained, noted):
        assert _log.traceback_of(exc) == traceback_text(exc, TRACEBACK_LIMIT)
    texts = [_log.traceback_of(e) for e in (base, other_message, other_place, chained)]
    assert len(set(texts)) == 4


class Unhashable(type):
    """A metaclass whose classes cannot be hashed or compared: the application's code."""

    def __hash__(cls) -> int:
        raise RuntimeError("no hash")

    def __eq__(cls, other: object) -> bool:
        raise RuntimeError("no eq")


class OddError(Exception, metaclass=Unhashable):
    """Raised twice from one place: the second line comes from the traceback cache."""


def _odd() -> OddError:
    try:
        raise OddError("odd")
    except OddError as exc:
        return exc


def test_an_exception_whose_class_cannot_be_hashed_gets_its_line_and_traceback(
    unconfigured: PluginLogger,
) -> None:
    """The dead letter's line once read "could not log dead_lettered": the cache hashed the class."""
    outlet = Outlet()
    unconfigured.send_to(outlet)
    for _ in range(2):
        unconfigured.error("dead-lettered", exc_info=_odd())
    assert len(outlet.lines) == 2
    for _, text, _, _ in outlet.lines:
        assert text.startswith("dead-lettered\nTraceback (most recent call last):\n")
        assert text.endswith("OddError: odd")


def test_a_cached_traceback_is_not_given_to_another_class_with_the_same_id() -> None:
    """The cache names a class by id; a new class that reuses a freed id is formatted anew."""

    def fail(cls: type[Exception]) -> Exception:
        try:
            raise cls("same message")
        except Exception as exc:  # the test's own classes
            return exc

    first = fail(type("First", (Exception,), {}))
    key = _log._kind(first)
    assert key is not None
    *where, message = key
    gone = type("Gone", (Exception,), {})
    _log._seen[tuple(where)] = (gone, "a stale text", message, "a stale text")
    assert "First: same message" in _log.traceback_of(first)
