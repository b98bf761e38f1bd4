"""The dead-letter page on NATS and Redis, as the RabbitMQ page's tests drive it.

What the page must hold on every broker: the JSON API answers in the command's shapes,
a read is asked for and consumes nothing, a replay and a purge go through the broker's
store; and its guard is the same: a rebinding ``Host`` and a cross-site POST are refused
before the broker is asked anything.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import TYPE_CHECKING, Any

import httpx

from faststream_retry.web import create_app

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

PORT = 8765
BASE = f"http://127.0.0.1:{PORT}"
REBOUND = f"rebind.attacker.test:{PORT}"


def page_client(url: str, **options: Any) -> httpx.AsyncClient:
    """The page as ``faststream-retry web --allow-actions`` serves it, asked from this machine."""
    options.setdefault("trusted_proxies", ())
    app = create_app(url, allow_actions=True, **options)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    return httpx.AsyncClient(transport=transport, base_url=BASE, timeout=60, follow_redirects=True)


def csrf_in(page: str) -> str:
    """The CSRF token of a page's forms."""
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token is not None, page
    return token[1]


def segment(name: str) -> str:
    """A name in a page's URL, as the page links it."""
    from urllib.parse import quote  # noqa: PLC0415

    return quote(name, safe="")


async def token_of(client: httpx.AsyncClient, queue: str) -> str:
    """Open ``queue``'s page (it sets the CSRF cookie) and return its forms' token."""
    page = await client.get(f"/queues/{segment(queue)}")
    assert page.status_code == 200, page.text
    return csrf_in(page.text)


async def api_read(client: httpx.AsyncClient, queue: str) -> dict[str, Any]:
    """``POST /api/queues/<queue>/read``: the listing it answers."""
    token = await token_of(client, queue)
    answer = await client.post(
        f"/api/queues/{segment(queue)}/read", headers={"X-CSRF-Token": token}
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def api_post(
    client: httpx.AsyncClient, queue: str, action: str, body: dict[str, Any]
) -> dict[str, Any]:
    """An API action with the page's own CSRF token; the answer, which must be a 200."""
    token = await token_of(client, queue)
    answer = await client.post(
        f"/api/queues/{segment(queue)}/{action}",
        headers={"X-CSRF-Token": token, "Content-Type": "application/json"},
        content=json.dumps(body),
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def refuses_rebinding_and_cross_site(
    url: str,
    queue: str,
    confirm: str,
    held: Callable[[], Awaitable[object]],
    **options: Any,
) -> None:
    """A rebinding ``Host`` gets 403 on every path; a cross-site POST too; nothing moves.

    ``held``: what the broker holds of ``queue``'s dead letters, compared before and
    after. Then the page's own purge, with the same token, does work: the refusals
    were the guard's, not a broken page's.
    """
    before = await held()
    async with page_client(url, **options) as client:
        q = segment(queue)
        paths = [
            ("GET", "/"),
            ("GET", "/api/status"),
            ("GET", f"/queues/{q}"),
            ("GET", f"/api/queues/{q}/dead-letters"),
            ("POST", f"/queues/{q}/read"),
            ("POST", f"/api/queues/{q}/read"),
            ("POST", f"/queues/{q}/export"),
            ("POST", f"/queues/{q}/purge"),
            ("POST", f"/api/queues/{q}/purge"),
        ]
        token = await token_of(client, queue)
        for method, path in paths:
            rebound = await client.request(
                method,
                path,
                headers={
                    "Host": REBOUND,
                    "Origin": f"http://{REBOUND}",
                    "Sec-Fetch-Site": "same-origin",
                    "X-CSRF-Token": token,
                },
                data={"csrf": token, "confirm": confirm} if method == "POST" else None,
            )
            assert rebound.status_code == 403, (method, path, rebound.text)
        for origin, site in (("https://evil.test", "cross-site"), ("null", "cross-site")):
            forged = await client.post(
                f"/queues/{q}/purge",
                data={"csrf": token, "confirm": confirm},
                headers={"Origin": origin, "Sec-Fetch-Site": site},
            )
            assert forged.status_code == 403, forged.text
            assert "another" in forged.text
        no_token = await client.post(f"/api/queues/{q}/purge", json={"confirm": confirm})
        assert no_token.status_code == 403, no_token.text
        as_get = await client.get(f"/queues/{q}/purge")
        assert as_get.status_code == 405, "a mutation is a POST only"
        assert await held() == before, "nothing read away, moved or removed"
        own = await client.post(
            f"/api/queues/{q}/purge",
            headers={"X-CSRF-Token": token, "Origin": BASE},
            json={"confirm": confirm},
        )
        assert own.status_code == 200, own.text
        assert own.json()["removed"] > 0


@contextlib.asynccontextmanager
async def attacked_chromium() -> AsyncIterator[Any]:
    """Chromium resolving the attacker's name to this machine: DNS rebinding, done."""
    from tests.integration.test_web_browser import ATTACKER, chromium  # noqa: PLC0415

    rule = f"--host-resolver-rules=MAP {ATTACKER} 127.0.0.1"
    # Chromium's own Local Network Access check blocks such a request from a public page;
    # Firefox, Safari and older Chromium do not, so the page must refuse it itself: off.
    unguarded = (
        "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,"
        "PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults"
    )
    async with chromium(rule, unguarded) as launched:
        yield launched


async def browser_attack(url: str, queue: str, secret: str, **options: Any) -> dict[str, Any]:
    """DNS rebinding in Chromium against a page on ``url``: the attacker's script's answers.

    The operator reads ``queue`` first (what the page shows is there to take); then a
    page of the attacker's name, resolved to 127.0.0.1, asks the page everything.
    """
    from tests.integration.test_web_browser import (  # noqa: PLC0415 - playwright's
        ATTACK,
        ATTACKER,
        WAIT_MS,
        new_page,
        read_queue,
        serving,
    )

    async with attacked_chromium() as browser, serving(url, allow_actions=True, **options) as base:
        operator = await new_page(browser)
        await read_queue(operator, base, segment(queue))
        assert secret in await operator.content(), "the operator's read shows the secret"
        port = base.rsplit(":", 1)[1]
        evil = await new_page(browser)
        script = ATTACK % {"queue": json.dumps(segment(queue))}
        await evil.route(
            f"http://{ATTACKER}:{port}/cats",
            lambda route: route.fulfill(status=200, content_type="text/html", body=script),
        )
        await evil.goto(f"http://{ATTACKER}:{port}/cats")
        await evil.wait_for_function("window.__attack !== undefined", timeout=WAIT_MS)
        return dict(await evil.evaluate("window.__attack"))
