"""The dead-letter page: an ASGI app on ``faststream_retry.ops``, rendered on the server.

Every move is an ``ops`` call, with the command's guarantees (confirm-then-ack, one
operation per queue at a time, ``rate``). The overview counts by passive declares (and
the management API's listing when given) and never browses a queue: listing a quorum
DLQ passes every message through it. A queue's page lists its dead letters, which does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from faststream_retry.core.defaults import PREFIX
from faststream_retry.core.durations import format_ms
from faststream_retry.core.topology import dlq_of, dlq_owner
from faststream_retry.ops import dlq as ops
from faststream_retry.ops.common import DEFAULT_URL, OperationError, connect
from faststream_retry.ops.management import vhost_of
from faststream_retry.ops.records import Selection
from faststream_retry.ops.status import status as gather
from faststream_retry.web.groups import group
from faststream_retry.web.guard import AUDIT, CSRF_FIELD, CSRF_HEADER, TOKEN_COOKIE, Guard
from faststream_retry.web.history import EVERY_S, History, sparkline
from faststream_retry.web.jobs import Job, Jobs

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from starlette.requests import Request

    from faststream_retry.middleware.app import LoadedApp
    from faststream_retry.ops.records import DeadLetter

__all__ = ["create_app"]

HERE = Path(__file__).parent
BODY_SHOWN = 64 * 1024
"""Characters of a body a page shows; the export has every byte."""
LIST_LIMIT = 1000
"""Dead letters a queue's page reads (and groups), head first."""
_SHORT_S = 2.0
"""How long an action's request waits for its job before showing the job's page."""
RATE = 200.0
"""Moves a second at most, for every action (the command's ``--rate``)."""
_PAGE_HEADERS = {
    # Defence in depth under the escaping: no inline script runs, nothing loads from
    # elsewhere, no other site frames the page, and no URL (a login's token) leaks on.
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


@dataclass(frozen=True, slots=True)
class _Settings:
    url: str
    app: LoadedApp | None
    management_url: str | None
    jaeger_url: str | None
    guard: Guard
    prefix: str = PREFIX


def create_app(
    url: str = DEFAULT_URL,
    *,
    app: LoadedApp | None = None,
    management_url: str | None = None,
    allow_actions: bool = False,
    token: str | None = None,
    jaeger_url: str | None = None,
    prefix: str = PREFIX,
) -> Starlette:
    """Return the dead-letter page as an ASGI app, to serve or mount in your own.

    Args:
        url: the broker (``amqp://``); each request opens a connection of its own.
        app: the application whose queues to show (``faststream_retry.ops.load_app``);
            without one, the queues the plugin's registry names.
        management_url: RabbitMQ's management API, to find every ``.dlq`` and tier.
        allow_actions: replay and purge; without it the page only reads.
        token: required of every request (``/login?token=...`` sets a cookie); without
            one, only clients on this machine are served.
        jaeger_url: a Jaeger UI (``http://localhost:16686``): trace ids become links.
        prefix: the plugin's prefix, whose registry names the queues (without ``app``).
    """
    settings = _Settings(
        url, app, management_url, jaeger_url, Guard(token=token, actions=allow_actions), prefix
    )
    pages = _Pages(settings)
    routes = [
        Route("/", pages.overview),
        Route("/login", pages.login),
        Route("/api/status", pages.api_status),
        Route("/queues/{queue}", pages.queue),
        Route("/queues/{queue}/groups/{key}", pages.group),
        Route("/queues/{queue}/messages/{key:path}", pages.letter),
        Route("/queues/{queue}/export", pages.export),
        Route("/queues/{queue}/replay", pages.replay, methods=["POST"]),
        Route("/queues/{queue}/purge", pages.purge, methods=["POST"]),
        Route("/api/queues/{queue}/dead-letters", pages.api_letters),
        Route("/api/queues/{queue}/groups", pages.api_groups),
        Route("/api/queues/{queue}/messages/{key:path}", pages.api_letter),
        Route("/api/queues/{queue}/replay", pages.replay, methods=["POST"]),
        Route("/api/queues/{queue}/purge", pages.purge, methods=["POST"]),
        Route("/jobs/{job}", pages.job),
        Route("/jobs/{job}/stop", pages.stop_job, methods=["POST"]),
        Route("/api/jobs/{job}", pages.api_job),
        Route("/api/jobs/{job}/stop", pages.stop_job, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)


def _ms_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _shown(text: str) -> str:
    """Text as a page shows it: control characters made visible, cut to ``BODY_SHOWN``."""
    cut = text[:BODY_SHOWN]
    visible = "".join(
        ch if ch in "\n\t" or (ch.isprintable() and ch != "\x7f") else f"\\x{ord(ch):02x}"
        for ch in cut
    )
    if len(text) > BODY_SHOWN:
        visible += f"\n… {len(text) - BODY_SHOWN} more characters (the export has every byte)"
    return visible


def _dotted(name: str) -> Markup:
    """A dotted name that may wrap after its dots, not inside a word (``a.<wbr>b``)."""
    return Markup(".<wbr>").join(escape(part) for part in name.split("."))


class _Pages:
    """The endpoints; each checks the guard first."""

    def __init__(self, settings: _Settings) -> None:
        self.s = settings
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["when"] = _ms_text
        self.env.filters["shown"] = _shown
        self.env.filters["dotted"] = _dotted
        self.env.filters["duration"] = format_ms
        self.env.filters["json"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False)
        self.history = History()
        self.jobs = Jobs()
        self._sampler: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ helpers
    def _render(self, request: Request, name: str, status_code: int = 200, **data: Any) -> Response:  # noqa: ANN401
        csrf = self.s.guard.csrf_of(request)
        template = self.env.get_template(name)
        html = template.render(
            csrf=csrf,
            csrf_field=CSRF_FIELD,
            actions=self.s.guard.actions,
            root=request.scope.get("root_path", ""),
            **data,
        )
        response = HTMLResponse(html, status_code=status_code, headers=_PAGE_HEADERS)
        self.s.guard.remember(response, request, csrf)
        return response

    def _refused(
        self, request: Request, why: str, *, api: bool, status_code: int = 403
    ) -> Response:
        if api:
            return JSONResponse({"error": why}, status_code=status_code)
        return self._render(request, "error.html", status_code=status_code, error=why)

    def _gate(self, request: Request, *, api: bool) -> Response | None:
        why = self.s.guard.refusal(request, api=api)
        return None if why is None else self._refused(request, why, api=api, status_code=401)

    def _trace_link(self, letter: DeadLetter) -> tuple[str | None, str | None]:
        parent = letter.headers.get("traceparent")
        match = _TRACEPARENT.match(parent) if isinstance(parent, str) else None
        if match is None:
            return None, None
        trace_id = match[1]
        if not self.s.jaeger_url:
            return trace_id, None
        return trace_id, f"{self.s.jaeger_url.rstrip('/')}/trace/{trace_id}"

    # ------------------------------------------------------------------ pages
    async def login(self, request: Request) -> Response:
        """Trade ``?token=`` for the cookie, then go to the overview."""
        sent = request.query_params.get("token", "")
        response = RedirectResponse(
            f"{request.scope.get('root_path', '')}/", status_code=303, headers=_PAGE_HEADERS
        )
        if self.s.guard.token is not None and sent:
            response.set_cookie(TOKEN_COOKIE, sent, httponly=True, samesite="strict", path="/")
        return response

    async def _gather(self) -> dict[str, Any]:
        async with connect(self.s.url) as connection:
            found = await gather(
                connection,
                app=self.s.app,
                management_url=self.s.management_url,
                vhost=vhost_of(self.s.url),
                prefix=self.s.prefix,
            )
        data = found.to_json()
        self.history.record(data)
        return data

    async def _status(self) -> dict[str, Any]:
        data = await self._gather()
        self._sample_from_now_on()
        return data

    def _sample_from_now_on(self) -> None:
        """Sample every ``EVERY_S`` while the server runs, from its first overview on.

        Started by a request, not at startup: a page mounted in another app gets no
        lifespan events of its own.
        """
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.get_running_loop().create_task(
                self._sample(), name="faststream-retry web history"
            )

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(EVERY_S)
            with contextlib.suppress(OperationError):  # the broker away: a gap in the chart
                await self._gather()

    async def overview(self, request: Request) -> Response:
        """Every covered queue: ready, consumers, waiting for a re-check, dead letters."""
        if (refused := self._gate(request, api=False)) is not None:
            return refused
        try:
            data = await self._status()
        except OperationError as exc:
            return self._refused(request, str(exc), api=False, status_code=502)
        charts = {
            row["queue"]: {
                "retry": sparkline(self.history.of(row["queue"]), "retry"),
                "dlq": sparkline(self.history.of(row["queue"]), "dlq"),
            }
            for row in data["queues"]
        }
        return self._render(request, "overview.html", status=data, charts=charts)

    async def api_status(self, request: Request) -> Response:
        """The overview as JSON: ``faststream-retry status --json``'s shape."""
        if (refused := self._gate(request, api=True)) is not None:
            return refused
        try:
            return JSONResponse(await self._status())
        except OperationError as exc:
            return JSONResponse({"error": str(exc)}, status_code=502)

    async def _letters(self, request: Request, *, api: bool) -> tuple[str, ops.Outcome] | Response:
        """The work queue a request names and its first dead letters, or a refusal."""
        if (refused := self._gate(request, api=api)) is not None:
            return refused
        queue = dlq_owner(dlq_of(request.path_params["queue"]))
        try:
            async with connect(self.s.url) as connection:
                found = await ops.list_dead_letters(connection, queue, limit=LIST_LIMIT)
        except OperationError as exc:
            return self._refused(request, str(exc), api=api, status_code=404)
        return queue, found

    async def queue(self, request: Request) -> Response:
        """A queue's dead letters, grouped by cause."""
        read = await self._letters(request, api=False)
        if isinstance(read, Response):
            return read
        queue, found = read
        letters = found.taken
        return self._render(
            request,
            "queue.html",
            queue=queue,
            dlq=dlq_of(queue),
            groups=group(letters),
            total=len(letters),
            complete=found.complete,
            oldest=min(
                (t for x in letters if (t := x.last_failed_ms or x.first_failed_ms) is not None),
                default=None,
            ),
            limit=LIST_LIMIT,
        )

    async def api_letters(self, request: Request) -> Response:
        """A queue's dead letters as ``dlq list --json`` answers them."""
        read = await self._letters(request, api=True)
        if isinstance(read, Response):
            return read
        return JSONResponse(read[1].listing())

    async def api_groups(self, request: Request) -> Response:
        """A queue's dead letters grouped by cause, as JSON."""
        read = await self._letters(request, api=True)
        if isinstance(read, Response):
            return read
        found = read[1]
        return JSONResponse(
            {
                "format": ops.JSON_FORMAT,
                "queue": found.queue,
                "complete": found.complete,
                "limit": found.limit,
                "groups": [g.to_json() for g in group(found.taken)],
            }
        )

    async def group(self, request: Request) -> Response:
        """One group: its dead letters, to open, replay or purge."""
        read = await self._letters(request, api=False)
        if isinstance(read, Response):
            return read
        queue, letters = read[0], read[1].taken
        found = next((g for g in group(letters) if g.key == request.path_params["key"]), None)
        if found is None:
            return self._refused(
                request,
                "no such group (any more): its dead letters left",
                api=False,
                status_code=404,
            )
        return self._render(request, "group.html", queue=queue, dlq=dlq_of(queue), group=found)

    async def _letter(self, queue: str, key: str) -> DeadLetter | None:
        async with connect(self.s.url) as connection:
            return await ops.show_dead_letter(connection, queue, key)

    async def letter(self, request: Request) -> Response:
        """One dead letter: properties, headers, history, traceback and body."""
        if (refused := self._gate(request, api=False)) is not None:
            return refused
        queue = dlq_owner(dlq_of(request.path_params["queue"]))
        key = request.path_params["key"]
        try:
            found = await self._letter(queue, key)
        except OperationError as exc:
            return self._refused(request, str(exc), api=False, status_code=404)
        if found is None:
            return self._refused(
                request, f"no dead letter {key!r} in {dlq_of(queue)}", api=False, status_code=404
            )
        trace_id, trace_url = self._trace_link(found)
        details = found.details()
        return self._render(
            request,
            "letter.html",
            queue=queue,
            dlq=dlq_of(queue),
            letter=found,
            body=found.body.text,
            headers=details["headers"],
            properties=details["properties"],
            trace_id=trace_id,
            trace_url=trace_url,
        )

    async def api_letter(self, request: Request) -> Response:
        """One dead letter as ``dlq show --json``."""
        if (refused := self._gate(request, api=True)) is not None:
            return refused
        queue, key = request.path_params["queue"], request.path_params["key"]
        try:
            found = await self._letter(queue, key)
        except OperationError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        if found is None:
            return JSONResponse({"error": f"no dead letter {key!r}"}, status_code=404)
        return JSONResponse(found.details())

    async def export(self, request: Request) -> Response:
        """Every dead letter of the queue as JSON Lines (``dlq export``): a download."""
        if (refused := self._gate(request, api=False)) is not None:
            return refused
        queue = dlq_owner(dlq_of(request.path_params["queue"]))
        lines: list[str] = []
        try:
            async with connect(self.s.url) as connection:
                await ops.export_dead_letters(connection, queue, lines.append)
        except OperationError as exc:
            return self._refused(request, str(exc), api=False, status_code=404)
        AUDIT.info("%s export %s: %d dead letter(s)", self.s.guard.who(request), queue, len(lines))
        name = re.sub(r"[^A-Za-z0-9._-]", "_", dlq_of(queue))
        return Response(
            "".join(lines),
            media_type="application/x-ndjson",
            headers={"content-disposition": f'attachment; filename="{name}.jsonl"'},
        )

    # ------------------------------------------------------------------ actions
    @staticmethod
    def _is_api(request: Request) -> bool:
        """Whether ``request`` came to the JSON API (its answers are JSON, not pages)."""
        return request.url.path.startswith(f"{request.scope.get('root_path', '')}/api/")

    @staticmethod
    async def _action_input(request: Request, *, api: bool) -> tuple[dict[str, Any], str | None]:
        """The action's fields, and the CSRF token it sent."""
        if api:
            try:
                data = await request.json()
            except ValueError:
                data = None
            if not isinstance(data, dict):
                data = {}
            return data, request.headers.get(CSRF_HEADER)
        form = await request.form()
        data = {
            "ids": [str(v) for v in form.getlist("id")],
            "to": str(form.get("to") or "") or None,
            "dry_run": form.get("dry_run") == "1",
            "confirm": str(form.get("confirm") or ""),
        }
        return data, str(form.get(CSRF_FIELD) or "") or None

    async def _check_action(self, request: Request) -> tuple[dict[str, Any], bool, Response | None]:
        api = self._is_api(request)
        if (refused := self._gate(request, api=api)) is not None:
            return {}, api, refused
        if not self.s.guard.actions:
            read_only = (
                "forbidden: the page is read-only (start it with --allow-actions, or "
                "create_app(allow_actions=True))"
                if api
                else "this page is read-only: start it with actions allowed (--allow-actions)"
            )
            return {}, api, self._refused(request, read_only, api=api)
        data, sent = await self._action_input(request, api=api)
        if (forged := self.s.guard.csrf_refusal(request, sent, api=api)) is not None:
            return {}, api, self._refused(request, forged, api=api)
        return data, api, None

    @staticmethod
    def _ids(data: dict[str, Any]) -> frozenset[str]:
        ids = data.get("ids") or []
        return frozenset(str(i) for i in ids) if isinstance(ids, list) else frozenset()

    async def replay(self, request: Request) -> Response:
        """Replay the dead letters named (``id``, repeatable) to their queue or ``to``."""
        data, api, refused = await self._check_action(request)
        if refused is not None:
            return refused
        queue = dlq_owner(dlq_of(request.path_params["queue"]))
        ids = self._ids(data)
        if not ids:
            return self._refused(
                request,
                'bad request: give "ids", a list of message ids (or #positions)'
                if api
                else "name the dead letters to replay (id)",
                api=api,
                status_code=400,
            )
        to = str(data["to"]) if data.get("to") else None
        dry_run = bool(data.get("dry_run"))
        who = self.s.guard.who(request)

        async def run(job: Job | None) -> dict[str, Any]:
            async with connect(self.s.url) as connection:
                outcome = await ops.replay_dead_letters(
                    connection,
                    queue,
                    selection=Selection(ids=ids),
                    to=to,
                    dry_run=dry_run,
                    rate=RATE,
                    progress=None if job is None else job.progress,
                )
            moved = outcome.done.moved if outcome.done is not None else 0
            AUDIT.info(
                "%s replay %s -> %s: %d of %d named%s",
                who,
                dlq_of(queue),
                outcome.target,
                moved,
                len(ids),
                " (dry run)" if dry_run else "",
            )
            return outcome.replayed(dry_run=dry_run)

        return await self._act(request, api, "replay", queue, run)

    async def purge(self, request: Request) -> Response:
        """Remove the dead letters named, or all; ``confirm`` must be the DLQ's name."""
        data, api, refused = await self._check_action(request)
        if refused is not None:
            return refused
        queue = dlq_owner(dlq_of(request.path_params["queue"]))
        if data.get("confirm") != dlq_of(queue):
            why = (
                f'bad request: "confirm" must be the queue\'s name, {dlq_of(queue)}'
                if api
                else f"type the queue's name, {dlq_of(queue)}, to confirm the purge"
            )
            return self._refused(request, why, api=api, status_code=400)
        ids = self._ids(data)
        who = self.s.guard.who(request)

        async def run(job: Job | None) -> dict[str, Any]:
            async with connect(self.s.url) as connection:
                outcome = await ops.purge_dead_letters(
                    connection,
                    queue,
                    selection=Selection(ids=ids) if ids else None,
                    progress=None if job is None else job.progress,
                )
            AUDIT.info(
                "%s purge %s: %d removed (%s)",
                who,
                dlq_of(queue),
                len(outcome.taken),
                f"{len(ids)} named" if ids else "all",
            )
            return outcome.purged()

        return await self._act(request, api, "purge", queue, run)

    async def _act(
        self,
        request: Request,
        api: bool,
        what: str,
        queue: str,
        run: Callable[[Job | None], Awaitable[dict[str, Any]]],
    ) -> Response:
        """Run an action: inline for the JSON API, else as a job the page follows."""
        if api:
            try:
                return JSONResponse(await run(None))
            except OperationError as exc:
                AUDIT.info("%s %s %s failed: %s", self.s.guard.who(request), what, queue, exc)
                return JSONResponse({"error": str(exc)}, status_code=409)
        job = self.jobs.start(what, queue, run, who=self.s.guard.who(request))
        if job.task is not None:
            # A short one is over before the page would first look: show its end at once.
            await asyncio.wait({job.task}, timeout=_SHORT_S)
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/jobs/{job.id}", status_code=303)

    async def job(self, request: Request) -> Response:
        """A job's progress (the page reloads itself while it runs), or how it ended."""
        if (refused := self._gate(request, api=False)) is not None:
            return refused
        found = self.jobs.get(request.path_params["job"])
        if found is None:
            return self._refused(request, "no such job (any more)", api=False, status_code=404)
        return self._render(
            request, "job.html", job=found, queue=found.queue, dlq=dlq_of(found.queue)
        )

    async def api_job(self, request: Request) -> Response:
        """A job as JSON."""
        if (refused := self._gate(request, api=True)) is not None:
            return refused
        found = self.jobs.get(request.path_params["job"])
        if found is None:
            return JSONResponse({"error": "no such job"}, status_code=404)
        return JSONResponse(found.to_json())

    async def stop_job(self, request: Request) -> Response:
        """Ask a job to stop after the message it is at."""
        _, api, refused = await self._check_action(request)
        if refused is not None:
            return refused
        found = self.jobs.get(request.path_params["job"])
        if found is None:
            return self._refused(request, "no such job (any more)", api=api, status_code=404)
        found.stop_asked = True
        AUDIT.info("%s stop %s of %s", self.s.guard.who(request), found.what, found.queue)
        if api:
            return JSONResponse(found.to_json())
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/jobs/{found.id}", status_code=303)
