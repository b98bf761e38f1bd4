"""What a Redis crash or failover can lose, from the server's persistence settings (pure).

Everything the plugin holds on Redis (the streams' entries, the retry schedules, the dead
letters) is only as durable as the server's persistence. ``doctor`` reads the settings
with ``CONFIG GET`` and ``INFO`` and says, in one line, what a crash can lose with them:

- ``appendonly yes``, ``appendfsync always``: every write is on disk before Redis
  answers, so nothing acknowledged is lost; but with ``no-appendfsync-on-rewrite yes``
  the fsync is suspended while a background save or AOF rewrite runs (seconds to
  minutes), and a machine crash then loses what that time wrote.
- ``appendonly yes``, ``appendfsync everysec`` (Redis' default with the AOF on): the AOF
  is flushed once a second, and while an fsync is slow Redis postpones even the
  ``write(2)`` for up to 2 s more, still answering (``aof.c``; counted by ``INFO``'s
  ``aof_delayed_fsync``): up to about 2 s of acknowledged writes, on a process kill too
  when the disk falls behind.
- ``appendonly yes``, ``appendfsync no``: the operating system flushes when it likes
  (Linux: about every 30 s), so a machine crash can lose up to that long.
- ``appendonly no`` with ``save`` rules (RDB snapshots only): everything written since
  the last snapshot.
- neither: everything, at the first restart.

Apart from these, a primary with replicas (Sentinel, Cluster) that fails over loses the
acknowledged writes its replica had not received yet, whatever ``appendfsync`` says:
replication is asynchronous, and ``min-replicas-to-write`` only bounds the lag
(``failover``).

A managed service often renames or denies ``CONFIG``; ``INFO persistence`` still says
whether the AOF is on (``aof_enabled``) and when the last snapshot was taken, but not
the fsync policy, and the line says what is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Durability", "Persistence", "Replication", "durability", "failover"]

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
    no_fsync_on_rewrite: str | None = None
    """``yes`` or ``no``: ``CONFIG GET no-appendfsync-on-rewrite``; ``None``: not read."""
    delayed_fsyncs: int | None = None
    """``INFO persistence``'s ``aof_delayed_fsync``: writes postponed by a slow fsync."""


@dataclass(frozen=True, slots=True)
class Replication:
    """A primary's replicas, as read (``INFO replication``, ``CONFIG GET min-replicas-*``)."""

    replicas: int
    """``connected_slaves``."""
    min_replicas: int | None = None
    """``min-replicas-to-write`` (0: off); ``None``: not read."""
    max_lag_s: int | None = None
    """``min-replicas-max-lag``; ``None``: not read."""


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
        if p.no_fsync_on_rewrite == "yes":
            return Durability(
                "warning",
                "a crash of the machine while Redis saves in the background (BGSAVE, an AOF "
                "rewrite: seconds to minutes) loses the writes of that time, acknowledged or "
                "not: no-appendfsync-on-rewrite yes suspends the fsync then; at other times, "
                "and on a kill of the Redis process, nothing acknowledged (appendonly yes, "
                "appendfsync always)",
                "set no-appendfsync-on-rewrite no, so that every write waits for the disk",
            )
        return Durability(
            "ok",
            "a crash loses nothing acknowledged: every write is on disk before Redis "
            "answers (appendonly yes, appendfsync always)",
            "",
        )
    if p.appendfsync == "everysec":
        return _everysec(p)
    if p.appendfsync == "no":
        return Durability(
            "warning",
            "a crash of the machine can lose the writes the operating system has not "
            "flushed yet, on Linux up to about 30 s of them; a kill of the Redis process "
            "alone loses nothing acknowledged (appendonly yes, appendfsync no)",
            f"set appendfsync everysec (about 2 s at most), or {_ALWAYS}",
        )
    return Durability(
        "warning",
        "the AOF is on, but its fsync policy could not be read, so a crash can lose "
        f"from nothing to about 30 s of writes{_refused(p)}",
        "ask the service which appendfsync it runs with (always: nothing lost; "
        "everysec: up to about 2 s)",
    )


def _everysec(p: Persistence) -> Durability:
    """``everysec``: a second, and up to 2 s more while a slow fsync holds the writes back."""
    slow = ""
    if p.delayed_fsyncs:
        slow = (
            f"; the disk has fallen behind {p.delayed_fsyncs} time(s) since Redis started "
            "(aof_delayed_fsync), each time holding up to 2 s of writes in memory"
        )
    return Durability(
        "warning" if p.delayed_fsyncs else "ok",
        "a crash can lose up to about 2 s of acknowledged writes: the messages published, "
        "retries scheduled and dead letters written in them. Redis fsyncs once a second, "
        "and while an fsync is slow it holds even the write back for up to 2 s, answering "
        "all the same, so a kill of the Redis process alone loses nothing only while the "
        f"disk keeps up{slow} (appendonly yes, appendfsync everysec)",
        f"if no acknowledged write may be lost, {_ALWAYS}",
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
                f"{_ALWAYS}, or appendfsync everysec (about 2 s at most)",
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


def failover(r: Replication | None) -> Durability | None:
    """Say what a failover to a replica can lose (pure); ``None``: no replica, no failover."""
    if r is None or r.replicas <= 0:
        return None
    bound = (
        f"min-replicas-to-write {r.min_replicas} bounds it to about min-replicas-max-lag "
        f"({r.max_lag_s if r.max_lag_s is not None else '?'} s) of writes"
        if r.min_replicas
        else "min-replicas-to-write is off, so nothing bounds it"
    )
    return Durability(
        "warning",
        f"a failover to one of its {r.replicas} replica(s) loses the acknowledged writes "
        "that replica had not received yet, whatever appendfsync says: replication is "
        f"asynchronous and the plugin does not WAIT; {bound}. A step lost so is run again "
        "(its entry pending once more), a message published then is lost",
        "set min-replicas-to-write 1 and a small min-replicas-max-lag to bound the loss; "
        "keep the replicas' clocks in sync (a copy is due by the primary's clock)",
    )
