"""The plugin on a ``NatsBroker``: the start and stop wrapping, and what it keeps per broker.

The NATS side of ``runtime``: the same ``Plugin`` makes a ``NatsRuntime`` for a
``NatsBroker`` and a ``Runtime`` for a ``RabbitBroker``; the per-message scope
(``middleware``) talks to either through the same few members (``plan``, ``route``,
``sink``, ``live``). At start the plugin checks the broker's subscribers (a core-NATS
subscriber with retries on is refused, with the fix), makes the delay stream and a
dead-letter stream per covered stream (``nats.streams``, ``nats.dead_letters``), lets
FastStream start its subscribers, then starts a re-check consumer per tier and a
hand-over per covered subscriber (``nats.live``). Under ``TestNatsBroker`` nothing
starts: inside ``retry.testing()`` failures go to test mode's sink (``nats.test_mode``),
once the subscribers passed the same checks (``Planned.check_in_test``).

Outage mode (``outage_after``) holds a covered subscriber's messages at its gate
(``faststream_retry.outages``), each at most half its consumer's ``ack_wait`` (JetStream
redelivers a message unacked longer: a duplicate) or ``outage_hold`` if shorter; one held
longer, or held when the broker stops, is parked in the delay tier of the probe interval
with its attempt unchanged (``nats.park``), never ``nak``'d (that spends ``max_deliver``).

A subscriber that joins the running broker (``middleware.late``) is checked as the start
checks the others before it consumes (a refusal raises from its start), and covered: its
dead-letter stream made, its route planned, and its hand-over started once it consumes.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from faststream_retry.core.durations import format_ms
from faststream_retry.core.topology import Handler, Route
from faststream_retry.errors import RetryConfigError
from faststream_retry.middleware import _internals, checks, late, nats_subscribers
from faststream_retry.middleware.nats.test_mode import NatsTestSink
from faststream_retry.middleware.planned import Planned
from faststream_retry.nats import checks as nats_checks
from faststream_retry.nats.checks import Finding
from faststream_retry.nats.keepalive import KeepAlive
from faststream_retry.outages import HandBacks, Outages
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.topology import Plan
    from faststream_retry.middleware.checks import Middleware
    from faststream_retry.middleware.testing import Testing
    from faststream_retry.nats.live import NatsLive
    from faststream_retry.nats.sink import Message, NatsSink
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["NatsRuntime"]

_CONSUMERS_KEPT = 256

_NOTHING = contextlib.nullcontext()
"""What wraps the call of a message nothing keeps alive (reusable: it holds no state)."""


class NatsRuntime(Planned):
    """Everything the plugin holds for one ``NatsBroker``."""

    messaging_system = "nats"

    def __init__(
        self,
        config: RetryConfig,
        reporter: Reporter,
        broker: Any,  # noqa: ANN401 - a NatsBroker
        testing: Testing,
    ) -> None:
        """Prepare; nothing touches the network before ``open``."""
        super().__init__(config, reporter, broker, testing)
        self.live: NatsLive | None = None
        self._hand_backs = HandBacks()
        self._js: Any = None
        self._keep_alive = KeepAlive()
        # Per subscriber (by id, the subscriber kept with it): its consumer's max_deliver
        # and ack_wait, as declared, read once rather than at every message.
        self._consumers: dict[int, tuple[Any, int, float]] = {}

    def sink(self) -> NatsSink | NatsTestSink | None:
        """Where this broker's failures go now; ``None``: the plugin is not running.

        The live sink from the start to the stop; test mode's under ``TestNatsBroker``.
        """
        live = self.live
        if live is None and nats_subscribers.under_test_nats(self.broker):
            return NatsTestSink(self.broker, self.plan, self.reporter, self._testing)
        if live is None or not live.running:
            return None
        from faststream_retry.nats.sink import NatsSink  # noqa: PLC0415 - nats-py, on NATS only

        return NatsSink(live, self.reporter, self.config.pause_s)

    async def cover_failed(self, sub: Any) -> Route | None:  # noqa: ANN401 - a subscriber
        """Return the route for a failure of ``sub``, which the plan does not cover (``late``)."""
        return await late.cover_failed(self, sub)

    @property
    def running(self) -> bool:
        """Whether the plugin runs on the broker: its re-checks and hand-overs started."""
        return self.live is not None and self.live.consuming

    async def join(self, sub: Any) -> bool:  # noqa: ANN401 - a JetStream subscriber
        """Check a subscriber that joins the running broker, and cover it; ``True``: covered.

        The start's checks of one subscriber: a core-NATS one with retries on, a consumer
        whose ack policy cannot keep a failure (as the server holds it, if it exists),
        ``ACK_FIRST``; warnings logged. Then its stream's dead-letter stream is made and
        its route planned. A subscriber with retries off is left to FastStream.

        Raises:
            RetryConfigError: it is refused; it must not start.
        """
        live = self.live
        if live is None:
            return False
        default = self.config.default
        key = nats_subscribers.key_of(sub)
        if key is None:
            subject = nats_subscribers.subject_of(sub)
            handlers = tuple(
                Handler(_internals.handler_policy(item)) for item in getattr(sub, "calls", ())
            )
            if Route(subject, handlers).enabled(default):
                _settle([_wiring(nats_checks.core_subscriber(subject), "core-nats")])
            return False
        route = _internals.route_of(sub)
        stream = nats_subscribers.stream_of(sub)
        if route is None or stream is None or not route.enabled(default):
            return False
        checks.refuse_ack_first_of(sub, route)
        durable = nats_subscribers.durable_of(sub)
        from faststream_retry.nats import survey  # noqa: PLC0415 - nats-py, on NATS only

        on_server = await survey.consumers(self._js, [(stream, durable)]) if durable else {}
        consumer = on_server.get((stream, durable or ""))
        _settle(
            nats_checks.consumer_findings(
                key,
                nats_subscribers.consumer_config(sub) if consumer is None else consumer,
                self.config.topology.delivery_limit,
                self.config.publish_timeout_s,
                on_server=None if consumer is None else f"{stream}/{durable}",
            )
        )
        if key not in live.plan.routes:
            await live.cover(route, stream, nats_subscribers.replicas_of(sub) or 1)
            self._plan = live.plan
            if live.outages is not None:
                wait = getattr(consumer, "ack_wait", None) or nats_subscribers.ack_wait_s(sub)
                _cap(live.outages, key, wait)
            log.info("faststream-retry (NATS): %s joined the running broker: covered", key)
        return True

    async def joined(self, sub: Any) -> None:  # noqa: ANN401 - a JetStream subscriber
        """A covered subscriber that joined consumes now: start its hand-over."""
        live = self.live
        key = nats_subscribers.key_of(sub)
        if live is None or key is None or key not in live.plan.routes:
            return
        from faststream_retry.nats.live import HandOver  # noqa: PLC0415 - nats-py, on NATS only

        await live.hand_over(HandOver(key, sub.consume, nats_subscribers.ack_wait_s(sub)))

    async def leave(self, sub: Any) -> None:  # noqa: ANN401 - a JetStream subscriber
        """A subscriber stops while the broker runs: stop its hand-over, unless another needs it.

        Its copies wait in the delay stream for its next start.
        """
        live = self.live
        key = nats_subscribers.key_of(sub)
        if live is None or key is None:
            return
        if any(
            other is not sub
            and getattr(other, "running", False)
            and nats_subscribers.key_of(other) == key
            for other in self.broker.subscribers
        ):
            return
        await live.let_go(key)

    def holding(
        self,
        msg: Any,  # noqa: ANN401 - FastStream's NatsMessage
        sub: Any,  # noqa: ANN401 - its subscriber
    ) -> contextlib.AbstractContextManager[None]:
        """Keep ``msg`` alive (``in_progress``) while its handler runs and its failure is placed."""
        raw = getattr(msg, "raw_message", None)
        if self.live is None or sub is None or not getattr(raw, "reply", None):
            return contextlib.nullcontext()
        return self._keep_alive.holding(raw, self._consumer_of(sub)[2])

    def entering(
        self,
        msg: Any,  # noqa: ANN401 - FastStream's NatsMessage
        sub: Any,  # noqa: ANN401 - its subscriber
    ) -> contextlib.AbstractContextManager[None] | None:
        """``holding`` and ``settle_first``'s test in one; ``None``: ``settle_first`` may settle.

        Every covered message passes here: its consumer is looked up once, and a consumer
        without ``max_deliver`` (the plugin's own advice) reads no delivery count.
        """
        live = self.live
        if live is None or sub is None:
            return _NOTHING
        _, limit, ack_wait_s = self._consumer_of(sub)
        raw = getattr(msg, "raw_message", None)
        if limit > 0 and live.running:
            delivered = getattr(getattr(raw, "metadata", None), "num_delivered", None)
            if isinstance(delivered, int) and delivered >= limit:
                return None
        if not getattr(raw, "reply", None):
            return _NOTHING
        return self._keep_alive.holding(raw, ack_wait_s)

    def _consumer_of(self, sub: Any) -> tuple[Any, int, float]:  # noqa: ANN401 - its subscriber
        """``sub``, its consumer's ``max_deliver`` (0: none) and ``ack_wait`` in seconds."""
        found = self._consumers.get(id(sub))
        if found is None or found[0] is not sub:
            if len(self._consumers) >= _CONSUMERS_KEPT:  # subscribers made and dropped at run time
                self._consumers.clear()
            limit = getattr(nats_subscribers.consumer_config(sub), "max_deliver", None)
            found = self._consumers[id(sub)] = (
                sub,
                limit if isinstance(limit, int) else 0,
                nats_subscribers.ack_wait_s(sub),
            )
        return found

    async def settle_first(
        self,
        msg: Any,  # noqa: ANN401 - FastStream's NatsMessage
        sub: Any,  # noqa: ANN401 - its subscriber
    ) -> bool:
        """Dead-letter the last delivery ``max_deliver`` allows as ``stuck``, before its handler.

        JetStream delivers a message no more after it (an advisory, no dead letter): a
        message redelivered until then by a crash loop (the process dies in its handler)
        would silently stop. A retried copy is the plugin's (no ``max_deliver``): not this.
        """
        live = self.live
        if live is None or not live.running or sub is None:
            return False
        limit = self._consumer_of(sub)[1]
        if limit <= 0:
            return False
        meta = getattr(getattr(msg, "raw_message", None), "metadata", None)
        delivered = getattr(meta, "num_delivered", None)
        if not isinstance(delivered, int) or delivered < limit:
            return False
        # Read for the last delivery only: the key is built anew at each read.
        key = nats_subscribers.key_of(sub)
        route = None if key is None else live.plan.route(key)
        if route is None or getattr(meta, "stream", None) != nats_subscribers.stream_of(sub):
            return False
        from faststream_retry.nats.sink import NatsSink  # noqa: PLC0415 - nats-py, on NATS only

        sink = NatsSink(live, self.reporter, self.config.pause_s)
        return await sink.last_delivery(msg, route, delivered)

    def check(self, middleware: Middleware) -> Plan:
        """Plan and check the broker's subscribers as declared; raise one error naming every fix.

        Raises:
            RetryConfigError: a core-NATS subscriber with retries on, a consumer whose
                ack policy cannot keep a failure, ``ACK_FIRST``, two middlewares.
        """
        topology, found = self.findings(middleware)
        _settle(found)
        return topology

    def findings(
        self,
        middleware: Middleware,
        consumers: Mapping[tuple[str, str], Any] | None = None,
    ) -> tuple[Plan, list[Finding]]:
        """Plan, and say what the subscribers and their consumers would break in the plan.

        ``consumers``: the durable consumers that exist, ``(stream, name)`` to their config
        as the server has it (``nats.survey.consumers``): FastStream binds to those as they
        are, so they are checked instead of what the code declares. No network.
        """
        topology = self.replan()
        found = [
            refusal
            for refuse in (
                lambda: checks.refuse_ack_first(self.broker, topology),
                lambda: checks.refuse_other_instances(self.broker, middleware),
            )
            if (refusal := _refusal_of(refuse)) is not None
        ]
        default = self.config.default
        for sub in self.broker.subscribers:
            core, batch = nats_subscribers.key_of(sub) is None, nats_subscribers.is_batch(sub)
            if core or batch:
                handlers = tuple(
                    Handler(_internals.handler_policy(item)) for item in getattr(sub, "calls", ())
                )
                subject = nats_subscribers.subject_of(sub)
                if not Route(subject, handlers).enabled(default):
                    continue
                if core:
                    found.append(_wiring(nats_checks.core_subscriber(subject), "core-nats"))
                else:
                    found.append(_wiring(nats_checks.batch_subscriber(subject), "batch"))
        options = self.config.topology
        for covered in self.covered(topology, consumers or {}):
            on_server = (consumers or {}).get((covered.stream, covered.durable or ""))
            found += nats_checks.consumer_findings(
                covered.key,
                covered.consumer,
                options.delivery_limit,
                self.config.publish_timeout_s,
                on_server=None if on_server is None else f"{covered.stream}/{covered.durable}",
            )
        return topology, found

    def covered(
        self, topology: Plan, consumers: Mapping[tuple[str, str], Any]
    ) -> list[nats_checks.Covered]:
        """The subscribers ``topology`` covers, once each, their consumer as it will run."""
        found: dict[str, nats_checks.Covered] = {}
        for sub in self.broker.subscribers:
            key = nats_subscribers.key_of(sub)
            stream = nats_subscribers.stream_of(sub)
            if key is None or stream is None or key not in topology.routes or key in found:
                continue
            durable = nats_subscribers.durable_of(sub)
            on_server = consumers.get((stream, durable)) if durable else None
            found[key] = nats_checks.Covered(
                key,
                stream,
                durable,
                nats_subscribers.consumer_config(sub) if on_server is None else on_server,
                nats_subscribers.max_msg_size_of(sub),
                nats_subscribers.replicas_of(sub),
            )
        return list(found.values())

    async def open(self, middleware: Middleware) -> None:
        """Check the subscribers, then make the plugin's streams on the broker's connection.

        The subscribers are checked as declared first, with no network; then the durable
        consumers that exist, as the server has them (FastStream binds to them as they
        are); then, once made, the plugin's streams (their duplicate windows and sizes).
        """
        topology = self.check(middleware)
        if nats_subscribers.under_test_nats(self.broker):
            return  # nothing to open: test mode's sink takes the failures (``sink``)
        connection = await self.broker.connect()
        jetstream = getattr(connection, "jetstream", None)
        if not callable(jetstream) or not type(connection).__module__.startswith("nats"):
            self._leave_to_faststream(
                f"the broker's connection is a {type(connection).__name__}, not a nats-py "
                "client (a test double?): the plugin does not start on it, and leaves the "
                "broker's messages to FastStream"
            )
            return
        from faststream_retry.nats import survey  # noqa: PLC0415 - nats-py, on NATS only
        from faststream_retry.nats.live import NatsLive  # noqa: PLC0415

        js = self._js = jetstream()
        durables = [(c.stream, c.durable) for c in self.covered(topology, {}) if c.durable]
        consumers = await survey.consumers(js, durables)
        if consumers:
            said = {(f.check, f.subject) for f in self.findings(middleware)[1]}
            _settle(
                [
                    f
                    for f in self.findings(middleware, consumers)[1]
                    if (f.check, f.subject) not in said
                ]
            )
        live = NatsLive(topology, js, self.config, self.reporter)
        declared: dict[str, int] = {}
        for c in self.covered(topology, consumers):
            declared[c.stream] = max(declared.get(c.stream, 1), c.declared_replicas or 1)
        await live.open(declared)
        live.outages = self._outages(topology, consumers)
        streams = dict.fromkeys(declared)
        self.live = live
        self.started = True
        found = await survey.streams(js, live.prefix, streams)
        _settle(
            nats_checks.stream_findings(
                live.prefix,
                self.covered(topology, consumers),
                found,
                survey.max_payload_of(connection),
            )
        )
        tiers = topology.tiers
        log.info(
            "faststream-retry (NATS): tick %s, %d tiers up to %s in stream %s, %d covered: %s",
            format_ms(tiers.tick_ms),
            len(tiers.ttls_ms),
            format_ms(tiers.ttls_ms[-1]),
            live.delay_stream(),
            len(topology.routes),
            ", ".join(sorted(topology.routes)) or "none",
        )

    def _outages(self, topology: Plan, consumers: Mapping[tuple[str, str], Any]) -> Outages | None:
        """Outage mode's gates (``None``: off), each holding at most half its ``ack_wait``.

        A message unacked for ``ack_wait`` is redelivered while it still waits at the gate
        (a duplicate): half of it leaves room for the park's PubAck.
        """
        outages = Outages.of(self.config.outage, topology.tiers.tick_ms, self.reporter)
        if outages is None:
            return None
        for covered in self.covered(topology, consumers):
            _cap(outages, covered.key, getattr(covered.consumer, "ack_wait", None))
        return outages

    async def park(self, msg: Message, route: Route) -> bool:
        """Hand a message held in outage mode back without a ``nak``; ``False``: not done.

        A copy in the delay tier of the probe interval, its attempt unchanged
        (``nats.park``), confirmed before the original is acked.
        """
        live = self.live
        if live is None or live.outages is None:
            return False
        from faststream_retry.nats.park import park  # noqa: PLC0415 - nats-py, on NATS only

        with self._hand_backs.one():
            return await park(live, self.reporter, msg, route, wait_ms=live.outages.probe_ms)

    def _leave_to_faststream(self, why: str) -> None:
        self.bypass = why
        self.reporter.error_once(("bypass", id(self.broker)), "faststream-retry: %s", why)

    async def start_consumers(self) -> None:
        """Start the re-check consumers and the hand-overs (once FastStream's subscribers run)."""
        live = self.live
        if live is None:
            return
        from faststream_retry.nats.live import HandOver  # noqa: PLC0415

        hand_overs = []
        seen: set[str] = set()
        for sub in self.broker.subscribers:
            key = nats_subscribers.key_of(sub)
            if key is None or key not in live.plan.routes or key in seen:
                continue
            seen.add(key)
            hand_overs.append(HandOver(key, sub.consume, nats_subscribers.ack_wait_s(sub)))
        await live.start_consumers(hand_overs)

    async def stop_consumers(self) -> None:
        """Park the messages held in outage mode, stop the hand-overs and the re-checks.

        The held ones first: a hand-over's stop, and FastStream's, wait for them.
        """
        if self.live is not None:
            if self.live.outages is not None:
                held = self.live.outages.close()
                await self._hand_backs.settle(held, 2 * self.config.publish_timeout_s + 1)
            await self.live.stop_consumers()

    async def stop(self) -> None:
        """Stop publishing; the connection is the broker's."""
        if self.live is not None:
            self.live.close()
        self.live = None


def _cap(outages: Outages, key: str, ack_wait_s: object) -> None:
    """Hold ``key``'s messages at most half its ``ack_wait``; warn if probes come rarer."""
    wait = ack_wait_s if isinstance(ack_wait_s, (int, float)) and ack_wait_s > 0 else None
    hold_ms = int((wait or nats_checks.DEFAULT_ACK_WAIT_S) * 1000) // 2
    outages.cap(key, hold_ms)
    if outages.probe_ms > outages.hold_ms(key):
        log.warning(
            "faststream-retry: in outage mode %s holds a message at most %s (half its "
            "consumer's ack_wait), less than outage_probe (%s): every held message is parked "
            "before a probe comes. Raise the consumer's ack_wait or shorten outage_probe",
            key,
            format_ms(outages.hold_ms(key)),
            format_ms(outages.probe_ms),
        )


def _wiring(text: str, check: str = "wiring") -> Finding:
    """A refusal of how the app is wired, said as one text."""
    return Finding(refuse=True, check=check, subject="", what=text, why="", fix="")


def _refusal_of(refuse: Callable[[], None]) -> Finding | None:
    """Run one of the shared wiring checks; what it refused, as a finding."""
    try:
        refuse()
    except RetryConfigError as refused:
        return _wiring(str(refused))
    return None


def _settle(found: list[Finding]) -> None:
    """Log each warning; raise the refusals, together, in one error that names every fix.

    Raises:
        RetryConfigError: something in ``found`` refuses the start.
    """
    for finding in found:
        if not finding.refuse:
            log.warning("faststream-retry: %s", finding.text)
    refusals = [finding.text for finding in found if finding.refuse]
    if refusals:
        raise RetryConfigError(
            "faststream-retry cannot run on this NatsBroker:\n"
            + "\n".join(f"- {text}" for text in refusals)
        )
