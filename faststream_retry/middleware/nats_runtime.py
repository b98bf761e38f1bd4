"""The plugin on a ``NatsBroker``: the start and stop wrapping, and what it keeps per broker.

The NATS side of ``runtime``: the same ``Plugin`` makes a ``NatsRuntime`` for a
``NatsBroker`` and a ``Runtime`` for a ``RabbitBroker``; the per-message scope
(``middleware``) talks to either through the same few members (``plan``, ``route``,
``sink``, ``live``). At start the plugin checks the broker's subscribers (a core-NATS
subscriber with retries on is refused, with the fix), makes the delay stream and a
dead-letter stream per covered stream (``nats.streams``, ``nats.dead_letters``), lets
FastStream start its subscribers, then starts a re-check consumer per tier and a
hand-over per covered subscriber (``nats.live``). Under ``TestNatsBroker`` nothing
starts: inside ``retry.testing()`` failures go to test mode's sink (``nats_test_mode``),
once the subscribers passed the same checks (``check_in_test``). Not yet on NATS: outage
mode (refused), and subscribers that join a running broker (left to FastStream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faststream_retry.core.durations import format_ms
from faststream_retry.core.topology import Handler, Route
from faststream_retry.errors import RetryConfigError
from faststream_retry.middleware import _internals, checks, nats_subscribers
from faststream_retry.middleware.nats_test_mode import NatsTestSink
from faststream_retry.middleware.planned import Planned
from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from faststream_retry.core.config import RetryConfig
    from faststream_retry.core.topology import Plan
    from faststream_retry.middleware.checks import Middleware
    from faststream_retry.middleware.testing import Testing
    from faststream_retry.nats.live import NatsLive
    from faststream_retry.nats.sink import NatsSink
    from faststream_retry.reporting.reporter import Reporter

__all__ = ["NatsRuntime"]


class NatsRuntime(Planned):
    """Everything the plugin holds for one ``NatsBroker``."""

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
        self._checked_in_test = False

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

    def check_in_test(self, middleware: Middleware) -> None:
        """Test mode's start: the checks a real start makes, once; a refusal raises every time.

        A test of an app the plugin would refuse to start with (a core-NATS subscriber
        with retries on, say) fails with the same error, rather than retrying in memory
        what production would not.

        Raises:
            RetryConfigError: as ``check``.
        """
        if self.refused is not None:
            raise self.refused
        if self._checked_in_test:
            return
        try:
            self.check(middleware)
        except RetryConfigError as refused:
            self.refused = refused
            raise
        self._checked_in_test = True

    async def cover_failed(self, sub: Any) -> Route | None:  # noqa: ANN401, ARG002 - a subscriber
        """A subscriber that joined the running broker: not covered on NATS yet (FastStream's)."""
        return None

    def check(self, middleware: Middleware) -> Plan:
        """Plan and check the broker's subscribers; raise one error naming every fix.

        Raises:
            RetryConfigError: a core-NATS subscriber with retries on, a consumer whose
                ack policy cannot keep a failure, ``ACK_FIRST``, two middlewares, outage mode.
        """
        topology = self.replan()
        checks.refuse_ack_first(self.broker, topology)
        checks.refuse_other_instances(self.broker, middleware)
        from faststream_retry.nats import checks as nats_checks  # noqa: PLC0415

        refusals: list[str] = []
        if self.config.outage is not None:
            refusals.append(nats_checks.outage_refused())
        default = self.config.default
        limit = self.config.topology.delivery_limit
        for sub in self.broker.subscribers:
            key = nats_subscribers.key_of(sub)
            if key is None:
                handlers = tuple(
                    Handler(_internals.handler_policy(item)) for item in getattr(sub, "calls", ())
                )
                subject = nats_subscribers.subject_of(sub)
                if Route(subject, handlers).enabled(default):
                    refusals.append(nats_checks.core_subscriber(subject))
                continue
            if key not in topology.routes:
                continue
            for found in nats_checks.consumer_findings(
                key, nats_subscribers.consumer_config(sub), limit
            ):
                if found.refuse:
                    refusals.append(found.text)
                else:
                    log.warning("faststream-retry: %s", found.text)
        if refusals:
            raise RetryConfigError(
                "faststream-retry cannot run on this NatsBroker:\n"
                + "\n".join(f"- {text}" for text in refusals)
            )
        return topology

    async def open(self, middleware: Middleware) -> None:
        """Check the subscribers, then make the plugin's streams on the broker's connection."""
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
        from faststream_retry.nats.live import NatsLive  # noqa: PLC0415 - nats-py, on NATS only

        live = NatsLive(topology, jetstream(), self.config, self.reporter)
        streams = {
            stream: None
            for sub in self.broker.subscribers
            if nats_subscribers.key_of(sub) in topology.routes
            and (stream := nats_subscribers.stream_of(sub)) is not None
        }
        await live.open(streams)
        self.live = live
        self.started = True
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
        """Stop the hand-overs and the re-check consumers."""
        if self.live is not None:
            await self.live.stop_consumers()

    async def stop(self) -> None:
        """Stop publishing; the connection is the broker's."""
        if self.live is not None:
            self.live.close()
        self.live = None
