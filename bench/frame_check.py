"""What measuring every copy against the frame limit costs, next to what a publish costs anyway.

Every copy is checked before it is published (``faststream_retry.core.fit``): a quick bound
(``marshal``), and the exact encoding only near the limit. aiormq encodes the same
properties once more to send them. For copies the plugin makes every day (a first retry,
a tenth, a dead letter with its traceback) and one near the limit, this prints, in one
run, the time of the check, of the encoding aiormq does anyway, and their ratio; no
broker needed.

    python -m bench.frame_check [N]
"""

from __future__ import annotations

import functools
import sys
import timeit
from typing import Any

from pamqp import commands
from rich.console import Console
from rich.table import Table

from faststream_retry.core import headers as h
from faststream_retry.core.fit import payload_limit
from faststream_retry.rabbit import frames

LIMIT = payload_limit(131_072) or 0


def _copies() -> dict[str, commands.Basic.Properties]:
    own = {
        "traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01",
        "tenant": "acme",
    }
    failure = h.FailureRecord(
        attempt=1,
        at_ms=h.now_ms(),
        exception="smtplib.SMTPServerDisconnected",
        error="Connection unexpectedly closed: timed out after 30 s talking to smtp.example.com",
        delay_ms=1000,
    )
    first = h.retry_headers(own, failure, h.now_ms() + 1000)
    tenth = first
    for _ in range(9):
        tenth = h.retry_headers(tenth, failure, h.now_ms() + 1000)
    dead = h.dead_letter_headers(
        tenth, failure, reason="exhausted", origin_queue="email-queue", traceback="x" * 3000
    )
    near = {**first, "big": "b" * (LIMIT - 3000)}

    def properties(headers: dict[str, Any]) -> commands.Basic.Properties:
        return commands.Basic.Properties(
            headers=headers,
            content_type="application/json",
            delivery_mode=2,
            message_id="6f1c0e9c4b7d4a4e9d8f5b1e2a3c4d5e",
            correlation_id="b7e1f7a2-5c4e-4f0e-9a51-3d2c1b0a9f8e",
        )

    return {
        "first retry (1 failure in the history)": properties(first),
        "tenth retry (10 in the history)": properties(tenth),
        "dead letter (10 + a 3 KB traceback)": properties(dead),
        "near the limit (a 128 KB header of its own)": properties(near),
    }


def main(n: int) -> None:
    table = Table(title=f"the frame check against aiormq's own encoding, {n:,} times each")
    for column in ("copy", "header frame bytes", "check µs", "encode µs", "check / encode"):
        table.add_column(column, justify="left" if column == "copy" else "right")
    for name, properties in _copies().items():
        size = frames.header_size(properties, 100)
        assert frames.fits(properties, 100, LIMIT)  # noqa: S101 - the bench's premise
        fits = functools.partial(frames.fits, properties, 100, LIMIT)
        encode_ = functools.partial(frames.header_size, properties, 100)
        check = min(timeit.repeat(fits, number=n, repeat=5))
        encode = min(timeit.repeat(encode_, number=n, repeat=5))
        table.add_row(
            name,
            f"{size:,}",
            f"{check / n * 1e6:.1f}",
            f"{encode / n * 1e6:.1f}",
            f"{check / encode:.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
