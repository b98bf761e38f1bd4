"""On RabbitMQ a dead letter's log line and hook name ``<queue>.dlq`` as before, and that
queue holds the letter (the place the NATS and Redis lines now name their own way)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from faststream_retry import PermanentError
from faststream_retry.core.events import EventKind
from tests.dead_letter_lines import dead_letter_lines
from tests.rabbit import App, drain, eventually, unique

if TYPE_CHECKING:
    from aio_pika.abc import AbstractRobustConnection

pytestmark = pytest.mark.rabbit

DEAD = 3


async def test_the_dead_letter_line_names_the_dlq_queue_that_holds_the_letter(
    make_app: Any, amqp: AbstractRobustConnection
) -> None:
    """Each line says ``from <queue> to <queue>.dlq``, the hook's ``dlq`` the same; the
    ``.dlq`` holds one letter per message id the lines name."""
    app: App = make_app()
    queue = unique("invoices")

    @app.broker.subscriber(queue)
    async def handle(body: dict[str, Any]) -> None:
        raise PermanentError(f"invoice {body['id']} is bad")

    with dead_letter_lines() as lines:
        await app.start()
        for n in range(DEAD):
            await app.broker.publish({"id": n}, queue=queue, message_id=f"inv-{n}")
        dead = await drain(amqp, f"{queue}.dlq", expect=DEAD)
        await eventually(lambda: len(lines.places) == DEAD, what=f"{DEAD} dead-letter lines")
    assert lines.places == {f"inv-{n}": f"{queue}.dlq" for n in range(DEAD)}
    assert sorted(str(m.message_id) for m in dead) == sorted(lines.places)
    for line in lines.lines:
        assert f" from {queue} to {queue}.dlq: reason=permanent attempt=1/" in line
    events = {e.message_id: e.dlq for e in app.events if e.kind is EventKind.DEAD_LETTERED}
    assert events == lines.places
