"""What the operator is told: RabbitMQ's 406 and 403 replies read, the fixes, work-queue advice."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
from faststream.rabbit import QueueType, RabbitQueue

from faststream_retry import RetryPolicy, RetryTopologyError
from faststream_retry.core.advice import (
    Advice,
    Mismatch,
    Refusal,
    migrate_command,
    mismatch_advice,
    mismatch_text,
    parse_mismatch,
    parse_refusal,
    refusal_advice,
    refused,
    series_advice,
    work_queue_findings,
)
from faststream_retry.core.policy import HandlerPolicy
from faststream_retry.core.topology import Handler, Route, TopologyOptions


@pytest.mark.parametrize(
    ("reply", "argument", "wanted", "current"),
    [
        (
            (
                "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q.retry' in "
                "vhost '/': received 'quorum' but current is 'classic'"
            ),
            "x-queue-type",
            "quorum",
            "classic",
        ),
        (
            (
                "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'retry.delay.100'"
                " in vhost '/': received the value '100' of type 'byte' but current is none"
            ),
            "x-message-ttl",
            "100",
            "none",
        ),
        (
            (
                "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'retry.delay.100' in "
                "vhost '/': received 'fanout' but current is 'direct'"
            ),
            "type",
            "fanout",
            "direct",
        ),
    ],
)
def test_406_replies_name_the_argument(
    reply: str, argument: str, wanted: str, current: str
) -> None:
    """The texts are the ones RabbitMQ 3.10.8 sent in this repository's tests."""
    mismatch = parse_mismatch(reply, "queue", "fallback")
    assert (mismatch.argument, mismatch.wanted, mismatch.current) == (argument, wanted, current)


def test_a_406_reply_names_the_object_it_is_about() -> None:
    """The kind and name come from the text, not from what the plugin was declaring."""
    reply = (
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'p.delay.100' in "
        "vhost '/': received 'fanout' but current is 'direct'"
    )
    assert parse_mismatch(reply, "queue", "fallback") == Mismatch(
        "exchange", "p.delay.100", "type", "fanout", "direct"
    )


def test_an_unknown_406_text_is_kept_whole() -> None:
    """A future wording still reaches the user, with the object's name."""
    mismatch = parse_mismatch("PRECONDITION_FAILED - something new", "queue", "q.dlq")
    assert (mismatch.name, mismatch.current) == ("q.dlq", "PRECONDITION_FAILED - something new")
    assert mismatch == Mismatch("queue", "q.dlq", "?", "?", "PRECONDITION_FAILED - something new")


def route(arguments: dict[str, Any], max_attempts: int = 5) -> Route:
    return Route("orders", (Handler(HandlerPolicy({"max_attempts": max_attempts})),), arguments)


def texts(findings: list[tuple[int, str]], level: int) -> list[str]:
    return [text for lvl, text in findings if lvl == level]


def test_quorum_work_queue_without_a_limit_is_warned_about_on_3x() -> None:
    """On 3.x nothing bounds a message that crashes its consumer every time."""
    args = RabbitQueue("orders", queue_type=QueueType.QUORUM).arguments
    findings = work_queue_findings([route(dict(args))], RetryPolicy(), (3, 10))
    (warning,) = texts(findings, logging.WARNING)
    assert "no x-delivery-limit" in warning
    assert "orders.dlq" in warning
    assert work_queue_findings([route(dict(args))], RetryPolicy(), (4, 0)) == []


def test_a_limit_without_dead_letter_exchange_drops_messages() -> None:
    """RabbitMQ drops a message at the limit when no DLX is set."""
    args = {"x-queue-type": "quorum", "x-delivery-limit": 10}
    (warning,) = texts(work_queue_findings([route(args)], RetryPolicy(), (3, 10)), logging.WARNING)
    assert "drops a message at the limit" in warning


def test_a_limit_below_max_attempts_is_explained_not_refused() -> None:
    """Retries are new copies: the limit bounds crash redeliveries only."""
    args = {"x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": ""}
    findings = work_queue_findings([route(args, max_attempts=5)], RetryPolicy(), (3, 10))
    assert texts(findings, logging.WARNING) == []
    (info,) = texts(findings, logging.INFO)
    assert "x-delivery-limit=2 is below max_attempts=5" in info


def test_classic_work_queues_need_no_advice() -> None:
    assert work_queue_findings([route({"x-queue-type": "classic"})], RetryPolicy(), (3, 10)) == []


HEAD = (
    "faststream-retry cannot use queues that exist with other arguments "
    "(RabbitMQ would refuse with 406 PRECONDITION_FAILED):"
)
COMMAND = (
    "faststream-retry migrate <queue> --queue-type quorum --prefix retry (the cli extra) "
    "moves its messages to a temporary queue and back, with confirms, declaring it as the "
    "plugin does"
)
QUEUE_MIGRATION = f"it may hold messages: stop the services that consume it, then {COMMAND}"
TIER_MIGRATION = (
    "a tier holds a message for one tier period only: stop the services that use prefix "
    "'retry', wait until the tier is empty, delete it (rabbitmqctl delete_queue) and "
    "start again; or choose a new prefix=, whose tiers are new queues, and let the old "
    "tiers drain into their .retry queues; or, with the services stopped, "
    f"{COMMAND} (its messages wait their tier period again)"
)


def test_a_queue_of_the_old_classic_default_names_both_fixes() -> None:
    """It matches what queue_type="classic" declares: keep classic, or migrate."""
    found = Mismatch("queue", "orders.dlq", "x-queue-type", "quorum", "none", fits="classic")
    assert mismatch_text([found], "retry").splitlines() == [
        HEAD,
        (
            "- queue 'orders.dlq': argument 'x-queue-type' is unset on the broker, the plugin "
            "declares 'quorum'"
        ),
        (
            'It is what queue_type="classic" declares (the plugin\'s default before "quorum"; it '
            'dead-letters at most once). To keep it: pass RetryMiddleware(queue_type="classic"), '
            "for every queue the plugin declares."
        ),
        "To migrate instead, for each queue:",
        f"- 'orders.dlq': {QUEUE_MIGRATION}",
    ]


def test_quorum_queues_where_classic_is_asked_for_say_quorum_is_the_default() -> None:
    """The tryout's case: tiers, a .retry and a .dlq; one line per difference, not per queue."""
    tiers = [
        Mismatch(
            "queue",
            f"retry.delay.{100 * 2**k}",
            "x-dead-letter-strategy",
            "none",
            "at-least-once",
            fits="quorum",
        )
        for k in range(3)
    ]
    others = [
        Mismatch("queue", "q.retry", "x-dead-letter-exchange", "none", "", fits="quorum"),
        Mismatch("queue", "q.dlq", "x-queue-type", "classic", "quorum", fits="quorum"),
    ]
    assert mismatch_text(tiers + others, "retry").splitlines() == [
        HEAD,
        (
            "- queues 'retry.delay.100', 'retry.delay.200', 'retry.delay.400': argument "
            "'x-dead-letter-strategy' is 'at-least-once' on the broker, the plugin declares unset"
        ),
        (
            "- queue 'q.retry': argument 'x-dead-letter-exchange' is '' on the broker, the plugin "
            "declares unset"
        ),
        (
            "- queue 'q.dlq': argument 'x-queue-type' is 'quorum' on the broker, the plugin "
            "declares 'classic'"
        ),
        (
            'All of them are what the default queue_type="quorum" declares. To keep them: drop '
            'queue_type="classic" (or pass queue_type="quorum"), for every queue the plugin '
            "declares."
        ),
        "To migrate instead, for each queue:",
        f"- the tiers (retry.delay.*): {TIER_MIGRATION}",
        f"- 'q.retry', 'q.dlq': {QUEUE_MIGRATION}",
    ]


def test_some_queues_fitting_the_other_type_are_named() -> None:
    """Not all of them fit: those that do are named, one or several."""
    one = Mismatch("queue", "a.dlq", "x-queue-type", "quorum", "classic", fits="classic")
    two = Mismatch("queue", "b.dlq", "x-queue-type", "quorum", "classic", fits="classic")
    other = Mismatch("queue", "c.dlq", "x-max-length", "none", "5")
    lines = mismatch_text([one, other], "p").splitlines()
    assert lines[3].startswith("'a.dlq' is what queue_type=\"classic\" declares")
    assert "To keep it: pass" in lines[3]
    lines = mismatch_text([one, two, other], "p").splitlines()
    assert lines[1] == (
        "- queues 'a.dlq', 'b.dlq': argument 'x-queue-type' is 'classic' on the broker, "
        "the plugin declares 'quorum'"
    )
    assert lines[3].startswith("'a.dlq', 'b.dlq' are what queue_type=\"classic\" declares")
    assert "To keep them: pass" in lines[3]
    assert lines[4] == "To migrate instead, for each queue:"


def test_a_queue_no_queue_type_declares_gets_the_migration_only() -> None:
    tier = Mismatch("queue", "p.delay.100", "x-max-length", "5", "none")
    assert mismatch_text([tier], "p").splitlines()[2:] == [
        "To migrate, for each queue:",
        "- the tiers (p.delay.*): "
        + TIER_MIGRATION.replace("'retry'", "'p'").replace("--prefix retry", "--prefix p"),
    ]
    dlq = Mismatch("queue", "p.dlq", "x-max-length", "5", "none")
    assert mismatch_text([dlq], "p").endswith(
        "To migrate, for each queue:\n- 'p.dlq': "
        + QUEUE_MIGRATION.replace("--prefix retry", "--prefix p")
    )
    # A queue of another prefix's shape is not one of this plugin's tiers.
    assert "- 'q.delay.100': " in mismatch_text([replace(tier, name="q.delay.100")], "p")


def test_a_403_reply_names_the_permission_and_the_object() -> None:
    """A text that names the permission and the object wins over the guess.

    RabbitMQ 3.10.8 names the object only ("access to exchange 'x' in vhost '/' refused
    for user 'u'"); a wording with the permission in front is read too.
    """
    reply = (
        "ACCESS_REFUSED - configure access to exchange 'retry.delay.200' in vhost '/' "
        "refused for user 'app'"
    )
    refusal = parse_refusal(reply, "queue", "guess", "write permission", "declare")
    assert refusal == Refusal(
        "exchange", "retry.delay.200", "configure permission", "declare", reply
    )
    # A refused read names no permission: the object is read, the guess stands.
    read = "ACCESS_REFUSED - access to queue 'q.retry' in vhost '/' refused for user 'app'"
    unnamed = parse_refusal(read, "queue", "a .retry", "read permission", "consume")
    assert unnamed == Refusal("queue", "q.retry", "read permission", "consume", read)
    unknown = parse_refusal("ACCESS_REFUSED - new words", "queue", "q", "read x", "consume")
    assert unknown == Refusal("queue", "q", "read x", "consume", "ACCESS_REFUSED - new words")


def test_refusals_are_one_error_naming_each_object() -> None:
    error = refused(
        [
            Refusal("exchange", "retry.delay.200", "configure permission", "declare", "r1"),
            Refusal("queue", "q.retry", "read permission", "consume", "r2"),
        ]
    )
    assert isinstance(error, RetryTopologyError)
    assert str(error) == (
        "faststream-retry's RabbitMQ user lacks permissions it needs (403 ACCESS_REFUSED):\n"
        "- exchange 'retry.delay.200': to declare it, the user needs configure permission. "
        "RabbitMQ said: r1\n"
        "- queue 'q.retry': to consume it, the user needs read permission. RabbitMQ said: r2\n"
        "Grant them with rabbitmqctl set_permissions; "
        "https://faststream-retry.readthedocs.io/en/latest/reference/topology/#permissions "
        "lists the configure, write and read patterns the plugin needs"
    )


def test_the_work_queue_advice_in_full() -> None:
    """Each warning names the queue, the fix and, for a missing limit, the policy to paste."""
    two = (Handler(HandlerPolicy({"max_attempts": 5})), Handler(HandlerPolicy({"max_attempts": 3})))
    unlimited = Route("orders", two, {"x-queue-type": "quorum"})
    assert work_queue_findings([unlimited], RetryPolicy(), (3, 13)) == [
        (
            logging.WARNING,
            (
                "quorum queue 'orders' has no x-delivery-limit: a message that crashes the consumer "
                "process is redelivered for ever. Set x-delivery-limit (max_attempts=5 is a fair "
                "value) and x-dead-letter-routing-key 'orders.dlq' with x-dead-letter-exchange '' "
                "(on a queue that exists, by a policy, which needs no redeclaring: rabbitmqctl "
                'set_policy <name> \'^orders$\' \'{"delivery-limit": 5, "dead-letter-exchange": '
                '"", "dead-letter-routing-key": "orders.dlq"}\' --apply-to queues; a policy is not '
                "visible to this check)"
            ),
        )
    ]
    assert work_queue_findings([unlimited], RetryPolicy(), None) == []
    limited = route({"x-queue-type": "quorum", "x-delivery-limit": 4})
    assert work_queue_findings([limited], RetryPolicy(), (3, 13)) == [
        (
            logging.WARNING,
            (
                "quorum queue 'orders' has x-delivery-limit=4 and no x-dead-letter-exchange in its "
                "arguments: unless a policy sets one, RabbitMQ drops a message at the limit. Set "
                "x-dead-letter-exchange '' and x-dead-letter-routing-key 'orders.dlq'"
            ),
        ),
        (
            logging.INFO,
            (
                "quorum queue 'orders': x-delivery-limit=4 is below max_attempts=5. Retries do not "
                "spend it (each one is a new copy); it bounds redeliveries after crashes only"
            ),
        ),
    ]


def test_each_work_queue_gets_its_own_advice() -> None:
    """A queue that needs none, or gets only one of them, does not end the look."""
    classic = Route("a", (Handler(None),), {"x-queue-type": "classic"})
    unlimited = Route("b", (Handler(None),), {"x-queue-type": "quorum"})
    no_dlx = Route("c", (Handler(None),), {"x-queue-type": "quorum", "x-delivery-limit": 9})
    found = work_queue_findings([classic, unlimited, no_dlx], RetryPolicy(), (3, 13))
    assert [text.split(" ", 3)[2] for _, text in found] == ["'b'", "'c'"]


def test_a_limit_at_max_attempts_or_not_a_number_needs_no_explaining() -> None:
    for limit in (5, "5"):
        args = {"x-queue-type": "quorum", "x-delivery-limit": limit, "x-dead-letter-exchange": ""}
        assert work_queue_findings([route(args, max_attempts=5)], RetryPolicy(), (3, 13)) == []


def test_an_exchange_named_like_a_tier_is_not_migrated_as_one() -> None:
    """Only queues wait their tier period: an exchange of a tier's name is listed by name."""
    exchange = Mismatch("exchange", "p.delay.100", "type", "fanout", "direct")
    assert mismatch_text([exchange], "p").splitlines()[-1].startswith("- 'p.delay.100': ")


def test_a_classic_plugin_names_classic_in_its_commands() -> None:
    dlq = Mismatch("queue", "p.dlq", "x-max-length", "5", "none")
    assert "--queue-type classic --prefix p (the cli" in mismatch_text([dlq], "p", "classic")


def test_migrate_commands_name_the_delivery_limit_of_a_quorum_retry_queue_only() -> None:
    """It is the only argument besides the type that migrate cannot know."""
    options = TopologyOptions("p", 60_000, delivery_limit=5)
    assert migrate_command("o.retry", options, retry_queue=True) == (
        "faststream-retry migrate o.retry --queue-type quorum --prefix p --delivery-limit 5"
    )
    assert migrate_command("o.dlq", options, retry_queue=False) == (
        "faststream-retry migrate o.dlq --queue-type quorum --prefix p"
    )
    classic = TopologyOptions("p", 60_000, "classic", delivery_limit=5)
    assert migrate_command("o.retry", classic, retry_queue=True) == (
        "faststream-retry migrate o.retry --queue-type classic --prefix p"
    )
    default = TopologyOptions("p", 60_000, delivery_limit=20)
    assert migrate_command("o.retry", default, retry_queue=True).endswith("--prefix p")


def test_doctors_words_for_a_mismatch() -> None:
    """What differs, why the app will not start, and the fix to paste (or to keep it)."""
    options = TopologyOptions("p", 60_000, delivery_limit=7)
    retry = Mismatch("queue", "o.retry", "x-queue-type", "quorum", "none", fits="classic")
    why = "the app refuses to start: RabbitMQ answers its declaration with 406 PRECONDITION_FAILED"
    assert mismatch_advice(retry, options) == Advice(
        "queue 'o.retry': argument 'x-queue-type' is unset on the broker, the app declares "
        "'quorum'",
        why + "; the queue is what queue_type='classic' declares",
        "stop every service that consumes it, then run: faststream-retry migrate o.retry "
        "--queue-type quorum --prefix p --delivery-limit 7 (or keep it: pass "
        'RetryMiddleware(queue_type="classic"))',
    )
    dlq = Mismatch("queue", "o.dlq", "x-max-length", "none", "5")
    assert mismatch_advice(dlq, options).why == why
    assert mismatch_advice(dlq, options).fix == (
        "stop every service that consumes it, then run: faststream-retry migrate o.dlq "
        "--queue-type quorum --prefix p"
    )
    exchange = Mismatch("exchange", "p.delay.100", "type", "fanout", "direct")
    assert mismatch_advice(exchange, options).fix == (
        "an exchange holds no messages: stop the services that use prefix 'p', delete it "
        "(rabbitmqadmin delete exchange name=p.delay.100, or the management UI: rabbitmqctl "
        "cannot delete exchanges) and start the app, which declares it again"
    )


def test_doctors_words_for_a_refusal() -> None:
    refusal = Refusal("queue", "o.dlq", "configure permission", "declare", "ACCESS_REFUSED - x")
    assert refusal_advice(refusal) == Advice(
        "queue 'o.dlq': the user may not declare it",
        "the app refuses to start (403 ACCESS_REFUSED). RabbitMQ said: ACCESS_REFUSED - x",
        "grant configure permission (rabbitmqctl set_permissions; "
        "https://faststream-retry.readthedocs.io/en/latest/reference/topology/#permissions "
        "lists the patterns the plugin needs)",
    )


class TestSeriesAdvice:
    """Work queues declared as RabbitMQ 4.x deprecates or refuses them (measured on 4.3.6)."""

    def test_a_transient_queue_that_is_not_exclusive_is_named_with_the_fix(self) -> None:
        (found,) = series_advice([Route("orders", (Handler(None),), transient=True)], (4, 3))
        queue, advice = found
        assert queue == "orders"
        assert advice == Advice(
            "queue 'orders' is declared transient (durable=False) and not exclusive",
            "a broker restart deletes it with every message in it, and the retry copies on "
            "their way back to it find no queue; RabbitMQ 4.x deprecates such queues and "
            "refuses them where deprecated_features.permit.transient_nonexcl_queues = false",
            "declare it RabbitQueue('orders', durable=True) (a new name, or delete the queue "
            "first: RabbitMQ refuses to redeclare it durable)",
        )

    @pytest.mark.parametrize("value", [1, "1"])
    def test_classic_queue_version_1_is_refused_from_4_3(self, value: object) -> None:
        routes = [route({"x-queue-version": value})]
        ((queue, here),) = series_advice(routes, (4, 3))
        assert queue == "orders"
        assert here.what == "queue 'orders' is declared with x-queue-version=1"
        assert here.why == (
            "RabbitMQ 4.3 removed classic queue version 1 and refuses the declaration "
            "(406 PRECONDITION_FAILED)"
        )
        assert here.fix == (
            "declare it without x-queue-version (version 2 is the only one from 4.3 on)"
        )
        for before in [(4, 0), (3, 10), None]:
            ((_, coming),) = series_advice(routes, before)
            assert coming.why == here.why + ": this app will not start after an upgrade"

    def test_a_durable_queue_of_version_2_is_fine(self) -> None:
        routes = [route({"x-queue-version": 2}), route({}), route({"x-queue-mode": "lazy"})]
        assert series_advice(routes, (4, 3)) == []
