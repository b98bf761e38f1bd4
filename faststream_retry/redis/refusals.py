"""Why a Redis subscriber cannot be covered, each with its fix (pure).

The RabbitMQ start checks' and ``nats.checks``' equivalent for FastStream's Redis
subscribers: the middleware's runtime reads the subscribers and gathers these texts into
one ``RetryConfigError`` at start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.errors import RetryConfigError
from faststream_retry.redis.keys import clashes, stream_keys

if TYPE_CHECKING:
    from collections.abc import Iterable

    from faststream_retry.redis.keys import Clash

__all__ = [
    "batch",
    "claiming",
    "key_problems",
    "no_ack",
    "no_group",
    "not_a_stream",
    "shared_keys",
]

_OFF = "or switch its retries off with @retry_policy(enabled=False)"


def not_a_stream(kind: str, name: str) -> str:
    """The refusal of a pub/sub channel or a list subscriber whose handlers have retries on."""
    return (
        f"the subscriber of {kind} {name!r} reads a Redis {kind}: a message is gone once it "
        "is delivered, so a failed one has nowhere to wait for its retry and would be lost. "
        f"Use a stream with a consumer group: @broker.subscriber(stream=StreamSub({name!r}, "
        f"group=..., consumer=...)), {_OFF}"
    )


def no_group(stream: str) -> str:
    """The refusal of a stream subscriber that reads without a consumer group."""
    return (
        f"the subscriber of stream {stream!r} reads it without a consumer group (XREAD): "
        "nothing is acknowledged, so a failure cannot be kept. Give it a group and a consumer "
        f"name: StreamSub({stream!r}, group=..., consumer=...), {_OFF}"
    )


def no_ack(stream: str) -> str:
    """The refusal of a stream subscriber that reads with ``NOACK``."""
    return (
        f"the subscriber of stream {stream!r} reads with no_ack=True: an entry is "
        "acknowledged as it is delivered, so a failure cannot be kept. Leave no_ack off, "
        f"{_OFF}"
    )


def batch(stream: str) -> str:
    """The refusal of a batch stream subscriber (not covered yet)."""
    return (
        f"the subscriber of stream {stream!r} takes batches (StreamSub(batch=True)): one "
        "failure of a batch cannot be told apart per entry, and retries of batches are not "
        f"built yet. Use batch=False, {_OFF}"
    )


def claiming(stream: str, option: str, value: object) -> str:
    """The refusal of a covered stream whose subscriber claims pending entries itself."""
    return (
        f"the subscriber of stream {stream!r} claims pending entries itself "
        f"(StreamSub({option}={value!r})): the plugin claims them too, and FastStream's "
        "claim takes entries a live replica still holds (read, not yet handled), so they "
        "are handled twice and its claims count no attempt. Leave "
        f"{option} out (the plugin's claimer takes a dead consumer's entries after "
        f"RetryMiddleware(claim_idle=...)), {_OFF}"
    )


_ROLES = {
    "schedule": "the retry schedule",
    "data": "the hash of retry copies",
    "dlq": "the dead-letter stream",
}
_ONE_OFF = "or switch one's retries off with @retry_policy(enabled=False)"


def shared_keys(clash: Clash) -> str:
    """The refusal of two covered streams that would share a key."""
    first, second = clash.first, clash.second
    if "stream" in {clash.role, clash.other_role}:
        named, owner = (first, second) if clash.role == "stream" else (second, first)
        role = clash.other_role if clash.role == "stream" else clash.role
        harm = (
            f"would write the dead letters of {owner!r} into a stream an app reads, and a "
            f"dlq purge of {owner!r} would delete the messages of {named!r}"
            if role == "dlq"
            else f"could not keep the retries of {owner!r}: the key is the stream {named!r}"
        )
        return (
            f"streams {owner!r} and {named!r} are both covered, and {named!r} is "
            f"{_ROLES[role]} of {owner!r}: the plugin {harm}. Rename {named!r}, {_ONE_OFF}"
        )
    return (
        f"streams {first!r} and {second!r} are both covered, and would share their retry "
        f"keys ({clash.key!r}, the hash of retry copies and the dead-letter stream): each "
        "one's mover would put the other's retries into its own stream, and copies of equal "
        "entry ids would overwrite each other. Rename one of them (moving a stream to a "
        f"hash-tagged name: drain the old one before covering the new one), {_ONE_OFF}"
    )


def key_problems(streams: Iterable[str]) -> list[str]:
    """The refusals of covered stream names: one no hash tag can follow, two sharing a key."""
    named = sorted(streams)
    found = []
    for stream in named:
        try:
            stream_keys(stream)
        except RetryConfigError as unnamed:  # noqa: PERF203 - a few names, once at start
            found.append(str(unnamed))
    return found + [shared_keys(clash) for clash in clashes(named)]
