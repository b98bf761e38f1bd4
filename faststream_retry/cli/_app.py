"""The typer application: one sub-module per command (group) registers itself here."""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated

import typer

from faststream_retry.cli import dlq, doctor, explain, migrate, status, web, worker

__all__ = ["app"]

app = typer.Typer(
    name="faststream-retry",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(asked: bool) -> None:
    if asked:
        typer.echo(f"faststream-retry {version('faststream-retry')}")
        raise typer.Exit


@app.callback()
def _root(
    _: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """See, explain, replay and migrate retries and dead letters; run the retry worker.

    Exit status: 0 done, 1 done and something needs action, 2 a usage error,
    3 could not do what was asked (under --json, a JSON error on stdout says why),
    130 stopped by Ctrl-C or a signal.
    """


for module in (status, explain, doctor, dlq, migrate, worker, web):
    module.register(app)
