"""The ``faststream-retry`` command: see, explain, replay and migrate retries and dead letters.

A thin layer over ``faststream_retry.ops``: parsing, tables and progress bars here,
every broker operation there. Needs the ``cli`` extra (typer and rich).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Run the command line (the ``faststream-retry`` console script)."""
    try:
        from faststream_retry.cli._app import app  # noqa: PLC0415 - typer is an extra
    except ImportError as exc:
        if exc.name not in {"typer", "rich", "click"}:
            raise
        sys.stderr.write(
            f"faststream-retry: the command needs the cli extra ({exc.name} is missing): "
            "pip install 'faststream-retry[cli]'\n"
        )
        sys.exit(3)
    app()
