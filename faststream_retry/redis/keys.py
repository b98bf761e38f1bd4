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
"""

from __future__ import annotations

from dataclasses import dataclass

from faststream_retry.errors import RetryConfigError

__all__ = ["StreamKeys", "hash_tag", "stream_keys"]

RETRY_SUFFIX = ".retry"
DATA_SUFFIX = ".retry.data"
DLQ_SUFFIX = ".dlq"
WAKE_SUFFIX = ".retry.wake"


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
