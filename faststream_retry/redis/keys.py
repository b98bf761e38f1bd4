"""The keys of a covered stream, all in the stream's hash slot (pure).

Redis Cluster runs a script only on keys of one hash slot, and a key's slot is that of
its hash tag, the text between its first ``{`` and the first ``}`` after it, when that
text is not empty; else that of the whole name. So every key one step touches starts
with the same tag ``P``: the stream's own name when it already has a tag
(``{tenant}.orders``), else ``{S}`` (``{orders}``, which hashes as ``orders`` does):

====================  ============  =============================================
``S``                 stream        the user's stream, unchanged
``P.retry``           sorted set    copy id, scored by due time (ms, the server's)
``P.retry.data``      hash          copy id: the copy (FastStream's encoded message)
``P.dlq``             stream        dead letters, capped (``MAXLEN ~``)
``P.retry.wake``      channel       the mover's nudge (not a key: no slot)
====================  ============  =============================================

A name with a ``}`` but no tag (``a}b``, ``{}x``) can share no slot with any key
derived from it: ``{a}b}`` hashes as ``a``, ``{{}x}.retry`` as ``{``. Such a stream is
refused (``stream_keys`` raises) with the fix: rename it, or give it a tag.

Two names can give the same ``P``: ``orders`` and ``{orders}`` (also ``a{b`` and
``{a{b}``), and a stream can be named as another's key (``{orders}.dlq``). Such streams
cannot both be covered (``clashes`` finds them), and a name ending ``.dlq`` is a
dead-letter key only when it is some stream's ``P.dlq`` (``dlq_owners``): the dead letters
of a stream named ``payments.dlq`` are in ``{payments.dlq}.dlq``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from faststream_retry.errors import RetryConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Clash", "StreamKeys", "clashes", "dlq_owners", "hash_tag", "stream_keys"]

RETRY_SUFFIX = ".retry"
DATA_SUFFIX = ".retry.data"
DLQ_SUFFIX = ".dlq"
WAKE_SUFFIX = ".retry.wake"
CLAIMER = "faststream-retry-claimer"
"""The consumer name the plugin's claimer takes a dead consumer's entries under: listed in a
covered group beside the app's own consumers, and not one of them."""


def hash_tag(name: str) -> str | None:
    """Return the text a cluster hashes ``name`` by when it has a tag, else ``None``.

    Redis' own rule (``keyHashSlot``): the first ``{``, then the first ``}`` after it,
    and something between them.
    """
    start = name.find("{")
    if start < 0:
        return None
    end = name.find("}", start + 1)
    if end <= start + 1:
        return None
    return name[start + 1 : end]


@dataclass(frozen=True, slots=True)
class StreamKeys:
    """The keys and channel of one covered stream; see the module docstring."""

    stream: str
    schedule: str
    data: str
    dlq: str
    wake: str


# A failure's step asks for its stream's keys each time: made once per stream (a few µs).
@functools.lru_cache(maxsize=1024)
def stream_keys(stream: str) -> StreamKeys:
    """Return the keys of ``stream``, every one in its slot; refuse a name no tag can follow."""
    if not stream:
        raise RetryConfigError("a Redis stream needs a name: the empty name cannot be covered")
    if hash_tag(stream) is not None:
        prefix = stream
    elif "}" in stream:
        raise RetryConfigError(
            f"stream {stream!r} cannot be covered: its name holds a '}}' but no hash tag, so no "
            "key derived from it can share its Redis Cluster slot and the retry step could "
            "not be one atomic script. Rename the stream without '}', or give it a hash tag "
            f"(for example '{{{stream.replace('}', '')}}}')"
        )
    else:
        prefix = "{" + stream + "}"
    return StreamKeys(
        stream=stream,
        schedule=prefix + RETRY_SUFFIX,
        data=prefix + DATA_SUFFIX,
        dlq=prefix + DLQ_SUFFIX,
        wake=prefix + WAKE_SUFFIX,
    )


@dataclass(frozen=True, slots=True)
class Clash:
    """Two covered streams that would share ``key``: ``second``'s name or derived key."""

    first: str
    second: str
    key: str
    """The key both would use."""
    role: str
    """What ``key`` is to ``first``: ``stream``, ``schedule``, ``data`` or ``dlq``."""
    other_role: str
    """What ``key`` is to ``second``."""


def clashes(streams: Iterable[str]) -> list[Clash]:
    """Return each pair of ``streams`` that would share a key (pure); ``[]``: none.

    Names ``stream_keys`` refuses are left out (refused on their own). Each pair is named
    once, by the first key they share, the streams in the order given.
    """
    owner: dict[str, tuple[str, str]] = {}
    found: dict[tuple[str, str], Clash] = {}
    for stream in dict.fromkeys(streams):
        try:
            named = stream_keys(stream)
        except RetryConfigError:
            continue
        mine = {
            named.stream: "stream",
            named.schedule: "schedule",
            named.data: "data",
            named.dlq: "dlq",
        }
        for key, role in mine.items():
            taken = owner.get(key)
            if taken is None:
                continue
            first, first_role = taken
            found.setdefault((first, stream), Clash(first, stream, key, first_role, role))
        for key, role in mine.items():
            owner.setdefault(key, (stream, role))
    return list(found.values())


def dlq_owners(key: str) -> tuple[str, ...]:
    """Return the streams whose dead-letter key is ``key`` (pure); ``()``: it is nobody's.

    ``{orders}.dlq`` is the key of ``orders`` and of ``{orders}`` (a start refuses covering
    both); ``{t}.orders.dlq`` of ``{t}.orders``; ``payments.dlq`` of none (its prefix has no
    tag: a stream of that name keeps its dead letters in ``{payments.dlq}.dlq``).
    """
    if not key.endswith(DLQ_SUFFIX):
        return ()
    prefix = key[: -len(DLQ_SUFFIX)]
    found: list[str] = []
    if prefix.startswith("{") and prefix.endswith("}"):
        inner = prefix[1:-1]
        try:
            if inner and stream_keys(inner).dlq == key:
                found.append(inner)
        except RetryConfigError:
            pass
    if hash_tag(prefix) is not None:
        found.append(prefix)
    return tuple(found)
