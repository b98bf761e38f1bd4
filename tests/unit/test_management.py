"""The management API client sends what RabbitMQ's HTTP API expects and reads its answer.

RabbitMQ's management plugin is off on the test broker (and turning it on at run time
would bind a port other brokers may use), so this checks the client's side of the
exchange against a local HTTP server that records the request: the path, the vhost's
quoting, basic auth from the URL, and the errors an operator gets. That the real API
answers this request was checked by hand against a broker with the plugin on.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from faststream_retry.ops.common import OperationError
from faststream_retry.ops.management import Listed, list_queues

if TYPE_CHECKING:
    from collections.abc import Iterator


class Recorder(BaseHTTPRequestHandler):
    """Answers every GET with ``answer`` (status, body) and records the request."""

    answer: ClassVar[tuple[int, bytes]] = (200, b"[]")
    seen: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        Recorder.seen.append({"path": self.path, "auth": self.headers.get("Authorization")})
        status, body = Recorder.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def server() -> Iterator[str]:
    httpd = HTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Recorder.seen.clear()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_it_asks_for_the_queue_names_of_the_vhost_with_the_urls_credentials(server: str) -> None:
    rows = [
        {"name": "retry.delay.100", "messages_dlx": 32},
        {"name": "orders.dlq"},
        {"name": "odd", "messages_dlx": "7"},
        {"other": 1},
        "junk",
    ]
    Recorder.answer = (200, json.dumps(rows).encode())
    listed = list_queues(f"http://ops:s%3Acret@{server}/", "prod/eu")
    assert listed == [
        Listed("retry.delay.100", undeliverable=32),
        Listed("orders.dlq"),
        Listed("odd"),
    ]
    (request,) = Recorder.seen
    assert request["path"] == "/api/queues/prod%2Feu?columns=name,messages_dlx"
    assert request["auth"] == "Basic " + base64.b64encode(b"ops:s:cret").decode()


def test_a_refused_login_or_an_unreachable_api_is_an_operation_error(server: str) -> None:
    Recorder.answer = (401, b'{"error":"not_authorised"}')
    with pytest.raises(OperationError, match="answered 401"):
        list_queues(f"http://guest:wrong@{server}", "/")
    with pytest.raises(OperationError, match="takes http"):
        list_queues("amqp://guest:guest@127.0.0.1:5672/", "/")
    with pytest.raises(OperationError, match="cannot read the management API"):
        list_queues("http://guest:guest@127.0.0.1:1", "/", timeout=2)
