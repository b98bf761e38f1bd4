"""The operator API: list a queue's dead letters, replay the exhausted ones."""

from faststream_retry.ops import (
    Selection,
    connect,
    list_dead_letters,
    replay_dead_letters,
)


async def replay_exhausted(url: str, queue: str) -> int:
    """Print 20 dead letters, replay the exhausted ones, return how many."""
    async with connect(url) as connection:
        found = await list_dead_letters(connection, queue, limit=20)
        for letter in found.taken:
            print(
                letter.key,
                letter.reason,
                letter.attempts,
                letter.exception,
                letter.body.preview(),
            )
        replayed = await replay_dead_letters(
            connection,
            queue,
            selection=Selection(reasons=frozenset({"exhausted"})),
            rate=100,
        )
    return len(replayed.taken)
