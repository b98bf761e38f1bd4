"""The plan: routes, tick, tiers, and every queue with its arguments (pure, no broker)."""

from __future__ import annotations

import hashlib

import pytest

from faststream_retry import Exponential, Fixed, RetryPolicy, Schedule
from faststream_retry.core.policy import HandlerPolicy
from faststream_retry.core.topology import (
    MAX_NAME_BYTES,
    Handler,
    QueueType,
    Route,
    TopologyOptions,
    dlq_of,
    dlq_owner,
    intake_dlq_name,
    intake_name,
    is_dlq,
    is_own_queue,
    is_retry_or_dlq,
    is_retry_queue,
    lock_name,
    looks_like_intake,
    merge_routes,
    migrating_name,
    migrating_of,
    plan,
    registry_name,
    tier_name,
    tier_ttl,
    work_queue_of,
)

DEFAULT = RetryPolicy(backoff=Fixed(1))


def route(queue: str, *policies: HandlerPolicy | None) -> Route:
    return Route(queue, tuple(Handler(p) for p in policies) or (Handler(None),))


def options(
    queue_type: QueueType = "classic",
    *,
    max_delay_ms: int = 8000,
    delivery_limit: int = 20,
    tick_ms: int | None = None,
) -> TopologyOptions:
    return TopologyOptions("p", max_delay_ms, queue_type, delivery_limit, tick_ms)


class TestNames:
    def test_route_names(self) -> None:
        """`<queue>.retry` and `<queue>.dlq`, derived from the work queue."""
        r = route("svc.orders")
        assert (r.retry_queue, r.dlq) == ("svc.orders.retry", "svc.orders.dlq")

    def test_registry_name(self) -> None:
        """The registry of covered queues: `<prefix>.queues`, under the tiers' prefix."""
        assert registry_name("p") == "p.queues"

    def test_tier_names(self) -> None:
        """One exchange per tier, named like its queue: `<prefix>.delay.<ms>`."""
        p = plan([route("q")], DEFAULT, options())
        assert p.exchanges == ("p.delay.1000", "p.delay.2000", "p.delay.4000", "p.delay.8000")
        assert p.tier(2000) == "p.delay.2000"

    def test_the_workers_intake_names_derive_from_the_prefix(self) -> None:
        assert intake_name("p") == "p.intake"
        assert intake_dlq_name("p") == "p.intake.dlq"

    def test_a_dlq_is_named_by_its_work_queue_or_by_itself(self) -> None:
        """An operator may name the work queue or its `.dlq`: both mean the same queue."""
        assert dlq_of("orders") == "orders.dlq"
        assert dlq_of("orders.dlq") == "orders.dlq"
        assert dlq_of("orders.dlq.x") == "orders.dlq.x.dlq"

    def test_a_name_tells_the_work_queue_it_belongs_to(self) -> None:
        """A ``.retry`` or ``.dlq`` belongs to its work queue; a bare suffix is a name of its own."""
        assert [work_queue_of(q) for q in ("o", "o.retry", "o.dlq", "o.dlq.retry", ".retry")] == [
            "o",
            "o",
            "o",
            "o.dlq",
            ".retry",
        ]
        assert [is_retry_queue(q) for q in ("o.retry", "o.dlq", "o.retry.x")] == [1, 0, 0]
        assert [is_dlq(q) for q in ("o.dlq", "o.retry", "o.dlq.x")] == [1, 0, 0]
        assert [is_retry_or_dlq(q) for q in ("o.retry", "o.dlq", "o")] == [1, 1, 0]
        assert dlq_owner("o.dlq") == "o"
        assert dlq_owner("o") == "o"

    def test_the_machinerys_own_queues_are_told_by_name(self) -> None:
        """Sending a message back to a ``.retry``, a ``.dlq`` or a prefix's queue would loop."""
        assert [is_own_queue(q, "p") for q in ("o.retry", "o.dlq", "p.intake", "p", "o")] == [
            1,
            1,
            1,
            0,
            0,
        ]

    def test_an_intake_is_told_by_its_shape_whatever_the_prefix(self) -> None:
        assert looks_like_intake("p.intake")
        assert looks_like_intake("other.intake.dlq")
        assert not looks_like_intake("p.intake.retry")
        assert not looks_like_intake("orders.dlq")

    def test_a_tier_name_reads_back_to_its_ttl(self) -> None:
        """Only the names ``tier_name`` makes: the prefix, ``.delay.`` and a TTL of 1 ms or more."""
        assert tier_name("p", 100) == "p.delay.100"
        assert tier_ttl("p.delay.100", "p") == 100
        assert tier_ttl("a.b.delay.2000", "a.b") == 2000
        for other in ("p.delay.0", "p.delay.0100", "p.delay.1e3", "p.delay.", "q.delay.100"):
            assert tier_ttl(other, "p") is None, other
        assert tier_ttl("pxdelay.100", "p") is None
        assert tier_ttl("p.delay.100", ".") is None

    def test_a_migrations_temporary_queue_is_named_after_its_queue(self) -> None:
        assert migrating_name("o.dlq") == "o.dlq.migrating"
        assert migrating_of("o.dlq.migrating") == "o.dlq"
        assert migrating_of("o.dlq") is None

    def test_a_lock_name_stays_within_what_amqp_allows(self) -> None:
        """The lock of a queue whose name is long is named by the name's hash instead."""
        assert MAX_NAME_BYTES == 255
        prefix = "faststream-retry.lock."
        fits = "q" * (MAX_NAME_BYTES - len(prefix))
        assert lock_name(fits) == prefix + fits
        assert len(lock_name(fits).encode()) == MAX_NAME_BYTES
        longer = fits + "q"
        assert lock_name(longer) == prefix + hashlib.sha256(longer.encode()).hexdigest()
        wide = "é" * 120  # 240 bytes: over the limit with the prefix, though 142 characters
        assert lock_name(wide) == prefix + hashlib.sha256(wide.encode()).hexdigest()


class TestClassicSpecs:
    def test_every_queue_in_order_with_its_arguments(self) -> None:
        """Tiers first (TTL, DLX back by their own key), then each route's .retry and .dlq."""
        p = plan([route("a"), route("b")], DEFAULT, options(max_delay_ms=2000))
        assert [(s.name, dict(s.arguments)) for s in p.queues] == [
            (
                "p.delay.1000",
                {"x-queue-type": "classic", "x-message-ttl": 1000, "x-dead-letter-exchange": ""},
            ),
            (
                "p.delay.2000",
                {"x-queue-type": "classic", "x-message-ttl": 2000, "x-dead-letter-exchange": ""},
            ),
            ("a.retry", {"x-queue-type": "classic"}),
            ("a.dlq", {"x-queue-type": "classic"}),
            ("b.retry", {"x-queue-type": "classic"}),
            ("b.dlq", {"x-queue-type": "classic"}),
        ]

    def test_no_tier_overrides_the_routing_key(self) -> None:
        """An expired message goes back by its own key, so a header can never redirect it."""
        p = plan([route("a")], DEFAULT, options())
        assert all("x-dead-letter-routing-key" not in s.arguments for s in p.queues)


class TestQuorumSpecs:
    def test_tiers_dead_letter_at_least_once(self) -> None:
        """At-most-once dead-lettering could lose a message expiring while a node fails."""
        p = plan([route("a")], DEFAULT, options("quorum", max_delay_ms=1000))
        assert dict(p.spec("p.delay.1000").arguments) == {
            "x-queue-type": "quorum",
            "x-message-ttl": 1000,
            "x-dead-letter-exchange": "",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    def test_retry_queue_dead_letters_to_the_dlq_at_the_limit(self) -> None:
        """A message that hits the delivery limit of `.retry` lands in `.dlq`, never nowhere."""
        p = plan([route("a")], DEFAULT, options("quorum", delivery_limit=7))
        assert dict(p.spec("a.retry").arguments) == {
            "x-queue-type": "quorum",
            "x-delivery-limit": 7,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "a.dlq",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
        assert dict(p.spec("a.dlq").arguments) == {"x-queue-type": "quorum"}

    def test_an_unplanned_queue_has_no_spec(self) -> None:
        """Asking for a queue the plan does not hold is a bug, not a default."""
        with pytest.raises(KeyError, match=r"^'nope\.retry'$"):
            plan([], DEFAULT, options()).spec("nope.retry")


class TestRoutes:
    def test_subscribers_of_one_queue_are_merged(self) -> None:
        """Two subscribers of one queue: one route with both handlers, the first arguments."""
        first = Route("q", (Handler(None),), {"x-queue-type": "quorum"})
        second = Route("q", (Handler(HandlerPolicy({"max_attempts": 2})),), {})
        p = plan([first, second], DEFAULT, options())
        assert list(p.routes) == ["q"]
        assert p.routes["q"].queue == "q"
        assert len(p.routes["q"].handlers) == 2
        assert p.routes["q"].arguments == {"x-queue-type": "quorum"}

    def test_queues_with_retries_off_everywhere_are_left_out(self) -> None:
        """No `.retry`/`.dlq` for a queue whose every handler has `enabled=False`."""
        off = HandlerPolicy({"enabled": False})
        p = plan([route("off", off), route("mixed", off, None)], DEFAULT, options())
        assert set(p.routes) == {"mixed"}
        assert p.route("off") is None
        assert {s.name for s in p.queues} >= {"mixed.retry", "mixed.dlq"}
        assert not {"off.retry", "off.dlq"} & {s.name for s in p.queues}

    def test_a_disabled_default_leaves_undecorated_queues_out(self) -> None:
        """`enabled=False` on the default switches off every handler without its own policy."""
        on = HandlerPolicy({"enabled": True})
        p = plan([route("plain"), route("on", on)], RetryPolicy(enabled=False), options())
        assert set(p.routes) == {"on"}


class TestHomeFromTier:
    @pytest.mark.parametrize(
        ("arguments", "home"),
        [
            ({}, True),
            ({"x-overflow": "drop-head", "x-max-length": 10}, True),
            ({"x-max-length": 10}, True),
            ({"x-overflow": "reject-publish", "x-max-length": 10}, False),
            ({"x-overflow": "reject-publish-dlx", "x-max-length": 10}, False),
        ],
    )
    def test_a_queue_that_refuses_when_full_takes_the_re_check_step(
        self, arguments: dict[str, object], home: bool
    ) -> None:
        """A last tier delivers straight home unless the queue refuses publishes when full."""
        assert Route("q", (), arguments).home_from_tier is home

    def test_a_queue_whose_arguments_are_not_known_takes_the_re_check_step(self) -> None:
        """The retry worker cannot see another team's declaration: its queues are released."""
        assert Route("q", (), {}, known=False).home_from_tier is False

    def test_merged_routes_are_known_only_if_each_is(self) -> None:
        merged = merge_routes([Route("q", (), {}), Route("q", (), {}, known=False)])
        assert merged["q"].known is False
        assert merge_routes([Route("q", ()), Route("q", ())])["q"].known is True
        assert merge_routes([Route("q", (), known=False), Route("q", ())])["q"].known is False

    def test_merged_routes_are_transient_if_any_declaration_is(self) -> None:
        """Another subscriber of the same queue must not hide the 4.x warning."""
        for first, second in [(True, False), (False, True)]:
            routes = [Route("q", (), transient=first), Route("q", (), transient=second)]
            assert merge_routes(routes)["q"].transient is True
        assert merge_routes([Route("q", ()), Route("q", ())])["q"].transient is False


class TestTick:
    def test_tick_is_the_gcd_of_every_policy_in_use(self) -> None:
        """The default's and each handler's named delays; a handler's options over the default."""
        handler = HandlerPolicy({"backoff": Schedule([1.5, 6])})
        p = plan([route("q", handler)], RetryPolicy(backoff=Exponential(2, maximum=8)), options())
        assert p.tiers.tick_ms == 500

    def test_a_disabled_queue_does_not_shape_the_tick(self) -> None:
        """Delays of handlers the plugin does not cover never shrink the tick."""
        off = HandlerPolicy({"enabled": False, "backoff": Fixed(0.3)})
        p = plan([route("off", off), route("on")], DEFAULT, options())
        assert p.tiers.tick_ms == 1000

    def test_an_explicit_tick_wins(self) -> None:
        """`tick=` is used as given, and the tiers are built on it up to `max_delay`."""
        p = plan([route("q")], DEFAULT, options(tick_ms=250, max_delay_ms=1000))
        assert p.tiers.ttls_ms == (250, 500, 1000)


class TestLateRoutes:
    """A subscriber started after the broker joins the plan, on the tiers already declared."""

    @pytest.mark.parametrize("queue_type", ["classic", "quorum"])
    def test_with_route_adds_its_queues_and_keeps_the_tiers(self, queue_type: QueueType) -> None:
        """The new route's `.retry` and `.dlq` are specified exactly as if planned at start."""
        opts = options(queue_type)
        before = plan([route("a")], DEFAULT, opts)
        late = route("b", HandlerPolicy({"backoff": Fixed(0.3)}))
        after = before.with_route(late)
        assert after.tiers == before.tiers  # no new tick for a late policy
        assert after.options == before.options
        assert list(after.routes) == ["a", "b"]
        assert after.route("b") is late
        at_start = plan([route("a"), late], DEFAULT, opts)
        assert {s.name: s for s in after.queues} == {
            s.name: s for s in at_start.queues if not s.name.startswith("p.delay.")
        } | {s.name: s for s in before.queues}
        assert after.spec("b.retry") == at_start.spec("b.retry")
        assert after.spec("b.dlq") == at_start.spec("b.dlq")
        assert before.route("b") is None  # plans are values

    def test_with_route_again_replaces_its_queues_once(self) -> None:
        """Adding a queue the plan has replaces it: no queue is listed twice."""
        p = plan([route("a")], DEFAULT, options())
        again = p.with_route(route("a"))
        assert sorted(s.name for s in again.queues) == sorted(s.name for s in p.queues)

    def test_without_drops_the_route_and_its_queues_only(self) -> None:
        """A stopped late subscriber: its `.retry`/`.dlq` leave the plan, the tiers stay."""
        p = plan([route("a"), route("b")], DEFAULT, options())
        less = p.without("b")
        assert list(less.routes) == ["a"]
        assert [s.name for s in less.queues] == [
            s.name for s in p.queues if s.name not in {"b.retry", "b.dlq"}
        ]
        assert less.tiers == p.tiers
        assert less.options == p.options
        assert p.without("unknown") is p


def test_the_plugin_owns_its_tiers_retry_and_dead_letter_queues_only() -> None:
    """A missing work queue is its application's: never declared again by the plugin."""
    topology = plan(
        [Route("orders", (Handler(None),))],
        RetryPolicy(),
        TopologyOptions("p", 200, tick_ms=100),
    )
    assert topology.owns("p.delay.100", "orders.retry")
    assert topology.owns("p.delay.200", "anything")
    assert not topology.owns("p.delay.400", "orders.retry")
    assert topology.owns("", "orders.retry")
    assert topology.owns("", "orders.dlq")
    assert not topology.owns("", "orders")
    assert not topology.owns("", "other.dlq")
    assert not topology.owns("amq.direct", "orders.dlq")
