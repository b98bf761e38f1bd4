"""The dead-letter page on Redis Streams (``create_app("redis://...")``), on a real server.

The overview is ``status --json``'s; a read lists the dead letters with ``XRANGE`` (no
group, the entries unchanged); a replay puts each back in its stream; the guard refuses a
rebinding ``Host`` and a cross-site POST, in Chromium too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.redis.support import until
from tests.redis.test_dlq_cli import App, dead, entries
from tests.web_support import (
    api_post,
    api_read,
    browser_attack,
    page_client,
    refuses_rebinding_and_cross_site,
    segment,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

pytest.importorskip("httpx")


async def test_the_page_lists_without_consuming_and_replays_to_the_stream(
    redis_url: str, stream: str, client: Redis
) -> None:
    """Overview, a read, the groups, one letter, a dry run, a replay: counted by id."""
    app = App(redis_url, stream)
    await app.broker.start()
    try:
        await app.send(5)
        await dead(client, app, 5)
        before = await entries(client, app.dlq)
        async with page_client(redis_url) as page:
            status = (await page.get("/api/status")).json()
            assert status["system"] == "redis"
            assert status["prefix"] is None
            (row,) = [r for r in status["queues"] if r["queue"] == stream]
            assert row["dlq"]["messages"] == 5
            overview = await page.get("/")
            assert overview.status_code == 200
            assert f'data-queue="{stream}"' in overview.text
            queue_page = await page.get(f"/queues/{segment(stream)}")
            assert "Holds 5 dead letter(s) now" in queue_page.text
            assert "XRANGE" in queue_page.text
            listing = await api_read(page, stream)
            assert listing["queue"] == app.dlq
            assert [r["message_id"] for r in listing["dead_letters"]] == [f"m{i}" for i in range(5)]
            assert await entries(client, app.dlq) == before, "a read consumes nothing"
            assert await client.xinfo_groups(app.dlq) == []
            by_key = await page.get(f"/queues/{segment(app.dlq)}")
            assert by_key.status_code == 200, "the .dlq key names the same dead letters"
            one = (await page.get(f"/api/queues/{segment(stream)}/messages/m3")).json()
            assert one["reason"] == "permanent"
            dry = await api_post(page, stream, "replay", {"ids": ["m1"], "dry_run": True})
            assert dry["selected"] == ["m1"]
            assert int(await client.xlen(app.dlq)) == 5
            app.broken = False
            done = await api_post(page, stream, "replay", {"ids": ["m1", "m2"]})
            assert done["moved"] == 2

            async def handled() -> bool:
                return app.done[1] == 1 and app.done[2] == 1

            await until(handled, 30, "the replayed two handled")
            assert int(await client.xlen(app.dlq)) == 3
    finally:
        await app.broker.stop()
    assert sorted(app.done) == [1, 2]


async def test_rebinding_host_and_cross_site_post_are_refused(
    redis_url: str, stream: str, client: Redis
) -> None:
    """The guard holds on a Redis-backed page: 403 before the server is asked; nothing moves."""
    app = App(redis_url, stream)
    await app.broker.start()
    try:
        await app.send(3)
        await dead(client, app, 3)
    finally:
        await app.broker.stop()

    async def held() -> object:
        return await entries(client, app.dlq)

    await refuses_rebinding_and_cross_site(redis_url, stream, app.dlq, held)
    assert int(await client.xlen(app.dlq)) == 0, "the page's own purge removed them"


@pytest.mark.browser
async def test_dns_rebinding_in_chromium_reads_and_purges_nothing(
    redis_url: str, stream: str, client: Redis
) -> None:
    """The RabbitMQ page's browser attack, on a Redis-backed page: every answer a 403."""
    app = App(redis_url, stream)
    await app.broker.start()
    try:
        await app.send(2)
        await dead(client, app, 2)
    finally:
        await app.broker.stop()
    before = await entries(client, app.dlq)
    attack = await browser_attack(redis_url, stream, "PermanentError")
    for step in ("list", "status", "queue", "letter", "read", "purge", "api_purge", "export"):
        assert attack[step][0] == 403, (step, attack[step])
    assert "PermanentError" not in "\n".join(attack["texts"])
    assert attack["csrf"] == ""
    assert await entries(client, app.dlq) == before
