"""``explain``: what the plugin does for an application's queues, with no connection."""

from __future__ import annotations

from typing import TYPE_CHECKING

from faststream_retry.ops.common import OperationError
from faststream_retry.ops.explanation import Explanation, explain_plan

if TYPE_CHECKING:
    from faststream_retry.middleware.app import LoadedApp

__all__ = ["explain"]


def explain(loaded: LoadedApp) -> Explanation:
    """Return, for every subscriber of ``loaded``, its policy, schedule and declared objects.

    Pure: reads the app's plan and policies, connects to nothing. ``to_json()`` of the
    result is the stable shape ``faststream-retry explain --json`` prints.

    Raises:
        OperationError: a custom ``Backoff`` of the app raised while computing delays.
    """
    try:
        return explain_plan(
            loaded.spec,
            loaded.plan,
            loaded.config.default,
            list(zip(loaded.routes, loaded.handler_names, strict=True)),
        )
    except Exception as exc:  # the app's own backoff code: report it, do not crash
        raise OperationError(
            f"{loaded.spec}: computing the retry schedule raised {type(exc).__name__}: {exc}"
        ) from exc
