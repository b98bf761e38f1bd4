"""The app killed with SIGKILL three times mid-burst and started again, under the real app.

FastStream reads the whole backlog at once, so each kill leaves every entry the process had
read and not settled pending in its consumer's name; the restarted process (same name) is
not their reader any more, and the claimer brings them back after ``claim_idle``, each
counted as a lost attempt. Counted by id: nothing lost; processed twice only an entry
the kill left unacknowledged (pending for the killed consumer: the one in hand, or one
handled whose ``XACK``, batched beside the handlers, Redis had not stored; the guarantees
are at least once), at most one a kill more than the batch's bound; a failure's step is
one script, so never a copy twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from faststream_retry.redis import acks, settling
from tests.faults.support import Timeline, stopped
from tests.redis.fault_support import (
    Ledger,
    Tally,
    Worker,
    Workload,
    check_outcomes,
    drained,
    late,
    publish,
    record,
    server_of,
    settle,
    until_up,
)
from tests.redis.support import pending_ids

if TYPE_CHECKING:
    from pathlib import Path

    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.fault, pytest.mark.timeout(300)]

N = 400
KILLS = 3


async def test_the_app_killed_three_times_mid_burst_loses_nothing(
    redis_url: str, client: Redis, stream: str, tmp_path: Path
) -> None:
    """400 messages; SIGKILL after 60, 140 and 220 of them were processed, and again each
    time its restart: every id processed or dead-lettered, none lost."""
    timeline = Timeline()
    workload = Workload(N)
    tally = Tally(workload.ids)
    ledger = Ledger(tmp_path / "ledger")
    app = Worker(redis_url, stream, "c1", ledger.path)
    unacknowledged: set[str] = set()
    try:
        await app.start()
        await publish(client, stream, workload.ids)
        for kill in range(KILLS):
            mark = 60 + 80 * kill

            async def reached(mark: int = mark) -> bool:
                return len(ledger.ids()) >= mark

            await until_up(reached, f"{mark} processed")
            pending = (await client.xpending(stream, "g"))["pending"]
            await app.kill()
            unacknowledged |= await pending_ids(client, stream, "g", "c1")
            timeline(f"SIGKILL {kill + 1} with {pending} entries pending")
            await app.start()
        seconds = await settle(tally, client, stream, ledger, timeout=120, what="SIGKILL x3")
        timeline("settled")

        await drained(client, stream)
        await stopped("stopping the app", app.stop())
        duplicates = await late(client, stream)
        server = await server_of(client)
    finally:
        await stopped("stopping the app", app.stop())
    check_outcomes(workload, tally)
    assert app.kills == KILLS
    twice = {m for m in tally.processed if tally.processed.count(m) > 1}
    assert twice <= unacknowledged, f"handled again once acknowledged: {twice - unacknowledged}"
    # In hand at a kill: one handler, the handled ones whose XACK waited, the failures'
    # steps in flight.
    bound = KILLS * (1 + acks.DEFAULT_BOUND + settling.DEFAULT_BOUND)
    assert tally.duplicates <= bound, f"more than was in hand at the kills: {tally.duplicates}"
    assert duplicates == 0, "nothing comes back once every id settled"
    record("app SIGKILL x3 mid-burst", server, tally, duplicates, seconds, faults="3 SIGKILLs")
