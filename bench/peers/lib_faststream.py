"""Bare FastStream: a subscriber that returns, no retry (the happy path's yardstick).

python -m bench.peers.lib_faststream happy      (run.py starts it in its own venv)
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from faststream.rabbit import Channel, RabbitBroker, RabbitQueue

from bench.peers import driver


class FastStream:
    name = "faststream"
    version = version("faststream")
    retries = False

    def make(self, base: str, queue: str, spec: driver.Spec | None, rec: driver.Recorder) -> Any:  # noqa: ARG002
        broker = RabbitBroker(driver.URL, default_channel=Channel(prefetch_count=driver.PREFETCH))
        context = broker.context

        @broker.subscriber(RabbitQueue(queue, durable=True))
        async def handler(body: Any) -> None:  # noqa: ARG001 - FastStream passes the body
            if rec.call(context.get_local("message").message_id) is not None:
                raise RuntimeError("bench: no retry configured")

        return broker

    async def start(self, app: RabbitBroker) -> None:
        await app.start()

    async def stop(self, app: RabbitBroker) -> None:
        await app.stop()


if __name__ == "__main__":
    driver.main(FastStream())
