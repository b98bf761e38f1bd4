"""The background tasks the mover and the claimer run beside the app: stopping them."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["stop_tasks"]

logger = logging.getLogger("faststream_retry.redis")


async def stop_tasks(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them; one that had died is logged, and the stop goes on."""
    for task in tasks:
        task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for task, outcome in zip(tasks, outcomes, strict=True):
        if isinstance(outcome, Exception):
            logger.error("task %s had stopped: %r", task.get_name(), outcome)
