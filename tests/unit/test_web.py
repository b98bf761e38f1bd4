"""The dead-letter page's rules, without a broker: who may look, who may act, and how
hostile text is shown. (The page on a real broker, in Chromium: tests/integration.)"""

from __future__ import annotations

import asyncio

import pytest
from starlette.testclient import TestClient

from faststream_retry.ops.common import OperationError
from faststream_retry.ops.dlq import Outcome
from faststream_retry.ops.records import DeadLetter
from faststream_retry.ops.walk import Pass
from faststream_retry.web import create_app
from faststream_retry.web.app import BODY_SHOWN, _Pages, _Settings, _shown
from faststream_retry.web.groups import group, normalise
from faststream_retry.web.guard import CSRF_COOKIE, Guard, is_loopback
from faststream_retry.web.history import History, sparkline
from faststream_retry.web.jobs import Job, Jobs
from faststream_retry.web.reads import Reads

# Nothing listens there: a test that reached the broker would fail loudly.
NOWHERE = "amqp://guest:guest@127.0.0.1:1/"
LOCAL = ("127.0.0.1", 50000)
REMOTE = ("203.0.113.7", 50000)


BASE = "http://127.0.0.1:8765"
"""Where the tests' page is: a loopback name on the port it serves."""


def client(*, at: tuple[str, int] = LOCAL, base: str = BASE, **options: object) -> TestClient:
    """The page as ``faststream-retry web`` serves it: nothing forwards to it."""
    options.setdefault("trusted_proxies", ())
    return TestClient(create_app(NOWHERE, **options), base_url=base, client=at)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("localhost", True), ("127.8.0.1", True),
     ("10.0.0.1", False), ("203.0.113.7", False), ("testclient", False), (None, False)],
)  # fmt: skip
def test_loopback_is_this_machine_only(host: str | None, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_without_a_token_only_this_machine_is_served() -> None:
    """A page mounted in a service that listens everywhere shows nothing to the network."""
    response = client(at=REMOTE).get("/api/status")
    assert response.status_code == 401
    assert "token" in response.json()["error"]
    page = client(at=REMOTE).get("/")
    assert page.status_code == 401
    assert "--token" in page.text


def test_with_a_token_every_request_shows_it() -> None:
    app = client(at=REMOTE, token="s3cret", allow_actions=True)
    assert app.get("/api/status").status_code == 401
    assert app.get("/api/status", headers={"Authorization": "Bearer wrong"}).status_code == 401
    # Past the gate, the broker is asked (and is not there): 502, not 401.
    authorised = app.get("/api/status", headers={"Authorization": "Bearer s3cret"})
    assert authorised.status_code == 502
    login = app.get("/login?token=s3cret", follow_redirects=False)
    assert login.status_code == 303
    assert "httponly" in login.headers["set-cookie"].lower()
    assert "samesite=strict" in login.headers["set-cookie"].lower()
    assert app.get("/api/status").status_code == 502  # the cookie now carries it


def test_a_read_only_page_refuses_every_action() -> None:
    app = client()
    for path in ("/queues/orders/replay", "/queues/orders/purge"):
        response = app.post(path, data={"id": "m-1", "confirm": "orders.dlq"})
        assert response.status_code == 403
        assert "read-only" in response.text
    api = app.post("/api/queues/orders/replay", json={"ids": ["m-1"]})
    assert api.status_code == 403


def _csrf(app: TestClient) -> str:
    """Send the page's CSRF cookie from now on, as a browser would; return its value."""
    token = "k" * 43
    # A header, not the client's cookie jar: Python 3.10's jar keeps no cookie for a
    # host without a dot ("testserver") set this way.
    app.headers["Cookie"] = f"{CSRF_COOKIE}={token}"
    return token


def test_an_action_needs_the_pages_csrf_token() -> None:
    """A form from another site, or without the page's token, is refused before anything moves."""
    app = client(allow_actions=True)
    missing = app.post("/queues/orders/replay", data={"id": "m-1"})
    assert missing.status_code == 403
    assert "CSRF" in missing.text
    token = _csrf(app)
    wrong = app.post("/queues/orders/replay", data={"id": "m-1", "csrf": "x" * 43})
    assert wrong.status_code == 403
    foreign = app.post(
        "/queues/orders/replay",
        data={"id": "m-1", "csrf": token},
        headers={"Origin": "https://evil.example"},
    )
    assert foreign.status_code == 403
    assert "another origin" in foreign.text
    cross_site = app.post(
        "/queues/orders/replay",
        data={"id": "m-1", "csrf": token},
        headers={"Sec-Fetch-Site": "cross-site"},
    )
    assert cross_site.status_code == 403
    # With it, the action goes on to its own checks: no id named is a 400, no broker needed.
    passed = app.post("/queues/orders/replay", data={"csrf": token})
    assert passed.status_code == 400
    assert "name the dead letters" in passed.text


def test_the_json_api_takes_the_csrf_header_or_a_bearer_token() -> None:
    app = client(allow_actions=True)
    assert app.post("/api/queues/orders/replay", json={}).status_code == 403
    token = _csrf(app)
    assert (
        app.post("/api/queues/orders/replay", json={}, headers={"X-CSRF-Token": token}).status_code
        == 400
    )
    bearer = client(allow_actions=True, token="s3cret", at=REMOTE)
    # A browser never adds Authorization to another site's request: no CSRF needed.
    answer = bearer.post(
        "/api/queues/orders/replay", json={}, headers={"Authorization": "Bearer s3cret"}
    )
    assert answer.status_code == 400


def test_the_json_apis_refusals_are_worded_for_scripts() -> None:
    """A script is told which header to send, never to reload a page or type into a form."""
    app = client(allow_actions=True)
    no_csrf = app.post("/api/queues/orders/replay", json={"ids": ["m-1"]})
    assert no_csrf.status_code == 403
    assert "X-CSRF-Token" in no_csrf.json()["error"]
    assert "reload" not in no_csrf.json()["error"]
    token = _csrf(app)
    headers = {"X-CSRF-Token": token}
    no_ids = app.post("/api/queues/orders/replay", json={}, headers=headers)
    assert no_ids.status_code == 400
    assert '"ids"' in no_ids.json()["error"]
    no_confirm = app.post("/api/queues/orders/purge", json={}, headers=headers)
    assert no_confirm.status_code == 400
    assert '"confirm"' in no_confirm.json()["error"]
    read_only = client().post("/api/queues/orders/replay", json={"ids": ["m-1"]})
    assert read_only.json()["error"].startswith("forbidden: the page is read-only")
    remote = client(token="s3cret", at=REMOTE).get("/api/status")
    assert remote.status_code == 401
    assert "Authorization: Bearer" in remote.json()["error"]
    assert "/login" not in remote.json()["error"]


def test_a_purge_needs_the_dlqs_name_typed() -> None:
    app = client(allow_actions=True)
    token = _csrf(app)
    for typed in ("", "orders", "orders.dlq "):
        refused = app.post("/queues/orders/purge", data={"csrf": token, "confirm": typed})
        assert refused.status_code == 400
        assert "orders.dlq" in refused.text


def test_the_audit_names_who_without_the_token() -> None:
    guard = Guard(token="s3cret", actions=True)
    request = type("R", (), {"client": type("C", (), {"host": "10.1.2.3"})(), "headers": {}})()
    who = guard.who(request)
    assert who.startswith("10.1.2.3 token:")
    assert "s3cret" not in who


@pytest.mark.parametrize(
    ("error", "normal"),
    [
        ("order 42 not found", "order <n> not found"),
        ("order 97 not found", "order <n> not found"),
        ("user 'ann' has no card", "user <str> has no card"),
        ("id 1b4e28ba-2fa1-11d2-883f-0016d3cca427 gone", "id <uuid> gone"),
        ("at 0x7f3a2c and deadbeefdeadbeefdead", "at <hex> and <hex>"),
        ("  spaced \n out  ", "spaced out"),
    ],
)
def test_what_varies_between_messages_of_one_cause_is_taken_out(error: str, normal: str) -> None:
    assert normalise(error) == normal


def letter(position: int, error: str, *, exception: str = "app.NotFound", reason: str = "permanent",
           body: bytes = b"{}", headers: dict[str, object] | None = None) -> DeadLetter:  # fmt: skip
    return DeadLetter.read(
        position,
        body,
        {"message_id": f"m-{position}", "content_type": "application/json"},
        {
            "retry-reason": reason,
            "retry-exception": exception,
            "retry-error": error,
            "retry-last-failed-at": 1_700_000_000_000 + position,
            **(headers or {}),
        },
    )


def test_dead_letters_are_grouped_by_cause_the_largest_first() -> None:
    letters = [
        letter(1, "card 9 refused", exception="app.Refused"),
        letter(2, "order 17 not found"),
        letter(3, "order 18 not found"),
        letter(4, "order 19 not found", reason="exhausted"),
        letter(5, "order 20 not found"),
    ]
    groups = group(letters)
    assert [(g.exception, g.reason, g.error, g.ids) for g in groups] == [
        ("app.NotFound", "permanent", "order <n> not found", ["m-2", "m-3", "m-5"]),
        ("app.NotFound", "exhausted", "order <n> not found", ["m-4"]),
        ("app.Refused", "permanent", "card <n> refused", ["m-1"]),
    ]
    assert groups[0].first_ms == 1_700_000_000_002
    assert groups[0].last_ms == 1_700_000_000_005
    assert len({g.key for g in groups}) == 3
    assert group(list(reversed(letters)))[0].key == groups[0].key  # stable


def test_control_characters_are_shown_and_long_text_is_cut() -> None:
    assert _shown("a\x1b[31mb\x00c\nd\te\x7f") == "a\\x1b[31mb\\x00c\nd\te\\x7f"
    long = "x" * (BODY_SHOWN + 10)
    shown = _shown(long)
    assert shown.startswith("x" * BODY_SHOWN)
    assert shown.endswith("10 more characters (the export has every byte)")


def test_hostile_bodies_and_headers_render_as_text() -> None:
    """A body or header with markup, control characters or invalid UTF-8 never becomes markup."""
    pages = _Pages(_Settings(NOWHERE, None, None, None, Guard(token=None, actions=True)))
    hostile = letter(
        1,
        "<b>bold</b> error\x1b[31m",
        exception="<svg onload=alert(1)>",
        body=b"<script>window.__pwned=1</script>",
        headers={"x-note": "<img src=x onerror=alert(2)>", "traceparent": "<i>"},
    )
    html = pages.env.get_template("letter.html").render(
        queue="orders",
        dlq="orders.dlq",
        letter=hostile,
        body=hostile.body.text,
        headers=hostile.details()["headers"],
        properties=hostile.details()["properties"],
        trace_id=None,
        trace_url=None,
        read=Reads().put("orders", Outcome("orders.dlq", taken=[hostile]), "tester"),
        body_more=0,
        short=False,
        csrf="t",
        csrf_field="csrf",
        actions=True,
        root="",
    )
    for raw in ("<script>", "<img src=x", "<svg onload", "<b>bold</b>"):
        assert raw not in html
    for escaped in ("&lt;script&gt;", "&lt;img src=x", "&lt;svg onload", "&lt;b&gt;bold"):
        assert escaped in html
    assert "\\x1b[31m" in html  # the escape character shown, not sent to a terminal
    # Bytes that are not UTF-8 are shown as hex, never decoded into something else.
    assert letter(2, "e", body=b"\xff\xfe\x00<").body.text == "ff fe 00 3c"


def test_the_history_keeps_the_last_hour_per_queue() -> None:
    history = History(window_s=3600)

    def status(dlq: int) -> dict[str, object]:
        return {
            "queues": [
                {"queue": "orders", "retry": {"messages": 2}, "dlq": {"messages": dlq}},
                {"queue": "gone", "retry": {"messages": None}, "dlq": {"messages": None}},
            ]
        }

    for minute, dlq in [(0, 0), (30, 4), (61, 7), (90, 1)]:
        history.record(status(dlq), now=minute * 60.0)
    assert [(s.at, s.dlq) for s in history.of("orders")] == [(1800.0, 4), (3660.0, 7), (5400.0, 1)]
    assert [s.retry for s in history.of("gone")] == [0, 0, 0]  # a missing queue counts 0
    assert history.of("unknown") == []


def test_a_chart_is_numbers_only() -> None:
    history = History()
    for i, dlq in enumerate([0, 3, 1]):
        history.record({"queues": [{"queue": "<b>q</b>", "dlq": {"messages": dlq}}]}, now=i * 15)
    svg = sparkline(history.of("<b>q</b>"), "dlq")
    assert svg.startswith('<svg class="spark dead"')
    assert "<b>" not in svg
    assert 'aria-label="dlq: 1 now, at most 3 in the hour"' in svg
    assert "points=" in sparkline(history.of("<b>q</b>")[:1], "dlq")  # one: a flat line
    assert sparkline([], "dlq") == ""


async def test_a_job_reports_its_progress_and_stops_when_asked() -> None:
    """The pass is stopped by its own progress hook, after the message it is at."""
    jobs = Jobs()
    steps = asyncio.Event()
    visited: list[int] = []

    async def run(job: Job) -> dict[str, object]:
        for n in range(1, 1001):
            visited.append(n)
            job.progress(Pass("orders.dlq", 1000, visited=n))
            if n == 3:
                steps.set()
            await asyncio.sleep(0)
        return {"moved": 1000}

    job = jobs.start("replay", "orders", run, who="tester")
    await asyncio.wait_for(steps.wait(), 5)
    job.stop_asked = True
    assert job.task is not None
    await asyncio.wait_for(job.task, 5)
    assert job.state == "stopped"
    assert job.visited == len(visited) < 1000
    assert job.error is not None
    assert f"after {job.visited} of 1000" in job.error
    assert jobs.get(job.id) is job
    done = jobs.start("purge", "orders", lambda _job: asyncio.sleep(0, {"removed": 2}))
    assert done.task is not None
    await done.task
    assert (done.state, done.result) == ("done", {"removed": 2})
    failed = jobs.start("purge", "orders", lambda _job: _raise(OperationError("gone")))
    assert failed.task is not None
    await failed.task
    assert (failed.state, failed.error) == ("failed", "gone")


async def _raise(exc: Exception) -> dict[str, object]:
    raise exc


def test_pages_forbid_inline_scripts_framing_and_referrers() -> None:
    """Under the escaping, the browser is told to run no inline script and frame nothing."""
    page = client(at=REMOTE).get("/")  # an error page: rendered like every other
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-frame-options"] == "DENY"
    assert client().get("/login", follow_redirects=False).headers["referrer-policy"] == (
        "no-referrer"
    )
