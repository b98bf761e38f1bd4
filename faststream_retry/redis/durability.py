"""What a Redis crash can lose, from the server's persistence settings (pure).

Everything the plugin holds on Redis (the streams' entries, the retry schedules, the dead
letters) is only as durable as the server's persistence. ``doctor`` reads three settings
with ``CONFIG GET`` and says, in one line, what a crash can lose with them:

- ``appendonly yes``, ``appendfsync always``: every write is on disk before Redis
  answers, so nothing acknowledged is lost.
- ``appendonly yes``, ``appendfsync everysec`` (Redis' default with the AOF on): the AOF
  is flushed to disk once a second, so up to about a second of writes.
- ``appendonly yes``, ``appendfsync no``: the operating system flushes when it likes
  (Linux: about every 30 s), so up to that long.
- ``appendonly no`` with ``save`` rules (RDB snapshots only): everything written since
  the last snapshot.
- neither: everything, at the first restart.

A managed service often renames or denies ``CONFIG``; ``INFO persistence`` still says
whether the AOF is on (``aof_enabled``) and when the last snapshot was taken, but not
the fsync policy, and the line says what is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Durability", "Persistence", "durability"]

Level = Literal["ok", "warning"]


@dataclass(frozen=True, slots=True)
class Persistence:
    """The server's persistence settings, as read (``None``: could not be read)."""

    appendonly: str | None
    """``yes`` or ``no``: ``CONFIG GET appendonly``, else ``INFO``'s ``aof_enabled``."""
    appendfsync: str | None
    """``always``, ``everysec`` or ``no``; ``None`` when ``CONFIG`` was refused."""
    save: str | None
    """The RDB snapshot rules (``"3600 1 300 100"``; ``""``: none); ``None``: refused."""
    config_refused: str | None = None
    """Why ``CONFIG GET`` failed (renamed, denied by an ACL); ``None``: it answered."""
    last_save_age_s: int | None = None
    """Seconds since the last RDB snapshot (``INFO``'s ``rdb_last_save_time``)."""


@dataclass(frozen=True, slots=True)
class Durability:
    """What ``doctor`` says of the persistence: how urgent, the one line, and the fix."""

    level: Level
    loss: str
    """What a crash can lose, in one line, with the settings that make it so."""
    fix: str


_ALWAYS = "set appendonly yes and appendfsync always (each write waits for the disk)"


def durability(p: Persistence) -> Durability:
    """Say what a crash of the server can lose with ``p``'s settings (pure)."""
    if p.appendonly == "yes":
        return _aof(p)
    return _no_aof(p)


def _refused(p: Persistence) -> str:
    return "" if p.config_refused is None else f" (CONFIG GET refused: {p.config_refused})"


def _aof(p: Persistence) -> Durability:
    """With the AOF on: its fsync policy says how much."""
    if p.appendfsync == "always":
        return Durability(
            "ok",
            "a crash loses nothing acknowledged: every write is on disk before Redis "
            "answers (appendonly yes, appendfsync always)",
            "",
        )
    if p.appendfsync == "everysec":
        return Durability(
            "ok",
            "a crash can lose up to about a second of writes: the messages published, "
            "retries scheduled and dead letters written in it (appendonly yes, "
            "appendfsync everysec)",
            f"if no acknowledged write may be lost, {_ALWAYS}",
        )
    if p.appendfsync == "no":
        return Durability(
            "warning",
            "a crash of the machine can lose the writes the operating system has not "
            "flushed yet, on Linux up to about 30 s of them (appendonly yes, "
            "appendfsync no)",
            f"set appendfsync everysec (about a second at most), or {_ALWAYS}",
        )
    return Durability(
        "warning",
        "the AOF is on, but its fsync policy could not be read, so a crash can lose "
        f"from nothing to about 30 s of writes{_refused(p)}",
        "ask the service which appendfsync it runs with (always: nothing lost; "
        "everysec: about a second)",
    )


def _no_aof(p: Persistence) -> Durability:
    """Without the AOF (or not known): RDB snapshots, or nothing."""
    snapshots = _snapshots(p)
    if p.appendonly == "no" and snapshots is not None:
        if snapshots:
            age = (
                "" if p.last_save_age_s is None else f"; the last one was {p.last_save_age_s} s ago"
            )
            return Durability(
                "warning",
                "a crash loses every write since the last RDB snapshot: the messages, "
                "scheduled retries and dead letters of that time (appendonly no, "
                f"save {p.save!r}{age})",
                f"{_ALWAYS}, or appendfsync everysec (about a second at most)",
            )
        return Durability(
            "warning",
            "a restart or crash loses everything: every stream, retry schedule and dead "
            "letter (appendonly no, save '': no persistence)",
            _ALWAYS,
        )
    if p.appendonly == "no":
        return Durability(
            "warning",
            "a crash loses every write since the last RDB snapshot, or everything if none "
            f"is taken: the AOF is off and the snapshot rules could not be read{_refused(p)}",
            _ALWAYS,
        )
    return Durability(
        "warning",
        "what a crash can lose is unknown: the persistence settings could not be read"
        f"{_refused(p)}",
        "check appendonly, appendfsync and save with the service (always: nothing "
        "acknowledged lost)",
    )


def _snapshots(p: Persistence) -> bool | None:
    """Whether RDB snapshots are taken; ``None``: not known."""
    if p.save is None:
        return None
    return bool(p.save.strip())
