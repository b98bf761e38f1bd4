"""Outage mode's state machine: what counts, when the mode begins and ends, when to probe (pure)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faststream_retry import RetryConfigError, RetryMiddleware, Verdict
from faststream_retry.core import defaults as option_defaults
from faststream_retry.core.outage import (
    MIN_PROBE_MS,
    Entered,
    Left,
    Outage,
    OutageOptions,
)

T, P = Verdict.TRANSIENT, Verdict.PERMANENT


def entered_after(outage: Outage, failures: int, now_ms: int = 0) -> list[Entered | None]:
    return [outage.failed(T, now_ms) for _ in range(failures)]


class TestCounting:
    def test_the_nth_consecutive_transient_failure_switches_the_queue(self) -> None:
        """after=3: the first two change nothing visible, the third switches it, once."""
        outage = Outage(after=3, probe_ms=500)
        assert entered_after(outage, 2) == [None, None]
        assert not outage.active
        assert outage.failed(T, 10) == Entered(failures=3)
        assert outage.active
        assert outage.failed(T, 20) is None, "already in outage mode: no second start"
        assert outage.streak == 4

    def test_after_one_switches_at_the_first_failure(self) -> None:
        """The smallest threshold: one transient failure is enough."""
        outage = Outage(after=1, probe_ms=100)
        assert outage.failed(T, 0) == Entered(failures=1)

    def test_a_success_resets_the_streak(self) -> None:
        """Consecutive means consecutive: a success in between starts the count again."""
        outage = Outage(after=3, probe_ms=500)
        entered_after(outage, 2)
        assert outage.succeeded(0) is None, "not in outage mode: nothing ends"
        assert outage.streak == 0
        assert entered_after(outage, 2) == [None, None]
        assert not outage.active

    def test_a_permanent_failure_leaves_the_streak_as_it_is(self) -> None:
        """A bad payload says nothing about the dependency: neither a failure nor a success."""
        outage = Outage(after=3, probe_ms=500)
        entered_after(outage, 2)
        assert outage.failed(P, 0) is None
        assert outage.streak == 2
        assert outage.failed(T, 0) == Entered(failures=3)
        assert outage.failed(P, 0) is None
        assert outage.active, "a permanent failure does not end the mode either"

    def test_a_success_ends_the_mode_and_says_what_it_took(self) -> None:
        """Duration from the switch, the probes let through, the transient failures during it."""
        outage = Outage(after=2, probe_ms=500)
        entered_after(outage, 2, now_ms=1_000)
        assert outage.take_probe(1_500)
        outage.failed(T, 1_600)
        outage.failed(P, 1_650)  # not counted: permanent
        outage.probe_done(1_700)
        assert outage.take_probe(2_200)
        outage.failed(T, 2_250)  # and a call that was running before the switch
        assert outage.succeeded(6_000) == Left(duration_ms=5_000, probes=2, failures=2)
        assert not outage.active
        assert outage.streak == 0
        assert outage.probes == 0

    def test_a_clock_that_steps_back_never_makes_a_negative_duration(self) -> None:
        """Durations are at least 0, whatever the clock does."""
        outage = Outage(after=1, probe_ms=100)
        outage.failed(T, 5_000)
        assert outage.succeeded(4_000) == Left(duration_ms=0, probes=0, failures=0)

    def test_a_new_outage_starts_its_counts_afresh(self) -> None:
        """Probes and failures of one outage are not carried into the next."""
        outage = Outage(after=1, probe_ms=100)
        outage.failed(T, 0)
        assert outage.take_probe(100)
        outage.failed(T, 150)
        outage.succeeded(200)
        assert outage.failed(T, 1_000) == Entered(failures=1)
        assert outage.succeeded(1_050) == Left(duration_ms=50, probes=0, failures=0)

    def test_stopping_ends_the_mode_but_keeps_the_streak(self) -> None:
        """The consumer stops: the mode ends, but the dependency was never seen to work."""
        outage = Outage(after=2, probe_ms=100)
        assert outage.stopped(0) is None
        entered_after(outage, 2, now_ms=100)
        assert outage.take_probe(200)
        assert outage.stopped(400) == Left(duration_ms=300, probes=1, failures=0)
        assert not outage.active
        assert not outage.probing
        assert outage.streak == 2
        assert outage.stopped(500) is None
        assert outage.stopped(500) is None


class TestProbes:
    def test_a_new_queue_has_no_probe_and_none_running(self) -> None:
        """Normal mode from the start: no probe counted, none running, none to wait for."""
        outage = Outage(after=3, probe_ms=100)
        assert (outage.active, outage.probing, outage.probes) == (False, False, 0)
        assert outage.until_probe_ms(0) is None
        assert outage.take_probe(10**9) is False

    def test_leaving_frees_the_probe_slot_and_its_count(self) -> None:
        """A success during a probe: out of the mode, no probe running, the count back to 0."""
        outage = Outage(after=1, probe_ms=100)
        outage.failed(Verdict.TRANSIENT, 0)
        assert outage.take_probe(100)
        outage.succeeded(150)
        assert (outage.active, outage.probing, outage.probes) == (False, False, 0)

    def test_the_first_probe_is_due_one_interval_after_the_switch(self) -> None:
        """Entered at 1000 with a 500 ms interval: not at 1499, at 1500."""
        outage = Outage(after=1, probe_ms=500)
        assert not outage.take_probe(5_000), "no probes outside outage mode"
        outage.failed(T, 1_000)
        assert outage.until_probe_ms(1_000) == 500
        assert outage.until_probe_ms(1_499) == 1
        assert not outage.take_probe(1_499)
        assert outage.take_probe(1_500)
        assert outage.probing
        assert outage.probes == 1

    def test_one_probe_at_a_time_the_next_an_interval_after_it_ends(self) -> None:
        """A slow probe is never joined by another; the interval runs from its end."""
        outage = Outage(after=1, probe_ms=500)
        outage.failed(T, 0)
        assert outage.take_probe(500)
        assert outage.until_probe_ms(9_000) is None, "a probe runs: its end sets the next"
        assert not outage.take_probe(9_000)
        outage.probe_done(9_000)
        assert not outage.probing
        assert outage.until_probe_ms(9_000) == 500
        assert not outage.take_probe(9_499)
        assert outage.take_probe(9_500)
        assert outage.probes == 2

    def test_an_overdue_slot_waits_zero(self) -> None:
        """Past the due time the wait is 0, never negative."""
        outage = Outage(after=1, probe_ms=100)
        outage.failed(T, 0)
        assert outage.until_probe_ms(10_000) == 0

    def test_no_slot_to_wait_for_outside_outage_mode(self) -> None:
        """Normal mode has no probes."""
        assert Outage(after=1, probe_ms=100).until_probe_ms(0) is None

    def test_probe_done_without_a_probe_changes_nothing(self) -> None:
        """Only a running probe moves the next slot."""
        outage = Outage(after=1, probe_ms=500)
        outage.failed(T, 0)
        outage.probe_done(400)
        assert outage.until_probe_ms(400) == 100

    def test_a_success_while_a_probe_runs_frees_the_slot_for_the_next_outage(self) -> None:
        """A call that was running succeeds while the probe still runs: the mode ends cleanly."""
        outage = Outage(after=1, probe_ms=100)
        outage.failed(T, 0)
        assert outage.take_probe(100)
        outage.succeeded(150)
        assert not outage.probing
        outage.probe_done(160)  # the probe's own end comes later: nothing to do
        outage.failed(T, 1_000)
        assert outage.until_probe_ms(1_000) == 100


# One step of a queue's life: a failed or successful handler call.
calls = st.lists(st.sampled_from(["T", "P", "S"]), max_size=60)


@given(after=st.integers(1, 6), steps=calls)
def test_in_outage_mode_exactly_when_enough_transient_failures_since_the_last_success(
    after: int, steps: list[str]
) -> None:
    """The mode is on iff the transient failures since the last success reach ``after``;
    it starts once, where the count reaches it, and ends at the next success."""
    outage = Outage(after=after, probe_ms=100)
    since_success = 0
    for now, step in enumerate(steps):
        was_active = outage.active
        if step == "S":
            left = outage.succeeded(now)
            assert (left is not None) == was_active
            since_success = 0
        else:
            entered = outage.failed(T if step == "T" else P, now)
            since_success += step == "T"
            assert (entered is not None) == (step == "T" and since_success == after)
        assert outage.active == (since_success >= after)
        assert outage.streak == since_success


@given(
    probe_ms=st.integers(MIN_PROBE_MS, 2_000),
    steps=st.lists(
        st.tuples(st.sampled_from(["take", "done"]), st.integers(0, 3_000)), max_size=80
    ),
)
def test_probes_never_overlap_and_come_an_interval_apart(
    probe_ms: int, steps: list[tuple[str, int]]
) -> None:
    """At most one probe runs; each starts an interval after the previous one ended (or the
    switch), and a free, due slot is always granted."""
    outage = Outage(after=1, probe_ms=probe_ms)
    now = 0
    outage.failed(T, now)
    free_from = now + probe_ms
    running = False
    for action, elapsed in steps:
        now += elapsed
        if action == "take":
            granted = outage.take_probe(now)
            assert granted == (not running and now >= free_from)
            running = running or granted
        else:
            outage.probe_done(now)
            if running:
                free_from = now + probe_ms
            running = False
        assert outage.probing == running


class TestOptions:
    def test_off_by_default(self) -> None:
        """No outage_after: outage mode is off, and the middleware's defaults say so."""
        assert OutageOptions.build(None, None, timedelta(minutes=5)) is None
        defaults = RetryMiddleware.__init__.__kwdefaults__ or {}
        assert defaults["outage_after"] is None
        assert defaults["outage_probe"] is None
        assert defaults["outage_hold"] == timedelta(minutes=5)
        assert timedelta(minutes=5) == option_defaults.OUTAGE_HOLD

    def test_options_in_the_plugins_units(self) -> None:
        """Durations become ms; no probe interval means the tick (decided at start)."""
        assert OutageOptions.build(20, None, 300) == OutageOptions(20, None, 300_000)
        assert OutageOptions.build(1, timedelta(milliseconds=100), 0.1) == OutageOptions(
            1, 100, 100
        )

    @pytest.mark.parametrize("after", [0, -1])
    def test_a_threshold_below_one_names_the_fix(self, after: int) -> None:
        """0 would hold every message from the start; None is how to switch it off."""
        with pytest.raises(RetryConfigError) as raised:
            OutageOptions.build(after, None, 300)
        assert str(raised.value) == (
            "outage_after must be >= 1 (20 is a good start), or None to switch outage "
            f"mode off; got {after}"
        )

    @pytest.mark.parametrize("after", [True, 20.0, "20"])
    def test_a_threshold_that_is_not_an_int_is_refused(self, after: Any) -> None:
        """A bool, a float or a string is a mistake, named with what to pass instead."""
        with pytest.raises(RetryConfigError) as raised:
            OutageOptions.build(after, None, 300)
        assert str(raised.value) == (
            "outage_after takes an int (consecutive transient failures, 20 say) or None "
            f"(outage mode off), got {after!r}"
        )

    def test_the_probe_interval_has_the_ticks_floor(self) -> None:
        """100 ms is the shortest probe interval: outage mode is never a hot loop."""
        assert OutageOptions.build(5, 0.1, 300) == OutageOptions(5, 100, 300_000)
        with pytest.raises(RetryConfigError) as raised:
            OutageOptions.build(5, 0.099, 300)
        assert str(raised.value) == (
            "outage_probe must be at least 100 ms (or None: one probe per tick), got 99 ms"
        )

    def test_a_probe_interval_without_a_threshold_is_a_mistake(self) -> None:
        """outage_probe alone switches nothing on: say how to switch it on."""
        with pytest.raises(RetryConfigError) as raised:
            OutageOptions.build(None, 1, 300)
        assert str(raised.value) == (
            "outage_probe is set but outage_after is None, so outage mode is off: "
            "pass outage_after (20, say) to switch it on, or drop outage_probe"
        )

    def test_the_hold_must_be_longer_than_zero(self) -> None:
        """A zero hold would requeue every message it holds at once: a hot loop."""
        assert OutageOptions.build(5, None, 0.001) == OutageOptions(5, None, 1)
        with pytest.raises(RetryConfigError) as raised:
            OutageOptions.build(5, None, 0)
        assert str(raised.value) == (
            "outage_hold must be longer than 0: a held message is requeued after it "
            "(keep it below RabbitMQ's consumer_timeout, 30 min by default)"
        )

    def test_the_probe_interval_must_fit_in_the_hold(self) -> None:
        """A probe interval longer than the hold requeues every held message before each probe."""
        assert OutageOptions.build(5, 2, 2) == OutageOptions(5, 2_000, 2_000)
        with pytest.raises(RetryConfigError) as raised:
            OutageOptions.build(5, 2.001, 2)
        assert str(raised.value) == (
            "outage_probe (2001 ms) must not exceed outage_hold (2000 ms): every held "
            "message would be requeued before each probe. Shorten outage_probe or "
            "lengthen outage_hold"
        )

    @pytest.mark.parametrize(
        ("name", "changes"),
        [("outage_probe", {"outage_probe": "1s"}), ("outage_hold", {"outage_hold": "5m"})],
    )
    def test_durations_name_themselves(self, name: str, changes: dict[str, Any]) -> None:
        """A duration that is not one is refused with the option's name, through the middleware."""
        with pytest.raises(RetryConfigError) as raised:
            RetryMiddleware(outage_after=5, **changes)
        assert str(raised.value).startswith(f"{name} takes a timedelta or seconds, got ")

    def test_the_middleware_carries_the_options(self) -> None:
        """RetryMiddleware(outage_after=...) reaches the plugin's configuration checked."""
        retry = RetryMiddleware(outage_after=20, outage_probe=0.5, outage_hold=60)
        assert retry._plugin.config.outage == OutageOptions(20, 500, 60_000)
        with pytest.raises(RetryConfigError, match="outage_after must be >= 1"):
            RetryMiddleware(outage_after=0)
