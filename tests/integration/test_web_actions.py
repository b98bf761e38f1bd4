"""The dead-letter page's actions on a real broker, through its forms (no browser):
a replay the page follows as a job, and one stopped half-way, counted by id."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from faststream_retry.web import create_app
from tests.integration.test_cli_dlq import declare, delete, ids_in, seed
from tests.rabbit import eventually_async, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit


def page_client(rabbit_url: str, **options: Any) -> httpx.AsyncClient:
    """The page as ``faststream-retry web`` serves it, asked from this machine."""
    app = create_app(rabbit_url, allow_actions=True, trusted_proxies=(), **options)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    return httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1", timeout=60, follow_redirects=True
    )


def csrf_in(page: str) -> str:
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token is not None, page
    return token[1]


async def read(client: httpx.AsyncClient, queue: str, *, api: bool = False) -> str:
    """Ask the page to read ``queue``'s DLQ (its Read button); return the page it ends on."""
    page = await client.get(f"/queues/{queue}")
    assert page.status_code == 200, page.text
    if api:
        token = csrf_in(page.text)
        answer = await client.post(f"/api/queues/{queue}/read", headers={"X-CSRF-Token": token})
        assert answer.status_code == 200, answer.text
        return answer.text
    done = await client.post(f"/queues/{queue}/read", data={"csrf": csrf_in(page.text)})
    assert done.status_code == 200, done.text
    if "/jobs/" in done.url.path:  # a long read: the page follows it as a job

        async def over() -> bool:
            state = (await client.get(f"/api{done.url.path}")).json()["state"]
            return bool(state != "running")

        await eventually_async(over, timeout=60, what="the read to end")
        done = await client.get(f"/queues/{queue}")
    return done.text


async def group_form(client: httpx.AsyncClient, queue: str) -> tuple[list[str], str]:
    """The only group's ids, as its form lists them, and the page's CSRF token."""
    groups = re.findall(r'data-group="([0-9a-f]+)"', await read(client, queue))
    assert len(groups) == 1
    page = (await client.get(f"/queues/{queue}/groups/{groups[0]}")).text
    ids = re.findall(r'name="id" value="([^"]+)" checked', page)
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token is not None
    return ids, token[1]


async def job_state(client: httpx.AsyncClient, job: str) -> dict[str, object]:
    answer = await client.get(f"/api{job}")
    return dict(answer.json())


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_stopped_replay_moves_each_dead_letter_once_or_leaves_it(
    amqp: AbstractRobustConnection, rabbit_url: str, queue_type: str
) -> None:
    """Stop half-way: what moved is in the work queue once, the rest is in the DLQ once."""
    queue = unique("web-stop")
    await declare(amqp, queue, "classic")
    await declare(amqp, f"{queue}.dlq", queue_type)
    sent = [f"m{n}" for n in range(900)]
    try:
        await seed(amqp, queue, [(i, "exhausted", b"{}", "application/json") for i in sent])
        async with page_client(rabbit_url) as client:
            ids, token = await group_form(client, queue)
            assert sorted(ids) == sorted(sent)
            # 900 moves at the page's 200 a second: still running when the request returns.
            started = await client.post(
                f"/queues/{queue}/replay", data={"csrf": token, "id": ids}, follow_redirects=False
            )
            assert started.status_code == 303
            job = started.headers["location"]
            assert (await job_state(client, job))["state"] == "running"
            stop = await client.post(f"{job}/stop", data={"csrf": token}, follow_redirects=False)
            assert stop.status_code == 303

            async def ended() -> bool:
                return (await job_state(client, job))["state"] != "running"

            await eventually_async(ended, timeout=30, what="the job to stop")
            state = await job_state(client, job)
            assert state["state"] == "stopped"
            page = (await client.get(job)).text
            assert "stopped" in page
        replayed, left = await ids_in(amqp, queue), await ids_in(amqp, f"{queue}.dlq")
        assert 0 < len(replayed) < len(sent)
        assert sorted(replayed + left) == sorted(sent)  # each once: none lost, none twice
    finally:
        await delete(amqp, queue, f"{queue}.dlq")


async def test_a_replay_the_page_follows_to_its_end(
    amqp: AbstractRobustConnection, rabbit_url: str
) -> None:
    queue = unique("web-replay")
    await declare(amqp, queue, "classic")
    await declare(amqp, f"{queue}.dlq", "quorum")
    sent = [f"m{n}" for n in range(5)]
    try:
        await seed(amqp, queue, [(i, "permanent", b"{}", "application/json") for i in sent])
        async with page_client(rabbit_url) as client:
            ids, token = await group_form(client, queue)
            done = await client.post(f"/queues/{queue}/replay", data={"csrf": token, "id": ids[:3]})
            assert done.status_code == 200
            assert "Replayed 3 to" in done.text
            refused = await client.post(f"/queues/{queue}/replay", data={"id": ids})
            assert refused.status_code == 403  # no CSRF token: nothing more moves
        await asyncio.sleep(0)
        assert await ids_in(amqp, queue) == sent[:3]
        assert await ids_in(amqp, f"{queue}.dlq") == sent[3:]
    finally:
        await delete(amqp, queue, f"{queue}.dlq")
