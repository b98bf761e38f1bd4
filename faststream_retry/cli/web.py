"""``faststream-retry web``: serve the dead-letter page (the ``web`` extra)."""

from __future__ import annotations

import logging
import secrets
from typing import Annotated

import typer

from faststream_retry.cli._common import (
    AppUrl,
    Factory,
    Prefix,
    app_and_broker,
    err,
    examined,
    fail,
)
from faststream_retry.cli.status import (  # noqa: TC001 - typer reads them at runtime
    AppOption,
    ManagementUrl,
)
from faststream_retry.core.defaults import PREFIX

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``web`` command to ``app``."""
    app.command("web")(web)


def web(
    *,
    app: AppOption = None,
    factory: Factory = False,
    management_url: ManagementUrl = None,
    url: AppUrl = None,
    prefix: Prefix = PREFIX,
    host: Annotated[
        str,
        typer.Option("--host", help="Address to listen on; anything but loopback needs a token."),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8765,
    allow_actions: Annotated[
        bool,
        typer.Option("--allow-actions", help="Allow replay and purge (read-only without it)."),
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="FASTSTREAM_RETRY_WEB_TOKEN",
            help="Required of every request; made up and printed when --host is not loopback.",
        ),
    ] = None,
    jaeger_url: Annotated[
        str | None,
        typer.Option("--jaeger-url", help="A Jaeger UI: a dead letter's trace id links there."),
    ] = None,
    allowed_hosts: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A name the page answers to (repeatable), besides loopback names and the "
            "address it serves; no other. With a token and none given, any name.",
        ),
    ] = None,
    trusted_proxies: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-proxy",
            help="A proxy in front of the page (address or network, repeatable): its "
            "X-Forwarded-For names the client. Without one, a forwarded request needs the token.",
        ),
    ] = None,
) -> None:
    """Serve a page of the queues and their dead letters, grouped by cause.

    Read-only unless --allow-actions: then replay (one, a selection or a group, to
    its queue or another) and purge (typed confirmation), with the dlq commands'
    guarantees. Each action is logged as one audit line. On NATS and Redis (--url
    nats://... or redis://..., or the app's broker) a read consumes nothing.
    """
    try:
        import uvicorn  # noqa: PLC0415 - the web extra's

        from faststream_retry.web import create_app  # noqa: PLC0415
        from faststream_retry.web.guard import is_loopback  # noqa: PLC0415
    except ImportError as exc:
        fail(f"the page needs the web extra: pip install 'faststream-retry[web]' ({exc})")
    loaded, url, origin = app_and_broker(app, url, factory=factory)
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(24)
        err.print(f"a token for this page (not on loopback): {token}")
    try:
        page = create_app(
            url,
            app=loaded,
            management_url=management_url,
            allow_actions=allow_actions,
            token=token,
            jaeger_url=jaeger_url,
            prefix=prefix,
            hosts=allowed_hosts or (),
            # This command's own server: the client is the connection's peer, unless a
            # proxy the operator named says otherwise.
            trusted_proxies=trusted_proxies or (),
        )
    except ValueError as exc:
        fail(str(exc))
    shown = f"[{host}]" if ":" in host else host
    login = f"/login?token={token}" if token else "/"
    err.print(
        f"serving http://{shown}:{port}{login}"
        + (" (actions allowed)" if allow_actions else " (read-only)")
        + f" for the {examined(url, origin)}",
        markup=False,
        highlight=False,
    )
    audit = logging.getLogger("faststream_retry.web.audit")
    if not audit.handlers:  # one line per action on stderr, unless logging says otherwise
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s audit %(message)s"))
        audit.addHandler(handler)
    audit.setLevel(logging.INFO)
    # proxy_headers off: uvicorn would otherwise take a client's address from the
    # X-Forwarded-For of any connection from 127.0.0.1 (a local proxy, or a TCP forward
    # an attacker talks through); the page reads it itself, from the proxies named.
    uvicorn.run(page, host=host, port=port, log_level="warning", proxy_headers=False)
