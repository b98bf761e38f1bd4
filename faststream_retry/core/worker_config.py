"""The retry worker's configuration: read from TOML, checked at start (pure: no broker imports).

Every error names the key (``queues[1].backoff.initial``) and what it accepts. The format::

    url = "amqp://guest:guest@localhost:5672/"   # optional: --url or RABBITMQ_URL win
    prefix = "retry"                # <prefix>.intake, <prefix>.delay.<ms>, ...
    queue_type = "quorum"           # of the queues the worker declares
    max_delay = "1d"                # durations: seconds, or "250ms", "5s", "10m", "2h", "1d"

    [defaults]                      # for every queue below, unless it says otherwise
    max_attempts = 5
    backoff = { kind = "exponential", initial = "1s", factor = 2, max = "5m", jitter = 0.1 }
    expired = "dead"                # a message that expired in its queue: "dead" or "retry"
    maxlen = "dead"                 # one its queue dropped at its length limit
    direct_release = false          # true: the last tier delivers straight to the queue

    [[queues]]
    name = "orders"                 # an exact name ...

    [[queues]]
    pattern = "billing.*"           # ... or a pattern: * is any run of characters, ? one
    max_attempts = 3
    backoff = { kind = "schedule", delays = ["1s", "10s", "1m"] }
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faststream_retry.core.config import RetryConfig
from faststream_retry.core.intake import OnDeath, QueueRules
from faststream_retry.core.policy import Backoff, Exponential, Fixed, RetryPolicy, Schedule
from faststream_retry.core.tiers import Tiers, compute_tick_ms
from faststream_retry.core.topology import intake_name
from faststream_retry.errors import RetryConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["QueueEntry", "WorkerConfig", "load_worker_config", "parse_duration", "policy_command"]

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*")
_DURATION_HELP = 'seconds (a number) or a string such as "250ms", "5s", "10m", "2h", "1d"'
_PATTERN = re.compile(r"[^*?\[\]]*")
_MAX_NAME_BYTES = 255
# The worker has no outage mode (outage_after=None switches it off): the hold is unused.
_NO_OUTAGE = 0


_TOP_KEYS = (
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
)
_RULE_KEYS = ("max_attempts", "backoff", "expired", "maxlen", "direct_release")
_BACKOFF_KEYS = {
    "fixed": ("kind", "delay"),
    "exponential": ("kind", "initial", "factor", "max", "jitter"),
    "schedule": ("kind", "delays"),
}


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One allowlist entry: an exact queue name or a pattern, with its rules."""

    rules: QueueRules
    name: str | None = None
    pattern: str | None = None
    _regex: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def matches(self, queue: str) -> bool:
        """Return whether this entry names ``queue``."""
        if self.name is not None:
            return queue == self.name
        return self._regex is not None and self._regex.fullmatch(queue) is not None

    @property
    def regex(self) -> str:
        """Return the entry as a regular expression RabbitMQ's policies understand."""
        if self.name is not None:
            return re.escape(self.name)
        return _pattern_regex(self.pattern or "")


def _pattern_regex(pattern: str) -> str:
    """Return a ``*`` / ``?`` pattern as a regular expression (Python's and RabbitMQ's)."""
    return "".join(
        ".*" if char == "*" else "." if char == "?" else re.escape(char) for char in pattern
    )


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """The worker's whole configuration, checked."""

    retry: RetryConfig
    """The options the worker shares with the FastStream middleware (tiers, confirms)."""
    queues: tuple[QueueEntry, ...]
    url: str | None = None
    source: str = "<config>"
    """Where it was read from, for messages."""

    @property
    def prefix(self) -> str:
        """Return the prefix of every name the worker declares."""
        return self.retry.topology.prefix

    @property
    def intake(self) -> str:
        """Return the intake exchange (and queue) name."""
        return intake_name(self.prefix)

    @property
    def tiers(self) -> Tiers:
        """Return the delay tiers every configured backoff fits on."""
        options = self.retry.topology
        delays: list[int] = []
        for entry in self.queues:
            delays.extend(entry.rules.backoff.named_delays_ms())
        return Tiers.build(compute_tick_ms(delays, options.tick_ms), options.max_delay_ms)

    @property
    def names(self) -> tuple[str, ...]:
        """Return the exact queue names the config lists."""
        return tuple(e.name for e in self.queues if e.name is not None)

    def rules(self, queue: str) -> QueueRules | None:
        """Return the rules of ``queue``: exact names first, then the first pattern that fits.

        ``None`` when the config does not name it, and for names that belong to the
        retry machinery itself (``.retry``, ``.dlq``, the prefix's own queues), whatever
        a pattern says: sending a message back to one of those would be a loop.
        """
        if queue.endswith((".retry", ".dlq")) or queue.startswith(self.prefix + "."):
            return None
        for entry in self.queues:
            if entry.name == queue:
                return entry.rules
        for entry in self.queues:
            if entry.pattern is not None and entry.matches(queue):
                return entry.rules
        return None


def load_worker_config(path: str | Path) -> WorkerConfig:
    """Read and check the TOML file at ``path``.

    Raises:
        RetryConfigError: the file is missing or not TOML, or a key is unknown or
            invalid; the message names the file, the key and what it takes.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RetryConfigError(f"{source}: cannot read the config: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RetryConfigError(f"{source}: not valid TOML: {exc}") from exc
    return worker_config(data, source)


def worker_config(data: Mapping[str, Any], source: str = "<config>") -> WorkerConfig:
    """Check a config already parsed into a mapping (the TOML file's tables)."""

    def fail(key: str, text: str) -> RetryConfigError:
        return RetryConfigError(f"{source}: {key} {text}")

    _known(data, _TOP_KEYS, "", fail)
    url = data.get("url")
    if url is not None and (
        not isinstance(url, str) or not url.startswith(("amqp://", "amqps://"))
    ):
        raise fail("url", f"must be an amqp:// or amqps:// URL, got {url!r}")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise fail("defaults", f"must be a table, got {defaults!r}")
    _known(defaults, _RULE_KEYS, "defaults.", fail)
    base = _rules(defaults, QueueRules(5, _default_backoff()), "defaults.", fail)
    entries = data.get("queues")
    if not isinstance(entries, list) or not entries:
        raise fail(
            "queues",
            'must list at least one queue: [[queues]] with name = "..." or pattern = "..."',
        )
    queues = tuple(_entry(item, i, base, fail) for i, item in enumerate(entries))
    try:
        retry = RetryConfig.build(
            RetryPolicy(max_attempts=base.max_attempts, backoff=base.backoff),
            prefix=_get(data, "prefix", str, "retry", fail),
            tick=_duration_or_none(data.get("tick"), "tick", fail),
            max_delay=_duration(data.get("max_delay", 86_400), "max_delay", fail) / 1000,
            queue_type=_get(data, "queue_type", str, "quorum", fail),
            delivery_limit=_get(data, "delivery_limit", int, 20, fail),
            prefetch=_get(data, "prefetch", int, 200, fail),
            publish_failure_pause=_duration(
                data.get("publish_failure_pause", 1), "publish_failure_pause", fail
            )
            / 1000,
            publish_timeout=_duration(data.get("publish_timeout", 30), "publish_timeout", fail)
            / 1000,
            log_retry_traceback="never",
            outage_after=None,
            outage_probe=None,
            outage_hold=_NO_OUTAGE,
        )
    except RetryConfigError as exc:
        if str(exc).startswith(f"{source}: "):
            raise
        raise RetryConfigError(f"{source}: {exc}") from exc
    _check_names(queues, retry.topology.prefix, fail)
    _check_delays(data, queues, retry.topology.max_delay_ms, fail)
    config = WorkerConfig(retry, queues, url, source)
    try:
        config.tiers  # noqa: B018 - every backoff must fit under max_delay
    except RetryConfigError as exc:
        raise RetryConfigError(f"{source}: {exc}") from exc
    return config


def _check_names(queues: tuple[QueueEntry, ...], prefix: str, fail: Any) -> None:  # noqa: ANN401
    """Refuse an entry listed twice, and a name under the prefix (the machinery's own)."""
    seen: set[str] = set()
    for i, entry in enumerate(queues):
        key = entry.name if entry.name is not None else f"pattern:{entry.pattern}"
        if key in seen:
            raise fail(f"queues[{i}]", f"repeats {key!r}; list each queue once")
        seen.add(key)
        if entry.name is not None and entry.name.startswith(prefix + "."):
            raise fail(
                f"queues[{i}].name",
                f"{entry.name!r} is under the prefix {prefix!r}, whose names are the retry "
                "machinery's own; set another prefix or name the work queue",
            )


def _check_delays(
    data: Mapping[str, Any],
    queues: tuple[QueueEntry, ...],
    max_delay_ms: int,
    fail: Any,  # noqa: ANN401
) -> None:
    """Refuse a delay a queue would use that is longer than ``max_delay``.

    The middleware cuts such a delay to ``max_delay``; a config file says what it means,
    so a wait it cannot keep is an error, not a surprise. Only the delays its attempts
    reach count (without jitter, which may go past by its fraction and is cut): the
    default backoff's 5 minute cap is never reached by 5 attempts. The key named is the
    one that set the backoff: the queue's, ``defaults.backoff``, or the built-in default.
    """
    defaults = data.get("defaults", {})
    for i, entry in enumerate(queues):
        longest = _longest_reached_ms(entry.rules)
        if longest <= max_delay_ms:
            continue
        if "backoff" in data["queues"][i]:
            key = f"queues[{i}].backoff"
        elif "backoff" in defaults:
            key = f"defaults.backoff (which queues[{i}] uses)"
        else:
            key = f"the default backoff (which queues[{i}] uses; set defaults.backoff)"
        raise fail(
            key,
            f"names a delay of {_seconds(longest)}, longer than max_delay "
            f"({_seconds(max_delay_ms)}): raise max_delay or shorten the delay",
        )


def _longest_reached_ms(rules: QueueRules) -> int:
    """Return the longest delay ``rules``' retries wait, without jitter; 0 with no retry."""
    retries = rules.max_attempts - 1
    if not retries:
        return retries  # 0: a single attempt waits for nothing
    backoff = rules.backoff
    if isinstance(backoff, Schedule):
        return max(backoff.named_delays_ms()[:retries])
    return backoff.delay_ms(retries, _no_jitter)  # Fixed and Exponential never shrink


def _no_jitter() -> float:
    return 0.5  # jitter's factor is 1 - j + 2j * rand(): 1 at 0.5


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g} s"


def policy_command(config: WorkerConfig, *, vhost: str = "/", name: str | None = None) -> str:
    """Return the ``rabbitmqctl set_policy`` command that opts the configured queues in.

    A policy changes queues that already exist without redeclaring them. RabbitMQ applies
    one policy per queue (the highest priority): a queue that has one already needs the
    ``dead-letter-exchange`` key added to it instead. The pattern leaves out the retry
    machinery's own queues (``.retry``, ``.dlq``, the prefix's) that a pattern entry
    would match: a ``.dlq`` dead-lettering into the intake would move dead letters.
    """
    own = "(?!" + re.escape(config.prefix + ".") + ")(?!.*\\.(retry|dlq)$)"
    if all(e.name is not None for e in config.queues):
        own = ""  # exact names are checked at load: none of them is the machinery's
    pattern = "^" + own + "(" + "|".join(e.regex for e in config.queues) + ")$"
    definition = '{"dead-letter-exchange":"' + config.intake + '"}'
    vhost_part = "" if vhost == "/" else f"-p {_shell(vhost)} "
    return (
        f"rabbitmqctl set_policy {vhost_part}--apply-to queues "
        f"{_shell(name or config.intake)} {_shell(pattern)} {_shell(definition)}"
    )


def _shell(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def parse_duration(value: object, key: str) -> int:
    """Return a duration in ms: seconds (int or float) or a string with a unit."""
    if isinstance(value, bool):
        raise RetryConfigError(f"{key} takes {_DURATION_HELP}, got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise RetryConfigError(f"{key} must be a duration >= 0, got {value!r}")
        return math.ceil(round(value * 1000, 6))
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match:
            return math.ceil(float(match[1]) * _UNITS_MS[match[2]])
    raise RetryConfigError(f"{key} takes {_DURATION_HELP}, got {value!r}")


def _default_backoff() -> Backoff:
    return RetryPolicy().backoff


def _known(table: Mapping[str, Any], keys: tuple[str, ...], where: str, fail: Any) -> None:  # noqa: ANN401
    for key in table:
        if key not in keys:
            valid = ", ".join(keys)
            raise fail(f"{where}{key}", f"is not a setting; the settings here are {valid}")


def _get(table: Mapping[str, Any], key: str, kind: type, default: Any, fail: Any) -> Any:  # noqa: ANN401
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise fail(key, f"must be {'an int' if kind is int else 'a string'}, got {value!r}")
    return value


def _duration(value: object, key: str, fail: Any) -> int:  # noqa: ANN401
    try:
        return parse_duration(value, key)
    except RetryConfigError as exc:
        raise fail(key, str(exc).removeprefix(key + " ")) from exc


def _duration_or_none(value: object, key: str, fail: Any) -> float | None:  # noqa: ANN401
    return None if value is None else _duration(value, key, fail) / 1000


def _entry(item: object, i: int, base: QueueRules, fail: Any) -> QueueEntry:  # noqa: ANN401
    where = f"queues[{i}]."
    if not isinstance(item, dict):
        raise fail(f"queues[{i}]", f"must be a table with name or pattern, got {item!r}")
    _known(item, ("name", "pattern", *_RULE_KEYS), where, fail)
    name, pattern = item.get("name"), item.get("pattern")
    if (name is None) == (pattern is None):
        raise fail(f"queues[{i}]", "needs exactly one of name or pattern")
    text = name if name is not None else pattern
    key = where + ("name" if name is not None else "pattern")
    if not isinstance(text, str) or not text or len(text.encode()) > _MAX_NAME_BYTES:
        raise fail(key, f"must be a queue name of 1 to 255 bytes, got {text!r}")
    if text.endswith((".retry", ".dlq")):
        raise fail(key, f"names the retry machinery's own queue {text!r}; name the work queue")
    rules = _rules(item, base, where, fail)
    if name is not None:
        return QueueEntry(rules, name=name)
    if "[" in text or "]" in text:
        raise fail(key, f"may use * and ? only, got {text!r}")
    regex = re.compile(_pattern_regex(text))
    return QueueEntry(rules, pattern=text, _regex=regex)


def _rules(table: Mapping[str, Any], base: QueueRules, where: str, fail: Any) -> QueueRules:  # noqa: ANN401
    max_attempts = table.get("max_attempts", base.max_attempts)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise fail(f"{where}max_attempts", f"must be an int >= 1, got {max_attempts!r}")
    backoff = base.backoff
    if "backoff" in table:
        backoff = _backoff(table["backoff"], f"{where}backoff", fail)
    on = {}
    for key in ("expired", "maxlen"):
        value = table.get(key, getattr(base, key).value)
        if value not in ("dead", "retry"):
            raise fail(f"{where}{key}", f'is "dead" or "retry", got {value!r}')
        on[key] = OnDeath(value)
    direct = table.get("direct_release", base.direct_release)
    if not isinstance(direct, bool):
        raise fail(f"{where}direct_release", f"is true or false, got {direct!r}")
    return QueueRules(
        max_attempts, backoff, expired=on["expired"], maxlen=on["maxlen"], direct_release=direct
    )


def _backoff(value: object, key: str, fail: Any) -> Backoff:  # noqa: ANN401
    if not isinstance(value, dict):
        example = '{ kind = "fixed", delay = "5s" }'
        raise fail(key, f"must be a table such as {example}, got {value!r}")
    kind = value.get("kind")
    if not isinstance(kind, str) or kind not in _BACKOFF_KEYS:
        raise fail(f"{key}.kind", f"is one of {', '.join(_BACKOFF_KEYS)}, got {kind!r}")
    _known(value, _BACKOFF_KEYS[kind], key + ".", fail)
    for name in _BACKOFF_KEYS[kind][1:2]:  # the one every kind needs: delay, initial, delays
        if name not in value:
            raise fail(f"{key}.{name}", "is missing")
    # Durations are read first, each naming its key; what the constructor then refuses
    # (a factor below 1, a maximum below the initial delay) is named by the table.
    if kind == "fixed":
        delay = _duration(value["delay"], f"{key}.delay", fail) / 1000
        return _built(lambda: Fixed(delay), key, fail)
    if kind == "schedule":
        listed = value["delays"]
        if not isinstance(listed, list) or not listed:
            raise fail(f"{key}.delays", f"must be a list of durations, got {listed!r}")
        delays = [_duration(d, f"{key}.delays[{i}]", fail) / 1000 for i, d in enumerate(listed)]
        return _built(lambda: Schedule(delays), key, fail)
    initial = _duration(value["initial"], f"{key}.initial", fail) / 1000
    maximum = value.get("max")
    top = None if maximum is None else _duration(maximum, f"{key}.max", fail) / 1000
    factor, jitter = value.get("factor", 2), value.get("jitter", 0)
    return _built(
        lambda: Exponential(initial, factor=factor, maximum=top, jitter=jitter), key, fail
    )


# The constructors' arguments that the config names otherwise.
_ARGUMENT_KEYS = {"maximum": "max"}


def _built(make: Callable[[], Backoff], key: str, fail: Any) -> Backoff:  # noqa: ANN401
    try:
        return make()
    except RetryConfigError as exc:
        if exc.option is None:  # a Backoff of the future, naming no argument
            raise fail(key, str(exc)) from exc
        name = _ARGUMENT_KEYS.get(exc.option, exc.option)
        raise fail(f"{key}.{name}", exc.problem) from exc
