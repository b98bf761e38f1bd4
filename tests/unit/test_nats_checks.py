"""What the NATS start checks conclude from a consumer's and the streams' configs (pure)."""

from __future__ import annotations

from types import SimpleNamespace

from faststream_retry.nats import checks


def consumer(**fields: object) -> SimpleNamespace:
    return SimpleNamespace(**{"ack_wait": None, "backoff": None, "max_deliver": None, **fields})


def stream(**fields: object) -> SimpleNamespace:
    return SimpleNamespace(**{"duplicate_window": 0, "max_msg_size": -1, **fields})


def test_an_ack_wait_the_pubacks_wait_can_outlast_is_warned_of() -> None:
    """Below publish_timeout: a warning naming both and the fix; JetStream's default 30 s
    against the default 30 s publish_timeout, or longer, is not; backoff[0] is the first
    delivery's wait."""
    [found] = checks.consumer_findings("S.d", consumer(ack_wait=5.0), 20, 30.0)
    assert (found.refuse, found.check) == (False, "ack-wait")
    assert "waits 5 s for an ack" in found.text
    assert "ConsumerConfig(ack_wait=...)" in found.text
    assert "RetryMiddleware(publish_timeout=...)" in found.text
    assert checks.consumer_findings("S.d", consumer(), 20, 30.0) == []
    assert checks.consumer_findings("S.d", consumer(ack_wait=60.0), 20, 30.0) == []
    assert checks.consumer_findings("S.d", consumer(ack_wait=5.0), 20) == []  # not asked
    [found] = checks.consumer_findings("S.d", consumer(ack_wait=60.0, backoff=[2.0, 90.0]), 20, 30)
    assert "waits 2 s" in found.text


def test_a_consumer_on_the_server_says_so_and_how_to_change_it_there() -> None:
    """Read from the server: named as stream/name, with the nats CLI line that changes it."""
    [found] = checks.consumer_findings("S.d", consumer(max_deliver=2), 20, on_server="S/d")
    assert found.what == "the consumer S/d (of 'S.d') on the server has max_deliver=2"
    assert "nats consumer edit S d" in found.fix
    [found] = checks.consumer_findings(
        "S.d", consumer(ack_policy=SimpleNamespace(value="none")), 20, on_server="S/d"
    )
    assert found.refuse
    assert "nats consumer rm S d" in found.fix
    assert "edit" not in found.fix  # JetStream cannot change a consumer's ack policy


def test_a_duplicate_window_must_outlast_what_repeats_a_publish() -> None:
    """Longer than the wait: nothing; as long or shorter: a warning; 0 is JetStream's 2 min."""
    assert checks.window_finding("D", 31.0, 30.0, "x") is None
    assert checks.window_finding("D", 0, 119.0, "x") is None
    found = checks.window_finding("D", 0, 120.0, "a redelivery")
    assert found is not None
    assert found.what == "the stream 'D' drops a repeated Nats-Msg-Id within 2 min only"
    assert found.why.startswith("a redelivery can come 2 min after the first publish")
    assert "nats stream edit D --dupe-window 240s" in found.fix


def test_a_plugin_stream_needs_room_for_the_largest_copy() -> None:
    """Unset (-1): nothing; set below the covered stream's largest message plus the headers
    the plugin adds: a warning with the size it needs."""
    assert checks.size_finding("D", -1, "W", 1024) is None
    assert checks.size_finding("D", 1024 + 12 * 1024, "W", 1024) is None
    found = checks.size_finding("D", 1024 + 12 * 1024 - 1, "W", 1024)
    assert found is not None
    assert found.check == "max-msg-size"
    assert "--max-msg-size 13312" in found.fix


def test_stream_findings_weigh_every_covered_subscriber() -> None:
    """The delay stream against the longest wait of any covered consumer and the largest
    message of any covered stream; each dead-letter stream against its own stream's."""
    covered = [
        checks.Covered("A.d", "A", "d", consumer(ack_wait=200.0), 2048),
        checks.Covered("B.d", "B", "d", consumer(), None),
    ]
    found = checks.Streams(
        delay=stream(max_msg_size=4096),
        dead_letters={"A": stream(), "B": stream(duplicate_window=10.0)},
        covered={"A": None, "B": stream(max_msg_size=8192)},
    )
    by = {(f.check, f.subject): f for f in checks.stream_findings("p", covered, found, 1 << 20)}
    assert set(by) == {
        ("duplicate-window", "p-delay"),
        ("max-msg-size", "p-delay"),
        ("duplicate-window", "p-dlq-A"),
        ("duplicate-window", "p-dlq-B"),
    }
    assert "'B' takes messages of up to 8,192 bytes" in by["max-msg-size", "p-delay"].why
    assert "above 3 min 20 s" in by["duplicate-window", "p-delay"].fix
    assert "above 30 s" in by["duplicate-window", "p-dlq-B"].fix
    assert found.missing("p") == []
    assert checks.Streams(None, {"A": None}, {}).missing("p") == ["p-delay", "p-dlq-A"]
