"""List queues through RabbitMQ's management HTTP API, which AMQP itself cannot do.

Standard library only (``urllib``): the operator command adds no HTTP dependency. The
URL carries the credentials (``http://user:password@host:15672``), as the AMQP URL does.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from faststream_retry.ops.common import OperationError

__all__ = ["Listed", "list_queues", "vhost_of"]

TIMEOUT_S = 10.0


def vhost_of(amqp_url: str) -> str:
    """Return the virtual host an AMQP URL names (``/`` when it names none)."""
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


@dataclass(frozen=True, slots=True)
class Listed:
    """A queue as the management API lists it."""

    name: str
    undeliverable: int = 0
    """Messages a quorum queue dead-lettered at least once and could not deliver yet
    (``messages_dlx``): their target is gone or refuses them. AMQP does not count them."""


def list_queues(management_url: str, vhost: str, timeout: float = TIMEOUT_S) -> list[Listed]:
    """Return every queue in ``vhost`` (blocking: run it in a thread).

    Raises:
        OperationError: the URL is not http(s), or the API cannot be reached, refuses
            the login or answers something that is not a list of queues.
    """
    parts = urlsplit(management_url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise OperationError(
            f"--management-url takes http(s)://user:password@host:port, got {management_url!r}"
        )
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    url = f"{base}/api/queues/{quote(vhost, safe='')}?columns=name,messages_dlx"
    request = urllib.request.Request(url)  # noqa: S310 - the scheme is checked above
    user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - checked
            rows = json.load(response)
    except urllib.error.HTTPError as exc:
        raise OperationError(
            f"the management API at {base} answered {exc.code} {exc.reason}"
        ) from exc
    except (OSError, ValueError) as exc:  # unreachable, timed out, not JSON
        raise OperationError(f"cannot read the management API at {base}: {exc}") from exc
    if not isinstance(rows, list):
        raise OperationError(f"the management API at {base} did not answer a list of queues")
    return [
        Listed(row["name"], _count(row.get("messages_dlx")))
        for row in rows
        if isinstance(row, dict) and isinstance(row.get("name"), str)
    ]


def _count(value: object) -> int:
    """A count the API gave, or 0 (a classic queue has none; an old broker omits it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
