"""The dead-letter page: an ASGI app on ``faststream_retry.ops``, rendered on the server.

Every move is an ``ops`` call, with the command's guarantees (confirm-then-ack, one
operation per queue at a time, ``rate``). No GET reads a queue's messages: reading one
is a pass through it (on a quorum DLQ, every message republished), so a read is asked
for (a POST, with CSRF) and its result shown to every view until the next (``reads``).
The overview counts by passive declares (and the management API's listing when given).
"""

from __future__ import annotations

import asyncio
import contextlib
import decimal
import json
import math
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from faststream_retry.core.defaults import PREFIX
from faststream_retry.core.durations import format_ms
from faststream_retry.ops import dlq as ops
from faststream_retry.ops.common import DEFAULT_URL, OperationError, shown_name
from faststream_retry.ops.records import Selection, iso_time, moment, not_a_time
from faststream_retry.ops.wire import encode_value
from faststream_retry.web.brokers import Broker, broker_for
from faststream_retry.web.guard import (
    CSRF_FIELD,
    CSRF_HEADER,
    TOKEN_COOKIE,
    Guard,
    audit,
    plain,
    proxy_networks,
)
from faststream_retry.web.history import EVERY_S, History, sparkline
from faststream_retry.web.jobs import Job, Jobs
from faststream_retry.web.reads import BODY_KEPT, LIMIT, Read, Reads

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

    from starlette.requests import Request

    from faststream_retry.middleware.app import LoadedApp
    from faststream_retry.ops.records import DeadLetter

__all__ = ["create_app"]

HERE = Path(__file__).parent
BODY_SHOWN = BODY_KEPT
"""Characters of a body a page shows; the export has every byte."""
LIST_LIMIT = LIMIT
"""Dead letters a read keeps (and groups), head first."""
_SHORT_S = 2.0
"""How long an action's request waits for its job before showing the job's page."""
RATE = 200.0
"""Moves a second at most, for every action (the command's ``--rate``)."""
BODY_LIMIT = 4 * 1024 * 1024
"""Bytes of a POST's body the page reads; a larger one is refused (413) unread."""
MAX_IDS = 10_000
"""Dead letters one action may name."""
ID_BYTES = 255
"""The longest id an action may name: a message id is an AMQP short string."""
_SPOOL_BYTES = 8 * 1024 * 1024
"""An export kept in memory up to this, then in a temporary file, until it is sent."""
_CHUNK = 64 * 1024
_PAGE_HEADERS = {
    # Defence in depth under the escaping: no inline script runs, nothing loads from
    # elsewhere, no other site frames the page.
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # No URL goes to another site; the page's own forms keep their Origin (under
    # no-referrer a browser sends "Origin: null" with a POST, which the CSRF check refuses).
    "referrer-policy": "same-origin",
}
_LOGIN_HEADERS = {**_PAGE_HEADERS, "referrer-policy": "no-referrer"}
"""The login's redirect: the URL it came from holds the token, and goes nowhere."""
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
    hosts: Sequence[str] = (),
    trusted_proxies: Sequence[str] | None = None,
) -> Starlette:
    """Return the dead-letter page as an ASGI app, to serve or mount in your own.

    Args:
        url: the broker (``amqp://``, ``nats://`` or ``redis://``); each request opens a
            connection of its own. On NATS and Redis a read consumes nothing
            (``web.brokers``).
        app: the application whose queues to show (``faststream_retry.ops.load_app``);
            without one, the queues the plugin's registry names (RabbitMQ), or those
            the server's streams and keys show (NATS, Redis).
        management_url: RabbitMQ's management API, to find every ``.dlq`` and tier
            (RabbitMQ only).
        allow_actions: replay and purge; without it the page only reads.
        token: required of every request (``/login?token=...`` sets a cookie). Without
            one, only clients on this machine are served, and only when
            ``trusted_proxies`` says who the client is.
        jaeger_url: a Jaeger UI (``http://localhost:16686``): trace ids become links.
        prefix: the plugin's prefix, whose registry names the queues (without ``app``).
        hosts: the ``Host`` names the page answers besides loopback ones on its port
            (``dlq.example.com``, or ``name:port``). Given, a page with a token answers
            only those and loopback; without, it answers any name (a page without a token
            answers loopback names only).
        trusted_proxies: the proxies (addresses or networks) whose ``X-Forwarded-For``
            names the client; ``[]`` when nothing forwards to the page. Unset, the page
            does not know who its clients are, and serves only requests with the token.

    Raises:
        ValueError: a host is not a name (``https://...``), a trusted proxy is not an
            address or a network, or ``management_url`` was given for NATS or Redis.
    """
    odd = [h for h in hosts if not h or any(c in h for c in "/@?# ")]
    if odd:
        raise ValueError(f"hosts takes names, or name:port (dlq.example.com:8443), got {odd[0]!r}")
    guard = Guard(
        token=token,
        actions=allow_actions,
        hosts=tuple(hosts),
        proxies=proxy_networks(trusted_proxies),
    )
    settings = _Settings(url, app, management_url, jaeger_url, guard, prefix)
    pages = _Pages(settings)
    routes = [
        Route("/", pages.overview),
        Route("/login", pages.login),
        Route("/api/status", pages.api_status),
        Route("/queues/{queue}", pages.queue),
        Route("/queues/{queue}/read", pages.read, methods=["POST"]),
        Route("/queues/{queue}/groups/{key}", pages.group),
        Route("/queues/{queue}/messages/{key:path}", pages.letter),
        Route("/queues/{queue}/export", pages.export, methods=["POST"]),
        Route("/queues/{queue}/replay", pages.replay, methods=["POST"]),
        Route("/queues/{queue}/purge", pages.purge, methods=["POST"]),
        Route("/api/queues/{queue}/read", pages.read, methods=["POST"]),
        Route("/api/queues/{queue}/dead-letters", pages.api_letters),
        Route("/api/queues/{queue}/groups", pages.api_groups),
        Route("/api/queues/{queue}/messages/{key:path}", pages.api_letter),
        Route("/api/queues/{queue}/export", pages.export, methods=["POST"]),
        Route("/api/queues/{queue}/replay", pages.replay, methods=["POST"]),
        Route("/api/queues/{queue}/purge", pages.purge, methods=["POST"]),
        Route("/jobs/{job}", pages.job),
        Route("/jobs/{job}/stop", pages.stop_job, methods=["POST"]),
        Route("/api/jobs/{job}", pages.api_job),
        Route("/api/jobs/{job}/stop", pages.stop_job, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)


def _ms_text(ms: object) -> str:
    """A time as the pages show it; a header's value that names none, as text."""
    if ms is None or ms == 0:
        return "-"
    found = moment(ms)
    return not_a_time(ms) if found is None else found.strftime("%Y-%m-%d %H:%M:%S UTC")


def _now_text() -> str:
    return _ms_text(int(time.time() * 1000))


def _shown(text: str) -> str:
    """Text as a page shows it: control characters made visible, cut to ``BODY_SHOWN``."""
    cut = text[:BODY_SHOWN]
    visible = "".join(
        ch if ch in "\n\t" or ch.isprintable() else ascii(ch)[1:-1]  # \x1b, \u202e
        for ch in cut
    )
    if len(text) > BODY_SHOWN:
        visible += f"\n… {len(text) - BODY_SHOWN} more characters (the export has every byte)"
    return visible


def _dotted(name: str) -> Markup:
    """A dotted name that may wrap after its dots, not inside a word (``a.<wbr>b``)."""
    return Markup(".<wbr>").join(escape(plain(part)) for part in str(name).split("."))


def _segment(value: str) -> str:
    """``value`` as one segment of a link's path: every ``/``, ``?``, ``#`` and ``%`` encoded."""
    return quote(str(value), safe="")


def _message_href(key: str) -> str:
    """The path of a dead letter's page under its queue's: ``..`` would climb, so a query."""
    if key.strip(".") == "":
        return f"messages/?id={_segment(key)}"
    return f"messages/{_segment(key)}"


def _jsonable(value: Any) -> Any:  # noqa: ANN401 - any JSON-able value, or a header's
    """Return ``value`` as strict JSON can hold it: what a header may carry, tagged or as text.

    A producer's headers reach the answers: ``NaN`` is no JSON, nor are bytes.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview, decimal.Decimal)) or (
        value is not None and not isinstance(value, (str, int, float, bool))
    ):
        encoded = encode_value(value)
        return encoded if isinstance(encoded, dict) else str(value)
    return value


class _JSON(JSONResponse):
    """A JSON answer that no header's value can break (``_jsonable``)."""

    def render(self, content: Any) -> bytes:  # noqa: ANN401 - any JSON-able value
        return json.dumps(
            _jsonable(content), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode()


class _BadInputError(Exception):
    """An action's input the page does not take: the text says why, ``status`` the code."""

    def __init__(self, why: str, status: int = 400) -> None:
        super().__init__(why)
        self.status = status


async def _body(request: Request) -> bytes:
    """Return the request's body, at most ``BODY_LIMIT`` bytes.

    Raises:
        _BadInputError: it is larger (413); what was read so far is dropped.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > BODY_LIMIT:
        raise _BadInputError(f"the request's body is over {BODY_LIMIT:,} bytes", 413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > BODY_LIMIT:
            raise _BadInputError(f"the request's body is over {BODY_LIMIT:,} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def _checked_ids(ids: object, *, api: bool) -> frozenset[str]:
    """Return the ids an action names, each a string of at most ``ID_BYTES``, at most ``MAX_IDS``.

    Raises:
        _BadInputError: they are not a list of strings, too many, or one is too long.
    """
    if ids is None:
        return frozenset()
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _BadInputError('bad request: "ids" is a list of message ids (or #positions)')
    if len(ids) > MAX_IDS:
        raise _BadInputError(
            f"{'bad request: ' if api else ''}an action names at most {MAX_IDS:,} dead letters, "
            f"not {len(ids):,}"
        )
    for one in ids:
        if len(one.encode(errors="replace")) > ID_BYTES:
            raise _BadInputError(
                f"{'bad request: ' if api else ''}no dead letter has the id {shown_name(one)}: "
                f"an id takes at most {ID_BYTES} bytes"
            )
    return frozenset(ids)


def _replay_input(
    data: dict[str, Any], broker: Broker, *, api: bool
) -> tuple[frozenset[str], str | None, bool]:
    """Return a replay's ids, target (``None``: their own queue) and whether it is a dry run.

    Raises:
        _BadInputError: a field is not of its type, or the target cannot be a queue's name.
    """
    ids = _checked_ids(data.get("ids"), api=api)
    to = data.get("to") or None
    if to is not None and not isinstance(to, str):
        raise _BadInputError('bad request: "to" is a queue\'s name, or null')
    if to is not None and (problem := broker.target_problem(to)) is not None:
        raise _BadInputError(
            f"cannot replay to queue {shown_name(to)}: {problem}; nothing was replayed"
        )
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise _BadInputError('bad request: "dry_run" is true or false')
    return ids, to, dry_run


class _Pages:
    """The endpoints; each checks the guard first."""

    def __init__(self, settings: _Settings) -> None:
        self.s = settings
        self.b: Broker = broker_for(
            settings.url,
            app=settings.app,
            management_url=settings.management_url,
            prefix=settings.prefix,
        )
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["when"] = _ms_text
        self.env.filters["shown"] = _shown
        self.env.filters["name"] = plain
        self.env.filters["dotted"] = _dotted
        self.env.filters["segment"] = _segment
        self.env.filters["message_href"] = _message_href
        self.env.filters["duration"] = format_ms
        self.env.filters["json"] = lambda v: json.dumps(
            _jsonable(v), indent=2, ensure_ascii=False, default=str
        )
        self.history = History()
        self.jobs = Jobs()
        self.reads = Reads()
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
            system=self.b.system,
            **data,
        )
        response = HTMLResponse(html, status_code=status_code, headers=_PAGE_HEADERS)
        self.s.guard.remember(response, request, csrf)
        return response

    def _refused(
        self,
        request: Request,
        why: str,
        *,
        api: bool,
        status_code: int = 403,
        **data: Any,  # noqa: ANN401 - the error page's extra values
    ) -> Response:
        if api:
            return _JSON({"error": why}, status_code=status_code)
        return self._render(request, "error.html", status_code=status_code, error=why, **data)

    def _gate(self, request: Request, *, api: bool) -> Response | None:
        refusal = self.s.guard.refusal(request, api=api)
        if refusal is None:
            return None
        return self._refused(request, refusal.why, api=api, status_code=refusal.status)

    def _queue(self, request: Request) -> str:
        """The work queue a request names (by itself or by its ``.dlq``)."""
        return self.b.work_queue(request.path_params["queue"])

    def _unnamed(self, request: Request, queue: str, *, api: bool) -> Response | None:
        """A 404 when no dead letters can follow from ``queue``'s name, else None."""
        if (why := self.b.problem(queue)) is None:
            return None
        return self._refused(request, why, api=api, status_code=404)

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
        """Trade ``?token=`` for the cookie, then go to the overview; a wrong token sets none."""
        if (refusal := self.s.guard.refusal(request)) is not None and refusal.status != 401:
            return self._refused(request, refusal.why, api=False, status_code=refusal.status)
        root = request.scope.get("root_path", "")
        response = RedirectResponse(f"{root}/", status_code=303, headers=_LOGIN_HEADERS)
        if self.s.guard.token is None:
            return response
        sent = request.query_params.get("token", "")
        if (why := self.s.guard.login_refusal(sent)) is not None:
            return self._refused(request, why, api=False, status_code=401)
        response.set_cookie(
            TOKEN_COOKIE,
            self.s.guard.session(),
            **self.s.guard.cookie_options(request),  # type: ignore[arg-type]
        )
        return response

    async def _gather(self) -> dict[str, Any]:
        data = (await self.b.status()).to_json()
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
            # As `status --json` says it: which broker was read, without its password.
            return _JSON({**await self._status(), "broker": self.b.shown_url()})
        except OperationError as exc:
            return _JSON({"error": str(exc)}, status_code=502)

    def _unread(self, queue: str, *, api: bool) -> str:
        """Why there is nothing to show of ``queue``'s dead letters: no read since..."""
        how = (
            f"POST /api/queues/{_segment(queue)}/read reads it"
            if api
            else "read it (the button below) to see them"
        )
        return (
            f"{shown_name(self.b.dlq(queue))} has not been read since the page started, or since "
            f"a replay or a purge from the page changed it: {how}"
        )

    def _read_of(self, request: Request, *, api: bool) -> tuple[str, Read] | Response:
        """The work queue a request names and its last read, or a refusal. No broker."""
        if (refused := self._gate(request, api=api)) is not None:
            return refused
        queue = self._queue(request)
        read = self.reads.get(queue)
        if read is None:
            return self._refused(
                request, self._unread(queue, api=api), api=api, status_code=404, read_queue=queue
            )
        return queue, read

    async def queue(self, request: Request) -> Response:
        """A queue's dead letters as last read, grouped by cause; its depth now."""
        if (refused := self._gate(request, api=False)) is not None:
            return refused
        queue = self._queue(request)
        if (unnamed := self._unnamed(request, queue, api=False)) is not None:
            return unnamed
        dlq = self.b.dlq(queue)
        try:
            now = await self.b.depth(queue)  # a count: reads no message
        except OperationError as exc:
            return self._refused(request, str(exc), api=False, status_code=502)
        if now is None:
            why = f"queue {shown_name(dlq)} does not exist"
            return self._refused(request, why, api=False, status_code=404)
        read = self.reads.get(queue)
        letters = read.outcome.taken if read is not None else []
        return self._render(
            request,
            "queue.html",
            queue=queue,
            dlq=dlq,
            read=read,
            now=now,
            groups=read.groups if read is not None else [],
            total=len(letters),
            complete=read.outcome.complete if read is not None else True,
            oldest=min(
                (t for x in letters if (t := x.last_failed_ms or x.first_failed_ms) is not None),
                default=None,
            ),
            limit=LIST_LIMIT,
            reading=self.jobs.running("read", queue),
            dropped=self.reads.dropped(queue),
        )

    async def api_letters(self, request: Request) -> Response:
        """A queue's dead letters as ``dlq list --json`` answers them, as last read."""
        read = self._read_of(request, api=True)
        if isinstance(read, Response):
            return read
        return _JSON(read[1].listing())

    async def api_groups(self, request: Request) -> Response:
        """A queue's dead letters grouped by cause, as JSON, as last read."""
        read = self._read_of(request, api=True)
        if isinstance(read, Response):
            return read
        found = read[1]
        return _JSON(
            {
                "format": ops.JSON_FORMAT,
                "queue": found.outcome.queue,
                "complete": found.outcome.complete,
                "limit": found.outcome.limit,
                "read_at": iso_time(found.at_ms),
                "groups": [g.to_json() for g in found.groups],
            }
        )

    async def group(self, request: Request) -> Response:
        """One group of the last read: its dead letters, to open, replay or purge."""
        read = self._read_of(request, api=False)
        if isinstance(read, Response):
            return read
        queue, found = read[0], read[1].group(request.path_params["key"])
        if found is None:
            return self._refused(
                request,
                "no such group in the last read of the queue: read it again",
                api=False,
                status_code=404,
                read_queue=queue,
            )
        return self._render(
            request, "group.html", queue=queue, dlq=self.b.dlq(queue), group=found, read=read[1]
        )

    @staticmethod
    def _key(request: Request) -> str:
        """The dead letter a request names: in its path, or ``?id=`` (for ``.`` and ``..``)."""
        return request.path_params["key"] or request.query_params.get("id", "")

    async def letter(self, request: Request) -> Response:
        """One dead letter of the last read: properties, headers, history, traceback, body."""
        read = self._read_of(request, api=False)
        if isinstance(read, Response):
            return read
        queue, last = read
        key = self._key(request)
        found = last.letter(key)
        if found is None:
            return self._refused(
                request,
                f"no dead letter {shown_name(key)} in the last read of "
                f"{shown_name(self.b.dlq(queue))}",
                api=False,
                status_code=404,
                read_queue=queue,
            )
        trace_id, trace_url = self._trace_link(found)
        details = found.details()
        return self._render(
            request,
            "letter.html",
            queue=queue,
            dlq=self.b.dlq(queue),
            letter=found,
            read=last,
            body=found.body.text,
            body_more=last.body_chars.get(found.position, len(found.body.text))
            - len(found.body.text),
            short=found.position in last.short,
            headers=details["headers"],
            properties=details["properties"],
            trace_id=trace_id,
            trace_url=trace_url,
        )

    async def api_letter(self, request: Request) -> Response:
        """One dead letter as ``dlq show --json``, as last read."""
        read = self._read_of(request, api=True)
        if isinstance(read, Response):
            return read
        key = self._key(request)
        found = read[1].letter(key)
        if found is None:
            dlq = self.b.dlq(read[0])
            why = f"no dead letter {shown_name(key)} in the last read of {shown_name(dlq)}"
            return _JSON({"error": why}, status_code=404)
        return _JSON(read[1].details(found))

    # ------------------------------------------------------------------ reads
    async def read(self, request: Request) -> Response:
        """Read a queue's dead letters (a pass through it): asked for, never by a view."""
        asked = await self._queue_action(request, needs_actions=False)
        if isinstance(asked, Response):
            return asked
        _, api, queue = asked
        who = self.s.guard.who(request)

        async def run(job: Job | None) -> dict[str, Any]:
            keeper = self.reads.keeper()
            found = await self.b.list(
                queue,
                limit=LIST_LIMIT,
                progress=None if job is None else job.progress,
                keep=keeper,
            )
            done = found.done
            audit(
                "%s read %s: %d dead letter(s) kept of %d gone through%s",
                who,
                shown_name(self.b.dlq(queue)),
                len(found.taken),
                done.visited if done else 0,
                "" if done is None or done.in_place else ", each republished to its tail",
            )
            read = self.reads.put(queue, found, who, keeper)
            return {**found.counts(), "read": len(read.outcome.taken), "complete": found.complete}

        if api:
            try:
                await run(None)
            except OperationError as exc:
                audit("%s read %s failed: %s", who, shown_name(self.b.dlq(queue)), exc)
                return _JSON({"error": str(exc)}, status_code=409)
            got = self.reads.get(queue)
            return _JSON(got.listing() if got is not None else {})
        running = self.jobs.running("read", queue)
        job = running or self.jobs.start("read", queue, run, who=who)
        if job.task is not None:
            await asyncio.wait({job.task}, timeout=_SHORT_S)
        root = request.scope.get("root_path", "")
        if job.state == "done":
            return RedirectResponse(f"{root}/queues/{_segment(queue)}", status_code=303)
        return RedirectResponse(f"{root}/jobs/{job.id}", status_code=303)

    async def export(self, request: Request) -> Response:
        """Every dead letter of the queue as JSON Lines (``dlq export``): a download, asked for.

        The pass writes to a spool (memory, then a temporary file) and the answer streams
        from it once the pass is over: the lock is held for the pass, not for the download.
        """
        asked = await self._queue_action(request, needs_actions=False)
        if isinstance(asked, Response):
            return asked
        _, api, queue = asked
        who = self.s.guard.who(request)
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 - closed by the stream

        def write(line: str) -> None:
            spool.write(line.encode())

        try:
            found = await self.b.export(queue, write)
        except OperationError as exc:
            spool.close()
            audit("%s export %s failed: %s", who, shown_name(self.b.dlq(queue)), exc)
            return self._refused(request, str(exc), api=api, status_code=409)
        audit(
            "%s export %s: %d dead letter(s)", who, shown_name(self.b.dlq(queue)), len(found.taken)
        )
        spool.seek(0)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while chunk := spool.read(_CHUNK):
                    yield chunk
            finally:
                spool.close()

        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.b.dlq(queue))[:200]
        return StreamingResponse(
            chunks(),
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
        """The action's fields, and the CSRF token it sent.

        Raises:
            _BadInputError: the body is too large, or not what the action takes.
        """
        raw = await _body(request)
        if api:
            try:
                data = json.loads(raw) if raw.strip() else {}
            except (ValueError, RecursionError):
                raise _BadInputError("bad request: the body is not JSON") from None
            if not isinstance(data, dict):
                raise _BadInputError("bad request: the body is a JSON object")
            return data, request.headers.get(CSRF_HEADER)
        try:
            fields = parse_qsl(
                raw.decode(errors="replace"), keep_blank_values=True, max_num_fields=MAX_IDS + 10
            )
        except ValueError:
            raise _BadInputError(f"the form has more than {MAX_IDS:,} fields") from None
        form: dict[str, Any] = {"ids": [v for k, v in fields if k == "id"]}
        for key, value in fields:
            if key != "id":
                form.setdefault(key, value)
        data = {
            "ids": form["ids"],
            "to": form.get("to") or None,
            "dry_run": form.get("dry_run") == "1",
            "confirm": form.get("confirm", ""),
        }
        return data, form.get(CSRF_FIELD) or None

    async def _queue_action(
        self, request: Request, *, needs_actions: bool = True
    ) -> tuple[dict[str, Any], bool, str] | Response:
        """A queue's action past the guard, or the refusal to answer with.

        Past it: the form or JSON, whether it came to the API, and the work queue.
        """
        data, api, refused = await self._check_action(request, needs_actions=needs_actions)
        if refused is not None:
            return refused
        queue = self._queue(request)
        if (unnamed := self._unnamed(request, queue, api=api)) is not None:
            return unnamed
        return data, api, queue

    async def _check_action(
        self, request: Request, *, needs_actions: bool = True
    ) -> tuple[dict[str, Any], bool, Response | None]:
        api = self._is_api(request)
        if (refused := self._gate(request, api=api)) is not None:
            return {}, api, refused
        if needs_actions and not self.s.guard.actions:
            read_only = (
                "forbidden: the page is read-only (start it with --allow-actions, or "
                "create_app(allow_actions=True))"
                if api
                else "this page is read-only: start it with actions allowed (--allow-actions)"
            )
            return {}, api, self._refused(request, read_only, api=api)
        try:
            data, sent = await self._action_input(request, api=api)
        except _BadInputError as exc:
            return {}, api, self._refused(request, str(exc), api=api, status_code=exc.status)
        if (forged := self.s.guard.csrf_refusal(request, sent, api=api)) is not None:
            return {}, api, self._refused(request, forged, api=api)
        return data, api, None

    async def replay(self, request: Request) -> Response:
        """Replay the dead letters named (``id``, repeatable) to their queue or ``to``."""
        asked = await self._queue_action(request)
        if isinstance(asked, Response):
            return asked
        data, api, queue = asked
        try:
            ids, to, dry_run = _replay_input(data, self.b, api=api)
        except _BadInputError as exc:
            return self._refused(request, str(exc), api=api, status_code=exc.status)
        if not ids:
            return self._refused(
                request,
                'bad request: give "ids", a list of message ids (or #positions)'
                if api
                else "name the dead letters to replay (id)",
                api=api,
                status_code=400,
            )
        who = self.s.guard.who(request)

        async def run(job: Job | None) -> dict[str, Any]:
            try:
                outcome = await self.b.replay(
                    queue,
                    selection=Selection(ids=ids),
                    to=to,
                    dry_run=dry_run,
                    rate=RATE,
                    progress=None if job is None else job.progress,
                )
            finally:
                if not dry_run:
                    self.reads.forget(queue, f"a replay from this page at {_now_text()}")
            moved = outcome.done.moved if outcome.done is not None else 0
            audit(
                "%s replay %s -> %s: %d of %d named%s",
                who,
                shown_name(self.b.dlq(queue)),
                shown_name(outcome.target or ""),
                moved,
                len(ids),
                " (dry run)" if dry_run else "",
            )
            return outcome.replayed(dry_run=dry_run)

        return await self._act(request, api, "replay", queue, run)

    async def purge(self, request: Request) -> Response:
        """Remove the dead letters named, or all; ``confirm`` must be the DLQ's name."""
        asked = await self._queue_action(request)
        if isinstance(asked, Response):
            return asked
        data, api, queue = asked
        if data.get("confirm") != self.b.dlq(queue):
            why = (
                f'bad request: "confirm" must be the queue\'s name, {self.b.dlq(queue)}'
                if api
                else f"type the queue's name, {self.b.dlq(queue)}, to confirm the purge"
            )
            return self._refused(request, plain(why), api=api, status_code=400)
        try:
            ids = _checked_ids(data.get("ids"), api=api)
        except _BadInputError as exc:
            return self._refused(request, str(exc), api=api, status_code=exc.status)
        who = self.s.guard.who(request)

        async def run(job: Job | None) -> dict[str, Any]:
            try:
                outcome = await self.b.purge(
                    queue,
                    selection=Selection(ids=ids) if ids else None,
                    progress=None if job is None else job.progress,
                )
            finally:
                self.reads.forget(queue, f"a purge from this page at {_now_text()}")
            audit(
                "%s purge %s: %d removed (%s)",
                who,
                shown_name(self.b.dlq(queue)),
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
        who = self.s.guard.who(request)
        if api:
            try:
                return _JSON(await run(None))
            except OperationError as exc:
                audit("%s %s %s failed: %s", who, what, shown_name(queue), exc)
                return _JSON({"error": str(exc)}, status_code=409)
        job = self.jobs.start(what, queue, run, who=who)
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
            request, "job.html", job=found, queue=found.queue, dlq=self.b.dlq(found.queue)
        )

    async def api_job(self, request: Request) -> Response:
        """A job as JSON."""
        if (refused := self._gate(request, api=True)) is not None:
            return refused
        found = self.jobs.get(request.path_params["job"])
        if found is None:
            return _JSON({"error": "no such job"}, status_code=404)
        return _JSON(found.to_json())

    async def stop_job(self, request: Request) -> Response:
        """Ask a job to stop after the message it is at (a read's, on a read-only page too)."""
        found = self.jobs.get(request.path_params["job"])
        _, api, refused = await self._check_action(
            request, needs_actions=found is None or found.what != "read"
        )
        if refused is not None:
            return refused
        if found is None:
            return self._refused(request, "no such job (any more)", api=api, status_code=404)
        found.stop_asked = True
        audit("%s stop %s of %s", self.s.guard.who(request), found.what, shown_name(found.queue))
        if api:
            return _JSON(found.to_json())
        root = request.scope.get("root_path", "")
        return RedirectResponse(f"{root}/jobs/{found.id}", status_code=303)
