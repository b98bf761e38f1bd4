"""The typer application: one sub-module per command (group) registers itself here."""

from __future__ import annotations

import typer

from faststream_retry.cli import dlq, doctor, explain, migrate, status, worker

__all__ = ["app"]

app = typer.Typer(
    name="faststream-retry",
    help=(
        "See, explain, replay and migrate faststream-retry's retries and dead letters; "
        "run the retry worker."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for module in (status, explain, doctor, dlq, migrate, worker):
    module.register(app)


def __getattr__(name: str) -> object:
    # The click command typer builds from the app, for the docs' CLI reference
    # (mkdocs-click); built on demand, so the command line does not build it twice.
    if name == "command":
        return typer.main.get_command(app)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
