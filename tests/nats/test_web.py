"""The dead-letter page on NATS JetStream (``create_app("nats://...")``), on a real server.

The overview is ``status --json``'s; a read lists the dead letters without a consumer (the
stream's messages and consumer count unchanged); a replay hands each to its subscriber;
the guard refuses a rebinding ``Host`` and a cross-site POST, in Chromium too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.nats.helpers import running, stream_count, stream_messages
from tests.nats.test_dlq_cli import App, dead
from tests.rabbit import eventually_async as until
from tests.web_support import (
    api_post,
    api_read,
    browser_attack,
    page_client,
    refuses_rebinding_and_cross_site,
    segment,
)

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from tests.nats.conftest import Names

pytestmark = [pytest.mark.nats, pytest.mark.timeout(180)]

pytest.importorskip("httpx")


async def test_the_page_lists_without_consuming_and_replays_to_the_subscriber(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """Overview, a read, the groups, one letter, a dry run, a replay: counted by id."""
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(5)
        await dead(js, app, 5)
        before = await stream_messages(js, app.dlq)
        async with page_client(nats_url, prefix=names.prefix) as client:
            status = (await client.get("/api/status")).json()
            assert status["system"] == "nats"
            assert status["broker"] == nats_url
            (row,) = [r for r in status["queues"] if r["queue"] == app.key]
            assert row["dlq"]["messages"] == 5
            overview = await client.get("/")
            assert overview.status_code == 200
            assert f'data-queue="{app.key}"' in overview.text
            queue_page = await client.get(f"/queues/{segment(app.key)}")
            assert "Holds 5 dead letter(s) now" in queue_page.text
            assert "consumes nothing" in queue_page.text
            missing = await client.get(f"/queues/none_{names.tag}.d")
            assert missing.status_code == 404, "no such dead-letter stream: a 404, as on RabbitMQ"
            assert "does not exist" in missing.text
            listing = await api_read(client, app.key)
            assert listing["queue"] == app.dlq
            assert listing["complete"] is True
            assert [r["message_id"] for r in listing["dead_letters"]] == [f"m{i}" for i in range(5)]
            assert await stream_messages(js, app.dlq) == before, "a read consumes nothing"
            assert (await js.stream_info(app.dlq)).state.consumer_count == 0
            groups = (await client.get(f"/api/queues/{segment(app.key)}/groups")).json()
            assert sum(g["count"] for g in groups["groups"]) == 5
            one = (await client.get(f"/api/queues/{segment(app.key)}/messages/m3")).json()
            assert one["reason"] == "permanent"
            dry = await api_post(client, app.key, "replay", {"ids": ["m1"], "dry_run": True})
            assert dry["selected"] == ["m1"]
            assert await stream_count(js, app.dlq) == 5
            app.broken = False
            done = await api_post(client, app.key, "replay", {"ids": ["m1", "m2"]})
            assert done["moved"] == 2
            assert done["to"] == app.key

            async def handled() -> bool:
                return app.done[1] == 1 and app.done[2] == 1

            await until(handled, 30, "the replayed two handled")
            assert await stream_count(js, app.dlq) == 3
            refused = await client.post(
                f"/api/queues/{segment(app.key)}/purge",
                json={"confirm": f"{app.key}.dlq"},
                headers={"X-CSRF-Token": "x"},
            )
            assert refused.status_code == 403, "no CSRF cookie: refused before the confirm"
    assert sorted(app.done) == [1, 2]


async def test_rebinding_host_and_cross_site_post_are_refused(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """The guard holds on a NATS-backed page: 403 before the server is asked; nothing moves."""
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(3)
        await dead(js, app, 3)

    async def held() -> object:
        return await stream_messages(js, app.dlq)

    await refuses_rebinding_and_cross_site(
        nats_url, app.key, f"{names.prefix}.dlq.{app.key}", held, prefix=names.prefix
    )
    assert await stream_count(js, app.dlq) == 0, "the page's own purge removed them"


@pytest.mark.browser
async def test_dns_rebinding_in_chromium_reads_and_purges_nothing(
    nats_url: str, names: Names, js: JetStreamContext
) -> None:
    """The RabbitMQ page's browser attack, on a NATS-backed page: every answer a 403."""
    app = App(nats_url, names)
    async with running(app.broker):
        await app.send(2)
        await dead(js, app, 2)
    before = await stream_messages(js, app.dlq)
    attack = await browser_attack(nats_url, app.key, "PermanentError", prefix=names.prefix)
    for step in ("list", "status", "queue", "letter", "read", "purge", "api_purge", "export"):
        assert attack[step][0] == 403, (step, attack[step])
    assert "PermanentError" not in "\n".join(attack["texts"])
    assert attack["csrf"] == ""
    assert await stream_messages(js, app.dlq) == before
