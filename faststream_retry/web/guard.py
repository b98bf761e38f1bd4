"""Who may look and who may act: the token, loopback, CSRF, and the audit line.

- Without a token, only clients on loopback are served: a page mounted into a service
  that listens on every interface does not show dead letters to the network.
- With a token, every request shows it: ``Authorization: Bearer <token>``, or the
  cookie that ``/login?token=...`` sets (HttpOnly, SameSite=Strict).
- Every action (a POST) carries the CSRF token of the page it came from: a form field
  or an ``X-CSRF-Token`` header equal to the page's cookie (double submit), from the
  same origin. A request authenticated by its ``Authorization`` header needs none: a
  browser never adds that header to another site's request.
- Each action is logged as one line on ``faststream_retry.web.audit``: who, what, on
  which queue, how many.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["AUDIT", "CSRF_COOKIE", "TOKEN_COOKIE", "Guard", "is_loopback"]

TOKEN_COOKIE = "fsr_token"  # noqa: S105 - a cookie's name, not a secret
CSRF_COOKIE = "fsr_csrf"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"

AUDIT = logging.getLogger("faststream_retry.web.audit")


def is_loopback(host: str | None) -> bool:
    """Return whether ``host`` (a client's address) is this machine."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Guard:
    """The page's rules: its token (``None``: loopback only) and whether actions are on."""

    token: str | None
    actions: bool

    def refusal(self, request: Request, *, api: bool = False) -> str | None:
        """Return why ``request`` may not see anything, or ``None`` when it may.

        ``api``: the answer is for a script (the JSON API), not a person at a page.
        """
        if self.token is None:
            client = request.client.host if request.client else None
            if is_loopback(client):
                return None
            return (
                "this page serves clients on this machine only; start it with a token "
                "(faststream-retry web --token ..., or create_app(token=...)) to serve others"
            )
        if not (self._is_token(request.cookies.get(TOKEN_COOKIE, "")) or self.by_header(request)):
            if api:
                return "unauthorized: send the page's token as 'Authorization: Bearer <token>'"
            return "a token is needed: open /login?token=<token>, or send Authorization: Bearer"
        return None

    def _is_token(self, sent: str) -> bool:
        """Whether ``sent`` is the page's token (compared in constant time)."""
        return (
            self.token is not None
            and bool(sent)
            and hmac.compare_digest(sent.encode(), self.token.encode())
        )

    def by_header(self, request: Request) -> bool:
        """Return whether ``request`` proved itself by its ``Authorization`` header."""
        header = request.headers.get("authorization", "")
        return header.lower().startswith("bearer ") and self._is_token(header[7:].strip())

    def who(self, request: Request) -> str:
        """Name the requester for the audit line: address, and which token (a hash)."""
        client = request.client.host if request.client else "?"
        if self.token is None:
            return client
        digest = hashlib.sha256(self.token.encode()).hexdigest()[:8]
        return f"{client} token:{digest}"

    @staticmethod
    def csrf_of(request: Request) -> str:
        """Return the page's CSRF token: its cookie's, or a new one (``remember`` sets it)."""
        return request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)

    @staticmethod
    def remember(response: Response, request: Request, csrf: str) -> None:
        """Set the CSRF cookie on ``response`` when the request did not have it."""
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(
                CSRF_COOKIE, csrf, httponly=True, samesite="strict", path="/", secure=False
            )

    def csrf_refusal(self, request: Request, sent: str | None, *, api: bool = False) -> str | None:
        """Return why an action's CSRF check fails, or ``None`` when it passes.

        ``api``: the answer is for a script (the JSON API), not a person at a form.
        """
        if self.by_header(request):
            return None
        origin = request.headers.get("origin")
        if origin and origin != "null":
            host = request.headers.get("host", "")
            if urlsplit(origin).netloc != host:
                return f"an action from another origin ({origin}) is refused"
        if request.headers.get("sec-fetch-site") not in (None, "same-origin", "none"):
            return "an action from another site is refused"
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
            if api:
                return (
                    "forbidden: authenticate with 'Authorization: Bearer <token>', or send "
                    f"the {CSRF_COOKIE} cookie's value in an X-CSRF-Token header"
                )
            return "the form's CSRF token is missing or stale: reload the page and try again"
        return None
