"""The atomic steps, each one Lua script on the keys of one hash slot.

Sent by ``EVALSHA``; a server that does not know a script (restarted, failed over,
``SCRIPT FLUSH``) answers ``NOSCRIPT`` and redis-py's ``AsyncScript`` loads it and runs it
again. Every time is the server's (``TIME``), so replicas with skewed clocks agree on
what is due. Times are integer milliseconds.

``RETRY_LATER``  KEYS stream, schedule, data; ARGV group, entry id, copy id, copy,
                 delay ms, wake channel. Return one integer, ``due ms * 4 + outcome``
                 (``split_due``; one reply line where ``{outcome, due}`` took three,
                 and exact: a due time of ms since the epoch times 4 is far below
                 2^53, the largest integer a Lua number holds). When the entry is
                 pending in the group: store the copy, score it ``now + delay``, ``XACK``
                 the entry, nudge the movers when it is the new head (``WRITTEN``).
                 When it is not pending: this very copy already stored (a script run
                 again after its reply was lost) is ``ALREADY_WRITTEN``, nothing done; an
                 entry still in the stream was settled by another consumer
                 (``SETTLED_ELSEWHERE``, nothing done); an entry gone from the stream
                 (the producer's ``MAXLEN``, an ``XDEL``: a claimer's ``XAUTOCLAIM`` or
                 ``XCLAIM`` then drops it from the pending list too) exists only in the
                 caller's memory, and its copy is stored from it (``FROM_MEMORY``).
``DEAD_LETTER``  KEYS stream, dlq; ARGV group, entry id, letter, maxlen (0: no cap).
                 Return the outcome: ``XADD`` the letter to the dead-letter stream and
                 ``XACK`` the entry when it is pending; when not, the same three cases
                 (this letter among the dead-letter stream's last 100, the entry still
                 in the stream, or gone and written from memory).
``MOVE``         KEYS stream, schedule, data; ARGV batch, group. Up to ``batch`` copies
                 due by now: ``XADD`` each to the stream, remove it from the schedule and
                 the data. Return ``{moved, head due ms or -1, now ms, group missing}``.
                 A stream without the group (deleted by an operator) gets nothing: a
                 group made again starts at ``$``, behind any copy added meanwhile, so
                 the copies wait in the schedule.
``RELEASE``      KEYS stream; ARGV group, consumer, entry id. An entry still pending for
                 ``consumer`` (read, never handed to a handler) is added again unchanged
                 and acknowledged: delivered afresh, no attempt spent. Return 1, or 0
                 when it is not pending there or not in the stream.

Redis does not undo a script's writes when a later command of it fails, so each
settling script writes the copy or letter first and acknowledges the entry last: a
script stopped part-way (a key of another type, a command the app's ACL user may not
run, the server out of memory) leaves the entry pending, to be delivered again, never
acknowledged with nothing stored. The worst a stop between the write and the ``XACK``
can do is a copy beside a pending entry: a duplicate, which the guarantees allow, not a
loss. The types of the keys written are checked before anything, and a clash refused
(``WRONGTYPE``) with nothing done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from faststream_retry.redis.client import Client

__all__ = [
    "ALREADY_WRITTEN",
    "DEAD_LETTER",
    "FROM_MEMORY",
    "MOVE",
    "RELEASE",
    "RETRY_LATER",
    "SETTLED_ELSEWHERE",
    "WRITTEN",
    "Scripts",
    "split_due",
]

SETTLED_ELSEWHERE = 0
"""The entry was not pending and is still in the stream: another consumer settled it."""
WRITTEN = 1
"""The entry was pending: the copy or letter written, the entry acknowledged."""
FROM_MEMORY = 2
"""The entry was gone from the stream (MAXLEN, XDEL): written from the caller's copy."""
ALREADY_WRITTEN = 3
"""This very copy or letter was already written: the script ran again (a lost reply)."""

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# A dead letter is written under maxmemory too (noeviction): refused, a failed entry
# whose attempts are spent would stay pending and be claimed again and again. A retry
# is not: refused, its entry stays pending (nothing lost), and a full server does not
# grow by a copy per failing entry of the backlog. Redis 7.0 and Valkey 7.2 read a
# script's flags from its first line; with a first line and no flags, the server refuses
# the whole script at once under maxmemory, before any write.
_SETTLING = "#!lua flags=allow-oom\n"
_RETRYING = "#!lua\n"

_GUARD = """
local function expect(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= kind then
    return redis.error_reply('WRONGTYPE ' .. key .. ' is a ' .. found .. ', not a ' .. kind ..
      ': nothing was done, the entry stays pending')
  end
end
-- Is the entry pending in the group (delivered, not yet acknowledged)?
local function pending(stream, group, id)
  return #redis.call('XPENDING', stream, group, id, id, 1) > 0
end
-- Is the entry still in the stream (not trimmed by MAXLEN, not deleted)?
local function present(stream, id)
  return #redis.call('XRANGE', stream, id, id) > 0
end
"""

RETRY_LATER = (
    _RETRYING
    + _GUARD
    + """
local refused = expect(KEYS[2], 'zset') or expect(KEYS[3], 'hash')
if refused then return refused end
local outcome = 1
if not pending(KEYS[1], ARGV[1], ARGV[2]) then
  if redis.call('HGET', KEYS[3], ARGV[3]) == ARGV[4] then
    return tonumber(redis.call('ZSCORE', KEYS[2], ARGV[3]) or 0) * 4 + 3
  end
  if present(KEYS[1], ARGV[2]) then return 0 end
  outcome = 2
end
"""
    + _NOW
    + """
local due = now + tonumber(ARGV[5])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[2], due, ARGV[3])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if head[1] == ARGV[3] then redis.call('PUBLISH', ARGV[6], due) end
return due * 4 + outcome
"""
)

DEAD_LETTER = (
    _SETTLING
    + _GUARD
    + """
local refused = expect(KEYS[2], 'stream')
if refused then return refused end
local outcome = 1
if not pending(KEYS[1], ARGV[1], ARGV[2]) then
  for _, row in ipairs(redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 100)) do
    local fields = row[2]
    if fields[1] == '__data__' and fields[2] == ARGV[3] then return 3 end
  end
  if present(KEYS[1], ARGV[2]) then return 0 end
  outcome = 2
end
if tonumber(ARGV[4]) > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', '__data__', ARGV[3])
else
  redis.call('XADD', KEYS[2], '*', '__data__', ARGV[3])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return outcome
"""
)

MOVE = (
    _NOW
    + """
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local next_due = -1
if head[2] then next_due = tonumber(head[2]) end
if type(redis.pcall('XPENDING', KEYS[1], ARGV[2])['err']) == 'string' then
  return {0, next_due, now, 1}
end
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(due) do
  local copy = redis.call('HGET', KEYS[3], id)
  if copy then redis.call('XADD', KEYS[1], '*', '__data__', copy) end
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
end
head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
next_due = -1
if head[2] then next_due = tonumber(head[2]) end
return {#due, next_due, now, 0}
"""
)

# Lua's unpack takes a few thousand values at most: an entry with more fields than that
# is left pending, to be claimed as its stopped reader's would be.
RELEASE = """
local rows = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #rows == 0 then return 0 end
local found = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
if #found == 0 or #found[1][2] == 0 or #found[1][2] > 7000 then return 0 end
redis.call('XADD', KEYS[1], '*', unpack(found[1][2]))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


def split_due(reply: int) -> tuple[int, int]:
    """Return ``RETRY_LATER``'s ``(outcome, due ms)``; due -1 when nothing was scheduled."""
    due, outcome = divmod(int(reply), 4)
    return outcome, -1 if outcome == SETTLED_ELSEWHERE else due


class Scripts:
    """The scripts, registered on one client (``EVALSHA``, loaded again on ``NOSCRIPT``)."""

    __slots__ = ("dead_letter", "move", "release", "retry_later")

    def __init__(self, client: Client) -> None:
        """Register the scripts on ``client``; nothing is sent until one runs."""
        self.retry_later: AsyncScript = client.register_script(RETRY_LATER)
        self.dead_letter: AsyncScript = client.register_script(DEAD_LETTER)
        self.move: AsyncScript = client.register_script(MOVE)
        self.release: AsyncScript = client.register_script(RELEASE)
