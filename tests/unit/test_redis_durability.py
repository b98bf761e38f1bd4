"""What ``doctor`` says a Redis crash can lose, from the persistence settings it read (pure)."""

from __future__ import annotations

import pytest

from faststream_retry.redis.durability import Persistence, Replication, durability, failover


def said(
    appendonly: str | None,
    appendfsync: str | None,
    save: str | None,
    refused: str | None = None,
    age: int | None = None,
    **more: object,
) -> tuple[str, str, str]:
    found = durability(Persistence(appendonly, appendfsync, save, refused, age, **more))  # type: ignore[arg-type]
    return found.level, found.loss, found.fix


def test_appendfsync_always_loses_nothing_acknowledged() -> None:
    """Every write on disk before the reply: ok, nothing to fix, whatever the RDB rules."""
    for save in ("", "3600 1"):
        assert said("yes", "always", save) == (
            "ok",
            (
                "a crash loses nothing acknowledged: every write is on disk before Redis answers "
                "(appendonly yes, appendfsync always)"
            ),
            "",
        )


def test_appendfsync_always_with_no_fsync_on_rewrite_is_not_taken_for_always() -> None:
    """no-appendfsync-on-rewrite yes suspends the fsync during every background save or AOF
    rewrite, even under always: a warning, the window and the fix named.

    Found in review: doctor said "nothing acknowledged" without reading it.
    """
    level, loss, fix = said("yes", "always", "", no_fsync_on_rewrite="yes")
    assert level == "warning"
    assert loss.startswith("a crash of the machine while Redis saves in the background")
    assert "no-appendfsync-on-rewrite yes suspends the fsync" in loss
    assert fix == "set no-appendfsync-on-rewrite no, so that every write waits for the disk"
    assert said("yes", "always", "", no_fsync_on_rewrite="no")[0] == "ok"


def test_appendfsync_everysec_loses_up_to_about_two_seconds() -> None:
    """Redis' default with the AOF on: a second, and up to 2 s more while a slow fsync holds
    even the write back (aof.c), so a process kill is safe only while the disk keeps up; a
    disk that fell behind (aof_delayed_fsync) is a warning, its count said.

    Found in review: "about a second", and "nothing acknowledged" on a process kill.
    """
    level, loss, fix = said("yes", "everysec", "", delayed_fsyncs=0)
    assert level == "ok"
    assert loss.startswith("a crash can lose up to about 2 s of acknowledged writes: ")
    assert "a kill of the Redis process alone loses nothing only while the disk keeps up" in loss
    assert loss.endswith("(appendonly yes, appendfsync everysec)")
    assert fix == (
        "if no acknowledged write may be lost, set appendonly yes and appendfsync always "
        "(each write waits for the disk)"
    )
    level, loss, _ = said("yes", "everysec", "", delayed_fsyncs=7)
    assert level == "warning"
    assert "the disk has fallen behind 7 time(s) since Redis started (aof_delayed_fsync)" in loss


def test_a_primary_with_replicas_can_lose_acknowledged_steps_on_failover() -> None:
    """Replication is asynchronous: a failover loses what the replica had not received,
    whatever appendfsync says; min-replicas-to-write bounds it, and is named. No replica:
    nothing said.

    Found in review: doctor read only the role, and said "nothing acknowledged".
    """
    assert failover(None) is None
    assert failover(Replication(replicas=0)) is None
    found = failover(Replication(replicas=2, min_replicas=0, max_lag_s=10))
    assert found is not None
    assert found.level == "warning"
    assert found.loss.startswith(
        "a failover to one of its 2 replica(s) loses the acknowledged writes that replica "
        "had not received yet, whatever appendfsync says"
    )
    assert "min-replicas-to-write is off, so nothing bounds it" in found.loss
    assert "min-replicas-to-write 1" in found.fix
    bounded = failover(Replication(replicas=1, min_replicas=1, max_lag_s=10))
    assert bounded is not None
    assert "min-replicas-to-write 1 bounds it to about min-replicas-max-lag (10 s)" in bounded.loss


def test_appendfsync_no_leaves_it_to_the_operating_system() -> None:
    level, loss, fix = said("yes", "no", "")
    assert level == "warning"
    assert "up to about 30 s" in loss
    assert "a kill of the Redis process alone loses nothing acknowledged" in loss
    assert loss.endswith("(appendonly yes, appendfsync no)")
    assert fix.startswith("set appendfsync everysec")


def test_rdb_alone_loses_what_came_since_the_last_snapshot() -> None:
    """The rules and the age of the last snapshot are named: the window is concrete."""
    level, loss, fix = said("no", "everysec", "3600 1 300 100", age=42)
    assert level == "warning"
    assert loss == (
        "a crash loses every write since the last RDB snapshot: the messages, scheduled "
        "retries and dead letters of that time (appendonly no, save '3600 1 300 100'; the "
        "last one was 42 s ago)"
    )
    assert "appendfsync always" in fix
    assert "; the last one" not in said("no", "everysec", "60 1")[1]


@pytest.mark.parametrize("save", ["", "  "])
def test_no_persistence_loses_everything(save: str) -> None:
    """appendfsync is moot without the AOF: everything goes at the first restart."""
    level, loss, fix = said("no", "always", save)
    assert level == "warning"
    assert loss == (
        "a restart or crash loses everything: every stream, retry schedule and dead letter "
        "(appendonly no, save '': no persistence)"
    )
    assert fix == "set appendonly yes and appendfsync always (each write waits for the disk)"


def test_a_refused_config_is_said_with_what_info_still_tells() -> None:
    """CONFIG renamed or denied: the server's answer is quoted; the AOF's state, known from
    INFO, still bounds the loss; nothing known says so."""
    refused = "NOPERM this user has no permissions to run the 'config|get' command"
    level, loss, _ = said("yes", None, None, refused)
    assert level == "warning"
    assert "the AOF is on, but its fsync policy could not be read" in loss
    assert loss.endswith(f"(CONFIG GET refused: {refused})")
    level, loss, _ = said("no", None, None, refused)
    assert "the AOF is off and the snapshot rules could not be read" in loss
    level, loss, fix = said(None, None, None, "unknown command 'CONFIG'")
    assert level == "warning"
    assert loss == (
        "what a crash can lose is unknown: the persistence settings could not be read "
        "(CONFIG GET refused: unknown command 'CONFIG')"
    )
    assert fix.startswith("check appendonly, appendfsync and save")


def test_an_unknown_fsync_policy_is_not_taken_for_a_safe_one() -> None:
    """A value this code does not know (a future Redis): a warning, never an ok."""
    assert said("yes", "sometimes", "")[0] == "warning"
