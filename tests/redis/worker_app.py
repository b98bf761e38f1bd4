"""A replica of a retrying app, run as a subprocess and killed with SIGKILL by the tests.

``REDIS_URL``, ``STREAM``, ``CONSUMER``, ``CLAIM_IDLE_MS`` (the other replicas' own); a
message whose id is a multiple of 10 fails once. Each success is counted in the hash ``<STREAM>:done`` (id: times), written before
the handler returns, so a kill after it and before the acknowledgement counts twice.
"""

from __future__ import annotations

import asyncio
import os

from tests.redis.support import App

STREAM = os.environ["STREAM"]


async def main() -> None:
    """Run until killed."""
    app = App(
        os.environ["REDIS_URL"],
        STREAM,
        fails=lambda n, attempt: n % 10 == 0 and attempt == 1,
        max_attempts=10,
        delay_ms=200,
        consumer=os.environ["CONSUMER"],
        claim_idle_ms=int(os.environ["CLAIM_IDLE_MS"]),
        on_done=lambda n: app.client.hincrby(f"{STREAM}:done", str(n), 1),
    )
    await app.start()
    # Started: its subscriber reads from now on (the kill test publishes a wave only then).
    await app.client.set(f"{STREAM}:ready", os.getpid())
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
