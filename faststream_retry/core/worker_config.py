"""The retry worker's configuration: read from TOML, checked at start (pure: no broker imports).

The file's tables are pydantic models (unknown keys refused, ``backoff`` a union
told apart by its ``kind``); every error is one line naming the file, the key
(``queues[1].backoff.initial``) and what it accepts. ``faststream-retry worker
--schema`` prints the file's JSON Schema (``worker_config_schema()``), for editors.
The format::

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

The other top-level keys are ``tick``, ``delivery_limit``, ``prefetch``,
``publish_timeout`` and ``publish_failure_pause``; every default is the middleware's
(``core/defaults.py``). The durations' grammar is ``core/durations.py``'s. The broker's
URL alone may come from the environment: ``--url``, else ``RABBITMQ_URL``, else ``url``.
"""

from __future__ import annotations

import re
import sys
from abc import abstractmethod
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from faststream_retry.core.config import RetryConfig
from faststream_retry.core.defaults import (
    DELIVERY_LIMIT,
    MAX_DELAY,
    PREFETCH,
    PREFIX,
    PUBLISH_FAILURE_PAUSE,
    PUBLISH_TIMEOUT,
    QUEUE_TYPE,
    QUEUE_TYPES,
    QueueType,
    is_queue_type,
)
from faststream_retry.core.durations import HELP, PATTERN, format_ms, parse_duration
from faststream_retry.core.intake import OnDeath, QueueRules
from faststream_retry.core.policy import Backoff, Exponential, Fixed, RetryPolicy, Schedule
from faststream_retry.core.tiers import MAX_TTL_MS, Tiers, compute_tick_ms
from faststream_retry.core.topology import (
    MAX_NAME_BYTES,
    intake_name,
    is_own_queue,
    is_retry_or_dlq,
)
from faststream_retry.errors import RetryConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Mapping

    from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
    from pydantic.json_schema import JsonSchemaValue
    from pydantic_core import ErrorDetails

__all__ = [
    "QueueEntry",
    "WorkerConfig",
    "load_worker_config",
    "policy_command",
    "worker_config",
    "worker_config_schema",
]

# The worker has no outage mode (outage_after=None switches it off): the hold is unused.
_NO_OUTAGE = 0
_JSON_SCHEMA = "https://json-schema.org/draft/2020-12/schema"
"""The JSON Schema dialect pydantic writes."""
_POLICY = RetryPolicy()
_BUILT_IN = QueueRules(_POLICY.max_attempts, _POLICY.backoff)
"""The rules of a queue the ``[defaults]`` table says nothing about: ``RetryPolicy()``'s."""


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
        if is_own_queue(queue, self.prefix):
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
    """Check a config already parsed into a mapping (the TOML file's tables).

    Raises:
        RetryConfigError: as ``load_worker_config``: one line, ``<source>: <key> <problem>``.
    """
    try:
        checked = WorkerFile.model_validate(data)
    except ValidationError as exc:
        raise RetryConfigError(f"{source}: {_line(exc.errors()[0])}") from None
    return checked.config(source)


def worker_config_schema() -> dict[str, Any]:
    """Return the JSON Schema of the worker's config file, for editors (``worker --schema``).

    It describes what the file may say; the checks that need the whole file (a delay
    longer than ``max_delay``, a queue listed twice) are the worker's at start.
    """
    return {"$schema": _JSON_SCHEMA, **WorkerFile.model_json_schema()}


# --- The errors: each one line, naming the key -------------------------------------------


def _refuse(problem: str, key: str | None = None) -> PydanticCustomError:
    """Return the error of the value being checked (of its ``key``, if given): ``problem``.

    ``problem`` is carried in the context, not formatted into pydantic's message: a
    value's repr may hold braces.
    """
    context = {"problem": problem} if key is None else {"problem": problem, "key": key}
    return PydanticCustomError("worker_config", "{problem}", context)


_MISSING = {
    "queues": 'must list at least one queue: [[queues]] with name = "..." or pattern = "..."'
}
"""What a missing key's line says, where "is missing" is not enough."""


def _line(error: ErrorDetails) -> str:
    """Return ``<key> <problem>`` for one of pydantic's errors (ours or its own)."""
    context = error.get("ctx") or {}
    loc = error["loc"]
    if "key" in context:
        loc = (*loc, str(context["key"]))
    key = _key(loc)
    if error["type"] == "missing":
        problem = _MISSING.get(key, "is missing")
    else:
        problem = str(context.get("problem", error["msg"]))
    return f"{key} {problem}" if key else problem  # no key: the file itself


def _key(loc: tuple[int | str, ...]) -> str:
    """Return a location as the file writes it: ``queues[1].backoff.kind``.

    A backoff's ``kind`` is in pydantic's location after ``backoff`` (which table of
    the union it checked); it is not a key of the file.
    """
    key = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            key += f"[{part}]"
        elif not (i and loc[i - 1] == "backoff" and part in _BACKOFFS):
            key += f".{part}" if key else part
    return key


@dataclass(frozen=True)
class _Accepts:
    """A check before pydantic's own: refuse what ``check`` refuses, saying what the key takes."""

    accepts: str
    check: Callable[[Any], bool]

    def __call__(self, value: object) -> object:
        """Return ``value``, or refuse it: ``<accepts>, got <value>``."""
        if not self.check(value):
            raise _refuse(f"{self.accepts}, got {value!r}")
        return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _duration(value: object) -> int:
    try:
        ms = parse_duration(value, "duration")
    except RetryConfigError as exc:
        raise _refuse(exc.problem) from None
    # No delay outlives RabbitMQ's longest TTL, and this keeps every value a timedelta.
    if ms > MAX_TTL_MS:
        raise _refuse(f"must be at most {format_ms(MAX_TTL_MS)}, got {format_ms(ms)}")
    return ms


class _DurationSchema:
    """A duration's JSON Schema: what the file may write, not the ms it is read as.

    A class, not ``WithJsonSchema``, whose dict pydantic 2.0 cannot hash in a union.
    """

    @classmethod
    def __get_pydantic_json_schema__(
        cls, _schema: core_schema.CoreSchema, _handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": PATTERN},
            ],
            "description": f"a duration: {HELP}",
        }


_Duration = Annotated[int, BeforeValidator(_duration), _DurationSchema]
"""A duration, read as whole ms (``core/durations.py``)."""
_AtLeastOne = Annotated[
    int,
    Field(ge=1),
    BeforeValidator(_Accepts("must be an int >= 1", lambda v: _is_int(v) and v >= 1)),
]
_Number = Annotated[float, BeforeValidator(_Accepts("must be a number", _is_number))]
_Text = Annotated[str, BeforeValidator(_Accepts("must be a string", lambda v: isinstance(v, str)))]
_Flag = Annotated[
    bool, BeforeValidator(_Accepts("is true or false", lambda v: isinstance(v, bool)))
]
_ON_DEATH = sorted(d.value for d in OnDeath)
_OnDeath = Annotated[
    OnDeath,
    BeforeValidator(
        _Accepts("is " + " or ".join(f'"{d}"' for d in _ON_DEATH), lambda v: v in _ON_DEATH)
    ),
]
_QueueType = Annotated[
    QueueType,
    BeforeValidator(_Accepts("is " + " or ".join(map(repr, QUEUE_TYPES)), is_queue_type)),
]
_Url = Annotated[
    str,
    BeforeValidator(
        _Accepts(
            "must be an amqp:// or amqps:// URL",
            lambda v: isinstance(v, str) and v.startswith(("amqp://", "amqps://")),
        )
    ),
]


def _queue_name(value: object) -> str:
    if not isinstance(value, str) or not value or len(value.encode()) > MAX_NAME_BYTES:
        raise _refuse(f"must be a queue name of 1 to {MAX_NAME_BYTES} bytes, got {value!r}")
    if is_retry_or_dlq(value):
        raise _refuse(f"names the retry machinery's own queue {value!r}; name the work queue")
    return value


def _pattern(value: object) -> str:
    text = _queue_name(value)
    if "[" in text or "]" in text:
        raise _refuse(f"may use * and ? only, got {text!r}")
    return text


# --- The file's tables ---------------------------------------------------------------------


class _Table(BaseModel):
    """A TOML table: only its own keys, each checked, every error naming its key."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    not_a_table: ClassVar[str] = "must be a table"
    """What the line says when the value is not a table at all."""

    @model_validator(mode="before")
    @classmethod
    def _only_its_keys(cls, data: object) -> object:
        if not isinstance(data, dict):
            raise _refuse(f"{cls.not_a_table}, got {data!r}")
        keys = [info.alias or name for name, info in cls.model_fields.items()]
        for key in data:
            if key not in keys:
                raise _refuse(f"is not a setting; the settings here are {', '.join(keys)}", key)
        cls._check_whole(data)
        return data

    @classmethod
    def _check_whole(cls, data: dict[str, object]) -> None:
        """Refuse what the table says as a whole (nothing, unless the table has such a rule)."""


class _Backoff(_Table):
    """A ``backoff`` table; its constructor's refusal is named by the table's key for it."""

    @abstractmethod
    def build(self) -> Backoff:
        """Return the ``Backoff`` this table describes."""


def _buildable(table: _Backoff) -> _Backoff:
    """Return ``table`` if its constructor takes what it says (a factor >= 1, say)."""
    _built(table.build, type(table))
    return table


def _built(make: Callable[[], Backoff], table: type[_Table]) -> Backoff:
    """Return ``make()``, or refuse it, naming the key of the argument it refused."""
    try:
        return make()
    except RetryConfigError as exc:
        info = table.model_fields.get(exc.option or "")
        if info is None:  # a Backoff of the future, naming no argument the table has
            raise _refuse(str(exc)) from None
        raise _refuse(exc.problem, info.alias or exc.option) from None


class FixedTable(_Backoff):
    """``{ kind = "fixed", delay = "5s" }``: the same delay before every retry."""

    kind: Literal["fixed"]
    delay: _Duration

    def build(self) -> Backoff:
        """Return the ``Fixed`` backoff."""
        return Fixed(timedelta(milliseconds=self.delay))


class ExponentialTable(_Backoff):
    """``{ kind = "exponential", initial = "1s", factor = 2, max = "5m", jitter = 0.1 }``.

    ``initial * factor ** (n - 1)`` before retry ``n``, at most ``max``, each spread by
    the fraction ``jitter``; ``factor`` and ``jitter`` default to ``Exponential``'s.
    """

    kind: Literal["exponential"]
    initial: _Duration
    factor: _Number | None = None
    maximum: _Duration | None = Field(default=None, alias="max")
    jitter: _Number | None = None

    def build(self) -> Backoff:
        """Return the ``Exponential`` backoff."""
        shape = {
            k: v for k, v in (("factor", self.factor), ("jitter", self.jitter)) if v is not None
        }
        top = None if self.maximum is None else timedelta(milliseconds=self.maximum)
        return Exponential(timedelta(milliseconds=self.initial), maximum=top, **shape)


class ScheduleTable(_Backoff):
    """``{ kind = "schedule", delays = ["1s", "10s", "1m"] }``: retry ``n`` waits the n-th.

    The last delay repeats.
    """

    kind: Literal["schedule"]
    delays: Annotated[
        tuple[_Duration, ...],
        Field(min_length=1),
        BeforeValidator(
            _Accepts("must be a list of durations", lambda v: isinstance(v, list) and bool(v))
        ),
    ]

    def build(self) -> Backoff:
        """Return the ``Schedule`` backoff."""
        return Schedule([timedelta(milliseconds=ms) for ms in self.delays])


_BACKOFFS: dict[str, type[_Backoff]] = {
    get_args(table.model_fields["kind"].annotation)[0]: table
    for table in (FixedTable, ExponentialTable, ScheduleTable)
}
"""Each backoff table by its ``kind``."""
_KINDS = tuple(_BACKOFFS)


class _TaggedByKind:
    """The backoff tables as one union told apart by ``kind``: pydantic's tagged union.

    Built here, not by ``Field(discriminator="kind")``, which pydantic 2.0 (the floor)
    cannot nest in a table of a table (pydantic#6435, fixed in 2.0.2).
    """

    @classmethod
    def __get_pydantic_core_schema__(
        cls, _source: object, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        choices: dict[Hashable, core_schema.CoreSchema] = {
            kind: handler.generate_schema(table) for kind, table in _BACKOFFS.items()
        }
        return core_schema.tagged_union_schema(choices, discriminator="kind")


def _backoff_table(value: object) -> object:
    if not isinstance(value, dict):
        example = '{ kind = "fixed", delay = "5s" }'
        raise _refuse(f"must be a table such as {example}, got {value!r}")
    kind = value.get("kind")
    if kind not in _KINDS:
        raise _refuse(f"is one of {', '.join(_KINDS)}, got {kind!r}", "kind")
    return value


_BackoffTable = Annotated[
    Union[FixedTable, ExponentialTable, ScheduleTable],  # noqa: UP007 - a runtime union
    _TaggedByKind,
    BeforeValidator(_backoff_table),
    AfterValidator(_buildable),
]


class RulesTable(_Table):
    """A queue's rules: in ``[[queues]]`` a key left out is ``[defaults]``' value.

    In ``[defaults]``, a key left out is the middleware's default policy's
    (``RetryPolicy()``: ``max_attempts`` and ``backoff``). ``expired`` and ``maxlen``: what a
    message that expired in its queue, or that its queue dropped at its length limit,
    becomes (``"dead"`` unless set). ``direct_release``: the last tier delivers straight
    into the queue (false unless set).
    """

    max_attempts: _AtLeastOne | None = None
    backoff: _BackoffTable | None = None
    expired: _OnDeath | None = None
    maxlen: _OnDeath | None = None
    direct_release: _Flag | None = None

    def rules(self, base: QueueRules) -> QueueRules:
        """Return ``base`` with what this table sets."""
        return QueueRules(
            base.max_attempts if self.max_attempts is None else self.max_attempts,
            base.backoff if self.backoff is None else self.backoff.build(),
            expired=base.expired if self.expired is None else self.expired,
            maxlen=base.maxlen if self.maxlen is None else self.maxlen,
            direct_release=(
                base.direct_release if self.direct_release is None else self.direct_release
            ),
        )


class _Named(_Table):
    name: Annotated[str, BeforeValidator(_queue_name)] | None = None
    pattern: Annotated[str, BeforeValidator(_pattern)] | None = None


# pydantic takes the bases' fields from the last base to the first: name and pattern
# come first among the keys an error lists.
class QueueTable(RulesTable, _Named):
    """A ``[[queues]]`` entry: a ``name``, or a ``pattern`` (``*`` any run, ``?`` one character).

    With the rules of that queue; a rule left out is ``[defaults]``'.
    """

    not_a_table: ClassVar[str] = "must be a table with name or pattern"

    @classmethod
    def _check_whole(cls, data: dict[str, object]) -> None:
        if (data.get("name") is None) == (data.get("pattern") is None):
            raise _refuse("needs exactly one of name or pattern")

    def entry(self, base: QueueRules) -> QueueEntry:
        """Return the allowlist entry, its rules on top of ``base``."""
        rules = self.rules(base)
        if self.pattern is None:  # then the name is set: exactly one of them is
            return QueueEntry(rules, name=self.name)
        regex = re.compile(_pattern_regex(self.pattern))
        return QueueEntry(rules, pattern=self.pattern, _regex=regex)


class WorkerFile(_Table):
    """The retry worker's config file: ``faststream-retry worker --config retry.toml``."""

    model_config = ConfigDict(title="faststream-retry worker config")

    url: _Url | None = None
    prefix: _Text = PREFIX
    queue_type: _QueueType = QUEUE_TYPE
    # A duration's default is written as the file would write it (seconds), for the schema.
    max_delay: _Duration = Field(default=MAX_DELAY.total_seconds(), validate_default=True)
    tick: _Duration | None = None
    delivery_limit: _AtLeastOne = DELIVERY_LIMIT
    prefetch: _AtLeastOne = PREFETCH
    publish_timeout: _Duration = Field(
        default=PUBLISH_TIMEOUT.total_seconds(), validate_default=True
    )
    publish_failure_pause: _Duration = Field(
        default=PUBLISH_FAILURE_PAUSE.total_seconds(), validate_default=True
    )
    defaults: RulesTable = Field(default_factory=RulesTable)
    queues: Annotated[
        tuple[QueueTable, ...],
        Field(min_length=1),
        BeforeValidator(_Accepts(_MISSING["queues"], lambda v: isinstance(v, list) and bool(v))),
    ]

    def config(self, source: str) -> WorkerConfig:
        """Return the ``WorkerConfig``, checking what needs the whole file."""

        def fail(key: str, problem: str) -> RetryConfigError:
            return RetryConfigError(f"{source}: {key} {problem}")

        base = self.defaults.rules(_BUILT_IN)
        queues = tuple(table.entry(base) for table in self.queues)
        try:
            retry = RetryConfig.build(
                RetryPolicy(max_attempts=base.max_attempts, backoff=base.backoff),
                prefix=self.prefix,
                tick=None if self.tick is None else timedelta(milliseconds=self.tick),
                max_delay=timedelta(milliseconds=self.max_delay),
                queue_type=self.queue_type,
                delivery_limit=self.delivery_limit,
                prefetch=self.prefetch,
                publish_failure_pause=timedelta(milliseconds=self.publish_failure_pause),
                publish_timeout=timedelta(milliseconds=self.publish_timeout),
                log_retry_traceback="never",
                outage_after=None,
                outage_probe=None,
                outage_hold=_NO_OUTAGE,
            )
        except RetryConfigError as exc:
            raise RetryConfigError(f"{source}: {exc}") from exc
        _check_names(queues, retry.topology.prefix, fail)
        self._check_delays(queues, retry.topology.max_delay_ms, fail)
        config = WorkerConfig(retry, queues, self.url, source)
        try:
            config.tiers  # noqa: B018 - every backoff must fit under max_delay
        except RetryConfigError as exc:
            raise RetryConfigError(f"{source}: {exc}") from exc
        return config

    def _check_delays(
        self,
        queues: tuple[QueueEntry, ...],
        max_delay_ms: int,
        fail: Callable[[str, str], RetryConfigError],
    ) -> None:
        """Refuse a delay a queue would use that is longer than ``max_delay``.

        The middleware cuts such a delay to ``max_delay``; a config file says what it
        means, so a wait it cannot keep is an error, not a surprise. Only the delays its
        attempts reach count (without jitter, which may go past by its fraction and is
        cut): the default backoff's 5 minute cap is never reached by 5 attempts. The key
        named is the one that set the backoff: the queue's, ``defaults.backoff``, or the
        built-in default.
        """
        for i, entry in enumerate(queues):
            longest = _longest_reached_ms(entry.rules)
            if longest <= max_delay_ms:
                continue
            if self.queues[i].backoff is not None:
                key = f"queues[{i}].backoff"
            elif self.defaults.backoff is not None:
                key = f"defaults.backoff (which queues[{i}] uses)"
            else:
                key = f"the default backoff (which queues[{i}] uses; set defaults.backoff)"
            raise fail(
                key,
                f"names a delay of {format_ms(longest)}, longer than max_delay "
                f"({format_ms(max_delay_ms)}): raise max_delay or shorten the delay",
            )


def _check_names(
    queues: tuple[QueueEntry, ...], prefix: str, fail: Callable[[str, str], RetryConfigError]
) -> None:
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
