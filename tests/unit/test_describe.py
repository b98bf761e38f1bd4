"""Describing a failure never raises: names, messages and tracebacks of hostile exceptions.

An exception is the application's object: its ``__str__``, ``__repr__``, ``__notes__``, its
class's metaclass, even its ``__class__`` run application code while the plugin describes
it. Whatever they do, the failure path must still classify it, decide, build the copy's
headers (which must encode) and report it, so the message reaches its retry or its DLQ.
"""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pamqp.decode import field_table as decode_table
from pamqp.encode import field_table as encode_table

from faststream_retry import (
    Exponential,
    PermanentError,
    RetryEvent,
    RetryLater,
    RetryPolicy,
    TransientError,
)
from faststream_retry.core import headers as h
from faststream_retry.core.decision import Action, decide
from faststream_retry.core.policy import HandlerPolicy
from faststream_retry.core.tiers import Tiers
from faststream_retry.reporting.reporter import Reporter
from faststream_retry.reporting.telemetry import Telemetry


class ApiError(Exception):
    """The issue's example: a __str__ that reads an argument it was not given."""

    def __str__(self) -> str:
        return f"API error {self.args[0]}"


def raised(exc: BaseException) -> BaseException:
    """Return ``exc`` with a traceback, as a handler's exception has one."""
    try:
        raise exc
    except BaseException as caught:  # any exception is what is under test
        return caught


def chained(links: int) -> BaseException:
    """An exception with ``links - 1`` causes before it: a long traceback."""
    exc: BaseException | None = None
    for link in range(links):
        try:
            raise ValueError(f"link {link}") from exc
        except ValueError as caught:  # noqa: PERF203 - building a chain, once
            exc = caught
    assert exc is not None
    return exc


class TestExceptionName:
    def test_builtin_and_module_names(self) -> None:
        """Builtins by their name; others qualified by module."""
        assert h.exception_name(KeyError()) == "KeyError"
        assert h.exception_name(ApiError()) == "tests.unit.test_describe.ApiError"
        assert h.exception_name(PermanentError()) == "faststream_retry.errors.PermanentError"

    def test_a_module_that_is_not_a_str_is_left_out(self) -> None:
        """A class body may set __module__ to anything: only the name is said then."""
        odd = type("Odd", (Exception,), {"__module__": 42})
        assert h.exception_name(odd()) == "Odd"

    def test_a_str_subclass_module_is_read_as_plain_text(self) -> None:
        """A __module__ str subclass that lies about equality is read as its characters."""

        class Liar(str):
            __slots__ = ()

            def __eq__(self, other: object) -> bool:
                return True

            __hash__ = str.__hash__

        odd = type("Odd", (Exception,), {"__module__": Liar("app")})
        assert h.exception_name(odd()) == "app.Odd"

    def test_a_class_without_module_is_named_alone(self) -> None:
        """A class whose namespace lost __module__ still has a name."""
        namespace: dict[str, Any] = {}  # no __name__: type() then sets no __module__
        exec("Odd = type('Odd', (Exception,), {})", namespace)  # noqa: S102 - fixed text
        odd = namespace["Odd"]
        assert "__module__" not in odd.__dict__
        assert h.exception_name(odd()) == "Odd"

    def test_a_metaclass_cannot_fake_or_break_the_name(self) -> None:
        """Metaclass properties named __qualname__ / __module__ are not consulted."""

        class Meta(type):
            def __getattribute__(cls, name: str) -> Any:
                if name in {"__qualname__", "__module__", "__name__"}:
                    raise IndexError
                return super().__getattribute__(name)

        class ModuleProperty(type):
            @property
            def __module__(cls) -> str:  # type: ignore[override]
                raise IndexError

        odd = Meta("Odd", (Exception,), {"__module__": "app"})
        assert h.exception_name(odd()) == "app.Odd"
        other = ModuleProperty("Other", (Exception,), {"__module__": "app"})
        assert h.exception_name(other()) == "app.Other"

    def test_a_dunder_class_property_is_not_consulted(self) -> None:
        """type(exc), never exc.__class__."""

        class LyingError(Exception):
            @property  # type: ignore[misc]
            def __class__(self) -> type:
                raise IndexError

        assert h.exception_name(LyingError()).endswith("LyingError")

    def test_surrogates_are_escaped_and_long_names_cut(self) -> None:
        """__qualname__ and __module__ take any str: escaped and bounded like any text."""
        odd = type("Odd", (Exception,), {"__module__": "app\udc80"})
        odd.__qualname__ = "Bad\udc80"
        assert h.exception_name(odd()) == "app\\udc80.Bad\\udc80"
        long = type("E" * 300, (Exception,), {"__module__": "app"})
        assert h.exception_name(long()) == "app." + "E" * (h.EXCEPTION_LIMIT - 7) + "..."


class TestErrorText:
    def test_plain_message(self) -> None:
        """str(exc), as it is."""
        assert h.error_text(ValueError("bad value")) == "bad value"

    def test_a_str_that_raises_gets_a_fallback_naming_both(self) -> None:
        """The issue's ApiError: the text names the class and what str() raised."""
        assert h.error_text(ApiError()) == (
            "<unprintable tests.unit.test_describe.ApiError: str() raised IndexError>"
        )

    def test_a_str_that_returns_no_text(self) -> None:
        """str() refuses a non-str result with TypeError: that is what is said."""

        class NumberError(Exception):
            def __str__(self) -> str:
                return 42  # type: ignore[return-value]  # noqa: PLE0307 - the point

        assert h.error_text(NumberError()).endswith("NumberError: str() raised TypeError>")

    def test_a_str_subclass_result_is_read_as_plain_text(self) -> None:
        """A str subclass whose methods raise is read by str's own methods."""

        class Sly(str):
            __slots__ = ()

            def encode(self, *_: object, **__: object) -> bytes:
                raise RuntimeError

            def __getitem__(self, _: object) -> str:
                raise RuntimeError

        class OddError(Exception):
            def __str__(self) -> str:
                return Sly("odd text")

        text = h.error_text(OddError())
        assert (text, type(text)) == ("odd text", str)

    def test_surrogates_are_escaped(self) -> None:
        """A lone surrogate is written as its escape, not dropped."""
        assert h.error_text(ValueError("bad \udc80 byte")) == "bad \\udc80 byte"

    def test_a_problem_comes_first_and_the_message_after_it(self) -> None:
        """Why the plugin overruled the exception, then what the exception said; one bound."""
        assert h.error_text(KeyError("k"), problem="bad delay") == "bad delay ('k')"
        assert h.error_text(ApiError(), 30, "bad delay") == "bad delay (<unprintable tes..."
        assert h.error_text(ValueError("x\udc80"), problem="p\udc80") == "p\\udc80 (x\\udc80)"

    def test_the_limit_applies_and_defaults_to_the_header_bound(self) -> None:
        """Cut to the limit given, the retry-error bound by default."""
        assert h.error_text(ValueError("x" * 5000)) == "x" * (h.ERROR_LIMIT - 3) + "..."
        assert h.error_text(ValueError("abcdef"), 5) == "ab..."
        assert h.error_text(ApiError(), 12) == "<unprinta..."


class TestTracebackText:
    def test_a_raised_exception_has_its_traceback(self) -> None:
        """The usual text, ending with the exception line."""
        exc = raised(ValueError("bad \udc80"))
        text = h.traceback_text(exc)
        assert text.startswith("Traceback (most recent call last):\n")
        assert text.endswith("ValueError: bad \\udc80\n")
        formatted = "".join(traceback.format_exception(exc))
        assert text == formatted.encode(errors="backslashreplace").decode()

    def test_a_traceback_that_cannot_be_formatted_says_so(self) -> None:
        """__notes__ that raises breaks traceback formatting: frames, name, message and why."""

        class NotedError(Exception):
            @property
            def __notes__(self) -> list[str]:
                raise IndexError

        name = (
            "tests.unit.test_describe.TestTracebackText."
            "test_a_traceback_that_cannot_be_formatted_says_so.<locals>.NotedError"
        )
        text = h.traceback_text(raised(NotedError("boom")))
        assert text.startswith('Traceback (most recent call last):\n  File "')
        assert text.endswith(
            f"in raised\n    raise exc\n{name}: boom\n"
            "(no full traceback: formatting it raised IndexError)\n"
        )
        # Never raised: no frames, and no frame header either.
        assert h.traceback_text(NotedError("boom")) == (
            f"{name}: boom\n(no full traceback: formatting it raised IndexError)\n"
        )

    def test_a_cause_that_cannot_be_formatted_leaves_the_own_frames(self) -> None:
        """A hook's failure chained to such an exception: the hook's frames still show."""

        class NotedError(Exception):
            @property
            def __notes__(self) -> list[str]:
                raise IndexError

        try:
            try:
                raise NotedError("handler")
            except NotedError:
                raise RuntimeError("hook") from None
        except RuntimeError as caught:
            caught.__context__ = NotedError("handler")
            text = h.traceback_text(caught)
        assert "in test_a_cause_that_cannot_be_formatted_leaves_the_own_frames" in text
        assert text.endswith(
            "RuntimeError: hook\n(no full traceback: formatting it raised IndexError)\n"
        )

    def test_the_fallback_shows_every_frame_as_the_traceback_module_does(self) -> None:
        """Frames one after another, exactly as ``traceback.format_list`` writes them."""

        class NotedError(Exception):
            @property
            def __notes__(self) -> list[str]:
                raise IndexError

        def inner() -> None:
            raise NotedError("deep")

        try:
            inner()
        except NotedError as caught:
            exc = caught
        frames = traceback.format_list(traceback.extract_tb(exc.__traceback__))
        assert len(frames) == 2
        assert h.traceback_text(exc) == (
            "Traceback (most recent call last):\n"
            + "".join(frames)
            + f"{h.exception_name(exc)}: deep\n"
            + "(no full traceback: formatting it raised IndexError)\n"
        )

    def test_an_exception_whose_traceback_cannot_be_read_is_still_described(self) -> None:
        """A class that makes __traceback__ a property that raises: name and message."""

        class HiddenError(Exception):
            @property
            def __traceback__(self) -> None:  # type: ignore[override]
                raise LookupError

        exc = HiddenError("h")
        assert h.traceback_text(exc) == (  # no frames to show, and no header for them
            f"{h.exception_name(exc)}: h\n(no full traceback: formatting it raised LookupError)\n"
        )

    def test_a_long_traceback_keeps_its_end(self) -> None:
        """The tail names the failing line: it is what is kept."""
        text = h.traceback_text(chained(40))
        assert len(text.encode()) == h.TRACEBACK_LIMIT
        assert text.startswith("...")
        assert text.endswith("ValueError: link 39\n")
        assert h.traceback_text(chained(2), 20) == "...lueError: link 1\n"

    def test_a_huge_message_is_cut_before_the_tail_is_taken(self) -> None:
        """A 2 MB message: its first ERROR_LIMIT bytes, the frames still in the text."""
        text = h.traceback_text(raised(ValueError("E" * 2_000_000)))
        assert text.startswith("Traceback (most recent call last):\n")
        assert "in raised\n" in text
        line = "ValueError: " + "E" * (h.ERROR_LIMIT - 3 - len("ValueError: ")) + "...\n"
        assert text.endswith("raise exc\n" + line)
        # A part exactly at the bound is kept whole.
        fits = "E" * (h.ERROR_LIMIT - len("ValueError: \n"))
        assert h.traceback_text(raised(ValueError(fits))).endswith(
            f"raise exc\nValueError: {fits}\n"
        )


class TestFailureRecordOf:
    def test_describes_the_exception(self) -> None:
        """Name and message come from exception_name and error_text."""
        record = h.FailureRecord.of(ApiError(), attempt=2, at_ms=1000, delay_ms=300)
        assert record.as_entry() == {
            "attempt": 2,
            "at": 1000,
            "exception": "tests.unit.test_describe.ApiError",
            "error": "<unprintable tests.unit.test_describe.ApiError: str() raised IndexError>",
            "delay": 300,
        }

    def test_delay_defaults_to_zero(self) -> None:
        """A dead letter has no delay."""
        assert h.FailureRecord.of(KeyError(), attempt=1, at_ms=5).delay_ms == 0

    def test_a_problem_leads_the_error(self) -> None:
        """The decision's problem (an unusable RetryLater delay) is what the error says first."""
        record = h.FailureRecord.of(KeyError("k"), attempt=1, at_ms=5, problem="bad delay")
        assert record.error == "bad delay ('k')"


# --- The property: any exception a handler can raise is carried to its retry or DLQ. ---

BOOMS = (IndexError, KeyError, ValueError, TypeError, RuntimeError, UnicodeError, LookupError)


class _BrokenStrError(Exception):
    """An exception whose own str() raises: raised from another's __str__."""

    def __str__(self) -> str:
        raise IndexError


class _Sly(str):
    """Text whose methods raise."""

    __slots__ = ()

    def encode(self, *_: object, **__: object) -> bytes:
        raise RuntimeError

    def __getitem__(self, _: object) -> str:
        raise RuntimeError

    def __str__(self) -> str:
        raise RuntimeError


def _dunder(behaviour: tuple[str, Any]) -> Any:
    """Build a __str__ or __repr__ that does ``behaviour``."""
    kind, value = behaviour

    def method(self: BaseException) -> Any:
        if kind == "text":
            return value
        if kind == "raise":
            raise value
        if kind == "raise-broken":
            raise _BrokenStrError
        if kind == "recurse":
            return str(self)
        if kind == "sly":
            return _Sly(value)
        return value  # "return": not a str at all

    return method


surrogates = st.integers(0xD800, 0xDFFF).map(chr)
texts = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(st.characters(), surrogates), max_size=40).map("".join),
    st.integers(0, 300_000).map(lambda n: "é" * n),
)
behaviours = st.one_of(
    st.tuples(st.just("text"), texts),
    st.tuples(st.just("raise"), st.sampled_from(BOOMS)),
    st.tuples(st.just("raise-broken"), st.none()),
    st.tuples(st.just("recurse"), st.none()),
    st.tuples(st.just("sly"), st.text(max_size=10)),
    st.tuples(st.just("return"), st.sampled_from([42, None, b"bytes", 1.5, ["x"]])),
)


@dataclass
class Recipe:
    """How to build one hostile exception (printed by hypothesis on a failure)."""

    base: type[BaseException]
    name: str
    qualname: str | None
    module: object
    str_: tuple[str, Any] | None
    repr_: tuple[str, Any] | None
    notes: str
    metaclass: str
    dunder_class: bool
    cause: bool
    delay: object


def build(recipe: Recipe, *, with_cause: bool = True) -> BaseException:  # noqa: PLR0912
    namespace: dict[str, Any] = {}
    if recipe.module is not None:
        namespace["__module__"] = recipe.module
    if recipe.str_ is not None:
        namespace["__str__"] = _dunder(recipe.str_)
    if recipe.repr_ is not None:
        namespace["__repr__"] = _dunder(recipe.repr_)
    if recipe.notes == "raises":

        def notes(self: BaseException) -> list[str]:
            raise IndexError

        namespace["__notes__"] = property(notes)
    elif recipe.notes == "not-a-list":
        namespace["__notes__"] = 42
    elif recipe.notes == "odd-items":
        namespace["__notes__"] = [_BrokenStrError(), b"x", "\udc80"]
    if recipe.dunder_class:

        def cls(self: BaseException) -> type:
            raise IndexError

        namespace["__class__"] = property(cls)
    meta: type = type
    if recipe.metaclass != "plain":
        broken = recipe.metaclass

        def boom(cls: type, *_: object) -> Any:
            raise IndexError

        def getattribute(cls: type, name: str) -> Any:
            if name in {"__qualname__", "__module__", "__name__", "__mro__", "__dict__"}:
                raise IndexError
            return type.__getattribute__(cls, name)

        meta_ns: dict[str, Any] = {}
        if broken == "getattribute":
            meta_ns["__getattribute__"] = getattribute
        elif broken == "module":
            meta_ns["__module__"] = property(boom)
        elif broken == "eq":
            meta_ns["__eq__"] = boom
            meta_ns["__hash__"] = type.__hash__
        elif broken == "hash":
            meta_ns["__hash__"] = boom
        meta = type("Meta", (type,), meta_ns)
    klass = meta(recipe.name, (recipe.base,), namespace)
    if recipe.qualname is not None:
        type.__dict__["__qualname__"].__set__(klass, recipe.qualname)
    if not issubclass(klass, RetryLater):
        exc: BaseException = klass()
    else:
        tampered = recipe.delay == "tampered"
        exc = klass(1 if tampered else recipe.delay)
        if tampered:
            with contextlib.suppress(Exception):  # a __class__ property may refuse it
                exc.delay = "soon"  # type: ignore[attr-defined]
    if recipe.cause and with_cause:
        exc.__cause__ = build(recipe, with_cause=False)
    return raised(exc)


recipes = st.builds(
    Recipe,
    base=st.sampled_from(
        [
            *(Exception, ValueError, TimeoutError, ConnectionError, KeyError),
            *(PermanentError, TransientError, RetryLater),
        ]
    ),
    name=st.one_of(st.just("ApiError"), st.text(min_size=1, max_size=20)),
    qualname=st.none() | st.lists(st.one_of(st.characters(), surrogates), max_size=20).map("".join),
    module=st.sampled_from([None, "app.errors", "builtins", 42, "fastapi.exceptions", "m\udc80"]),
    str_=st.none() | behaviours,
    repr_=st.none() | behaviours,
    notes=st.sampled_from(["none", "raises", "not-a-list", "odd-items"]),
    metaclass=st.sampled_from(["plain", "getattribute", "module", "eq", "hash"]),
    dunder_class=st.booleans(),
    cause=st.booleans(),
    delay=st.sampled_from([1, 0, 10**6, "tampered"]),
)

TIERS = Tiers.build(100, 60_000)


def hostile_recipe(recipe: Recipe) -> BaseException | None:
    """Build the exception, or ``None`` where Python itself refuses the class or instance."""
    try:
        return build(recipe)
    except (TypeError, ValueError):  # e.g. a name type() refuses (NUL in it)
        return None


@settings(deadline=None, max_examples=300)
@given(recipe=recipes, attempt=st.integers(1, 6), lists=st.booleans())
def test_any_exception_reaches_its_retry_or_its_dlq(
    recipe: Recipe, attempt: int, lists: bool
) -> None:
    """Decide, describe, build the copy's headers, encode them, report: nothing raises."""
    exc = hostile_recipe(recipe)
    if exc is None:
        return
    handler = (
        HandlerPolicy({"transient": (KeyError,), "permanent": (ValueError,)}) if lists else None
    )
    decision = decide(
        exc,
        attempt=attempt,
        handler=handler,
        default=RetryPolicy(max_attempts=4, backoff=Exponential(initial=0.1)),
        tiers=TIERS,
        rand=lambda: 0.5,
    )
    record = h.FailureRecord.of(exc, attempt=attempt, at_ms=1_000, delay_ms=decision.delay_ms)
    if decision.action is Action.DEAD_LETTER:
        headers = h.dead_letter_headers(
            {"app": "kept"},
            record,
            reason=str(decision.reason),
            origin_queue="orders",
            traceback=h.traceback_text(exc),
        )
        written = {h.REASON, h.EXCEPTION, h.ERROR, h.TRACEBACK, h.ORIGIN_QUEUE, h.HISTORY}
    else:
        headers = h.retry_headers({"app": "kept"}, record, due_ms=2_000)
        written = {h.DUE, h.HISTORY}
    assert written <= set(headers)
    # Every header encodes as it is: nothing is dropped by the publisher's repair.
    decoded = decode_table(encode_table(headers))[1]
    assert set(decoded) == set(headers)
    assert len(encode_table(headers)) <= h.MAX_ADDED_BYTES + 64
    try:
        expected = h.truncate(str.__str__(str(exc)), h.ERROR_LIMIT)
    except Exception:  # the fallback is what must be written then
        assert record.error.startswith("<unprintable ")
    else:
        assert record.error == expected
    # Reporting it (a span recording the exception, the metrics, the log, a hook) is quiet.
    events: list[RetryEvent] = []
    spans = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    reporter = Reporter(Telemetry(provider), [events.append])
    event = RetryEvent.scheduled(
        queue="orders",
        message_id="m-1",
        attempt=attempt,
        at_ms=1_000,
        max_attempts=4,
        delay_ms=0,
        due_ms=None,
        exception=h.exception_name(exc),
        error=h.error_text(exc, h.HISTORY_ERROR_LIMIT),
        rule=decision.classification.rule,
        classification=decision.classification.verdict,
        immediate=True,
    )
    reporter.record(event, incoming={}, exception=exc)
    assert events == [event]
    (span,) = spans.get_finished_spans()
    assert [e.name for e in span.events] == ["exception"]


def test_the_issues_api_error_is_dead_lettered_with_a_fallback_text() -> None:
    """ApiError raised without args: exhausted with the fallback, its traceback kept."""
    exc = raised(ApiError())
    decision = decide(
        exc,
        attempt=4,
        handler=None,
        default=RetryPolicy(max_attempts=4),
        tiers=TIERS,
        rand=lambda: 0.5,
    )
    assert decision.action is Action.DEAD_LETTER
    record = h.FailureRecord.of(exc, attempt=4, at_ms=1)
    headers = h.dead_letter_headers(
        None, record, reason="exhausted", origin_queue="q", traceback=h.traceback_text(exc)
    )
    assert headers[h.ERROR] == (
        "<unprintable tests.unit.test_describe.ApiError: str() raised IndexError>"
    )
    assert "ApiError: <exception str() failed>" in headers[h.TRACEBACK]


def test_notes_that_are_not_text_do_not_break_the_traceback() -> None:
    """add_note() is how 3.11+ annotates; odd notes are formatted or reported, never raised.

    Python 3.10 may ignore ``__notes__``: the text is still whole there.
    """
    exc = ValueError("boom")
    exc.__notes__ = [_BrokenStrError(), "\udc80"]  # type: ignore[attr-defined]
    text = h.traceback_text(raised(exc))
    assert "boom" in text
    text.encode()
