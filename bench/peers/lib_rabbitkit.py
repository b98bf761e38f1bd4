"""rabbitkit (AsyncBroker over aio-pika): per-attempt TTL queues that dead-letter back.

    python -m bench.peers.lib_rabbitkit <scenario>      (run.py starts it in its own venv)

RetryConfig(max_retries=3, delays=(d, d, d)) declares <queue>.retry.1..3, classic queues
whose x-message-ttl is the delay and whose dead-letter target is the work queue, and
<queue>.dlq. rabbitkit sorts errors itself: the handler raises TimeoutError, one it
retries (an unknown error goes straight to the DLQ).
"""

from __future__ import annotations

import logging
from importlib.metadata import version
from typing import Any

import structlog  # type: ignore[import-not-found]
from rabbitkit import AsyncBroker, RabbitConfig, RetryConfig  # type: ignore[import-not-found]
from rabbitkit.core.config import ConnectionConfig, ConsumerConfig  # type: ignore[import-not-found]
from rabbitkit.core.message import RabbitMessage  # type: ignore[import-not-found]

from bench.peers import driver


class Rabbitkit:
    name = "rabbitkit"
    version = version("rabbitkit")
    retries = True

    def make(self, base: str, queue: str, spec: driver.Spec | None, rec: driver.Recorder) -> Any:  # noqa: ARG002
        assert spec is not None  # noqa: S101
        config = RabbitConfig(
            connection=ConnectionConfig.from_url(driver.URL),
            consumer=ConsumerConfig(prefetch_count=driver.PREFETCH),
        )
        broker = AsyncBroker(config)
        delay = round(spec.delay)  # whole seconds only
        retry = RetryConfig(max_retries=3, delays=(delay, delay, delay))

        @broker.subscriber(queue=queue, retry=retry)
        async def handler(body: bytes, msg: RabbitMessage) -> None:  # noqa: ARG001
            if rec.call(msg.message_id) is not None:
                raise TimeoutError("bench: fails once")

        return broker

    async def start(self, app: Any) -> None:
        await app.start(install_signal_handlers=False)

    async def stop(self, app: Any) -> None:
        await app.stop()


if __name__ == "__main__":
    # rabbitkit logs partly through structlog's own printer: quiet it like the rest.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    driver.main(Rabbitkit())
