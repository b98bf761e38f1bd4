"""easy-faststream (StreamApp over FastStream 0.7): per-attempt TTL queues on a retry exchange.

    python -m bench.peers.lib_easy_faststream <scenario>      (run.py starts it in its own venv)

@app.consumer(..., retries=3, retry_delay=d, retry_backoff=1.0): queues <queue>.retry.1..3
bound to a topic retry exchange, dead-lettering back; <queue>.dead on a dead-letter
exchange. The exchanges are named after the run's prefix, so cleanup finds them. The
handler takes the pydantic payload easy-faststream requires and raises RetryableError.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

from easy_faststream import (  # type: ignore[import-not-found]
    RetryableError,
    StreamApp,
    StreamSettings,
)
from easy_faststream.context import MessageContext  # type: ignore[import-not-found]
from pydantic import BaseModel

from bench.peers import driver


class Payload(BaseModel):
    i: int
    pad: str = ""


class EasyFastStream:
    name = "easy-faststream"
    version = version("easy-faststream")
    retries = True

    def make(self, base: str, queue: str, spec: driver.Spec | None, rec: driver.Recorder) -> Any:
        assert spec is not None  # noqa: S101
        settings = StreamSettings(
            rabbitmq_url=driver.URL,
            app_name="bench",
            default_exchange=f"{base}.events",
            retry_exchange=f"{base}.retry",
            dlq_exchange=f"{base}.dead",
            rabbitmq_prefetch_count=driver.PREFETCH,
            log_level="WARNING",
        )
        app = StreamApp(settings)

        @app.consumer(
            event=queue,
            schema=Payload,
            queue=queue,
            retries=3,
            retry_delay=spec.delay,
            retry_backoff=1.0,
        )
        async def handler(payload: Payload, ctx: MessageContext) -> None:  # noqa: ARG001
            if rec.call(ctx.message_id) is not None:
                raise RetryableError("bench: fails once")

        return app

    async def start(self, app: Any) -> None:
        await app.app.start()

    async def stop(self, app: Any) -> None:
        await app.app.stop()


if __name__ == "__main__":
    driver.main(EasyFastStream())
