"""The dead-letter page against the web it lives in, without a broker: the names it answers
to, who it believes the client is, where its cookies go, what it takes in a request and
what it writes in its audit log. (With a broker, a proxy and Chromium: tests/integration.)"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pytest
from starlette.testclient import TestClient
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from faststream_retry.ops.dlq import Outcome
from faststream_retry.ops.records import DeadLetter
from faststream_retry.web import create_app
from faststream_retry.web.app import BODY_LIMIT, ID_BYTES, MAX_IDS, _Pages, _Settings
from faststream_retry.web.guard import CSRF_COOKIE, TOKEN_COOKIE, Guard, audit
from faststream_retry.web.history import History
from faststream_retry.web.jobs import Jobs
from faststream_retry.web.reads import Reads

if TYPE_CHECKING:
    from starlette.types import ASGIApp

NOWHERE = "amqp://guest:guest@127.0.0.1:1/"
LOCAL = ("127.0.0.1", 50000)
REMOTE = ("203.0.113.7", 50000)
BASE = "http://127.0.0.1:8765"
EVERY_PATH = [
    ("GET", "/"),
    ("GET", "/api/status"),
    ("GET", "/queues/orders"),
    ("GET", "/queues/orders/groups/abc"),
    ("GET", "/queues/orders/messages/m1"),
    ("GET", "/api/queues/orders/dead-letters"),
    ("GET", "/api/queues/orders/groups"),
    ("GET", "/api/queues/orders/messages/m1"),
    ("GET", "/jobs/1-x"),
    ("POST", "/queues/orders/read"),
    ("POST", "/queues/orders/export"),
    ("POST", "/queues/orders/replay"),
    ("POST", "/queues/orders/purge"),
    ("POST", "/api/queues/orders/read"),
    ("POST", "/api/queues/orders/purge"),
    ("POST", "/jobs/1-x/stop"),
]


def page(
    *, at: tuple[str, int] = LOCAL, base: str = BASE, wrap: bool = False, **options: Any
) -> TestClient:
    """The page; ``wrap``: behind uvicorn's proxy headers trusting everyone (``'*'``)."""
    options.setdefault("trusted_proxies", ())
    app: Any = create_app(NOWHERE, allow_actions=True, **options)
    if wrap:
        app = ProxyHeadersMiddleware(app, trusted_hosts="*")
    return TestClient(app, base_url=base, client=at)


def served(response: object) -> bool:
    """Past the gate: the broker was asked (and is not there), or a page/answer came."""
    status = response.status_code  # type: ignore[attr-defined]
    return status not in (401, 403)


# ---------------------------------------------------------------------- DNS rebinding
@pytest.mark.parametrize(("method", "path"), EVERY_PATH)
def test_a_page_without_a_token_answers_no_other_name(method: str, path: str) -> None:
    """An attacker's name resolved to 127.0.0.1 (DNS rebinding) reads nothing, does nothing."""
    app = page()
    app.cookies.set(CSRF_COOKIE, "k" * 43)
    rebound = app.request(
        method,
        path,
        headers={
            "Host": "rebind.attacker.test:8765",
            "Origin": "http://rebind.attacker.test:8765",
            "Sec-Fetch-Site": "same-origin",
            "X-CSRF-Token": "k" * 43,
        },
        data={"csrf": "k" * 43, "confirm": "orders.dlq"} if method == "POST" else None,
    )
    assert rebound.status_code == 403
    assert "does not answer to the name" in rebound.text


@pytest.mark.parametrize(
    ("host", "answers"),
    [("127.0.0.1:8765", True), ("localhost:8765", True), ("LOCALHOST:8765", True),
     ("[::1]:8765", True), ("127.0.0.2:8765", True), ("127.0.0.1:9000", False),
     ("127.0.0.1", False), ("localhost.attacker.test:8765", False), ("0.0.0.0:8765", False),
     ("192.0.2.2:8765", False), ("", False)],
)  # fmt: skip
def test_without_a_token_loopback_names_on_its_own_port_only(host: str, answers: bool) -> None:
    response = page().get("/api/status", headers={"Host": host})
    assert served(response) is answers, response.text


def test_the_names_given_are_answered_and_a_token_page_answers_any_unless_told() -> None:
    named = page(hosts=["dlq.example.com"])
    assert served(named.get("/api/status", headers={"Host": "dlq.example.com"}))
    assert served(named.get("/api/status", headers={"Host": "dlq.example.com:443"}))
    assert not served(named.get("/api/status", headers={"Host": "other.example.com"}))
    bearer = {"Authorization": "Bearer s3cret"}
    anywhere = page(token="s3cret", at=REMOTE)
    assert served(anywhere.get("/api/status", headers={**bearer, "Host": "dlq.example.com"}))
    told = page(token="s3cret", at=REMOTE, hosts=["dlq.example.com:8443"])
    assert served(told.get("/api/status", headers={**bearer, "Host": "dlq.example.com:8443"}))
    refused = told.get("/api/status", headers={**bearer, "Host": "rebind.attacker.test"})
    assert refused.status_code == 403
    # The address it serves (the URL faststream-retry web prints) is its own name too.
    bound = page(token="s3cret", at=REMOTE, hosts=["dlq.example.com"], base="http://192.0.2.2:8726")
    assert served(bound.get("/api/status", headers=bearer))
    assert not served(bound.get("/api/status", headers={**bearer, "Host": "192.0.2.2:9999"}))


@pytest.mark.parametrize(
    "origin",
    ["null", "https://127.0.0.1:8765", "http://rebind.attacker.test:8765", "http://127.0.0.1:9",
     "http://localhost:8765", "file://", "chrome-extension://abc"],
)  # fmt: skip
def test_an_action_from_any_origin_but_the_pages_own_is_refused(origin: str) -> None:
    """The origin is compared with the page itself: ``null`` and another scheme too."""
    app = page()
    app.cookies.set(CSRF_COOKIE, "k" * 43)
    refused = app.post(
        "/queues/orders/replay",
        data={"csrf": "k" * 43, "id": "m1"},
        headers={"Origin": origin},
    )
    assert refused.status_code == 403
    assert "another origin" in refused.text
    own = app.post(
        "/queues/orders/replay", data={"csrf": "k" * 43}, headers={"Origin": BASE}
    )  # past the CSRF check: no id named
    assert own.status_code == 400


# ---------------------------------------------------------------------- proxies
@pytest.mark.parametrize(
    "headers",
    [{"X-Forwarded-For": "127.0.0.1"}, {"X-Forwarded-For": "127.0.0.1, 192.0.2.2"},
     {"Forwarded": "for=127.0.0.1"}, {"X-Real-IP": "127.0.0.1"}, {"Via": "1.1 nginx"}],
)  # fmt: skip
def test_without_a_token_a_forwarded_request_is_refused(headers: dict[str, str]) -> None:
    """Loopback means the client, not the last hop: a proxy on this machine is not its client."""
    response = page().get("/api/status", headers=headers)
    assert response.status_code == 401
    assert "came through a proxy" in response.json()["error"]


def test_a_host_or_a_proxy_the_page_cannot_use_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="hosts takes names"):
        create_app(NOWHERE, hosts=["https://dlq.example.com"])
    with pytest.raises(ValueError, match="trusted_proxies takes addresses"):
        create_app(NOWHERE, trusted_proxies=["nginx"])


def test_a_trusted_proxy_names_the_client() -> None:
    trusted = page(trusted_proxies=["127.0.0.1"])
    for forwarded, answers in [
        ("127.0.0.1", True),  # the proxy says: a client on this machine
        ("192.0.2.2", False),
        ("127.0.0.1, 192.0.2.2", False),  # nginx appends the real client to a forged one
        ("not-an-address", False),
    ]:
        response = trusted.get("/api/status", headers={"X-Forwarded-For": forwarded})
        assert served(response) is answers, (forwarded, response.text)
    # A proxy it was not told about says nothing: the connection is not the trusted one.
    other = page(trusted_proxies=["10.0.0.5"])
    assert not served(other.get("/api/status", headers={"X-Forwarded-For": "127.0.0.1"}))


def test_uvicorn_trusting_every_proxy_does_not_make_a_remote_client_local() -> None:
    """The docs' mount under ``uvicorn --forwarded-allow-ips '*'``: X-Forwarded-For is a claim."""
    told: list[dict[str, Any]] = [{}, {"trusted_proxies": None}]
    for forwarded in ("127.0.0.1", "127.0.0.1, 192.0.2.2"):
        for options in told:
            app = page(at=REMOTE, wrap=True, **options)
            response = app.get("/api/status", headers={"X-Forwarded-For": forwarded})
            assert response.status_code == 401, (forwarded, options, response.text)


@pytest.mark.parametrize(("method", "path"), EVERY_PATH)
def test_a_page_that_does_not_know_its_clients_needs_a_token(method: str, path: str) -> None:
    """``create_app()`` mounted in another app: the client may be a proxy; no token, no page."""
    mounted = page(trusted_proxies=None)
    response = mounted.request(method, path)
    assert response.status_code == 401
    assert "does not know who its clients are" in response.text


def test_a_page_over_a_tcp_forward_is_refused_by_the_name_it_is_reached_by() -> None:
    """socat 192.0.2.2:8793 -> 127.0.0.1:8765: the client looks local, its Host does not."""
    forward = page()
    for host in ("192.0.2.2:8793", "127.0.0.1:8793"):
        assert forward.get("/api/status", headers={"Host": host}).status_code == 403


# ---------------------------------------------------------------------- the token
def test_the_cookie_is_the_pages_own_and_not_the_token() -> None:
    mounted = TestClient(
        _mount(create_app(NOWHERE, token="s3cret")), base_url="https://dlq.example.com"
    )
    login = mounted.get("/dead-letters/login?token=s3cret", follow_redirects=False)
    assert login.status_code == 303
    cookie = login.headers["set-cookie"]
    assert "Path=/dead-letters;" in cookie
    assert "Secure" in cookie
    assert "HttpOnly" in cookie
    assert "s3cret" not in cookie
    plain_http = TestClient(create_app(NOWHERE, token="s3cret"), base_url=BASE)
    assert (
        "Secure"
        not in plain_http.get("/login?token=s3cret", follow_redirects=False).headers["set-cookie"]
    )
    # The token itself in the cookie is not a login: only the derived value is.
    forged = TestClient(create_app(NOWHERE, token="s3cret"), base_url=BASE)
    forged.headers["Cookie"] = f"{TOKEN_COOKIE}=s3cret"
    assert forged.get("/api/status").status_code == 401


def _mount(app: ASGIApp) -> ASGIApp:
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.routing import Mount  # noqa: PLC0415

    return Starlette(routes=[Mount("/dead-letters", app)])


def test_login_takes_only_the_valid_token() -> None:
    """Another site's link with a wrong token does not replace the operator's cookie."""
    app = page(token="s3cret", at=REMOTE)
    for wrong in ("", "nope", "s3cret "):
        answer = app.get(f"/login?token={wrong}", follow_redirects=False)
        assert answer.status_code == 401
        assert TOKEN_COOKIE not in answer.headers.get("set-cookie", "")
    assert app.get("/login?token=s3cret", follow_redirects=False).status_code == 303
    assert served(app.get("/api/status"))


# ---------------------------------------------------------------------- what it takes
def csrf_client(**options: Any) -> tuple[TestClient, dict[str, str]]:
    app = page(**options)
    app.headers["Cookie"] = f"{CSRF_COOKIE}={'k' * 43}"
    return app, {"X-CSRF-Token": "k" * 43}


def test_a_body_over_the_limit_is_refused_unread() -> None:
    app, headers = csrf_client()
    huge = json.dumps({"ids": ["m"] * (BODY_LIMIT // 4)})
    answer = app.post("/api/queues/orders/replay", content=huge, headers=headers)
    assert answer.status_code == 413
    form = app.post("/queues/orders/purge", content=b"id=m&" * (BODY_LIMIT // 4))
    assert form.status_code == 413


@pytest.mark.parametrize(
    ("body", "why"),
    [({"ids": ["m"] * (MAX_IDS + 1)}, "at most"), ({"ids": ["m" * (ID_BYTES + 1)]}, "bytes"),
     ({"ids": "m1"}, '"ids"'), ({"ids": [1]}, '"ids"'), ({"ids": ["m1"], "to": 5}, '"to"'),
     ({"ids": ["m1"], "to": "t" * 200_000}, "bytes"), ({"ids": ["m1"], "to": "a\nb"}, "\\n"),
     ({"ids": ["m1"], "dry_run": "false"}, '"dry_run"')],
)  # fmt: skip
def test_every_field_of_a_replay_is_bounded_before_anything_moves(
    body: dict[str, object], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    app, headers = csrf_client()
    with caplog.at_level(logging.INFO, logger="faststream_retry.web.audit"):
        answer = app.post("/api/queues/orders/replay", json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert why in answer.json()["error"]
    assert len(answer.text) < 600
    assert all("\n" not in r.getMessage() and len(r.getMessage()) < 600 for r in caplog.records)


def test_a_form_with_too_many_fields_is_refused() -> None:
    app, _ = csrf_client()
    answer = app.post("/queues/orders/purge", content=b"&".join([b"id=m"] * (MAX_IDS + 20)))
    assert answer.status_code == 400


def test_a_body_that_is_not_an_object_is_a_bad_request() -> None:
    app, headers = csrf_client()
    for content in (b"[1]", b"not json", b"[" * 100_000):
        answer = app.post("/api/queues/orders/purge", content=content, headers=headers)
        assert answer.status_code == 400, content[:10]


# ---------------------------------------------------------------------- names in URLs
@pytest.mark.parametrize("name", ["a<b", "a%0Ab", "x" * 300, "caf%C3%A9", "a%E2%80%AEb"])
def test_a_queue_name_no_queue_can_have_is_a_404_not_a_500(name: str) -> None:
    app, headers = csrf_client()
    for path in ("/queues/{}", "/api/queues/{}/dead-letters", "/queues/{}/messages/m1"):
        answer = app.get(path.format(name))
        assert answer.status_code == 404, (path, answer.text)
    for path in ("/api/queues/{}/read", "/api/queues/{}/export", "/api/queues/{}/purge"):
        answer = app.post(path.format(name), headers=headers)
        assert answer.status_code == 404, (path, answer.text)
        assert "\n" not in answer.json()["error"]


def _letter(message_id: str, position: int = 1) -> DeadLetter:
    return DeadLetter.read(
        position,
        b"{}",
        {"message_id": message_id},
        {"retry-reason": "permanent", "retry-exception": "app.E", "retry-error": "e"},
    )


@pytest.mark.parametrize(
    ("message_id", "href"),
    [("../../jobs/1/stop", "messages/..%2F..%2Fjobs%2F1%2Fstop"), ("..", "messages/?id=.."),
     (".", "messages/?id=."), ("a?b#c", "messages/a%3Fb%23c"), ("100%", "messages/100%25")],
)  # fmt: skip
def test_ids_and_names_are_shown_escaped_and_linked_encoded(message_id: str, href: str) -> None:
    """An id's link points at its own page; U+202E and control characters are shown, not run."""
    pages = _Pages(_Settings(NOWHERE, None, None, None, Guard(token=None, actions=True)))
    letters = [_letter(message_id), _letter("\u202eevil\x1b[31m", 2)]
    read = pages.reads.put("or\u202ede\nrs", Outcome("orders.dlq", taken=letters), "tester")
    html = pages.env.get_template("group.html").render(
        queue="or\u202ede\nrs",
        dlq="or\u202ede\nrs.dlq",
        group=read.groups[0],
        read=read,
        csrf="t",
        csrf_field="csrf",
        actions=True,
        root="",
    )
    assert f'href="/queues/or%E2%80%AEde%0Ars/{href}"' in html
    assert "\u202e" not in html.replace('value="\u202eevil', "")  # the form's value is data
    assert "\\u202eevil\\x1b[31m" in html
    assert "or\\u202ede\\nrs" in html


async def test_a_pages_json_holds_whatever_a_header_held() -> None:
    """NaN, bytes and decimals in a producer's headers: strict JSON, never a 500."""
    import decimal  # noqa: PLC0415

    letter = DeadLetter.read(
        1,
        b'{"x": NaN}',
        {"message_id": "m1", "content_type": "application/json"},
        {
            "retry-replayed": [{"at": b"\xff", "n": decimal.Decimal("1.5"), "f": float("inf")}],
            "x-nan": float("nan"),
        },
    )
    pages = _Pages(_Settings(NOWHERE, None, None, None, Guard(token=None, actions=True)))
    read = pages.reads.put("orders", Outcome("orders.dlq", taken=[letter]), "tester")
    from faststream_retry.web.app import _JSON  # noqa: PLC0415

    body = bytes(_JSON(read.details(letter)).body)
    json.loads(body, parse_constant=lambda c: pytest.fail(f"{c} is no JSON"))


# ---------------------------------------------------------------------- the audit log
def test_no_audit_line_can_be_forged(caplog: pytest.LogCaptureFixture) -> None:
    """A newline in a queue's name or an error starts no line of its own."""
    forged = "payments.dlq: 5000 removed (all)\n2026-01-01 audit 10.9.9.9 purge payments"
    with caplog.at_level(logging.INFO, logger="faststream_retry.web.audit"):
        audit("%s purge %s: %d removed", "127.0.0.1\n", forged, 3)
        audit("%s", "x" * 10_000)
    lines = [r.getMessage() for r in caplog.records]
    assert all("\n" not in line and "\r" not in line for line in lines)
    assert "\\n2026-01-01 audit" in lines[0]
    assert len(lines[1]) < 400


async def test_a_failed_jobs_audit_line_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    from faststream_retry.ops.common import OperationError  # noqa: PLC0415

    async def fail(_job: object) -> dict[str, object]:
        raise OperationError("gone\nforged line")

    with caplog.at_level(logging.INFO, logger="faststream_retry.web.audit"):
        job = Jobs().start("purge", "pay\nments", fail, who="127.0.0.1")
        assert job.task is not None
        await job.task
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line
    assert "'pay\\nments'" in line


# ---------------------------------------------------------------------- memory
def test_the_status_samples_a_chart_point_at_most_every_few_seconds() -> None:
    history = History()
    status = {"queues": [{"queue": "orders", "dlq": {"messages": 1}}]}
    for n in range(1000):
        history.record(status, now=1000 + n / 100)  # 1,000 answers in 10 s
    assert len(history.of("orders")) == 2
    history.record({"queues": []}, now=2000)
    assert history.of("orders") == []  # a queue gone from the status is not kept


def test_a_read_keeps_its_letters_within_its_budget() -> None:
    big = [
        DeadLetter.read(n, b"x" * 100_000, {"message_id": f"m{n}"}, {"x-h": "h" * 50_000})
        for n in range(1, 41)
    ]
    reads = Reads(kept=2, budget=1_000_000)
    read = reads.put("orders", Outcome("orders.dlq", taken=big), "tester")
    kept = sum(len(x.body.text) + len(repr(x.headers)) for x in read.outcome.taken)
    assert kept < 1_100_000
    assert read.short  # past the budget: kept in short
    assert read.body_chars[1] == 100_000
    assert read.details(read.outcome.taken[0])["body_whole"] is False
    for queue in ("a", "b"):
        reads.put(queue, Outcome(f"{queue}.dlq"), "tester")
    assert reads.get("orders") is None  # only the last two reads
