"""Who may look and who may act: the host, the client, the token, CSRF, and the audit line.

- The page answers only the ``Host`` names it is: loopback names and the address it
  serves, on its port, and the ``hosts`` it is given (a page with a token and no
  ``hosts`` answers any), so a page reached by another name (DNS rebinding: an
  attacker's name resolved to 127.0.0.1) shows nothing and does nothing.
- Without a token, only clients on this machine are served, and only when the page
  knows who its client is: the server in front of it does not forward others
  (``trusted_proxies=()``, what ``faststream-retry web`` says of its own server), or the
  proxies it trusts say who sent the request (their ``X-Forwarded-For``). A page
  mounted in another app, or behind a proxy it was not told about, needs a token.
- With a token, every request shows it: ``Authorization: Bearer <token>``, or the
  cookie that ``/login?token=...`` sets (HttpOnly, SameSite=Strict, the page's path,
  ``Secure`` over TLS), which holds a value derived from the token, not the token.
- Every action (a POST) carries the CSRF token of the page it came from: a form field
  or an ``X-CSRF-Token`` header equal to the page's cookie (double submit), from the
  page's own origin. A request authenticated by its ``Authorization`` header needs none:
  a browser never adds that header to another site's request.
- Each action is one line on ``faststream_retry.web.audit`` (``audit``): who, what, on
  which queue, how many; every value in it escaped and cut, so no name or error text
  can end the line or forge another.
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
    from collections.abc import Iterable

    from starlette.requests import Request
    from starlette.responses import Response

__all__ = [
    "AUDIT",
    "CSRF_COOKIE",
    "TOKEN_COOKIE",
    "Guard",
    "Refusal",
    "audit",
    "is_loopback",
    "plain",
    "proxy_networks",
]

TOKEN_COOKIE = "fsr_token"  # noqa: S105 - a cookie's name, not a secret
CSRF_COOKIE = "fsr_csrf"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"

AUDIT = logging.getLogger("faststream_retry.web.audit")

FORWARDING_HEADERS = (
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "cf-connecting-ip",
    "via",
)
"""Headers a proxy adds: a request that has one came through something that forwards."""
_PLAIN_CHARS = 300
_SESSION = b"faststream-retry web session"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def is_loopback(host: str | None) -> bool:
    """Return whether ``host`` (a client's address, or a name) is this machine."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def plain(value: object, limit: int = _PLAIN_CHARS) -> str:
    """Return ``value`` as text for one log line: every unprintable character escaped, cut.

    A newline (or U+2028, or a bidirectional override) in a queue name or an error
    text must not start a line of its own in the audit log, nor turn one around.
    """
    text = str(value)
    shown = "".join(
        ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[:limit]
    )  # ascii(): \n, \x1b, \u202e
    if len(text) > limit:
        shown += f"… ({len(text):,} characters)"
    return shown


def audit(message: str, *args: object) -> None:
    """Log one audit line: ``message`` %-formatted with ``args``, each made ``plain``."""
    AUDIT.info(message, *(a if isinstance(a, int) else plain(a) for a in args))


def proxy_networks(proxies: Iterable[str] | None) -> tuple[Network, ...] | None:
    """Return the addresses (or networks, ``10.0.0.0/8``) of ``proxies``; ``None`` stays ``None``.

    Raises:
        ValueError: an entry is not an address or a network, with the entry named.
    """
    if proxies is None:
        return None
    return tuple(_network(entry) for entry in proxies)


def _network(entry: str) -> Network:
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"trusted_proxies takes addresses or networks (127.0.0.1, 10.0.0.0/8), got {entry!r}"
        ) from None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Return the address of an ``X-Forwarded-For`` entry (``1.2.3.4:80``, ``[::1]:80``)."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def _split_host(host: str) -> tuple[str, int | None]:
    """Return the name and port of a ``Host`` value (``[::1]:8765`` -> ``::1``, 8765)."""
    host = host.strip().lower()
    name, port = host, ""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":")
    elif host.count(":") == 1:
        name, port = host.split(":", 1)
    if not port:
        return name.rstrip("."), None
    return name.rstrip("."), int(port) if port.isdigit() and len(port) <= 5 else -1


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is not served, and the HTTP status that says so."""

    why: str
    status: int = 401


@dataclass(frozen=True, slots=True)
class Guard:
    """The page's rules: its token, whether actions are on, its hosts and its proxies.

    ``token``: ``None`` serves clients on this machine only. ``hosts``: ``Host`` values
    the page answers besides loopback (``name`` or ``name:port``). ``proxies``: the
    proxies whose ``X-Forwarded-For`` names the client; ``()`` when nothing forwards to
    the page; ``None`` when that is not known (then only a token lets anyone in).
    """

    token: str | None
    actions: bool
    hosts: tuple[str, ...] = ()
    proxies: tuple[Network, ...] | None = None

    # ------------------------------------------------------------------ who is asking
    def _trusted(self, host: str | None) -> bool:
        address = _address(host or "")
        return address is not None and any(address in net for net in self.proxies or ())

    def client(self, request: Request) -> tuple[str | None, str | None]:
        """Return the client's address, and why it cannot be known (``None`` when it can).

        The connection's address, unless it is a proxy the page trusts: then the
        last address of ``X-Forwarded-For`` that is not one of those proxies.
        """
        peer = request.client.host if request.client else None
        sent = [name for name in FORWARDING_HEADERS if name in request.headers]
        if not sent:
            return peer, None
        if not self._trusted(peer):
            return peer, (
                f"this request came through a proxy ({sent[0]}), and the page was not told to "
                "trust one"
            )
        chain = [
            entry
            for value in request.headers.getlist("x-forwarded-for")
            for entry in value.split(",")
        ]
        addresses = [_address(entry) for entry in chain]
        if not chain or any(a is None for a in addresses):
            return peer, "the proxy did not say who sent this request (X-Forwarded-For)"
        for address in reversed(addresses):
            if not any(address in net for net in self.proxies or ()):
                return str(address), None
        return str(addresses[0]), None

    def scheme(self, request: Request) -> str:
        """Return ``http`` or ``https``: as the browser sees the page (a trusted proxy's say)."""
        peer = request.client.host if request.client else None
        forwarded = request.headers.get("x-forwarded-proto", "")
        if forwarded and self._trusted(peer):
            return "https" if forwarded.split(",")[0].strip().lower() == "https" else "http"
        return "https" if request.url.scheme in ("https", "wss") else "http"

    # ------------------------------------------------------------------ the host
    def _host_problem(self, host: str | None, request: Request) -> str | None:
        """Return why ``host`` (``Host``, or an ``Origin``'s) is not this page, if it is not."""
        if host is None:
            return "a request without a Host header is not served"
        name, port = _split_host(host)
        for allowed in self.hosts:
            a_name, a_port = _split_host(allowed)
            if a_name == name and (a_port is None or a_port == port):
                return None
        server = request.scope.get("server")
        bound, served = (
            (str(server[0]).lower(), server[1])
            if isinstance(server, (tuple, list)) and len(server) > 1
            else (None, None)
        )
        default = 443 if self.scheme(request) == "https" else 80
        # Loopback names, and the address the connection came to (the URL the command
        # prints): an attacker's page cannot be of either origin.
        if (is_loopback(name) or name == bound) and (served is None or (port or default) == served):
            return None
        if self.token is not None and not self.hosts:
            return None  # a token's page answers any name, unless told its names
        return (
            f"this page does not answer to the name {plain(host, 80)!r}: only to "
            + ("loopback names on its port" if not self.hosts else ", ".join(self.hosts))
            + " (a page reached by another name may be a DNS rebinding attack; "
            "start it with --allowed-host, or create_app(hosts=[...]), to add a name)"
        )

    # ------------------------------------------------------------------ the gate
    def refusal(self, request: Request, *, api: bool = False) -> Refusal | None:
        """Return why ``request`` may not see anything, or ``None`` when it may.

        ``api``: the answer is for a script (the JSON API), not a person at a page.
        """
        if (problem := self._host_problem(request.headers.get("host"), request)) is not None:
            return Refusal(("forbidden: " if api else "") + problem, 403)
        if self.token is None:
            return self._local_only(request)
        if not (self._is_session(request.cookies.get(TOKEN_COOKIE, "")) or self.by_header(request)):
            if api:
                return Refusal(
                    "unauthorized: send the page's token as 'Authorization: Bearer <token>'"
                )
            return Refusal(
                "a token is needed: open /login?token=<token>, or send Authorization: Bearer"
            )
        return None

    def _local_only(self, request: Request) -> Refusal | None:
        """The rule of a page without a token: a client on this machine, known to be."""
        fix = "start it with a token (faststream-retry web --token ..., or create_app(token=...))"
        if self.proxies is None:
            return Refusal(
                "this page has no token and does not know who its clients are (mounted in "
                f"another app, or behind a proxy): {fix}, or say what forwards to it "
                "(create_app(trusted_proxies=[]) when nothing does)"
            )
        client, problem = self.client(request)
        if problem is not None:
            return Refusal(f"{problem}: a page without a token serves this machine only; {fix}")
        if not is_loopback(client):
            return Refusal(f"this page serves clients on this machine only; {fix} to serve others")
        return None

    # ------------------------------------------------------------------ the token
    def _is_token(self, sent: str) -> bool:
        """Whether ``sent`` is the page's token (compared in constant time)."""
        return (
            self.token is not None
            and bool(sent)
            and hmac.compare_digest(sent.encode(), self.token.encode())
        )

    def session(self) -> str:
        """Return the login cookie's value: derived from the token, never the token itself.

        A cookie goes to every port of its host: another service on this machine that
        receives it gets a key to this page's cookie, not the token its scripts use.
        """
        assert self.token is not None  # noqa: S101 - only a token's page logs in
        return hmac.new(self.token.encode(), _SESSION, hashlib.sha256).hexdigest()

    def _is_session(self, sent: str) -> bool:
        return (
            self.token is not None
            and bool(sent)
            and hmac.compare_digest(sent.encode(), self.session().encode())
        )

    def login_refusal(self, sent: str) -> str | None:
        """Return why ``/login?token=sent`` sets no cookie, or ``None`` when it does.

        Only the page's token: another value would replace the operator's cookie with
        a wrong one (another site's link logging the operator out).
        """
        return None if self._is_token(sent) else "that is not this page's token"

    def by_header(self, request: Request) -> bool:
        """Return whether ``request`` proved itself by its ``Authorization`` header."""
        header = request.headers.get("authorization", "")
        return header.lower().startswith("bearer ") and self._is_token(header[7:].strip())

    def who(self, request: Request) -> str:
        """Name the requester for the audit line: address, and which token (a hash)."""
        client, problem = self.client(request)
        where = plain(client or "?", 64) + (" (via a proxy)" if problem else "")
        if self.token is None:
            return where
        digest = hashlib.sha256(self.token.encode()).hexdigest()[:8]
        return f"{where} token:{digest}"

    # ------------------------------------------------------------------ cookies
    def cookie_options(self, request: Request) -> dict[str, object]:
        """The page's cookies' scope: its own path, HttpOnly, SameSite=Strict, Secure over TLS."""
        return {
            "httponly": True,
            "samesite": "strict",
            "path": request.scope.get("root_path", "") or "/",
            "secure": self.scheme(request) == "https",
        }

    @staticmethod
    def csrf_of(request: Request) -> str:
        """Return the page's CSRF token: its cookie's, or a new one (``remember`` sets it)."""
        return request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)

    def remember(self, response: Response, request: Request, csrf: str) -> None:
        """Set the CSRF cookie on ``response`` when the request did not have it."""
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(CSRF_COOKIE, csrf, **self.cookie_options(request))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ CSRF
    def _origin_problem(self, request: Request) -> str | None:
        """Return why the request's ``Origin`` is not the page itself, if it is not."""
        origin = request.headers.get("origin")
        if origin is None:
            return None  # not a browser's cross-site request: Sec-Fetch-Site and the token decide
        parts = urlsplit(origin)
        if (
            origin == "null"
            or parts.scheme != self.scheme(request)
            or parts.netloc.lower() != request.headers.get("host", "").lower()
            or self._host_problem(parts.netloc, request) is not None
        ):
            return f"an action from another origin ({plain(origin, 80)}) is refused"
        return None

    def csrf_refusal(self, request: Request, sent: str | None, *, api: bool = False) -> str | None:
        """Return why an action's CSRF check fails, or ``None`` when it passes.

        ``api``: the answer is for a script (the JSON API), not a person at a form.
        """
        if self.by_header(request):
            return None
        if (problem := self._origin_problem(request)) is not None:
            return problem
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
