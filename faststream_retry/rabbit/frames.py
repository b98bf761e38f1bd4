"""The frame limit of a connection, and what a message's properties take of it.

Every publish of the package asks here first (``fits``): the plugin's copies, the
re-check's hops and releases, the worker's, and the operator command's passes, replays,
imports and migrations. See ``faststream_retry.core.fit`` for why and for what happens to a
copy that does not fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp.header import ContentHeader

from faststream_retry.core.fit import frame_bound, payload_limit

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pamqp import commands

__all__ = ["fits", "frame_limit", "header_size", "weigher"]


def frame_limit(channel: Any) -> int | None:  # noqa: ANN401 - aiormq's channel, any version
    """Return the payload bytes a frame may carry on ``channel``'s connection; ``None``: no limit.

    ``frame_max`` is what the broker proposed when the connection opened (aiormq takes
    it as is). A channel that does not say (a stand-in in a test) has no limit.
    """
    tune = getattr(getattr(channel, "connection", None), "connection_tune", None)
    frame_max = getattr(tune, "frame_max", None)
    return payload_limit(frame_max) if isinstance(frame_max, int) else None


def header_size(properties: commands.Basic.Properties, body_size: int) -> int:
    """Return the exact payload of the content header frame that carries ``properties``.

    Raises what the encoder raises for a value it cannot encode.
    """
    return len(ContentHeader(0, body_size, properties).marshal())


def fits(properties: commands.Basic.Properties, body_size: int, limit: int) -> bool:
    """Return whether a publish with ``properties`` fits in a frame payload of ``limit`` bytes.

    Quick for what is far below the limit; exact near it. Raises what the encoder
    raises for a value it cannot encode (near the limit only).
    """
    bound = frame_bound(properties.headers)
    if bound is not None and bound <= limit:
        return True
    return header_size(properties, body_size) <= limit


def weigher(
    properties: commands.Basic.Properties, body_size: int
) -> Callable[[Mapping[str, Any]], int]:
    """Return ``weigh(headers)``: the exact size of ``properties`` carrying those headers.

    It sets ``properties.headers`` each time it is called: set the headers chosen last.
    """

    def weigh(headers: Mapping[str, Any]) -> int:
        properties.headers = dict(headers)
        return header_size(properties, body_size)

    return weigh
