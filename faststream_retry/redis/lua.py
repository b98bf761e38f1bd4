"""The three atomic steps, each one Lua script on the keys of one hash slot.

Sent by ``EVALSHA``; a server that does not know a script (restarted, failed over,
``SCRIPT FLUSH``) answers ``NOSCRIPT`` and redis-py's ``AsyncScript`` loads it and runs it
again. Every time is the server's (``TIME``), so replicas with skewed clocks agree on
what is due. Times are integer milliseconds.

``RETRY_LATER``  KEYS stream, schedule, data; ARGV group, entry id, copy id, copy,
                 delay ms, wake channel. When the entry is not pending in the group
                 (another consumer settled it, or it was never delivered) return -1 and
                 do nothing. Else store the copy, score it ``now + delay``, ``XACK``
                 the entry, nudge the movers when it is the new head, and return its
                 due time.
``DEAD_LETTER``  KEYS stream, dlq; ARGV group, entry id, letter, maxlen (0: no cap).
                 When the entry is not pending return 0; else ``XADD`` the letter to
                 the dead-letter stream, ``XACK`` the entry and return 1.
``MOVE``         KEYS stream, schedule, data; ARGV batch. Up to ``batch`` copies due by
                 now: ``XADD`` each to the stream, remove it from the schedule and the
                 data. Return ``{moved, head due ms or -1, now ms}``.

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

__all__ = ["DEAD_LETTER", "MOVE", "RETRY_LATER", "Scripts"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# A settling script writes under maxmemory too (noeviction): it moves what is already
# stored, and refusing it would leave a failed entry pending until it is claimed. Redis
# 7.0 and Valkey 7.2 read a script's flags from its first line; with none, a script's
# first write decides, and a copy written before the XACK would be refused.
_SETTLING = "#!lua flags=allow-oom\n"

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
"""

RETRY_LATER = (
    _SETTLING
    + _GUARD
    + """
local refused = expect(KEYS[2], 'zset') or expect(KEYS[3], 'hash')
if refused then return refused end
if not pending(KEYS[1], ARGV[1], ARGV[2]) then return -1 end
"""
    + _NOW
    + """
local due = now + tonumber(ARGV[5])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[2], due, ARGV[3])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if head[1] == ARGV[3] then redis.call('PUBLISH', ARGV[6], due) end
return due
"""
)

DEAD_LETTER = (
    _SETTLING
    + _GUARD
    + """
local refused = expect(KEYS[2], 'stream')
if refused then return refused end
if not pending(KEYS[1], ARGV[1], ARGV[2]) then return 0 end
if tonumber(ARGV[4]) > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', '__data__', ARGV[3])
else
  redis.call('XADD', KEYS[2], '*', '__data__', ARGV[3])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
)

MOVE = (
    _NOW
    + """
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(due) do
  local copy = redis.call('HGET', KEYS[3], id)
  if copy then redis.call('XADD', KEYS[1], '*', '__data__', copy) end
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local next_due = -1
if head[2] then next_due = tonumber(head[2]) end
return {#due, next_due, now}
"""
)


class Scripts:
    """The three scripts, registered on one client (``EVALSHA``, loaded again on ``NOSCRIPT``)."""

    __slots__ = ("dead_letter", "move", "retry_later")

    def __init__(self, client: Client) -> None:
        """Register the scripts on ``client``; nothing is sent until one runs."""
        self.retry_later: AsyncScript = client.register_script(RETRY_LATER)
        self.dead_letter: AsyncScript = client.register_script(DEAD_LETTER)
        self.move: AsyncScript = client.register_script(MOVE)
