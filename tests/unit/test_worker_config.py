"""The retry worker's config: what it accepts, and errors that name the key and the valid values."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from faststream_retry.core.durations import HELP, PATTERN
from faststream_retry.core.intake import OnDeath
from faststream_retry.core.policy import Exponential, Fixed, RetryPolicy, Schedule
from faststream_retry.core.worker_config import (
    FixedTable,
    ScheduleTable,
    WorkerFile,
    _BackoffTable,
    _built,
    _line,
    load_worker_config,
    policy_command,
    worker_config,
    worker_config_schema,
)
from faststream_retry.errors import RetryConfigError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

FULL = """
url = "amqp://guest:guest@127.0.0.1:5673/"
prefix = "svc"
queue_type = "classic"
max_delay = "1h"
prefetch = 10

[defaults]
max_attempts = 4
backoff = { kind = "exponential", initial = "500ms", factor = 3, max = "1m", jitter = 0.2 }
expired = "retry"

[[queues]]
name = "orders"

[[queues]]
pattern = "billing.*"
max_attempts = 2
backoff = { kind = "schedule", delays = ["1s", 5] }
maxlen = "retry"
direct_release = true
"""


def config(**top: Any) -> dict[str, Any]:
    return {"queues": [{"name": "orders"}], **top}


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(RetryConfigError) as info:
        worker_config(data, "retry.toml")
    return str(info.value)


def test_a_full_file_reads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "retry.toml"
    path.write_text(FULL)
    cfg = load_worker_config(path)
    assert (cfg.prefix, cfg.intake, cfg.url, cfg.source) == (
        "svc",
        "svc.intake",
        "amqp://guest:guest@127.0.0.1:5673/",
        str(path),
    )
    assert cfg.retry.topology.queue_type == "classic"
    assert cfg.retry.topology.max_delay_ms == 3_600_000
    assert cfg.retry.prefetch == 10
    orders = cfg.rules("orders")
    assert orders is not None
    assert orders.max_attempts == 4
    assert orders.backoff == Exponential(0.5, factor=3, maximum=60, jitter=0.2)
    assert (orders.expired, orders.maxlen) == (OnDeath.RETRY, OnDeath.DEAD)
    billing = cfg.rules("billing.eu")
    assert billing is not None
    assert billing.max_attempts == 2
    assert billing.backoff == Schedule([1, 5])
    assert (billing.expired, billing.maxlen) == (OnDeath.RETRY, OnDeath.RETRY)
    assert (orders.direct_release, billing.direct_release) == (False, True)
    assert cfg.names == ("orders",)
    assert cfg.tiers.tick_ms == 500
    # The [defaults] table is the shared RetryConfig's default policy too.
    assert cfg.retry.default == RetryPolicy(max_attempts=4, backoff=orders.backoff)


def test_the_smallest_config_takes_the_middlewares_defaults() -> None:
    cfg = worker_config(config())
    rules = cfg.rules("orders")
    assert rules is not None
    assert rules.max_attempts == 5
    assert rules.backoff == Exponential(
        timedelta(seconds=1), factor=2, maximum=timedelta(minutes=5)
    )
    assert (rules.expired, rules.maxlen) == (OnDeath.DEAD, OnDeath.DEAD)
    assert rules.direct_release is False
    assert (cfg.prefix, cfg.url) == ("retry", None)
    assert cfg.retry.topology.queue_type == "quorum"
    assert cfg.retry.topology.max_delay_ms == 86_400_000
    assert cfg.retry.topology.tick_ms is None  # the GCD of the backoffs' delays
    assert cfg.retry.topology.delivery_limit == 20
    assert cfg.retry.prefetch == 200
    assert (cfg.retry.pause_s, cfg.retry.publish_timeout_s) == (1.0, 30.0)
    assert cfg.retry.default == RetryPolicy()
    assert cfg.source == "<config>"
    assert str(refused_unnamed(config(prefix=""))).startswith("<config>: prefix ")


def refused_unnamed(data: dict[str, Any]) -> RetryConfigError:
    with pytest.raises(RetryConfigError) as info:
        worker_config(data)
    return info.value


def test_the_worker_options_read_as_written() -> None:
    cfg = worker_config(
        config(
            url="amqps://broker:5671/",
            tick="1s",
            delivery_limit=7,
            publish_failure_pause="1000s",
            publish_timeout="2000s",
        )
    )
    assert cfg.url == "amqps://broker:5671/"
    assert cfg.retry.topology.tick_ms == 1000
    assert cfg.retry.topology.delivery_limit == 7
    assert (cfg.retry.pause_s, cfg.retry.publish_timeout_s) == (1000.0, 2000.0)


def test_each_backoff_kind_reads_as_written() -> None:
    cfg = worker_config(
        {
            "queues": [
                {"name": "f", "backoff": {"kind": "fixed", "delay": "1000s"}},
                {"name": "e", "backoff": {"kind": "exponential", "initial": "1000s"}},
                {"name": "m", "backoff": {"kind": "exponential", "initial": 1, "max": "1000s"}},
                {"name": "s", "backoff": {"kind": "schedule", "delays": ["1000s", 2000]}},
            ]
        }
    )
    backoffs = [cfg.rules(q).backoff for q in "fems"]  # type: ignore[union-attr]
    assert backoffs == [
        Fixed(1000),
        Exponential(1000, factor=2, maximum=None, jitter=0),  # factor and jitter by default
        Exponential(1, factor=2, maximum=1000, jitter=0),
        Schedule([1000, 2000]),
    ]


def test_a_named_entry_matches_its_name_only() -> None:
    entry = worker_config(config()).queues[0]
    assert entry.matches("orders")
    assert not entry.matches("orders2")


class TestAllowlist:
    def test_exact_names_come_before_patterns_and_the_first_pattern_wins(self) -> None:
        cfg = worker_config(
            {
                "queues": [
                    {"pattern": "a.*", "max_attempts": 2},
                    {"pattern": "a.b*", "max_attempts": 3},
                    {"name": "a.bc", "max_attempts": 4},
                ]
            }
        )
        assert [cfg.rules(q).max_attempts for q in ("a.x", "a.bx", "a.bc")] == [2, 2, 4]  # type: ignore[union-attr]

    def test_a_pattern_takes_star_and_question_mark_only_and_matches_whole_names(self) -> None:
        cfg = worker_config({"queues": [{"pattern": "o?ders.*"}]})
        assert cfg.rules("orders.eu") is not None
        assert cfg.rules("oXders.") is not None
        assert cfg.rules("xorders.eu") is None
        assert cfg.rules("orders") is None
        assert cfg.rules("o+ders.eu") is not None  # ? is one character, whatever it is
        assert worker_config({"queues": [{"pattern": "a.b"}]}).rules("aXb") is None  # . literal
        assert "* and ? only" in refused({"queues": [{"pattern": "q[12]"}]})

    def test_the_retry_machinerys_own_queues_are_never_allowed(self) -> None:
        """A pattern such as * must not send messages back into .retry, .dlq or the tiers."""
        cfg = worker_config({"queues": [{"pattern": "*"}]})
        assert cfg.rules("orders") is not None
        for own in ("orders.retry", "orders.dlq", "retry.intake", "retry.delay.1000"):
            assert cfg.rules(own) is None, own
        assert "retry machinery's own queue" in refused({"queues": [{"name": "orders.dlq"}]})

    def test_the_policy_command_names_every_queue_as_a_whole_name(self) -> None:
        cfg = worker_config(
            {"prefix": "svc", "queues": [{"name": "email-queue"}, {"pattern": "billing.*"}]}
        )
        command = policy_command(cfg)
        assert command == (
            "rabbitmqctl set_policy --apply-to queues 'svc.intake' "
            "'^(?!svc\\.)(?!.*\\.(retry|dlq)$)(email\\-queue|billing\\..*)$' "
            '\'{"dead-letter-exchange":"svc.intake"}\''
        )
        pattern = re.compile(command.split("'")[3])
        assert pattern.fullmatch("email-queue")
        assert pattern.fullmatch("billing.eu")
        assert not pattern.fullmatch("billing")
        assert not pattern.fullmatch("billing.eu.dlq")  # the machinery's own: never opted in
        assert not pattern.fullmatch("billing.eu.retry")
        assert not pattern.fullmatch("svc.intake.dlq")
        assert not pattern.fullmatch("xemail-queue")
        assert "-p 'shop' " in policy_command(cfg, vhost="shop")
        assert "'it'\\''s'" in policy_command(cfg, name="it's")


class TestLimits:
    def test_one_attempt_and_a_255_byte_name_are_allowed(self) -> None:
        cfg = worker_config({"queues": [{"name": "a" * 255, "max_attempts": 1}]})
        assert cfg.rules("a" * 255).max_attempts == 1  # type: ignore[union-attr]
        assert worker_config({"queues": [{"pattern": "b" * 254 + "*"}]}).rules("b" * 300)

    def test_brackets_are_refused_one_at_a_time(self) -> None:
        for pattern in ("q[1", "q]1"):
            assert refused({"queues": [{"pattern": pattern}]}) == (
                f"retry.toml: queues[0].pattern may use * and ? only, got {pattern!r}"
            )


def _backoff(**backoff: Any) -> dict[str, Any]:
    return {"queues": [{"name": "a", "backoff": backoff}]}


_TAKES = 'takes seconds (a number) or a string such as "250ms", "5s", "10m", "2h", "1d"'


class TestErrorsNameTheKey:
    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            (config(prefix=5), "prefix must be a string, got 5"),
            (config(queue_type=5), "queue_type is 'classic' or 'quorum', got 5"),
            (config(delivery_limit="x"), "delivery_limit must be an int >= 1, got 'x'"),
            (config(tick="soon"), f"tick {_TAKES}, got 'soon'"),
            (config(publish_failure_pause="x"), f"publish_failure_pause {_TAKES}, got 'x'"),
            (config(publish_timeout="x"), f"publish_timeout {_TAKES}, got 'x'"),
            (
                config(publish_timeout="0s"),
                (
                    "publish_timeout must be at least 1 s, got 0 ms: a copy whose confirm "
                    "comes later is published again, and its message handled twice"
                ),
            ),
            (
                config(max_delay=1e15),
                (
                    "max_delay must be at most 49 d 17 h 2 min 47.295 s, got "
                    "11574074074 d 1 h 46 min 40 s"
                ),
            ),
            (
                _backoff(kind="fixed", delay="99999999999w"),
                (
                    "queues[0].backoff.delay must be at most 49 d 17 h 2 min 47.295 s, got "
                    "699999999993 d"
                ),
            ),
            (
                {"queues": [{"name": "a", "colour": "red"}]},
                (
                    "queues[0].colour is not a setting; the settings here are name, pattern, "
                    "max_attempts, backoff, expired, maxlen, direct_release"
                ),
            ),
            (
                {"queues": [{"pattern": ""}]},
                "queues[0].pattern must be a queue name of 1 to 255 bytes, got ''",
            ),
            (
                {"queues": [{"name": "orders.retry"}]},
                (
                    "queues[0].name names the retry machinery's own queue 'orders.retry'; "
                    "name the work queue"
                ),
            ),
            (
                {"queues": [{"name": "a", "max_attempts": True}]},
                "queues[0].max_attempts must be an int >= 1, got True",
            ),
            (
                _backoff(kind="exponential", initial="soon"),
                f"queues[0].backoff.initial {_TAKES}, got 'soon'",
            ),
            (
                _backoff(kind="exponential", initial=1, max="soon"),
                f"queues[0].backoff.max {_TAKES}, got 'soon'",
            ),
            (_backoff(kind="fixed"), "queues[0].backoff.delay is missing"),
            (
                _backoff(kind="fixed", delay=0),
                "queues[0].backoff.delay must be positive",
            ),
            (
                _backoff(kind="schedule", delays=[1, 0]),
                "queues[0].backoff.delays must be positive",
            ),
            (  # a kind TOML can write that is not a word: named, not a TypeError
                _backoff(kind=["fixed"]),
                "queues[0].backoff.kind is one of fixed, exponential, schedule, got ['fixed']",
            ),
            (  # a text echoing a constructor's name is the duration's error, said once
                _backoff(kind="fixed", delay="Fixed("),
                f"queues[0].backoff.delay {_TAKES}, got 'Fixed('",
            ),
            (
                {"queues": [{"name": "retry.orders"}]},
                (
                    "queues[0].name 'retry.orders' is under the prefix 'retry', whose names "
                    "are the retry machinery's own; set another prefix or name the work queue"
                ),
            ),
            (
                {
                    "max_delay": "1s",
                    "queues": [{"name": "a", "backoff": {"kind": "fixed", "delay": 2}}],
                },
                (
                    "queues[0].backoff names a delay of 2 s, longer than max_delay (1 s): "
                    "raise max_delay or shorten the delay"
                ),
            ),
            (  # the longest delay counts, not the first: 2 min into a 1 min max_delay
                {
                    "max_delay": "1m",
                    "defaults": {"backoff": {"kind": "schedule", "delays": ["1s", "2m"]}},
                    "queues": [{"name": "a"}],
                },
                (
                    "defaults.backoff (which queues[0] uses) names a delay of 2 min, longer "
                    "than max_delay (1 min): raise max_delay or shorten the delay"
                ),
            ),
            (  # no [defaults] table at all: the built-in backoff is named
                {"max_delay": "1m", "queues": [{"name": "a", "max_attempts": 10}]},
                (
                    "the default backoff (which queues[0] uses; set defaults.backoff) names a "
                    "delay of 4 min 16 s, longer than max_delay (1 min): raise max_delay or "
                    "shorten the delay"
                ),
            ),
            (  # 1, 2, 4, ... 256 s: the ninth retry's delay is past a minute
                {"max_delay": "1m", "defaults": {"max_attempts": 10}, "queues": [{"name": "a"}]},
                (
                    "the default backoff (which queues[0] uses; set defaults.backoff) names a "
                    "delay of 4 min 16 s, longer than max_delay (1 min): raise max_delay or "
                    "shorten the delay"
                ),
            ),
        ],
    )
    def test_the_whole_message_is_the_source_the_key_and_the_problem(
        self, data: dict[str, Any], expected: str
    ) -> None:
        """The file is named once, then the key: no prefix is repeated and no key is lost."""
        assert refused(data) == f"retry.toml: {expected}"

    @pytest.mark.parametrize(
        ("data", "expected"),
        [
            ({}, "retry.toml: queues must list at least one queue"),
            ({"queues": []}, "retry.toml: queues must list at least one queue"),
            (
                config(colour="red"),
                "retry.toml: colour is not a setting; the settings here are url",
            ),
            (config(url="http://x"), "retry.toml: url must be an amqp:// or amqps:// URL"),
            (config(prefix=5), "retry.toml: prefix must be a string, got 5"),
            (config(prefix=""), "retry.toml: prefix must be a short non-empty str"),
            (config(queue_type="stream"), "retry.toml: queue_type is 'classic' or 'quorum'"),
            (config(prefetch=0), "retry.toml: prefetch must be an int >= 1"),
            (config(prefetch=True), "retry.toml: prefetch must be an int >= 1, got True"),
            (config(max_delay="soon"), "retry.toml: max_delay takes seconds (a number) or"),
            (config(defaults=[]), "retry.toml: defaults must be a table"),
            (config(defaults={"max_attempts": 0}), "defaults.max_attempts must be an int >= 1"),
            (config(defaults={"retries": 3}), "defaults.retries is not a setting"),
            (config(defaults={"expired": "drop"}), 'defaults.expired is "dead" or "retry"'),
            (
                config(defaults={"direct_release": "yes"}),
                "defaults.direct_release is true or false, got 'yes'",
            ),
            ({"queues": ["orders"]}, "queues[0] must be a table with name or pattern"),
            ({"queues": [{"max_attempts": 3}]}, "queues[0] needs exactly one of name or pattern"),
            (
                {"queues": [{"name": "a", "pattern": "b*"}]},
                "queues[0] needs exactly one of name or pattern",
            ),
            ({"queues": [{"name": ""}]}, "queues[0].name must be a queue name of 1 to 255 bytes"),
            ({"queues": [{"name": "a" * 256}]}, "queues[0].name must be a queue name of 1 to 255"),
            ({"queues": [{"name": "a"}, {"name": "a"}]}, "queues[1] repeats 'a'"),
            (
                {"queues": [{"name": "a", "backoff": "fast"}]},
                'queues[0].backoff must be a table such as { kind = "fixed", delay = "5s" }',
            ),
            (
                {"queues": [{"name": "a", "backoff": {"kind": "linear"}}]},
                "queues[0].backoff.kind is one of fixed, exponential, schedule, got 'linear'",
            ),
            (
                {"queues": [{"name": "a", "backoff": {"kind": "fixed"}}]},
                "queues[0].backoff.delay is missing",
            ),
            (
                {"queues": [{"name": "a", "backoff": {"kind": "fixed", "delay": "5 weeks"}}]},
                "queues[0].backoff.delay takes seconds (a number) or a string such as",
            ),
            (
                {"queues": [{"name": "a", "backoff": {"kind": "fixed", "delay": 1, "max": 2}}]},
                "queues[0].backoff.max is not a setting; the settings here are kind, delay",
            ),
            (
                {"queues": [{"name": "a", "backoff": {"kind": "schedule", "delays": []}}]},
                "queues[0].backoff.delays must be a list of durations",
            ),
            (
                {"queues": [{"name": "a", "backoff": {"kind": "schedule", "delays": [1, "x"]}}]},
                "queues[0].backoff.delays[1] takes seconds",
            ),
            (
                {"queues": [{"name": "a", "backoff": {"kind": "exponential"}}]},
                "queues[0].backoff.initial is missing",
            ),
            (
                {
                    "queues": [
                        {"name": "a", "backoff": {"kind": "exponential", "initial": 1, "factor": 0}}
                    ]
                },
                "queues[0].backoff.factor must be a number >= 1, got 0",
            ),
            (
                config(tick="2s", max_delay="1s"),
                "retry.toml: max_delay (1000 ms) must be at least one tick (2000 ms)",
            ),
        ],
    )
    def test_the_message_names_the_key(self, data: dict[str, Any], expected: str) -> None:
        assert expected in refused(data)

    def test_a_missing_or_broken_file_is_named(self, tmp_path: Path) -> None:
        missing = tmp_path / "nothing.toml"
        with pytest.raises(RetryConfigError) as info:
            load_worker_config(missing)
        assert str(info.value) == f"{missing}: cannot read the config: No such file or directory"
        broken = tmp_path / "broken.toml"
        broken.write_text("queues = [")
        with pytest.raises(RetryConfigError, match=r"broken\.toml: not valid TOML"):
            load_worker_config(broken)


def test_the_file_is_read_as_utf8_whatever_the_locale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A locale that is not UTF-8 (Windows' cp1252, say) does not change the names read."""
    path = tmp_path / "retry.toml"
    path.write_text('[[queues]]\nname = "café"\n', encoding="utf-8")
    # What open() takes for "no encoding given" is asked of io.text_encoding: say latin-1.
    monkeypatch.setattr("io.text_encoding", lambda encoding, *_: encoding or "latin-1")
    assert load_worker_config(path).names == ("café",)


def test_a_source_that_begins_an_error_text_is_still_named() -> None:
    """A file called "p" and an error from the shared options that starts with "p"."""
    with pytest.raises(RetryConfigError) as info:
        worker_config(config(prefix="x" * 101), "p")
    assert str(info.value).startswith("p: prefix must be a short non-empty str")


_FIXED_2S = {"kind": "fixed", "delay": "2s"}
_FIXED_3S = {"kind": "fixed", "delay": "3s"}


def test_a_delay_as_long_as_max_delay_fits_and_each_queue_is_checked() -> None:
    """max_delay bounds every queue's delays, the first that fits does not end the check."""
    fits = {"max_delay": "2s", "queues": [{"name": "a", "backoff": _FIXED_2S}]}
    assert worker_config(fits).rules("a") is not None
    second = {
        "max_delay": "2s",
        "queues": [{"name": "a", "backoff": _FIXED_2S}, {"name": "b", "backoff": _FIXED_3S}],
    }
    assert refused(second) == (
        "retry.toml: queues[1].backoff names a delay of 3 s, longer than max_delay (2 s): "
        "raise max_delay or shorten the delay"
    )


def test_the_longest_ttl_rabbitmq_takes_is_the_longest_duration() -> None:
    """2**32 - 1 ms, x-message-ttl's bound, is a max_delay; a millisecond more is not."""
    longest = {"max_delay": "4294967.295s", "queues": [{"name": "a"}]}
    assert worker_config(longest).retry.topology.max_delay_ms == 2**32 - 1
    assert refused({"max_delay": "4294967.296s", "queues": [{"name": "a"}]}) == (
        "retry.toml: max_delay must be at most 49 d 17 h 2 min 47.295 s, got "
        "49 d 17 h 2 min 47.296 s"
    )


def test_a_max_delay_below_the_smallest_tick_is_named() -> None:
    """Delays under 100 ms still get a 100 ms tick: a max_delay below it cannot hold one."""
    data = {
        "max_delay": "50ms",
        "queues": [{"name": "a", "backoff": {"kind": "fixed", "delay": "50ms"}}],
    }
    assert refused(data) == "retry.toml: max_delay (50 ms) must be at least one tick (100 ms)"


def test_the_policy_for_exact_names_only_is_the_names() -> None:
    """Exact names are checked at load, so no guard against the machinery's names is added."""
    cfg = worker_config({"queues": [{"name": "orders"}, {"name": "email-queue"}]})
    assert policy_command(cfg).split("'")[3] == "^(orders|email\\-queue)$"


def test_a_refusal_naming_no_argument_is_the_tables() -> None:
    """A backoff whose refusal names none of the table's keys: the table's key, the text."""

    def refuse(option: str | None) -> Callable[[], Fixed]:
        def make() -> Fixed:
            raise RetryConfigError("not today", option=option)

        return make

    for option in (None, "colour"):
        with pytest.raises(PydanticCustomError) as info:
            _built(refuse(option), FixedTable)
        error: Any = {
            "type": "worker_config",
            "loc": ("queues", 0, "backoff", "fixed"),
            "msg": "",
            "ctx": info.value.context,
        }
        assert _line(error) == "queues[0].backoff not today"


def test_an_error_of_pydantics_own_is_said_as_pydantic_says_it() -> None:
    """Every check is the config's own; one pydantic made itself would still name its key."""
    error: Any = {"type": "int_type", "loc": ("defaults", "max_attempts"), "msg": "Not an int"}
    assert _line(error) == "defaults.max_attempts Not an int"
    missing: Any = {"type": "missing", "loc": ("queues", 1, "backoff", "schedule", "delays")}
    assert _line(missing) == "queues[1].backoff.delays is missing"


def test_only_the_delays_its_attempts_reach_must_fit_max_delay() -> None:
    """The default backoff's 5 minute cap is never reached by 5 attempts (1, 2, 4, 8 s)."""
    assert worker_config({"max_delay": "1m", "queues": [{"name": "a"}]}).rules("a") is not None
    unused = {"kind": "schedule", "delays": ["1s", "2m"]}  # the 2 min one is never used
    cfg = worker_config(
        {"max_delay": "1m", "queues": [{"name": "a", "max_attempts": 2, "backoff": unused}]}
    )
    assert cfg.rules("a") is not None
    two = {"max_delay": "2s", "queues": [{"name": "a", "max_attempts": 2, "backoff": _FIXED_3S}]}
    assert "names a delay of 3 s" in refused(two)  # one retry, and it waits 3 s
    single = {"kind": "schedule", "delays": ["1s"]}
    once = {"queues": [{"name": "a", "max_attempts": 1, "backoff": single}]}
    assert worker_config(once).rules("a") is not None  # one attempt: no delay to check
    jittered = {"kind": "exponential", "initial": "1s", "factor": 2, "jitter": 0.5}
    fits = {"max_delay": "8s", "queues": [{"name": "a", "backoff": jittered}]}
    assert worker_config(fits).rules("a") is not None  # 8 s; jitter's excess is cut


def test_the_schema_describes_the_file_for_editors() -> None:
    """What ``worker --schema`` prints: every key, its defaults (the middleware's), its values."""
    schema = worker_config_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["title"] == "faststream-retry worker config"
    assert (schema["required"], schema["additionalProperties"]) == (["queues"], False)
    top = schema["properties"]
    assert list(top) == [
        "url",
        "prefix",
        "queue_type",
        "max_delay",
        "tick",
        "delivery_limit",
        "prefetch",
        "publish_timeout",
        "publish_failure_pause",
        "defaults",
        "queues",
    ]
    duration = {
        "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": PATTERN}],
        "description": f"a duration: {HELP}",
    }
    assert {key: top["max_delay"][key] for key in duration} == duration
    defaults = [top[key]["default"] for key in top if "default" in top[key]]
    assert defaults == [None, "retry", "quorum", 86_400, None, 20, 200, 30, 1]
    assert top["queue_type"]["enum"] == ["classic", "quorum"]
    assert top["prefetch"]["minimum"] == 1
    rules = schema["$defs"]["RulesTable"]["properties"]
    assert list(rules) == ["max_attempts", "backoff", "expired", "maxlen", "direct_release"]
    queue = schema["$defs"]["QueueTable"]
    assert list(queue["properties"]) == ["name", "pattern", *rules]
    assert queue["additionalProperties"] is False
    backoff = rules["backoff"]["anyOf"][0]
    assert backoff["discriminator"]["propertyName"] == "kind"
    assert sorted(backoff["discriminator"]["mapping"]) == ["exponential", "fixed", "schedule"]
    exponential = schema["$defs"]["ExponentialTable"]
    assert list(exponential["properties"]) == ["kind", "initial", "factor", "max", "jitter"]
    assert exponential["required"] == ["kind", "initial"]


def test_what_the_schema_lists_the_worker_reads() -> None:
    """A file using every key the schema names is a config; one it does not name is refused."""
    full = {
        "url": "amqp://h/",
        "prefix": "p",
        "queue_type": "classic",
        "max_delay": "1h",
        "tick": "1s",
        "delivery_limit": 3,
        "prefetch": 4,
        "publish_timeout": 5,
        "publish_failure_pause": "250ms",
        "defaults": {"max_attempts": 2, "expired": "retry", "maxlen": "retry"},
        "queues": [
            {"name": "a", "direct_release": True, "backoff": {"kind": "fixed", "delay": 1}},
            {"pattern": "b.*", "backoff": {"kind": "exponential", "initial": 1, "max": 2}},
        ],
    }
    assert set(full) == set(worker_config_schema()["properties"])
    cfg = worker_config(full)
    assert (cfg.url, cfg.prefix, cfg.retry.topology.queue_type) == ("amqp://h/", "p", "classic")
    assert (cfg.retry.topology.tick_ms, cfg.retry.topology.delivery_limit) == (1000, 3)
    assert (cfg.retry.prefetch, cfg.retry.publish_timeout_s, cfg.retry.pause_s) == (4, 5, 0.25)
    a, b = cfg.rules("a"), cfg.rules("b.x")
    assert a is not None
    assert b is not None
    assert (a.max_attempts, a.expired, a.maxlen, a.direct_release) == (
        2,
        OnDeath.RETRY,
        OnDeath.RETRY,
        True,
    )
    assert (a.backoff, b.backoff) == (Fixed(1), Exponential(1, maximum=2))
    assert b.direct_release is False


def test_a_config_that_is_not_a_table_is_named_as_a_whole() -> None:
    data: Any = ["queues"]
    with pytest.raises(RetryConfigError) as info:
        worker_config(data, "retry.toml")
    assert str(info.value) == "retry.toml: must be a table, got ['queues']"


def test_a_factor_or_jitter_that_is_no_number_is_named() -> None:
    """Its range is Exponential's to check; that it is a number, the table's."""
    assert refused(_backoff(kind="exponential", initial=1, factor="x")) == (
        "retry.toml: queues[0].backoff.factor must be a number, got 'x'"
    )
    assert refused(_backoff(kind="exponential", initial=1, jitter=True)) == (
        "retry.toml: queues[0].backoff.jitter must be a number, got True"
    )
    assert refused(_backoff(kind="exponential", initial=1, jitter=2)) == (
        "retry.toml: queues[0].backoff.jitter is a fraction in [0, 1], got 2.0"
    )


def test_the_models_errors_are_the_configs_own_lines() -> None:
    """Validating with the model itself: pydantic's ValidationError, each message the line."""
    with pytest.raises(ValidationError) as info:
        WorkerFile.model_validate({"queues": [{"name": "a", "max_attempts": 0}]})
    error = info.value.errors()[0]
    assert (error["type"], error["msg"]) == ("worker_config", "must be an int >= 1, got 0")
    assert _line(error) == "queues[0].max_attempts must be an int >= 1, got 0"


def test_the_backoff_is_a_union_tagged_by_kind() -> None:
    """pydantic picks the table by kind and puts the kind in the error's location."""
    adapter: TypeAdapter[Any] = TypeAdapter(_BackoffTable)
    table = adapter.validate_python({"kind": "schedule", "delays": [1]})
    assert isinstance(table, ScheduleTable)
    assert table.build() == Schedule([1])
    with pytest.raises(ValidationError) as info:
        adapter.validate_python({"kind": "fixed"})
    (error,) = info.value.errors()
    assert (error["type"], error["loc"]) == ("missing", ("fixed", "delay"))
