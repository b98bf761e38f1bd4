"""What the retry worker decides for a delivery from its intake (the pure step)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from faststream_retry.core import headers as h
from faststream_retry.core.events import Reason, Rule, Verdict
from faststream_retry.core.intake import (
    DELAY,
    PERMANENT,
    DeadLetter,
    Death,
    OnDeath,
    QueueRules,
    Refuse,
    Retry,
    intake_step,
    newest_death,
    without_consumer_word,
)
from faststream_retry.core.policy import Exponential, Fixed, Schedule
from faststream_retry.core.tiers import Tiers
from tests.strategies import hostile_headers

TIERS = Tiers.build(500, 60_000)
INTAKE = "retry.intake"
ORDERS = QueueRules(3, Schedule([1, 3]))


def rules(queue: str) -> QueueRules | None:
    return {"orders": ORDERS, "keep": QueueRules(3, Fixed(1), OnDeath.RETRY, OnDeath.RETRY)}.get(
        queue
    )


def died(
    queue: str = "orders", reason: str = "rejected", extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Headers of a message RabbitMQ dead-lettered from ``queue`` (newest entry first)."""
    return {
        "x-death": [
            {"queue": queue, "reason": reason, "count": 1, "exchange": "orders-x"},
            {"queue": "retry.delay.1000", "reason": "expired", "count": 1},
        ],
        **(extra or {}),
    }


def step(headers: Any, exchange: str = INTAKE) -> Retry | DeadLetter | Refuse:
    return intake_step(
        exchange=exchange,
        intake_exchange=INTAKE,
        headers=headers,
        rules=rules,
        tiers=TIERS,
        now_ms=10_000,
        rand=lambda: 0.5,
    )


def failure(result: Retry | DeadLetter) -> tuple[int, int, str, str, int]:
    """The failure record a decision carries: attempt, time, exception, error, delay."""
    f = result.failure
    return (f.attempt, f.at_ms, f.exception, f.error, f.delay_ms)


class TestOrigin:
    def test_the_newest_death_names_the_queue_and_the_reason(self) -> None:
        assert newest_death(died()) == Death("orders", "rejected")
        assert newest_death({"x-death": [{"queue": b"q", "reason": b"expired"}]}) == Death(
            "q", "expired"
        )

    def test_unreadable_deaths_name_nothing(self) -> None:
        cases: tuple[dict[str, Any] | None, ...] = (
            None,
            {},
            {"x-death": []},
            {"x-death": "orders"},
            {"x-death": ["orders"]},
            {"x-death": [{"queue": "", "reason": "rejected"}]},
            {"x-death": [{"queue": 5, "reason": "rejected"}]},
            {"x-death": [{"queue": "orders"}]},
        )
        for headers in cases:
            assert newest_death(headers) is None, headers

    def test_bytes_that_are_not_utf8_are_replaced_not_fatal(self) -> None:
        headers = {"x-death": [{"queue": b"q\xff", "reason": b"rejected\xfe"}]}
        assert newest_death(headers) == Death("q\ufffd", "rejected\ufffd")

    def test_x_first_death_queue_is_never_read(self) -> None:
        """RabbitMQ keeps an x-first-death-queue a publisher set: it cannot name the origin."""
        result = step({"x-first-death-queue": "orders", "x-first-death-reason": "rejected"})
        assert result == Refuse("no readable x-death: RabbitMQ did not dead-letter it")

    def test_a_delivery_not_through_the_intake_exchange_is_refused(self) -> None:
        """A publish straight to the intake queue by the default exchange is not a dead letter."""
        result = step(died(), exchange="")
        assert result == Refuse(
            "published to the intake queue through the default exchange, "
            "not dead-lettered through 'retry.intake'",
            None,  # its x-death names orders, but a publisher wrote it
        )
        assert step(died(), exchange="other") == Refuse(
            "published to the intake queue through 'other', not dead-lettered through "
            "'retry.intake'",
        )

    def test_a_direct_publish_without_x_death_is_refused_without_a_queue(self) -> None:
        result = step({}, exchange="")
        assert isinstance(result, Refuse)
        assert result.queue is None
        assert result.problem.startswith("published to the intake queue through")

    def test_a_queue_outside_the_allowlist_is_refused(self) -> None:
        result = step(died(queue="billing"))
        assert result == Refuse(
            "dead-lettered from 'billing', which the worker's config does not name", "billing"
        )

    @given(hostile_headers, st.booleans())
    def test_any_headers_give_a_decision_and_never_raise(
        self, headers: dict[str, Any], dead_lettered: bool
    ) -> None:
        result = step({**died(), **headers} if dead_lettered else headers)
        assert isinstance(result, (Retry, DeadLetter, Refuse))
        if not isinstance(result, Refuse):
            assert result.queue in {"orders", "keep"}  # only ever a queue the allowlist names


class TestRetry:
    def test_a_rejection_is_retried_with_the_backoff_of_its_attempt(self) -> None:
        first = step(died())
        assert isinstance(first, Retry)
        assert (first.queue, first.attempt, first.max_attempts, first.delay_ms) == (
            "orders",
            1,
            3,
            1000,
        )
        assert failure(first) == (
            1,
            10_000,
            "rejected",
            "rejected (requeue=false) by a consumer of orders",
            1000,
        )
        second = step(died(extra={h.ATTEMPT: 1}))
        assert isinstance(second, Retry)
        assert (second.attempt, second.delay_ms) == (2, 3000)
        assert failure(second)[0] == 2

    def test_the_attempt_is_the_plugins_header_never_the_x_death_count(self) -> None:
        headers = died(extra={h.ATTEMPT: 1})
        headers["x-death"][0]["count"] = 50
        result = step(headers)
        assert isinstance(result, Retry)
        assert result.attempt == 2

    def test_delays_are_rounded_up_to_the_tick(self) -> None:
        def odd(queue: str) -> QueueRules | None:
            return QueueRules(3, Fixed(0.7)) if queue == "orders" else None

        result = intake_step(
            exchange=INTAKE,
            intake_exchange=INTAKE,
            headers=died(),
            rules=odd,
            tiers=TIERS,
            now_ms=0,
            rand=lambda: 0.5,
        )
        assert isinstance(result, Retry)
        assert result.delay_ms == 1000

    def test_jitter_draws_from_rand(self) -> None:
        def jittered(queue: str) -> QueueRules | None:
            return QueueRules(3, Exponential(1, jitter=0.5)) if queue == "orders" else None

        def delay(draw: float) -> int:
            result = intake_step(
                exchange=INTAKE,
                intake_exchange=INTAKE,
                headers=died(),
                rules=jittered,
                tiers=TIERS,
                now_ms=0,
                rand=lambda: draw,
            )
            assert isinstance(result, Retry)
            return result.delay_ms

        assert (delay(0.0), delay(1.0)) == (500, 1500)  # 1 s, jittered by half either way

    def test_a_reason_with_braces_is_named_as_written(self) -> None:
        """Only RabbitMQ writes it, but it is read as data, never as a format template."""
        result = step(died(reason="odd{0}}"))
        assert isinstance(result, Retry)
        assert result.failure.error == "dead-lettered from orders (reason odd{0}})"

    def test_an_unknown_reason_is_retried_and_named(self) -> None:
        result = step(died(reason="something_new"))
        assert isinstance(result, Retry)
        assert failure(result)[2:4] == (
            "something_new",
            "dead-lettered from orders (reason something_new)",
        )


class TestDeadLetter:
    def test_the_last_attempt_is_exhausted(self) -> None:
        result = step(died(extra={h.ATTEMPT: 2}))
        assert isinstance(result, DeadLetter)
        assert (result.queue, result.attempt, result.max_attempts, result.reason) == (
            "orders",
            3,
            3,
            Reason.EXHAUSTED,
        )
        assert failure(result) == (
            3,
            10_000,
            "rejected",
            "rejected (requeue=false) by a consumer of orders",
            0,  # no delay: it is not retried
        )

    def test_a_delivery_limit_is_poison_at_once(self) -> None:
        """A consumer crash loop: a delay will not end it, so no retry is spent."""
        result = step(died(reason="delivery_limit"))
        assert isinstance(result, DeadLetter)
        assert (result.queue, result.attempt, result.max_attempts, result.reason) == (
            "orders",
            1,
            3,
            Reason.POISON,
        )
        assert failure(result) == (
            1,
            10_000,
            "delivery_limit",
            "reached the delivery limit of orders: its consumer crashed or requeued it every time",
            0,
        )

    def test_expired_and_maxlen_are_dead_letters_by_default(self) -> None:
        expired = step(died(reason="expired"))
        maxlen = step(died(reason="maxlen"))
        assert isinstance(expired, DeadLetter)
        assert isinstance(maxlen, DeadLetter)
        assert expired.reason is Reason.EXPIRED
        assert maxlen.reason is Reason.MAXLEN
        assert expired.failure.error == "expired in orders (a message or queue TTL)"
        assert maxlen.failure.error == "dropped from orders at its length limit"

    def test_expired_and_maxlen_can_be_retried(self) -> None:
        for reason in ("expired", "maxlen"):
            result = step(died(queue="keep", reason=reason))
            assert isinstance(result, Retry), reason
            exhausted = step(died(queue="keep", reason=reason, extra={h.ATTEMPT: 2}))
            assert isinstance(exhausted, DeadLetter)
            assert exhausted.reason is Reason.EXHAUSTED

    def test_the_permanent_header_dead_letters_at_once_with_its_text(self) -> None:
        result = step(died(extra={PERMANENT: "customer 42 does not exist", h.ATTEMPT: 1}))
        assert isinstance(result, DeadLetter)
        assert (result.queue, result.attempt, result.max_attempts, result.reason) == (
            "orders",
            2,
            3,
            Reason.PERMANENT,
        )
        assert failure(result) == (2, 10_000, PERMANENT, "customer 42 does not exist", 0)
        assert isinstance(step(died(extra={PERMANENT: ""})), Retry)  # empty: not marked
        marked = step(died(extra={PERMANENT: True}))
        assert isinstance(marked, DeadLetter)
        assert marked.failure.error == "marked permanent (retry-permanent: true)"
        for unmarked in (False, 0, 1, None, [1]):
            assert isinstance(step(died(extra={PERMANENT: unmarked})), Retry), unmarked

    @given(st.integers(min_value=0, max_value=2**31))
    def test_every_attempt_count_ends_in_a_dead_letter_or_a_retry_below_max(
        self, attempt: int
    ) -> None:
        result = step(died(extra={h.ATTEMPT: attempt}))
        if isinstance(result, Retry):
            assert result.attempt < ORDERS.max_attempts
        else:
            assert isinstance(result, DeadLetter)
            assert result.reason is Reason.EXHAUSTED


class TestClassification:
    """One meaning, the middleware's: transient may pass (retried, then exhausted), permanent not."""

    def test_a_retry_and_an_exhausted_dead_letter_are_transient(self) -> None:
        retried = step(died())
        exhausted = step(died(extra={h.ATTEMPT: 2}))
        assert isinstance(retried, Retry)
        assert isinstance(exhausted, DeadLetter)
        assert retried.rule is Rule.DEAD_LETTERING
        assert (exhausted.classification, exhausted.rule) == (
            Verdict.TRANSIENT,
            Rule.DEAD_LETTERING,
        )

    def test_a_dead_letter_at_once_is_permanent(self) -> None:
        for reason in ("delivery_limit", "expired", "maxlen"):
            result = step(died(reason=reason))
            assert isinstance(result, DeadLetter)
            assert (result.classification, result.rule) == (
                Verdict.PERMANENT,
                Rule.DEAD_LETTERING,
            ), reason

    def test_the_consumer_s_word_is_the_explicit_rule(self) -> None:
        marked = step(died(extra={PERMANENT: "no"}))
        assert isinstance(marked, DeadLetter)
        assert (marked.classification, marked.rule) == (Verdict.PERMANENT, Rule.EXPLICIT)
        later = step(died(extra={DELAY: "2s"}))
        assert isinstance(later, Retry)
        assert later.rule is Rule.EXPLICIT


class TestConsumerWord:
    """What a consumer says on a marked copy it rejects: how it failed, when, or that it gives up."""

    def test_the_failure_it_describes_is_the_one_recorded(self) -> None:
        said = {h.EXCEPTION: "PaymentDeclined", h.ERROR: "card expired", h.TRACEBACK: "at pay"}
        retried = step(died(extra=said))
        assert isinstance(retried, Retry)
        assert failure(retried) == (1, 10_000, "PaymentDeclined", "card expired", 1000)
        exhausted = step(died(extra={**said, h.ATTEMPT: 2}))
        assert isinstance(exhausted, DeadLetter)
        assert failure(exhausted)[2:4] == ("PaymentDeclined", "card expired")
        assert exhausted.traceback == "at pay"
        assert retried.failure.exception == "PaymentDeclined"

    def test_a_description_is_cut_to_the_header_limits_and_only_text_counts(self) -> None:
        said = {h.EXCEPTION: "E" * 500, h.ERROR: "x" * 5000, h.TRACEBACK: "t" * 10_000}
        result = step(died(extra={**said, h.ATTEMPT: 2}))
        assert isinstance(result, DeadLetter)
        assert len(result.failure.exception.encode()) == h.EXCEPTION_LIMIT
        assert len(result.failure.error.encode()) == h.ERROR_LIMIT
        assert len(result.traceback.encode()) == h.TRACEBACK_LIMIT
        odd = step(died(extra={h.EXCEPTION: 5, h.ERROR: [1], h.TRACEBACK: {"a": 1}}))
        assert isinstance(odd, Retry)
        assert failure(odd)[2:4] == ("rejected", "rejected (requeue=false) by a consumer of orders")
        plain = step(died(extra={h.ATTEMPT: 2}))
        assert isinstance(plain, DeadLetter)
        assert plain.traceback == ""

    def test_giving_up_records_the_consumer_s_exception_and_error(self) -> None:
        said = {PERMANENT: True, h.EXCEPTION: "InvalidAddress", h.ERROR: "no @ in x"}
        result = step(died(extra={**said, h.ATTEMPT: 1}))
        assert isinstance(result, DeadLetter)
        assert result.reason is Reason.PERMANENT
        assert failure(result) == (2, 10_000, "InvalidAddress", "no @ in x", 0)
        texted = step(died(extra={PERMANENT: "gone", h.ERROR: "said"}))
        assert isinstance(texted, DeadLetter)
        assert texted.failure.error == "said"  # retry-error says it better than a flag

    def test_a_delay_it_asks_for_is_the_delay_rounded_to_the_tick(self) -> None:
        cases: list[tuple[object, int]] = [
            ("30s", 30_000),
            ("1m", 60_000),
            ("250ms", 500),
            (b"3s", 3000),
            (bytearray(b"4s"), 4000),
            (2.2, 2500),
            (7, 7000),
            (0, 500),
        ]
        for asked, delay in cases:
            result = step(died(extra={DELAY: asked}))
            assert isinstance(result, Retry), asked
            assert (result.delay_ms, result.failure.delay_ms) == (delay, delay), asked
            assert result.failure.error == "rejected (requeue=false) by a consumer of orders"

    def test_no_delay_asked_is_the_queue_s_backoff(self) -> None:
        for absent in ("", b"", None):
            result = step(died(extra={DELAY: absent}))
            assert isinstance(result, Retry)
            assert (result.delay_ms, result.rule) == (1000, Rule.DEAD_LETTERING), absent

    def test_a_delay_beyond_max_delay_is_cut_and_says_so(self) -> None:
        result = step(died(extra={DELAY: "2m"}))
        assert isinstance(result, Retry)
        assert result.delay_ms == 60_000
        assert result.failure.error == (
            "rejected (requeue=false) by a consumer of orders "
            "(retry-delay 2 min cut to max_delay 1 min)"
        )
        exact = step(died(extra={DELAY: "1m"}))
        assert isinstance(exact, Retry)
        assert "cut" not in exact.failure.error

    def test_an_unusable_delay_is_the_consumer_s_bug_dead_lettered_as_permanent(self) -> None:
        for asked in ("soon", -1, True, float("nan"), [1], "30"):
            result = step(died(extra={DELAY: asked, h.ERROR: "boom"}))
            assert isinstance(result, DeadLetter), asked
            assert (result.reason, result.classification, result.rule) == (
                Reason.PERMANENT,
                Verdict.PERMANENT,
                Rule.EXPLICIT,
            )
            assert result.failure.error.startswith("retry-delay "), asked
            assert result.failure.error.endswith(f"got {asked!r} (boom)"), result.failure.error
        garbled = step(died(extra={DELAY: b"\xff3s"}))  # not UTF-8: read, refused, kept
        assert isinstance(garbled, DeadLetter)
        assert "'\ufffd3s'" in garbled.failure.error
        long = step(died(extra={DELAY: "x" * 1000}))
        assert isinstance(long, DeadLetter)
        assert len(long.failure.error.encode()) <= h.HISTORY_ERROR_LIMIT + len(
            " (rejected (requeue=false) by a consumer of orders)"
        )

    def test_a_delay_counts_as_an_attempt(self) -> None:
        result = step(died(extra={DELAY: "5s", h.ATTEMPT: 2}))
        assert isinstance(result, DeadLetter)
        assert (result.reason, result.classification, result.rule) == (
            Reason.EXHAUSTED,
            Verdict.TRANSIENT,
            Rule.EXPLICIT,
        )

    def test_giving_up_and_a_death_at_once_win_over_a_delay(self) -> None:
        marked = step(died(extra={DELAY: "5s", PERMANENT: "no"}))
        assert isinstance(marked, DeadLetter)
        assert marked.reason is Reason.PERMANENT
        poison = step(died(reason="delivery_limit", extra={DELAY: "soon"}))
        assert isinstance(poison, DeadLetter)
        assert poison.reason is Reason.POISON

    def test_the_word_is_left_out_of_what_a_copy_starts_from(self) -> None:
        headers = {PERMANENT: "x", DELAY: "1s", h.ERROR: "e", "tenant": "t"}
        assert without_consumer_word(headers) == {h.ERROR: "e", "tenant": "t"}
        assert without_consumer_word(None) is None
        assert without_consumer_word({}) == {}
