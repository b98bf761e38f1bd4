"""The page's reads of a DLQ: each one asked for (a POST), then shown to every view.

Reading a queue's messages is a pass through it (``ops.walk``): on a quorum queue each
message is republished to the tail (the queue counts every requeue), on a classic one
the first ones are held unacked and handed back; either way the queue's lock is held
meanwhile, and another command on it is refused. So no view (a GET) reads a queue: an
operator asks for a read, and the pages and the API's GETs show the last one, with its
time, to everyone, until the next read or until a replay or a purge from the page
changes the queue (then the read is dropped: its ``#positions`` would name others).

A read keeps the first ``LIMIT`` dead letters, with at most ``BUDGET`` characters of
bodies, headers and tracebacks between them; a letter past that is kept in short (its
fields and the start of its body). The page keeps the last ``KEPT`` reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from faststream_retry.ops.records import Body, iso_time
from faststream_retry.web.groups import Group, group

if TYPE_CHECKING:
    from faststream_retry.ops.dlq import Outcome
    from faststream_retry.ops.records import DeadLetter

__all__ = ["BODY_KEPT", "BUDGET", "KEPT", "LIMIT", "Keeper", "Read", "Reads"]

LIMIT = 1000
"""Dead letters a read keeps (and groups), head first."""
BODY_KEPT = 64 * 1024
"""Characters of a body a read keeps (what a page shows); the export has every byte."""
BUDGET = 16 * 1024 * 1024
"""Characters of bodies, headers and tracebacks one read keeps; past it, letters in short."""
KEPT = 8
"""Reads the page keeps, one per queue, the most recent."""
_SHORT_BODY = 200
_SHORT_TRACEBACK = 2000


@dataclass(slots=True)
class Read:
    """One read of a queue's DLQ: when, by whom, what it found (letters cut to the budget)."""

    queue: str
    """The work queue."""
    at: float
    """When it ended (epoch seconds)."""
    who: str
    outcome: Outcome
    groups: list[Group]
    body_chars: dict[int, int] = field(default_factory=dict)
    """The whole body's characters of each letter (by position) whose body was cut."""
    short: set[int] = field(default_factory=set)
    """The positions of the letters kept in short (past the budget)."""

    @property
    def at_ms(self) -> int:
        """When it ended, in epoch milliseconds."""
        return int(self.at * 1000)

    def letter(self, key: str) -> DeadLetter | None:
        """Return the first letter whose id (or ``#position``) is ``key``."""
        return next((x for x in self.outcome.taken if x.key == key), None)

    def group(self, key: str) -> Group | None:
        """Return the group whose key is ``key``."""
        return next((g for g in self.groups if g.key == key), None)

    def listing(self) -> dict[str, Any]:
        """``dlq list --json``'s answer, and when the read was (``read_at``)."""
        return {**self.outcome.listing(), "read_at": iso_time(self.at_ms)}

    def details(self, letter: DeadLetter) -> dict[str, Any]:
        """``dlq show --json``'s answer for ``letter``, saying whether its body is whole."""
        found = letter.details()
        whole = letter.position not in self.body_chars and letter.position not in self.short
        if letter.body.value is None and letter.body.kind != "hex":
            found["body"] = letter.body.text  # kept as text only (see _kept)
            if letter.body.kind == "json" and whole:
                with contextlib.suppress(ValueError, RecursionError):
                    found["body"] = json.loads(letter.body.text)
        return {**found, "body_whole": whole, "read_at": iso_time(self.at_ms)}


def _kept(letter: DeadLetter, room: int) -> tuple[DeadLetter, int, int | None, bool]:
    """Return ``letter`` as a read keeps it, what it costs, its body's length if cut, if short."""
    body = letter.body
    cut = len(body.text) if len(body.text) > BODY_KEPT else None
    text = body.text[:BODY_KEPT]
    # A decoded JSON value can take many times its text's memory: keep the text, the
    # API decodes it again. A cut text is no JSON at all.
    value = body.value if body.kind in ("text", "hex") and cut is None else None
    cost = len(text) + len(repr(letter.headers)) + len(letter.traceback)
    if cost <= room:
        return dataclasses.replace(letter, body=Body(body.kind, text, value)), cost, cut, False
    short = dataclasses.replace(
        letter,
        body=Body(body.kind, body.preview(_SHORT_BODY), None),
        headers={},
        replayed=[],
        traceback=letter.traceback[:_SHORT_TRACEBACK],
    )
    return short, _SHORT_BODY + _SHORT_TRACEBACK, len(body.text), True


class Keeper:
    """What a read keeps of each letter, as its pass takes them: cut to ``BUDGET`` in all."""

    def __init__(self, budget: int = BUDGET) -> None:
        """Keep at most ``budget`` characters of bodies, headers and tracebacks."""
        self.room = budget
        self.body_chars: dict[int, int] = {}
        self.short: set[int] = set()

    def __call__(self, letter: DeadLetter) -> DeadLetter:
        """Return ``letter`` as the read keeps it."""
        one, cost, cut, short = _kept(letter, self.room)
        self.room -= cost
        if cut is not None:
            self.body_chars[one.position] = cut
        if short:
            self.short.add(one.position)
        return one


class Reads:
    """The last read of each queue, at most ``kept`` of them."""

    def __init__(self, kept: int = KEPT, budget: int = BUDGET) -> None:
        """Keep ``kept`` reads of at most ``budget`` characters each."""
        self.kept = kept
        self.budget = budget
        self._reads: OrderedDict[str, Read] = OrderedDict()
        self._dropped: OrderedDict[str, str] = OrderedDict()

    def keeper(self) -> Keeper:
        """What a new read keeps of each letter (``list_dead_letters(keep=...)``)."""
        return Keeper(self.budget)

    def get(self, queue: str) -> Read | None:
        """Return the last read of ``queue`` (its work queue's name), if there is one."""
        return self._reads.get(queue)

    def put(
        self,
        queue: str,
        outcome: Outcome,
        who: str,
        keeper: Keeper | None = None,
        at: float | None = None,
    ) -> Read:
        """Keep ``outcome`` (a ``list_dead_letters``) as the last read of ``queue``.

        ``keeper``: the one the pass kept its letters with; without, they are cut here.
        """
        if keeper is None:
            keeper = self.keeper()
            outcome.taken = [keeper(letter) for letter in outcome.taken]
        read = Read(
            queue,
            time.time() if at is None else at,
            who,
            outcome,
            group(outcome.taken),
            keeper.body_chars,
            keeper.short,
        )
        self._reads.pop(queue, None)
        self._reads[queue] = read
        while len(self._reads) > self.kept:
            self._reads.popitem(last=False)
        return read

    def forget(self, queue: str, why: str) -> None:
        """Drop the read of ``queue``: the page changed the queue since (``why``: how)."""
        self._reads.pop(queue, None)
        self._dropped.pop(queue, None)
        self._dropped[queue] = why
        while len(self._dropped) > self.kept:
            self._dropped.popitem(last=False)

    def dropped(self, queue: str) -> str | None:
        """Say why ``queue`` has no read any more, if the page dropped one."""
        return self._dropped.get(queue) if queue not in self._reads else None
