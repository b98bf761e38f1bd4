"""``faststream-retry dlq ...``: list, show, replay, purge, export and import dead letters."""

from __future__ import annotations

import typer

__all__ = ["register"]

dlq = typer.Typer(help="Look at dead letters and send them back.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``dlq`` group to ``app``."""
    app.add_typer(dlq, name="dlq")
