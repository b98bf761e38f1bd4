"""A retry written by hand in a FastStream 0.7 handler: the limit a FastStream middleware can reach.

    FR_QUEUE_TYPE=classic|quorum python -m bench.peers.lib_faststream_minimal <scenario>

The cheapest correct retry a FastStream app can have, and so the yardstick of the plugin's
own cost: the handler catches its failure, publishes the message with FastStream's own
confirmed ``broker.publish`` into a TTL queue (``<queue>.wait.<ms>``, of FR_QUEUE_TYPE, like
the plugin's tiers; a quorum one dead-letters at least once, as theirs do) whose
dead-letter exchange sends it back to the work queue, and returns;
FastStream then acks the delivery. The attempt rides in one header. There is no
classification, no dead-letter queue, no span, metric or log line: nothing but the copy.
Whatever the plugin costs on top of FastStream's own delivery path shows as the distance to
this column.
"""

from __future__ import annotations

import os
from importlib.metadata import version
from typing import Any

from faststream.rabbit import Channel, RabbitBroker, RabbitQueue

from bench.peers import driver

QUEUE_TYPE = os.environ.get("FR_QUEUE_TYPE", "classic")
MAX_RETRIES = 3  # the plugin's max_attempts=4, rabbitkit's max_retries=3


class TransientError(Exception):
    """The handler's own failure, which it retries."""


class HandWritten:
    name = f"hand-written {QUEUE_TYPE}"
    version = version("faststream")
    retries = True
    wait: RabbitQueue  # the TTL queue, declared once the app has started

    def make(self, base: str, queue: str, spec: driver.Spec | None, rec: driver.Recorder) -> Any:  # noqa: ARG002
        assert spec is not None  # noqa: S101 - the happy path too runs with its retry queue
        broker = RabbitBroker(driver.URL, default_channel=Channel(prefetch_count=driver.PREFETCH))
        context = broker.context
        arguments: Any = {  # FastStream's typed arguments know no x-queue-type of a variable
            "x-queue-type": QUEUE_TYPE,
            "x-message-ttl": round(spec.delay * 1000),
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": queue,
        }
        if QUEUE_TYPE == "quorum":
            # A quorum queue dead-letters at most once unless told otherwise: a copy
            # expiring while its leader changes is lost. Correct means at least once, as
            # the plugin's quorum tiers do (RabbitMQ requires reject-publish for it).
            arguments |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
        wait = RabbitQueue(
            f"{queue}.wait.{round(spec.delay * 1000)}", durable=True, arguments=arguments
        )

        @broker.subscriber(RabbitQueue(queue, durable=True))
        async def handler(body: Any) -> None:  # noqa: ARG001 - FastStream passes the body
            message = context.get_local("message")
            try:
                if rec.call(message.message_id) is not None:
                    raise TransientError("bench: fails once")  # noqa: TRY301 - the handler's own failure
            except TransientError:
                headers = message.headers or {}
                attempt = int(headers.get("attempt", 0)) + 1
                if attempt > MAX_RETRIES:
                    raise
                await broker.publish(
                    message.body,
                    queue=wait,
                    headers={**headers, "attempt": attempt},
                    message_id=message.message_id,
                    content_type=message.content_type,
                    persist=True,
                )

        self.wait = wait  # every app of a run has the same one
        return broker

    async def start(self, app: Any) -> None:
        await app.start()
        await app.declare_queue(self.wait)

    async def stop(self, app: Any) -> None:
        await app.stop()


if __name__ == "__main__":
    driver.main(HandWritten())
