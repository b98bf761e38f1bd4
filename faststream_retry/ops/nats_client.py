"""A connection to NATS for an operator's command: it fails at once and never reconnects.

Shared by ``doctor`` on NATS and the dead-letter store. Needs nats-py.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import nats

from faststream_retry.ops.common import CONNECT_TIMEOUT_S, OperationError, safe_nats_url

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = ["connect_client"]


async def connect_client(url: str, timeout: float = CONNECT_TIMEOUT_S) -> Client:
    """Connect to the server(s) at ``url`` (comma-separated); the caller closes the client.

    Raises:
        OperationError: no server can be reached.
    """
    servers = [one.strip() for one in url.split(",") if one.strip()]
    try:
        # Once per server, quietly: nats-py otherwise retries for ever (its
        # max_reconnect_attempts=0 means no limit) and prints each failure's traceback.
        return await asyncio.wait_for(
            nats.connect(
                servers=servers,
                connect_timeout=timeout,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                error_cb=_quiet,
            ),
            timeout * (len(servers) + 1),
        )
    except Exception as exc:  # any failure to connect is the same answer to an operator
        raise OperationError(
            f"cannot reach the NATS server at {safe_nats_url(url)}: {exc!r}"
        ) from exc


async def _quiet(error: Exception) -> None:
    """nats-py's error callback: the failure is the command's to say, once."""
