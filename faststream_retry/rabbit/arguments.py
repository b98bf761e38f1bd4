"""Where a queue dead-letters to, seen over AMQP alone: no management API needed.

AMQP has no call that returns a queue's arguments, but RabbitMQ's answer to a declaration
that differs from the live queue names the first argument that differs and its current
value (``406 PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'orders' in
vhost '/': received none but current is the value '5000' of type 'long'``). Declaring the
queue again with each value learned so far walks the arguments in RabbitMQ's own order
until it names ``x-dead-letter-exchange`` (found) or the declaration matches (the queue has
no such argument). Each try is on a channel of its own, which a 406 closes; a declaration
equal to the live queue is a no-op, so the queue is never changed. (A queue deleted between
the passive look and a try would be declared again, with the arguments it had.)

A policy's ``dead-letter-exchange`` is not an argument: AMQP cannot see policies. The
answer then is "no argument", and only the management API can tell more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from aiormq.exceptions import AMQPError, ChannelNotFoundEntity, ChannelPreconditionFailed

from faststream_retry.rabbit.channels import close_quietly

__all__ = ["DLX", "DeadLettering", "dead_lettering"]

DLX = "x-dead-letter-exchange"

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']+)' for queue '[^']*'.*?: "
    r"received .+? but current is (?P<current>.+?)\"?$"
)
_TYPED = re.compile(r"^the value '(?P<value>.*)' of type '(?P<type>[^']+)'$")
_QUOTED = re.compile(r"^'(?P<value>.*)'$")
_INTEGERS = frozenset(
    {"byte", "unsignedbyte", "short", "unsignedshort", "signedint", "unsignedint", "long", "int"}
)
_FLAGS = {"durable", "auto_delete"}
_TRIES = 24
"""A queue has a dozen arguments at most: each try learns one."""


@dataclass(frozen=True, slots=True)
class DeadLettering:
    """What a look at a queue's ``x-dead-letter-exchange`` argument found.

    ``exchange``: the argument's value (``""`` is the default exchange); ``None`` with
    ``known``: the queue has no such argument (a policy may still give it one).
    ``known`` is false when the look could not tell, and ``problem`` says why.
    """

    exchange: str | None
    known: bool = True
    problem: str = ""


def _unknown(exc: BaseException | str) -> DeadLettering:
    return DeadLettering(None, known=False, problem=exc if isinstance(exc, str) else _reply(exc))


async def dead_lettering(amqp: Any, queue: str) -> DeadLettering | None:  # noqa: ANN401 - aiormq's
    """Return what ``queue`` dead-letters into by its arguments; ``None``: it does not exist."""
    channel = await amqp.channel()
    try:
        await channel.queue_declare(queue, passive=True)
    except ChannelNotFoundEntity:
        return None
    except AMQPError as exc:
        return _unknown(exc)
    await close_quietly(channel)
    arguments: dict[str, Any] = {}
    flags = {"durable": True, "auto_delete": False}
    for _ in range(_TRIES):
        found = await _try(amqp, queue, arguments, flags)
        if found is not None:
            return found
    return _unknown("its arguments did not settle")


async def _try(
    amqp: Any,  # noqa: ANN401 - aiormq's connection
    queue: str,
    arguments: dict[str, Any],
    flags: dict[str, bool],
) -> DeadLettering | None:
    """Declare ``queue`` as learned so far; learn one more argument (``None``) or conclude."""
    channel = await amqp.channel()
    try:
        await channel.queue_declare(queue, arguments=arguments, **flags)
    except ChannelPreconditionFailed as exc:
        learned = _learned(_reply(exc))
        if learned is None:
            return _unknown(exc)
        name, value = learned
        if name == DLX:
            return DeadLettering(str(value))
        if name in _FLAGS:
            flags[name] = bool(value)
        else:
            arguments[name] = value
        return None
    except AMQPError as exc:  # 405: another connection's exclusive queue; 403: no access
        return _unknown(exc)
    await close_quietly(channel)
    return DeadLettering(None)  # equal to the live queue: it has no such argument


def _reply(exc: BaseException) -> str:
    return str(exc.args[0]) if exc.args else repr(exc)


_CONVERT: dict[str, Any] = {
    "longstr": str,
    **dict.fromkeys(_INTEGERS, int),
    "bool": lambda text: text == "true",
    "double": float,
    "float": float,
}
"""How to declare again a value RabbitMQ printed with its type (the types equal by class)."""


def _learned(reply: str) -> tuple[str, object] | None:
    """Return the argument a 406 names and its current value, typed as it was declared."""
    match = _INEQUIVALENT.search(reply)
    if match is None:
        return None
    name, current = match["argument"], match["current"]
    quoted = _QUOTED.match(current)
    if name in _FLAGS:
        return None if quoted is None else (name, quoted["value"] == "true")
    typed = _TYPED.match(current)
    if typed is not None and typed["type"] in _CONVERT:
        return name, _CONVERT[typed["type"]](typed["value"])
    # A value of a type not to declare again, "none" (the queue lacks what was sent),
    # or a bare quoted value (one sent differs): only the last says a DLX's name.
    return (name, quoted["value"]) if quoted is not None and name == DLX else None
