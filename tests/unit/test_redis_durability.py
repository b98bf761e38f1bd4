"""What ``doctor`` says a Redis crash can lose, from the persistence settings it read (pure)."""

from __future__ import annotations

import pytest

from faststream_retry.redis.durability import Persistence, durability


def said(
    appendonly: str | None,
    appendfsync: str | None,
    save: str | None,
    refused: str | None = None,
    age: int | None = None,
) -> tuple[str, str, str]:
    found = durability(Persistence(appendonly, appendfsync, save, refused, age))
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


def test_appendfsync_everysec_loses_about_a_second() -> None:
    """Redis' default with the AOF on: ok, the second said, and the setting that loses none."""
    level, loss, fix = said("yes", "everysec", "")
    assert level == "ok"
    assert loss.startswith("a crash can lose up to about a second of writes: ")
    assert loss.endswith("(appendonly yes, appendfsync everysec)")
    assert fix == (
        "if no acknowledged write may be lost, set appendonly yes and appendfsync always "
        "(each write waits for the disk)"
    )


def test_appendfsync_no_leaves_it_to_the_operating_system() -> None:
    level, loss, fix = said("yes", "no", "")
    assert level == "warning"
    assert "up to about 30 s" in loss
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
