"""What the plugin does with each queue's failures, worked out without a broker (pure).

The schedule is not a second model of the plugin: every row comes from ``decide``, the
function the middleware calls on a failure, and every hop from ``Tiers.wait`` and
``recheck_step``, the functions the middleware and the re-check consumer call. Jitter is
taken at both ends of its range (``rand()`` at 0 and just below 1), so each delay is a
range, already rounded up to the tick as the plugin rounds it. Times leave out what no
plan can know: how long the handler runs and how long each hop takes (milliseconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faststream_retry.core.classify import (
    BUILTIN_PERMANENT,
    BUILTIN_PERMANENT_NAMES,
    BUILTIN_TRANSIENT,
    classify,
)
from faststream_retry.core.decision import Action, Hop, decide, recheck_step
from faststream_retry.core.durations import format_ms
from faststream_retry.core.policy import Exponential, Fixed, Schedule, effective_policy
from faststream_retry.core.tiers import Wait
from faststream_retry.core.topology import Route, registry_name, tier_name
from faststream_retry.errors import (
    PermanentError,
    RetryConfigError,
    RetryLater,
    TransientError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from faststream_retry.core.policy import Backoff, HandlerPolicy, RetryPolicy
    from faststream_retry.core.tiers import Tiers
    from faststream_retry.core.topology import Plan

__all__ = [
    "FORMAT",
    "Declared",
    "Explanation",
    "HandlerExplanation",
    "Leg",
    "QueueExplanation",
    "Rules",
    "Step",
    "describe_backoff",
    "explain_plan",
    "format_ms",
    "legs",
]

FORMAT = 1
"""The version of the JSON shape ``Explanation.to_json`` returns; it changes only by adding."""

_LOWEST = 0.0
# rand() is documented to be in [0, 1): its largest value, not 1.0, is the top of the range.
_HIGHEST = math.nextafter(1.0, 0.0)


class _Unlisted(Exception):  # noqa: N818 - stands for any exception the lists do not name
    """An exception no list names: what the plugin does with an unknown failure."""


def _class_name(cls: type[BaseException]) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


@dataclass(frozen=True, slots=True)
class Leg:
    """One pass through a delay tier: its TTL, and the queue the broker then delivers to.

    ``to`` is the work queue for a last tier, or its ``.retry`` queue, whose re-check
    consumer sends the copy round another tier or, when it is due, releases it.
    """

    tier_ms: int
    to: str

    def to_json(self) -> dict[str, Any]:
        """Return ``{"tier_ms": int, "to": queue name}``."""
        return {"tier_ms": self.tier_ms, "to": self.to}


@dataclass(frozen=True, slots=True)
class Step:
    """What happens after failed attempt ``attempt`` (1 for the first handler call).

    ``action``: ``retry_now`` (in-process, no delay), ``retry_later`` (through the
    tiers) or ``dead_letter`` (the attempts are used up). Delays are the range jitter
    allows, rounded to the tick; ``elapsed`` is the sum of the delays so far, from the
    first failure to the next attempt (or to the dead letter). ``legs_min`` and
    ``legs_max`` are the tiers the shortest and the longest delay pass through.
    """

    attempt: int
    action: str
    delay_min_ms: int
    delay_max_ms: int
    elapsed_min_ms: int
    elapsed_max_ms: int
    legs_min: tuple[Leg, ...]
    legs_max: tuple[Leg, ...]

    def to_json(self) -> dict[str, Any]:
        """Return the step as JSON-able data (every duration in integer milliseconds)."""
        return {
            "attempt": self.attempt,
            "action": self.action,
            "delay_min_ms": self.delay_min_ms,
            "delay_max_ms": self.delay_max_ms,
            "elapsed_min_ms": self.elapsed_min_ms,
            "elapsed_max_ms": self.elapsed_max_ms,
            "legs_min": [leg.to_json() for leg in self.legs_min],
            "legs_max": [leg.to_json() for leg in self.legs_max],
        }


@dataclass(frozen=True, slots=True)
class Rules:
    """The exception lists a handler's failures are classified by, in precedence order.

    Each level maps ``transient`` and ``permanent`` to class names; the first level
    that names a class of the exception (its most specific one) decides. ``unknown``
    is the verdict for an exception no level names, ``unknown_rule`` the level that
    gave it (``fallback`` unless a list names ``Exception`` itself, say).
    """

    explicit: Mapping[str, tuple[str, ...]]
    handler: Mapping[str, tuple[str, ...]]
    default: Mapping[str, tuple[str, ...]]
    builtin: Mapping[str, tuple[str, ...]]
    unknown: str
    unknown_rule: str

    def to_json(self) -> dict[str, Any]:
        """Return the levels as ``{level: {"transient": [...], "permanent": [...]}}``."""
        return {
            "explicit": _lists_json(self.explicit),
            "handler": _lists_json(self.handler),
            "default": _lists_json(self.default),
            "builtin": _lists_json(self.builtin),
            "unknown": {"verdict": self.unknown, "rule": self.unknown_rule},
        }


def _lists_json(lists: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
    return {verdict: list(names) for verdict, names in lists.items()}


def _lists(
    transient: Iterable[type[BaseException]], permanent: Iterable[type[BaseException]]
) -> dict[str, tuple[str, ...]]:
    # dict.fromkeys: asyncio.TimeoutError is TimeoutError since Python 3.11, listed once.
    return {
        "transient": tuple(dict.fromkeys(_class_name(c) for c in transient)),
        "permanent": tuple(dict.fromkeys(_class_name(c) for c in permanent)),
    }


@dataclass(frozen=True, slots=True)
class HandlerExplanation:
    """One handler's effective policy, classification and schedule.

    ``retries`` False: the plugin leaves its failures to FastStream, and the other
    fields are empty. ``own_policy``: the handler has ``@retry_policy``; otherwise it
    runs with the middleware default.
    """

    name: str
    retries: bool
    own_policy: bool
    max_attempts: int
    immediate: int
    backoff: Mapping[str, Any]
    rules: Rules | None
    schedule: tuple[Step, ...]

    @property
    def dead_letter_min_ms(self) -> int:
        """Return the shortest time from the first failure to the dead letter."""
        return self.schedule[-1].elapsed_min_ms if self.schedule else 0

    @property
    def dead_letter_max_ms(self) -> int:
        """Return the longest time from the first failure to the dead letter."""
        return self.schedule[-1].elapsed_max_ms if self.schedule else 0

    def to_json(self) -> dict[str, Any]:
        """Return the handler as JSON-able data."""
        if not self.retries:
            return {"handler": self.name, "retries": False, "own_policy": self.own_policy}
        return {
            "handler": self.name,
            "retries": True,
            "own_policy": self.own_policy,
            "max_attempts": self.max_attempts,
            "immediate": self.immediate,
            "backoff": dict(self.backoff),
            "classification": self.rules.to_json() if self.rules else None,
            "schedule": [step.to_json() for step in self.schedule],
            "dead_letter_after_min_ms": self.dead_letter_min_ms,
            "dead_letter_after_max_ms": self.dead_letter_max_ms,
        }


@dataclass(frozen=True, slots=True)
class Declared:
    """One object the plugin declares: an exchange, a queue or a binding.

    ``fields`` are its JSON fields besides ``kind``: ``name``, ``type`` and
    ``durable`` for an exchange; ``name``, ``durable`` and ``arguments`` for a queue;
    ``exchange``, ``queue`` and ``routing_key`` for a binding.
    """

    kind: str
    fields: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """Return ``{"kind": ..., **fields}``."""
        return {"kind": self.kind, **self.fields}


@dataclass(frozen=True, slots=True)
class QueueExplanation:
    """A work queue: its handlers, and the objects the plugin declares for it alone.

    ``covered`` False: every handler has retries off and nothing is declared for it.
    ``home_from_tier`` False (a queue declared with ``x-overflow`` ``reject-publish``):
    a copy's last tier delivers it to ``.retry``, and the re-check consumer releases it;
    ``None`` on NATS and Redis, where no tier delivers anywhere by itself.
    """

    queue: str
    covered: bool
    home_from_tier: bool | None
    handlers: tuple[HandlerExplanation, ...]
    objects: tuple[Declared, ...]

    def to_json(self) -> dict[str, Any]:
        """Return the queue as JSON-able data."""
        return {
            "queue": self.queue,
            "covered": self.covered,
            "home_from_tier": self.home_from_tier,
            "handlers": [h.to_json() for h in self.handlers],
            "objects": [o.to_json() for o in self.objects],
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    """What the plugin does for an application: see ``to_json`` for the stable shape.

    ``system``: ``rabbitmq``, ``nats`` or ``redis``. What has no meaning on a broker is
    ``None`` (``queue_type`` on NATS and Redis, ``prefix`` on Redis) or empty (Redis has
    no tiers), and ``notes`` say what differs there.
    """

    app: str
    prefix: str | None
    queue_type: str | None
    tick_ms: int
    max_delay_ms: int
    tiers_ms: tuple[int, ...]
    shared: tuple[Declared, ...]
    """The tiers and the registry: declared once per broker, shared by every queue."""
    queues: tuple[QueueExplanation, ...]
    system: str = "rabbitmq"
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return the explanation as JSON-able data, format ``FORMAT``.

        Durations are integer milliseconds in keys ending ``_ms``; names are the
        broker's names. Keys are only ever added within one format.
        """
        return {
            "format": FORMAT,
            "system": self.system,
            "app": self.app,
            "prefix": self.prefix,
            "queue_type": self.queue_type,
            "tick_ms": self.tick_ms,
            "max_delay_ms": self.max_delay_ms,
            "tiers": [
                {"name": tier_name(self.prefix or "", ttl), "ttl_ms": ttl} for ttl in self.tiers_ms
            ],
            "shared_objects": [o.to_json() for o in self.shared],
            "queues": [q.to_json() for q in self.queues],
            "notes": list(self.notes),
        }


def describe_backoff(backoff: Backoff) -> dict[str, Any]:
    """Return a backoff's parameters in milliseconds, its ``kind`` and a ``text`` for people."""
    if isinstance(backoff, Fixed):
        ms = backoff.delay_ms(1, lambda: _LOWEST)
        return {"kind": "fixed", "delay_ms": ms, "text": f"fixed {format_ms(ms)}"}
    if isinstance(backoff, Schedule):
        delays = list(backoff.named_delays_ms())
        listed = ", ".join(format_ms(d) for d in delays)
        return {"kind": "schedule", "delays_ms": delays, "text": f"schedule {listed}, last repeats"}
    if isinstance(backoff, Exponential):
        initial, *capped = backoff.named_delays_ms()
        maximum = capped[0] if capped else None
        text = f"exponential {format_ms(initial)} x {backoff.factor:g}^(n-1)"
        if maximum is not None:
            text += f", at most {format_ms(maximum)}"
        if backoff.jitter:
            text += f", jitter ±{backoff.jitter:.0%}"
        return {
            "kind": "exponential",
            "initial_ms": initial,
            "factor": backoff.factor,
            "maximum_ms": maximum,
            "jitter": backoff.jitter,
            "text": text,
        }
    return {"kind": "custom", "text": repr(backoff)}


def legs(delay_ms: int, tiers: Tiers, route: Route) -> tuple[Leg, ...]:
    """Return the tiers a copy due in ``delay_ms`` passes, as the plugin sends it.

    The first tier is the middleware's choice (``Tiers.wait``), every next one the
    re-check step's (``recheck_step``), with no time lost between hops.
    """
    wait = tiers.wait(delay_ms)
    elapsed = 0
    path: list[Leg] = []
    while True:
        elapsed += wait.tier_ms
        if wait.last and route.home_from_tier:
            path.append(Leg(wait.tier_ms, route.queue))
            return tuple(path)
        path.append(Leg(wait.tier_ms, route.retry_queue))
        step = recheck_step(delay_ms, elapsed, tiers)
        if not isinstance(step, Hop):  # due: the re-check consumer releases it
            return tuple(path)
        wait = Wait(step.tier_ms, step.last)


def _schedule(
    handler: HandlerPolicy | None, default: RetryPolicy, tiers: Tiers, route: Route
) -> tuple[Step, ...]:
    failure = TransientError("explain")
    policy = effective_policy(handler, default)
    steps: list[Step] = []
    elapsed_min = elapsed_max = 0
    for attempt in range(1, policy.max_attempts + 1):
        ends = [
            decide(failure, attempt=attempt, handler=handler, default=default, tiers=tiers, rand=r)
            for r in (_constant(_LOWEST), _constant(_HIGHEST))
        ]
        action = ends[0].action
        low, high = sorted(d.delay_ms for d in ends)
        elapsed_min += low
        elapsed_max += high
        later = action is Action.RETRY_LATER
        steps.append(
            Step(
                attempt,
                action.value,
                low,
                high,
                elapsed_min,
                elapsed_max,
                legs(low, tiers, route) if later else (),
                legs(high, tiers, route) if later else (),
            )
        )
        if action is Action.DEAD_LETTER:
            break
    return tuple(steps)


def _constant(value: float) -> Callable[[], float]:
    return lambda: value


def _rules(handler: HandlerPolicy | None, default: RetryPolicy) -> Rules:
    policy = effective_policy(handler, default)
    # As decide() does: a handler's own lists only when it has @retry_policy.
    handler_transient = policy.transient if handler is not None else ()
    handler_permanent = policy.permanent if handler is not None else ()
    unknown = classify(
        _Unlisted(),
        handler_transient=handler_transient,
        handler_permanent=handler_permanent,
        default_transient=default.transient,
        default_permanent=default.permanent,
    )
    builtin = _lists(BUILTIN_TRANSIENT, BUILTIN_PERMANENT)
    builtin["permanent"] += tuple(sorted(BUILTIN_PERMANENT_NAMES))
    return Rules(
        explicit=_lists((TransientError, RetryLater), (PermanentError, RetryConfigError)),
        handler=_lists(handler_transient, handler_permanent),
        default=_lists(default.transient, default.permanent),
        builtin=builtin,
        unknown=str(unknown.verdict),
        unknown_rule=str(unknown.rule),
    )


def _handler(
    name: str, handler: HandlerPolicy | None, default: RetryPolicy, tiers: Tiers, route: Route
) -> HandlerExplanation:
    policy = effective_policy(handler, default)
    if not policy.enabled:
        return HandlerExplanation(
            name,
            retries=False,
            own_policy=handler is not None,
            max_attempts=0,
            immediate=0,
            backoff={},
            rules=None,
            schedule=(),
        )
    return HandlerExplanation(
        name=name,
        retries=True,
        own_policy=handler is not None,
        max_attempts=policy.max_attempts,
        immediate=policy.immediate,
        backoff=describe_backoff(policy.backoff),
        rules=_rules(handler, default),
        schedule=_schedule(handler, default, tiers, route),
    )


def _queue_objects(plan: Plan, route: Route) -> tuple[Declared, ...]:
    return tuple(
        Declared(
            "queue", {"name": name, "durable": True, "arguments": dict(plan.spec(name).arguments)}
        )
        for name in (route.retry_queue, route.dlq)
    )


def _shared_objects(plan: Plan) -> tuple[Declared, ...]:
    shared: list[Declared] = []
    for ttl in plan.tiers.ttls_ms:
        name = plan.tier(ttl)
        shared += [
            Declared("exchange", {"name": name, "type": "fanout", "durable": True}),
            Declared(
                "queue",
                {"name": name, "durable": True, "arguments": dict(plan.spec(name).arguments)},
            ),
            Declared("binding", {"exchange": name, "queue": name, "routing_key": ""}),
        ]
    # The registry is classic whatever queue_type says (see rabbit/registry.py).
    registry = {"x-queue-type": "classic"}
    registry_queue = {"name": registry_name(plan.options.prefix), "durable": True}
    shared.append(Declared("queue", {**registry_queue, "arguments": registry}))
    return tuple(shared)


def explain_plan(
    app: str,
    plan: Plan,
    default: RetryPolicy,
    subscribers: Sequence[tuple[Route, Sequence[str]]],
    *,
    declared: bool = True,
) -> Explanation:
    """Explain ``plan`` for the subscribers ``(route, handler names)`` of app ``app``.

    Subscribers of one queue are joined in order, as the plan joins them; queues are
    sorted by name, so the output does not depend on FastStream's order. A custom
    ``Backoff`` whose ``delay_ms`` raises makes this raise too. ``declared`` False: the
    plan declares no RabbitMQ objects (NATS, Redis), and none are listed.
    """
    joined: dict[str, tuple[Route, list[str]]] = {}
    for route, names in subscribers:
        known = joined.get(route.queue)
        if known is None:
            joined[route.queue] = (route, list(names))
        else:
            merged = Route(route.queue, known[0].handlers + route.handlers, known[0].arguments)
            joined[route.queue] = (merged, [*known[1], *names])
    queues = []
    for queue, (route, names) in sorted(joined.items()):
        covered = plan.route(queue)
        effective = covered or route
        handlers = tuple(
            _handler(name, h.policy, default, plan.tiers, effective)
            for name, h in zip(names, effective.handlers, strict=True)
        )
        objects = _queue_objects(plan, effective) if covered is not None and declared else ()
        queues.append(
            QueueExplanation(
                queue, covered is not None, effective.home_from_tier, handlers, objects
            )
        )
    return Explanation(
        app=app,
        prefix=plan.options.prefix,
        queue_type=plan.options.queue_type,
        tick_ms=plan.tiers.tick_ms,
        max_delay_ms=plan.tiers.max_delay_ms,
        tiers_ms=plan.tiers.ttls_ms,
        shared=_shared_objects(plan) if declared else (),
        queues=tuple(queues),
    )
