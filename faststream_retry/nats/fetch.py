"""One pull of the plugin's pull consumers (re-check, hand-over), and letting one go.

Nothing there yet is no news; a server hiccup is logged and waited out for a pause (no
hot loop); a closed connection ends the loop (the broker is stopping).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import nats.errors

from faststream_retry.reporting.log import log

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ["fetch", "stop_loop"]


async def fetch(
    sub: Any,  # noqa: ANN401 - nats-py's PullSubscription
    batch: int,
    timeout_s: float,
    *,
    pause_s: float,
    what: str,
) -> list[Msg] | None:
    """Return what one pull of up to ``batch`` brought; ``None``: the connection closed."""
    try:
        fetched: list[Msg] = await sub.fetch(batch, timeout=timeout_s)
    except (asyncio.TimeoutError, nats.errors.TimeoutError):
        return []
    except nats.errors.ConnectionClosedError:
        return None
    except Exception as exc:  # a server hiccup: pull again after a pause
        log.warning("faststream-retry: %s: %r", what, exc)
        await asyncio.sleep(pause_s)
        return []
    return fetched


async def stop_loop(task: asyncio.Task[None] | None, sub: Any, *, cancel: bool) -> None:  # noqa: ANN401 - nats-py's PullSubscription
    """End a consumer's loop (``cancel``: at once, else once its pull is done) and unbind.

    The durable consumer stays on the server for the next start.
    """
    if task is not None:
        if cancel:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if sub is not None:
        with contextlib.suppress(Exception):  # a closed connection: nothing to unbind
            await sub.unsubscribe()
