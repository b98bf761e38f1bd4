"""The dead-letter page in a real browser (Debian's chromium, driven by Playwright), on a
real broker: groups appear, a message opens, a group is replayed and its handler runs,
a purge asks for its confirmation, a read-only page cannot act, an action without its
token is refused, and hostile bodies and headers stay text.

The screenshots of each page go to ``$FASTSTREAM_RETRY_SCREENSHOTS`` when it is set (the
docs' images: ``docs/assets/web``), else to the test's temporary directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aio_pika
import pytest

from faststream_retry import PermanentError
from faststream_retry.core import headers as h
from faststream_retry.web import create_app
from tests.integration.test_cli_dlq import declare, delete, ids_in
from tests.rabbit import App, eventually, eventually_async, queue_depth, unique
from tests.web_support import attacked_chromium

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from aio_pika.abc import AbstractRobustConnection
    from playwright.async_api import Browser, Page

playwright = pytest.importorskip("playwright.async_api")
uvicorn = pytest.importorskip("uvicorn")

pytestmark = [pytest.mark.rabbit, pytest.mark.browser]

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000  # a loaded CI (three lanes starting at once) took over 15 s for a read once


@contextlib.asynccontextmanager
async def chromium(*extra: str) -> AsyncIterator[Browser]:
    """Debian's Chromium, headless, with ``extra`` arguments."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no chromium at {CHROMIUM}: scripts/test installs Debian's package")
        pytest.skip(f"no chromium at {CHROMIUM}")
    async with playwright.async_playwright() as p:
        launched = await p.chromium.launch(executable_path=CHROMIUM, args=[*ARGS, *extra])
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


@pytest.fixture
def shots(tmp_path: Path) -> Callable[[Page, str], Any]:
    where = Path(os.environ.get("FASTSTREAM_RETRY_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)

    async def shot(page: Page, name: str) -> None:
        await page.screenshot(path=str(where / f"{name}.png"))

    return shot


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(
    rabbit_url: str, *, seen: list[str] | None = None, **options: Any
) -> AsyncIterator[str]:
    """Serve the page (uvicorn, in this loop) and yield its base URL.

    ``seen``: the path of every request the page gets is added to it.
    """
    port = free_port()
    options.setdefault("trusted_proxies", ())  # as the command serves it: nothing forwards
    page = create_app(rabbit_url, **options)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if seen is not None and scope["type"] == "http":
            seen.append(scope["path"])
        await page(scope, receive, send)

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            proxy_headers=False,
        )
    )
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started, what="the page's server to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def new_page(browser: Browser) -> Page:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    return page


async def read_queue(page: Page, base: str, queue: str) -> None:
    """Open a queue's page and read its dead letters (the page reads only when asked)."""
    await page.goto(f"{base}/queues/{queue}")
    await page.locator("#read button").click()
    await page.locator("#groups").wait_for()


async def test_a_group_appears_opens_and_is_replayed_until_its_handler_runs(
    make_app: Callable[..., App],
    amqp: AbstractRobustConnection,
    rabbit_url: str,
    browser: Browser,
    shots: Callable[[Page, str], Any],
) -> None:
    """Two causes, two groups; one replayed from the page: each message handled once more."""
    app = make_app()
    queue = unique("orders")
    fixed = {"on": False}
    handled: list[str] = []

    @app.broker.subscriber(queue)
    async def take(body: dict[str, int]) -> None:
        if body["kind"] == 1 and fixed["on"]:
            handled.append(str(body["n"]))
            return
        if body["kind"] == 1:
            raise PermanentError(f"order {body['n']} not found")
        raise PermanentError(f"card {body['n']} refused for 'user{body['n']}'")

    await app.start()
    for n in range(5):
        await app.broker.publish({"kind": 1 if n < 3 else 2, "n": n}, queue=queue)
    await eventually_async(
        lambda: _depth_is(amqp, f"{queue}.dlq", 5), what="5 dead letters", timeout=20
    )
    async with serving(rabbit_url, allow_actions=True, prefix=app.prefix) as base:
        page = await new_page(browser)
        await page.goto(f"{base}/")
        await page.locator(f'#queues tr[data-queue="{queue}"]').wait_for()
        assert (
            await page.locator(f'tr[data-queue="{queue}"] [data-field="dlq"]').inner_text() == "5"
        )
        await shots(page, "overview")
        await page.click(f'a[href="/queues/{queue}"]')
        assert "Not read yet" in await page.locator("#read-at").inner_text()
        await page.locator("#read button").click()
        rows = page.locator("#groups tbody tr")
        assert await rows.count() == 2
        counts = sorted([await rows.nth(i).locator("td").first.inner_text() for i in range(2)])
        assert counts == ["2", "3"]
        assert "order <n> not found" in await page.locator("#groups").inner_text()
        await shots(page, "queue")
        await page.locator("#groups tr", has_text="order <n> not found").locator("a").click()
        await page.locator("#letters").wait_for()
        assert await page.locator('#letters input[name="id"]').count() == 3
        await shots(page, "group")
        await page.locator("#letters tbody a").first.click()
        await page.locator("pre.traceback").wait_for()
        assert "PermanentError" in await page.locator("h1").inner_text()
        assert "retry-reason" in await page.locator("pre.headers").first.inner_text()
        await shots(page, "message")
        await page.go_back()
        fixed["on"] = True
        await page.click("text=Replay selected")
        await page.locator("h1", has_text="Replayed 3 to").wait_for()
        await shots(page, "replayed")
    await eventually(lambda: len(handled) == 3, what="the 3 replayed handled", timeout=20)
    assert sorted(handled) == ["0", "1", "2"]
    await eventually_async(
        lambda: _depth_is(amqp, f"{queue}.dlq", 2), what="the other group left", timeout=20
    )


async def _depth_is(amqp: AbstractRobustConnection, queue: str, count: int) -> bool:
    return await queue_depth(amqp, queue) == count


async def seeded(
    amqp: AbstractRobustConnection, *letters: tuple[str, bytes, dict[str, Any]]
) -> str:
    """A work queue and its quorum .dlq holding ``(id, body, extra headers)`` dead letters."""
    queue = unique("web")
    await declare(amqp, queue, "classic")
    await declare(amqp, f"{queue}.dlq", "quorum")
    channel = await amqp.channel()
    for message_id, body, extra in letters:
        record = h.FailureRecord.of(PermanentError("refused"), attempt=1, at_ms=h.now_ms())
        headers = h.dead_letter_headers(extra, record, reason="permanent", origin_queue=queue)
        await channel.default_exchange.publish(
            aio_pika.Message(body, message_id=message_id, headers=headers),
            routing_key=f"{queue}.dlq",
        )
    await channel.close()
    return queue


async def test_a_purge_needs_the_queues_name_typed(
    amqp: AbstractRobustConnection, rabbit_url: str, browser: Browser
) -> None:
    queue = await seeded(amqp, ("p1", b"{}", {}), ("p2", b"{}", {}))
    try:
        async with serving(rabbit_url, allow_actions=True) as base:
            page = await new_page(browser)
            await page.goto(f"{base}/queues/{queue}")
            purge = page.locator("section.danger form")
            await purge.locator('input[name="confirm"]').fill(queue)  # not the .dlq's name
            await purge.locator("button").click()
            await page.locator(".error", has_text=f"type the queue's name, {queue}.dlq").wait_for()
            assert await queue_depth(amqp, f"{queue}.dlq") == 2
            await page.goto(f"{base}/queues/{queue}")
            await purge.locator('input[name="confirm"]').fill(f"{queue}.dlq")
            await purge.locator("button").click()
            await page.locator("h1", has_text="Purged 2 from").wait_for()
        assert await queue_depth(amqp, f"{queue}.dlq") == 0
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


async def test_a_read_only_page_has_no_working_action(
    amqp: AbstractRobustConnection,
    rabbit_url: str,
    browser: Browser,
    shots: Callable[[Page, str], Any],
) -> None:
    queue = await seeded(amqp, ("r1", b"{}", {}))
    try:
        async with serving(rabbit_url) as base:
            page = await new_page(browser)
            await read_queue(page, base, queue)  # a read is no action: a read-only page reads
            assert await page.locator("section.danger").count() == 0
            await page.locator("#groups a").first.click()
            await page.locator("#letters").wait_for()
            assert await page.locator("form, button, section.danger").count() == 0
            assert await page.locator(".mode").inner_text() == "read-only"
            await shots(page, "read-only")
            # Posted anyway, with the page's own cookie: refused, and nothing moves.
            refused = await page.request.post(
                f"{base}/queues/{queue}/replay", form={"id": "r1", "csrf": "x"}
            )
            assert refused.status == 403
            assert "read-only" in await refused.text()
        assert await ids_in(amqp, f"{queue}.dlq") == ["r1"]
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


async def test_an_action_without_its_tokens_is_refused(
    amqp: AbstractRobustConnection, rabbit_url: str, browser: Browser
) -> None:
    """No CSRF token: refused. With a page token set, nothing shows until it is given."""
    queue = await seeded(amqp, ("c1", b"{}", {}))
    try:
        async with serving(rabbit_url, allow_actions=True, token="s3cret") as base:
            page = await new_page(browser)
            await page.goto(f"{base}/queues/{queue}")
            assert "a token is needed" in await page.locator(".error").inner_text()
            await page.goto(f"{base}/login?token=s3cret")
            await read_queue(page, base, queue)
            await page.locator("#groups a").first.click()
            await page.locator("#letters").wait_for()
            # The page's form with its CSRF field emptied, as another site's form would be.
            await page.locator('#replay input[name="csrf"]').evaluate("e => e.value = ''")
            await page.click("text=Replay selected")
            await page.locator(".error", has_text="CSRF").wait_for()
        assert await ids_in(amqp, f"{queue}.dlq") == ["c1"]
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


async def test_hostile_bodies_and_headers_render_as_text(
    amqp: AbstractRobustConnection,
    rabbit_url: str,
    browser: Browser,
    shots: Callable[[Page, str], Any],
) -> None:
    script = b"<script>window.__pwned=1</script>"
    queue = await seeded(
        amqp,
        ("h1", script, {"x-note": "<img src=x onerror=window.__pwned=2>"}),
        ("h2", b"\xff\xfe\x00\x1b[31mred", {}),
        ("h3", b"A" * (1024 * 1024), {}),
    )
    try:
        async with serving(rabbit_url) as base:
            page = await new_page(browser)
            await read_queue(page, base, queue)
            await page.goto(f"{base}/queues/{queue}/messages/h1")
            body = await page.locator("pre.body").inner_text()
            assert body == script.decode()
            assert "<img src=x onerror" in await page.locator("pre.headers").first.inner_text()
            assert await page.evaluate("typeof window.__pwned") == "undefined"
            await shots(page, "hostile")
            await page.goto(f"{base}/queues/{queue}/messages/h2")
            assert (await page.locator("pre.body").inner_text()).startswith("ff fe 00 1b")
            await page.goto(f"{base}/queues/{queue}/messages/h3")
            cut = await page.locator("pre.body").inner_text()
            assert cut.endswith("more characters (the export has every byte)")
            assert await page.evaluate("typeof window.__pwned") == "undefined"
        assert sorted(await ids_in(amqp, f"{queue}.dlq")) == ["h1", "h2", "h3"]
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


def test_chromium_is_debians() -> None:
    """The tests use the distribution's browser: Playwright's own download is not used."""
    if not Path(CHROMIUM).exists() and os.environ.get("CI") != "true":
        pytest.skip("no chromium")
    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists()


ATTACKER = "rebind.attacker.test"
ATTACK = """<!doctype html><title>cat pictures</title><script>
(async () => {
  const q = %(queue)s, out = {texts: []};
  async function go(method, path, init) {
    try {
      const r = await fetch(path, Object.assign({method: method, credentials: "include"}, init));
      const text = await r.text();
      out.texts.push(text);
      return [r.status, text];
    } catch (e) { return [0, String(e)]; }
  }
  out.list = await go("GET", "/api/queues/" + q + "/dead-letters");
  out.status = await go("GET", "/api/status");
  out.queue = await go("GET", "/queues/" + q);
  out.letter = await go("GET", "/queues/" + q + "/messages/secret-1");
  const m = /name="csrf" value="([^"]+)"/.exec(out.queue[1]);
  const csrf = m ? m[1] : "";
  out.csrf = csrf;
  out.read = await go("POST", "/api/queues/" + q + "/read", {headers: {"X-CSRF-Token": csrf}});
  out.purge = await go("POST", "/queues/" + q + "/purge",
                       {body: new URLSearchParams({csrf: csrf, confirm: q + ".dlq"})});
  out.api_purge = await go("POST", "/api/queues/" + q + "/purge",
    {headers: {"X-CSRF-Token": csrf, "Content-Type": "application/json"},
     body: JSON.stringify({confirm: q + ".dlq"})});
  out.export = await go("POST", "/queues/" + q + "/export",
                        {body: new URLSearchParams({csrf: csrf})});
  window.__attack = out;
})();
</script>"""


@pytest.fixture
async def attacked_browser() -> AsyncIterator[Browser]:
    """Chromium resolving the attacker's name to this machine: DNS rebinding, done."""
    async with attacked_chromium() as launched:
        yield launched


async def test_dns_rebinding_reads_nothing_and_purges_nothing(
    amqp: AbstractRobustConnection, rabbit_url: str, attacked_browser: Browser
) -> None:
    """A script of the attacker's origin, its name now 127.0.0.1, asks the page everything.

    The page has no token (its default) and actions on, and the operator read the queue
    moments ago (what the page shows is there to take). Every answer is a refusal.
    """
    queue = await seeded(amqp, ("secret-1", b'{"card": "4111"}', {}), ("secret-2", b"{}", {}))
    try:
        async with serving(rabbit_url, allow_actions=True) as base:
            operator = await new_page(attacked_browser)
            await read_queue(operator, base, queue)
            port = base.rsplit(":", 1)[1]
            evil = await new_page(attacked_browser)
            # The attacker's own server answers the first load; every later request of that
            # origin goes where the name now resolves: to the page, on its port.
            script = ATTACK % {"queue": json.dumps(queue)}
            await evil.route(
                f"http://{ATTACKER}:{port}/cats",
                lambda route: route.fulfill(status=200, content_type="text/html", body=script),
            )
            await evil.goto(f"http://{ATTACKER}:{port}/cats")
            await evil.wait_for_function("window.__attack !== undefined", timeout=WAIT_MS)
            attack = await evil.evaluate("window.__attack")
        for step in ("list", "status", "queue", "letter", "read", "purge", "api_purge", "export"):
            assert attack[step][0] == 403, (step, attack[step])
        everything = "\n".join(attack["texts"])
        assert "secret-1" not in everything
        assert "4111" not in everything
        assert attack["csrf"] == ""  # no page of its own handed it the form's token
        assert await ids_in(amqp, f"{queue}.dlq") == ["secret-1", "secret-2"]
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


async def test_a_cross_site_image_moves_no_message(
    amqp: AbstractRobustConnection, rabbit_url: str, attacked_browser: Browser
) -> None:
    """Another site's ``<img>`` of every view: the quorum DLQ is not passed through.

    Each dead letter is delivered and given back once first, so it comes back
    ``redelivered``: a pass would republish it, and its copy would be a first delivery.
    """
    queue = await seeded(amqp, ("i1", b"{}", {}), ("i2", b"{}", {}))
    try:
        seen: list[str] = []
        async with serving(rabbit_url, allow_actions=True, seen=seen) as base:
            operator = await new_page(attacked_browser)
            await read_queue(operator, base, queue)
            await _deliver_once(amqp, f"{queue}.dlq")
            views = [
                f"/queues/{queue}",
                f"/queues/{queue}/messages/i1",
                f"/queues/{queue}/export",
                f"/api/queues/{queue}/dead-letters",
                f"/api/queues/{queue}/messages/i1",
            ]
            images = "".join(
                f'<img src="{base}{v}" onerror="done()" onload="done()">' for v in views
            )
            html = (
                f"<!doctype html><script>var n = 0; function done() {{ n += 1; }}</script>{images}"
            )
            evil = await new_page(attacked_browser)
            seen.clear()
            await evil.route(
                "http://evil.test/",
                lambda route: route.fulfill(status=200, content_type="text/html", body=html),
            )
            await evil.goto("http://evil.test/")
            await evil.wait_for_function(f"n === {len(views)}", timeout=WAIT_MS)
            assert sorted(seen) == sorted(views)  # each reached the page
        channel = await amqp.channel()
        dlq = await channel.get_queue(f"{queue}.dlq")
        marks = []
        while (message := await dlq.get(fail=False, no_ack=False)) is not None:
            marks.append((message.message_id, message.redelivered))
        await channel.close()
        assert marks == [("i1", True), ("i2", True)]
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


async def _deliver_once(amqp: AbstractRobustConnection, dlq: str) -> None:
    channel = await amqp.channel()
    queue = await channel.get_queue(dlq)
    taken = []
    while (message := await queue.get(fail=False, no_ack=False)) is not None:
        taken.append(message)
    for message in taken:
        await message.nack(requeue=True)
    await channel.close()
