"""What ``doctor`` concludes from what it saw on the broker (pure: no broker imports).

``faststream_retry.ops.doctor`` gathers the facts (the server version, the 406 and 403
replies to declarations, queue depths and consumers, the registry); the functions here
turn them into findings an operator can act on: each says what was found, why it
matters and the fix, with a severity. What is said of a 406 or a 403 is
``faststream_retry.core.advice``'s, the same words the start's error uses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from faststream_retry.core.advice import (
    migrate_command,
    mismatch_advice,
    refusal_advice,
    transient_queue_advice,
)
from faststream_retry.core.topology import is_retry_queue, migrating_name, tier_name
from faststream_retry.core.versions import MIN_VERSION, parse_version, too_old

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from faststream_retry.core.advice import Advice, Mismatch, Refusal
    from faststream_retry.core.topology import TopologyOptions

__all__ = [
    "SEVERITIES",
    "Finding",
    "QueueState",
    "Report",
    "Severity",
    "cut_short_findings",
    "limit_findings",
    "mismatch_findings",
    "missing_findings",
    "old_tier_findings",
    "queue_findings",
    "refusal_findings",
    "stranded_findings",
    "tier_candidates",
    "version_finding",
]

Severity = Literal["ok", "warning", "action"]
SEVERITIES: tuple[Severity, ...] = ("ok", "warning", "action")
"""From least to most urgent; a report is as urgent as its most urgent finding."""

PROBED_TICKS_MS = (
    *range(100, 1001, 100),
    250,
    750,
    *range(1000, 10_001, 1000),
    15_000,
    30_000,
    60_000,
)
"""The ticks whose power-of-two ladders ``doctor`` probes for tiers of another tick.

AMQP cannot list queues, so without the management API a tier is found only by its
name. These cover the ticks the plugin computes from round delays (the GCD of
"100 ms", "1 s", "10 s", "1 min", ...); a tier of any other tick is found only with
``--management-url``.
"""

LADDER_TOP_MS = 8 * 24 * 3600 * 1000
"""Probed ladders stop here: a ``max_delay`` beyond a week is unusual."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``doctor`` found: how urgent, what, why it matters and what to do."""

    severity: Severity
    check: str
    """Which check found it: version, arguments, permissions, missing, delivery-limit,
    consumers, dead-letters, stranded, old-tier, rabbitmq-4, undeliverable."""
    subject: str
    """The object it is about (a queue, an exchange), or ``""`` for the broker as a whole."""
    what: str
    why: str
    fix: str

    @classmethod
    def of(cls, severity: Severity, check: str, subject: str, advice: Advice) -> Finding:
        """Return the finding that ``advice`` (what, why, fix) words."""
        return cls(severity, check, subject, advice.what, advice.why, advice.fix)

    def as_dict(self) -> dict[str, str]:
        """Return the finding as JSON-able data."""
        return {
            "severity": self.severity,
            "check": self.check,
            "subject": self.subject,
            "what": self.what,
            "why": self.why,
            "fix": self.fix,
        }


@dataclass(frozen=True, slots=True)
class Report:
    """Everything ``doctor`` found for one app on one broker."""

    app: str
    prefix: str
    queue_type: str
    """RabbitMQ's queue type; ``""`` on NATS."""
    server_version: str | None
    findings: tuple[Finding, ...]
    system: str = "rabbitmq"
    """The broker examined: ``rabbitmq`` or ``nats`` (OpenTelemetry's ``messaging.system``)."""

    @property
    def status(self) -> Severity:
        """Return the most urgent severity among the findings (``ok`` when there are none)."""
        return max((f.severity for f in self.findings), key=SEVERITIES.index, default="ok")

    def count(self, severity: Severity) -> int:
        """Return how many findings have ``severity``."""
        return sum(1 for f in self.findings if f.severity == severity)

    def as_dict(self) -> dict[str, object]:
        """Return the report as JSON-able data (what ``doctor --json`` prints)."""
        return {
            "app": self.app,
            "system": self.system,
            "prefix": self.prefix,
            "queue_type": self.queue_type,
            "server_version": self.server_version,
            "status": self.status,
            "counts": {severity: self.count(severity) for severity in SEVERITIES},
            "findings": [f.as_dict() for f in self.findings],
        }


def version_finding(version_text: str | None, queue_type: str) -> Finding:
    """Say whether the server is recent enough for ``queue_type``."""
    need = ".".join(map(str, MIN_VERSION[queue_type]))
    version = parse_version(version_text)
    if version is None:
        return Finding(
            "warning",
            "version",
            "",
            f"RabbitMQ's version is unknown ({version_text!r})",
            f"queue_type={queue_type!r} needs RabbitMQ {need} or later; it could not be checked",
            "check the server's version by hand (rabbitmqctl status)",
        )
    if version < MIN_VERSION[queue_type]:
        return Finding(
            "action",
            "version",
            "",
            f"RabbitMQ {version_text} is too old for queue_type={queue_type!r}",
            "the app refuses to start (RetryTopologyError)",
            too_old(str(version_text), queue_type),
        )
    return Finding(
        "ok",
        "version",
        "",
        f"RabbitMQ {version_text} supports queue_type={queue_type!r} (needs {need} or later)",
        "",
        "",
    )


def mismatch_findings(mismatches: Iterable[Mismatch], options: TopologyOptions) -> list[Finding]:
    """Name each object that exists with other arguments, and how to migrate it."""
    return [
        Finding.of("action", "arguments", m.name, mismatch_advice(m, options)) for m in mismatches
    ]


def refusal_findings(refusals: Iterable[Refusal]) -> list[Finding]:
    """Name each object the app's user may not use as the plugin needs (a 403)."""
    return [Finding.of("action", "permissions", r.name, refusal_advice(r)) for r in refusals]


def missing_findings(missing: Iterable[tuple[str, str]]) -> list[Finding]:
    """Name the planned objects that do not exist (the app never started with this plan)."""
    missing = list(missing)
    if not missing:
        return []
    kinds: dict[str, list[str]] = {}
    for kind, name in missing:
        kinds.setdefault(kind, []).append(name)
    shown = "; ".join(
        f"{kind}s {', '.join(repr(n) for n in names)}" for kind, names in sorted(kinds.items())
    )
    return [
        Finding(
            "warning",
            "missing",
            ", ".join(name for _, name in missing),
            f"{len(missing)} object(s) the app declares do not exist: {shown}",
            "the app has not started with this configuration yet (or they were deleted); their "
            "arguments and permissions could not be checked without creating them",
            "start the app: it declares them; run doctor again to check them",
        )
    ]


def series_findings(
    found: Iterable[tuple[str, Advice]], *, transient_refused: bool = False
) -> list[Finding]:
    """Turn the advice on work queues RabbitMQ 4.x deprecates or refuses into warnings.

    ``transient_refused``: this broker refuses transient queues that are not exclusive
    (``amqp.probe.refuses_transient_queues``), so a work queue declared so stops the
    app's start: that needs action, not a warning.
    """
    findings = []
    for queue, advice in found:
        if transient_refused and advice == transient_queue_advice(queue):
            findings.append(
                Finding(
                    "action",
                    "rabbitmq-4",
                    queue,
                    advice.what,
                    "this broker refuses such queues "
                    "(deprecated_features.permit.transient_nonexcl_queues = false): it closes "
                    "the app's connection at the declaration, so the app cannot start",
                    advice.fix,
                )
            )
        else:
            findings.append(Finding.of("warning", "rabbitmq-4", queue, advice))
    return findings


def limit_findings(found: Iterable[tuple[int, str]]) -> list[Finding]:
    """Turn the start-time advice about quorum work queues' delivery limits into findings."""
    findings = []
    for level, text in found:
        subject = text.split("'")[1] if text.count("'") >= 2 else ""
        severity: Severity = "warning" if level >= logging.WARNING else "ok"
        what, _, fix = text.partition(". ")
        findings.append(
            Finding(
                severity,
                "delivery-limit",
                subject,
                what,
                "a quorum queue's x-delivery-limit bounds redeliveries after crashes; the "
                "plugin's retries never spend it",
                fix,
            )
        )
    return findings


@dataclass(frozen=True, slots=True)
class QueueState:
    """What a passive declare told about a queue the app uses (``missing-work``: not there)."""

    name: str
    role: Literal["work", "retry", "dlq", "tier", "missing-work"]
    messages: int
    consumers: int


def queue_findings(states: Iterable[QueueState]) -> list[Finding]:
    """Say which queues lack the consumer they need, and where dead letters wait.

    A ``.retry`` queue is consumed by the app's re-check consumer and a work queue by
    its subscribers: no consumer means the app is not running. Tiers and ``.dlq``
    queues have no consumer by design.
    """
    findings: list[Finding] = []
    states = list(states)
    for s in states:
        if s.role == "retry" and not s.consumers:
            if s.messages:
                findings.append(
                    Finding(
                        "action",
                        "consumers",
                        s.name,
                        f"{s.messages} message(s) wait in {s.name!r} and nothing releases them",
                        "its re-check consumer runs in the app: the app is not running",
                        "start the app; once it runs they go back to their work queue as due",
                    )
                )
            else:
                findings.append(
                    Finding(
                        "warning",
                        "consumers",
                        s.name,
                        f"{s.name!r} has no consumer",
                        "its re-check consumer runs in the app: the app is not running, so "
                        "retries that wait more than one tier are not released",
                        "start the app",
                    )
                )
        elif s.role == "work" and not s.consumers:
            findings.append(
                Finding(
                    "warning",
                    "consumers",
                    s.name,
                    f"work queue {s.name!r} has no consumer ({s.messages} message(s) ready)",
                    "the app is not running: nothing handles its messages, and its due retries "
                    "wait there",
                    "start the app",
                )
            )
        elif s.role == "missing-work":
            findings.append(
                Finding(
                    "warning",
                    "consumers",
                    s.name,
                    f"work queue {s.name!r} does not exist",
                    "the app declares it when it starts; until then, or if it was deleted, a "
                    "retry whose last tier releases into it has nowhere to go: a quorum tier "
                    "keeps it in a dead-letter backlog that AMQP does not count",
                    "start the app (it declares the queue); run doctor with --management-url "
                    "to count what the tiers cannot hand back",
                )
            )
        elif s.role == "dlq" and s.messages:
            findings.append(
                Finding(
                    "warning",
                    "dead-letters",
                    s.name,
                    f"{s.messages} dead letter(s) wait in {s.name!r}",
                    "each is a message the app gave up on, with the reason in its headers",
                    f"look at them (faststream-retry dlq list {s.name}), fix the cause, "
                    "replay them",
                )
            )
    retries = [s for s in states if s.role == "retry"]
    if retries and all(s.consumers for s in retries):
        findings.append(
            Finding(
                "ok",
                "consumers",
                "",
                f"every .retry queue of the app ({len(retries)}) has its re-check consumer",
                "",
                "",
            )
        )
    waiting = sum(s.messages for s in states if s.role == "tier")
    tiers = sum(1 for s in states if s.role == "tier")
    if tiers:
        findings.append(
            Finding(
                "ok",
                "tiers",
                "",
                f"{waiting} message(s) wait in the app's {tiers} tier(s)",
                "",
                "",
            )
        )
    return findings


def cut_short_findings(temps: Iterable[tuple[str, int]], options: TopologyOptions) -> list[Finding]:
    """Name the migrations that were cut short: a queue's temporary queue still exists."""
    return [
        Finding(
            "action",
            "migration",
            queue,
            f"a migration of {queue!r} was cut short: {messages} message(s) wait in "
            f"{migrating_name(queue)!r}",
            "they are out of their queue until the migration is finished",
            "stop the services that use it and run the migration again: "
            + migrate_command(queue, options, retry_queue=is_retry_queue(queue)),
        )
        for queue, messages in temps
    ]


def stranded_findings(stranded: Iterable[tuple[str, int]]) -> list[Finding]:
    """Name the ``.retry`` queues with messages that no subscriber of this app releases."""
    return [
        Finding(
            "action",
            "stranded",
            queue,
            f"{messages} message(s) wait in {queue!r}, which no subscriber of this app owns "
            "and nothing consumes",
            "its subscriber was renamed or removed, or runs in an app that is down: the "
            "messages wait for ever",
            "start a subscriber of its work queue with RetryMiddleware (retries on or off, "
            "either releases them), or move the messages by hand",
        )
        for queue, messages in stranded
    ]


def backlog_findings(backlog: Mapping[str, int] | None, tiers: Iterable[str]) -> list[Finding]:
    """Name the tiers holding copies their queue would not take (``None``: not asked).

    Such copies sit in the quorum tier's at-least-once dead-letter backlog, which a
    passive declare does not count: only the management API (``messages_dlx``) does.
    """
    if backlog is None:
        return []
    return [
        Finding(
            "action",
            "undeliverable",
            name,
            f"tier {name!r} holds {stuck} cop{'y' if stuck == 1 else 'ies'} that its queue "
            "would not take",
            "each copy's queue was deleted, or refuses it (full by a policy): RabbitMQ tries "
            "again every 180 s, and while 32 wait the tier releases nothing, for any queue of "
            "the prefix",
            "declare the queue again (start the service that owns it) and they go home; a "
            "service being retired is stopped and its retries drained before its queues are "
            "deleted",
        )
        for name in tiers
        if (stuck := backlog.get(name, 0))
    ]


def old_tier_findings(old: Iterable[tuple[str, int]]) -> list[Finding]:
    """Name the tiers of another tick (or ``max_delay``) still on the broker."""
    findings = []
    for name, messages in old:
        if messages:
            findings.append(
                Finding(
                    "warning",
                    "old-tier",
                    name,
                    f"tier {name!r}, not in this app's plan, holds {messages} message(s)",
                    "a tier of an earlier tick or max_delay (or of another service on the same "
                    "prefix): it still releases its messages into their .retry queues",
                    "if no service uses it any more, wait until it is empty, then delete it "
                    f"(rabbitmqctl delete_queue {name}, with -p <vhost> outside '/'; its exchange "
                    f"with rabbitmqadmin delete exchange name={name})",
                )
            )
        else:
            findings.append(
                Finding(
                    "ok",
                    "old-tier",
                    name,
                    f"tier {name!r}, not in this app's plan, is empty",
                    "a tier of an earlier tick or max_delay, or of another service on the "
                    "same prefix",
                    "if no service uses it any more, delete it "
                    f"(rabbitmqctl delete_queue {name}, with -p <vhost> outside '/'; its exchange "
                    f"with rabbitmqadmin delete exchange name={name})",
                )
            )
    return findings


def tier_candidates(prefix: str, ticks_ms: Iterable[int] = ()) -> list[str]:
    """Return the tier names to probe: the ladders of ``ticks_ms`` and of the usual ticks."""
    ttls: set[int] = set()
    for tick in {*ticks_ms, *PROBED_TICKS_MS}:
        ttl = tick
        while ttl <= LADDER_TOP_MS:
            ttls.add(ttl)
            ttl *= 2
    return [tier_name(prefix, ttl) for ttl in sorted(ttls)]
