"""A user's app for test_default_logging: one failing handler, FastStream's defaults.

Run as ``python tests/integration/logging_app.py`` or ``faststream run
tests.integration.logging_app:app``; it stops itself after its one message is
dead-lettered. ``LOG_CONFIG`` picks the logging the user configured: none, ``basic``
(``logging.basicConfig(level=INFO)``) or ``own`` (a handler on ``faststream_retry``).
``HUGE=1``: the handler's error is 2 MB long and a hook fails on every event (its
traceback chained to that error).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from faststream import FastStream
from faststream.rabbit import RabbitBroker

from faststream_retry import EventKind, Fixed, RetryEvent, RetryMiddleware, RetryPolicy

POLICY = RetryPolicy(max_attempts=3, backoff=Fixed(0.1))

if os.environ.get("LOG_CONFIG") == "basic":
    logging.basicConfig(level=logging.INFO)
elif os.environ.get("LOG_CONFIG") == "own":
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("OWN %(levelname)s %(message)s"))
    logging.getLogger("faststream_retry").addHandler(handler)
    logging.getLogger("faststream_retry").setLevel(logging.INFO)

queue = os.environ["QUEUE"]
retry = RetryMiddleware(
    default=POLICY,
    prefix=os.environ["PREFIX"],
    log_retry_traceback=os.environ.get("RETRY_TRACEBACK", "first"),
)
broker = RabbitBroker(os.environ["RABBITMQ_URL"])
retry.install(broker)
app = FastStream(broker)


HUGE = os.environ.get("HUGE") == "1"


@broker.subscriber(queue)
async def handle(body: str) -> None:
    raise ConnectionError(f"database down for {body}" + ("E" * 2_000_000 if HUGE else ""))


def stop_after_the_dead_letter(event: RetryEvent) -> None:
    if event.kind is EventKind.DEAD_LETTERED:
        app.exit()


retry.add_hook(stop_after_the_dead_letter)


def broken_hook(event: RetryEvent) -> None:
    raise RuntimeError(f"hook bug on {event.kind}")


if HUGE:
    retry.add_hook(broken_hook)


@app.after_startup
async def send() -> None:
    await broker.publish("order-1", queue=queue, message_id="order-1")


if __name__ == "__main__":
    asyncio.run(app.run())
