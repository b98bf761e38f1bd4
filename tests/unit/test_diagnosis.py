"""What ``doctor`` concludes from what it saw (pure parts)."""

from __future__ import annotations

import logging

import pytest

from faststream_retry.core.advice import Mismatch, Refusal, migrate_command, series_advice
from faststream_retry.core.topology import Route, TopologyOptions
from faststream_retry.ops.diagnosis import (
    Finding,
    QueueState,
    Report,
    backlog_findings,
    cut_short_findings,
    limit_findings,
    mismatch_findings,
    missing_findings,
    old_tier_findings,
    queue_findings,
    refusal_findings,
    series_findings,
    stranded_findings,
    tier_candidates,
    version_finding,
)

OPTIONS = TopologyOptions("p", 60_000)


def report(*severities: str) -> Report:
    findings = tuple(Finding(s, "c", "", "w", "", "") for s in severities)  # type: ignore[arg-type]
    return Report("m:app", "p", "quorum", "3.10.8", findings)


def test_a_report_is_as_urgent_as_its_most_urgent_finding() -> None:
    assert report().status == "ok"
    assert report("ok", "warning").status == "warning"
    assert report("action", "ok", "warning").status == "action"
    data = report("action", "ok").as_dict()
    assert data["counts"] == {"ok": 1, "warning": 0, "action": 1}
    assert report("action").as_dict()["findings"] == [
        {"severity": "action", "check": "c", "subject": "", "what": "w", "why": "", "fix": ""}
    ]


@pytest.mark.parametrize(
    ("version", "queue_type", "severity"),
    [
        ("3.10.8", "quorum", "ok"),
        ("3.9.29", "quorum", "action"),
        ("3.9.29", "classic", "ok"),
        ("garbage", "quorum", "warning"),
        (None, "quorum", "warning"),
    ],
)
def test_the_version_is_checked_for_the_queue_type(
    version: str | None, queue_type: str, severity: str
) -> None:
    assert version_finding(version, queue_type).severity == severity


def test_a_too_old_broker_gets_the_start_errors_fix() -> None:
    assert 'queue_type="classic"' in version_finding("3.9.29", "quorum").fix


def test_a_queue_mismatch_names_the_migrate_command() -> None:
    """The fix is a command to paste, with the prefix and a non-default delivery limit."""
    found = Mismatch("queue", "o.dlq", "x-queue-type", "quorum", "classic", fits="classic")
    (finding,) = mismatch_findings([found], OPTIONS)
    assert finding.severity == "action"
    assert finding.what == (
        "queue 'o.dlq': argument 'x-queue-type' is 'classic' on the broker, the app declares "
        "'quorum'"
    )
    assert "faststream-retry migrate o.dlq --queue-type quorum --prefix p" in finding.fix
    assert 'RetryMiddleware(queue_type="classic")' in finding.fix
    assert "queue_type='classic' declares" in finding.why


def test_the_delivery_limit_is_named_only_where_it_matters() -> None:
    options = TopologyOptions("p", 60_000, delivery_limit=5)
    assert migrate_command("o.retry", options, retry_queue=True).endswith("--delivery-limit 5")
    assert "--delivery-limit" not in migrate_command("o.dlq", options, retry_queue=False)
    assert "--delivery-limit" not in migrate_command("o.retry", OPTIONS, retry_queue=True)


def test_an_exchange_mismatch_is_fixed_by_deleting_it() -> None:
    """An exchange holds no messages: nothing to migrate."""
    found = Mismatch("exchange", "p.delay.100", "type", "fanout", "direct")
    (finding,) = mismatch_findings([found], OPTIONS)
    assert "rabbitmqadmin delete exchange name=p.delay.100" in finding.fix
    assert "migrate" not in finding.fix


def test_refusals_name_the_permission() -> None:
    refusal = Refusal("queue", "o.dlq", "configure permission", "declare", "ACCESS_REFUSED ...")
    (finding,) = refusal_findings([refusal])
    assert (finding.severity, finding.subject) == ("action", "o.dlq")
    assert "grant configure permission" in finding.fix


def test_missing_objects_are_one_warning() -> None:
    assert missing_findings([]) == []
    (finding,) = missing_findings([("exchange", "p.delay.100"), ("queue", "o.retry")])
    assert finding.severity == "warning"
    assert "exchanges 'p.delay.100'; queues 'o.retry'" in finding.what


def test_delivery_limit_advice_keeps_its_level() -> None:
    found = [
        (logging.WARNING, "quorum queue 'o' has no x-delivery-limit: a message. Set it"),
        (logging.INFO, "quorum queue 'o': x-delivery-limit=2 is below max_attempts=5. Fine"),
    ]
    warning, info = limit_findings(found)
    assert (warning.severity, warning.subject) == ("warning", "o")
    assert info.severity == "ok"


def test_a_retry_queue_without_its_consumer_means_the_app_is_down() -> None:
    """Waiting messages need action; an empty one is a warning; .dlq and tiers need none."""
    findings = queue_findings(
        [
            QueueState("a.retry", "retry", 2, 0),
            QueueState("b.retry", "retry", 0, 0),
            QueueState("a", "work", 5, 0),
            QueueState("a.dlq", "dlq", 0, 0),
            QueueState("p.delay.100", "tier", 4, 0),
        ]
    )
    by_subject = {f.subject: f.severity for f in findings}
    assert by_subject == {"a.retry": "action", "b.retry": "warning", "a": "warning", "": "ok"}


def test_a_running_app_is_ok_and_dead_letters_are_pointed_at() -> None:
    findings = queue_findings(
        [QueueState("a.retry", "retry", 0, 1), QueueState("a.dlq", "dlq", 3, 0)]
    )
    assert [(f.check, f.severity) for f in findings] == [
        ("dead-letters", "warning"),
        ("consumers", "ok"),
    ]
    assert "faststream-retry dlq list a.dlq" in findings[0].fix


def test_stranded_and_old_tiers() -> None:
    (stranded,) = stranded_findings([("gone.retry", 3)])
    assert stranded.severity == "action"
    full, empty = old_tier_findings([("p.delay.250", 1), ("p.delay.500", 0)])
    assert (full.severity, empty.severity) == ("warning", "ok")


def test_tier_candidates_cover_the_usual_ladders() -> None:
    """Power-of-two ladders of round ticks, and of the plan's own tick (beyond its max_delay)."""
    names = set(tier_candidates("p", [300]))
    for ttl in (100, 200, 51_200, 250, 1000, 15_000, 60_000, 120_000, 300, 2400):
        assert f"p.delay.{ttl}" in names
    assert "p.delay.333" not in names
    assert len(names) < 500  # one passive declare each


def test_a_cut_short_migration_is_finished_by_running_it_again() -> None:
    (finding,) = cut_short_findings(
        [("o.retry", 4)], TopologyOptions("p", 60_000, delivery_limit=9)
    )
    assert finding.severity == "action"
    assert "4 message(s) wait in 'o.retry.migrating'" in finding.what
    assert finding.fix.endswith(
        "faststream-retry migrate o.retry --queue-type quorum --prefix p --delivery-limit 9"
    )


def test_a_missing_work_queue_is_a_warning_that_points_at_the_management_api() -> None:
    """The app declares it at start: missing before a first deploy is no action, but copies
    for a deleted one are what AMQP cannot count."""
    (finding,) = queue_findings([QueueState("gone", "missing-work", 0, 0)])
    assert (finding.severity, finding.subject) == ("warning", "gone")
    assert finding.what == "work queue 'gone' does not exist"
    assert "--management-url" in finding.fix


def test_copies_a_tier_cannot_hand_back_need_action_and_only_the_tiers_are_named() -> None:
    backlog = {"p.delay.100": 3, "p.delay.200": 0, "orders": 7}
    (finding,) = backlog_findings(backlog, ["p.delay.100", "p.delay.200"])
    assert (finding.severity, finding.check, finding.subject) == (
        "action",
        "undeliverable",
        "p.delay.100",
    )
    assert finding.what == "tier 'p.delay.100' holds 3 copies that its queue would not take"
    (one,) = backlog_findings({"p.delay.100": 1}, ["p.delay.100"])
    assert "holds 1 copy that" in one.what
    assert backlog_findings(None, ["p.delay.100"]) == []


def test_a_transient_work_queue_needs_action_where_the_broker_refuses_it() -> None:
    found = series_advice([Route("a", (), transient=True)], (4, 3))
    (warning,) = series_findings(found)
    assert warning.severity == "warning"
    (action,) = series_findings(found, transient_refused=True)
    assert (action.severity, action.subject) == ("action", "a")
    assert "the app cannot start" in action.why
    assert action.fix == warning.fix
