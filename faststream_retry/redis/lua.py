"""The three atomic steps, each one Lua script on the keys of one hash slot.

Sent by ``EVALSHA``; a server that does not know a script (restarted, failed over,
``SCRIPT FLUSH``) answers ``NOSCRIPT`` and redis-py's ``AsyncScript`` loads it and runs it
again. Every time is the server's (``TIME``), so replicas with skewed clocks agree on
what is due. Times are integer milliseconds.

``RETRY_LATER``  KEYS stream, schedule, data; ARGV group, entry id, copy id, copy,
                 delay ms, wake channel. ``XACK`` the entry; when that acknowledged
                 nothing (another consumer settled it, or it was never pending)
                 return -1 and schedule nothing. Else store the copy, score it
                 ``now + delay``, nudge the movers when it is the new head, and return
                 its due time.
``DEAD_LETTER``  KEYS stream, dlq; ARGV group, entry id, letter, maxlen (0: no cap).
                 ``XACK``; when it acknowledged nothing return 0, else ``XADD`` the
                 letter to the dead-letter stream and return 1.
``MOVE``         KEYS stream, schedule, data; ARGV batch. Up to ``batch`` copies due by
                 now: ``XADD`` each to the stream, remove it from the schedule and the
                 data. Return ``{moved, head due ms or -1, now ms}``.

Redis does not undo a script's writes when a later command of it fails: a ``RETRY_LATER``
whose ``HSET`` met a key of another type (an operator's ``SET`` on ``P.retry.data``) would
have acknowledged the entry and stored no copy. So both settling scripts check the types
of the keys they write before the ``XACK``, and refuse (``WRONGTYPE``) with nothing done:
the entry stays pending.
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

_GUARD = """
local function expect(key, kind)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= kind then
    return redis.error_reply('WRONGTYPE ' .. key .. ' is a ' .. found .. ', not a ' .. kind ..
      ': nothing was done, the entry stays pending')
  end
end
"""

RETRY_LATER = (
    _GUARD
    + """
local refused = expect(KEYS[2], 'zset') or expect(KEYS[3], 'hash')
if refused then return refused end
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return -1 end
"""
    + _NOW
    + """
local due = now + tonumber(ARGV[5])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[2], due, ARGV[3])
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if head[1] == ARGV[3] then redis.call('PUBLISH', ARGV[6], due) end
return due
"""
)

DEAD_LETTER = (
    _GUARD
    + """
local refused = expect(KEYS[2], 'stream')
if refused then return refused end
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
if tonumber(ARGV[4]) > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', '__data__', ARGV[3])
else
  redis.call('XADD', KEYS[2], '*', '__data__', ARGV[3])
end
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
