"""Stand-ins for a real service's clients (an SMTP library, an HTTP client)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Response:
    """What an HTTP client answers."""

    status_code: int
    headers: dict[str, str] = field(default_factory=dict)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}")


async def deliver(to: str, text: str) -> None:
    """Send one mail; raises ``SMTPException`` while the server is down."""


async def post(url: str, body: object) -> Response:
    """POST ``body`` as JSON to ``url``."""
    return Response(200)
