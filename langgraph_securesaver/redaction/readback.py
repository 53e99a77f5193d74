"""What a tenant read back: strings of stored messages, exempt from the write budget.

A checkpoint's values were redacted (and paid for) when they were stored. After a restart
the redactor's caches are cold, and the next write of a long conversation analyzes every
old message again; if that analysis counted against the budget of the write, the turn after a
restart would be refused (the conversation could not go on). So :class:`ReadBack`
remembers, per message object handed out by a read, the exact string objects of its
content, and the redactor analyzes those strings without charging the write's budget.

Strings are immutable and compared by identity (``is``), so nothing written since the read
can pass for them: a message edited in place, a new message, or the same text in a new
string object is analyzed (and charged) as new content. Entries hold a weak reference to
the message and live only as long as it does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .caches import IdentityCache

MAX_MESSAGES = 65_536  # messages remembered (entries are a few references each)
MIN_CHARS = 256  # shorter strings are cheap to analyze again; not worth an entry
ENTRY_SIZE = 64
_PLAIN = frozenset({str, bytes, int, float, bool, type(None), dict, tuple})


def content_strings(msg: Any) -> tuple[str, ...]:
    """The long strings of a message's ``content`` (a string, or a list of strings and of
    blocks whose values are strings), as the objects themselves."""
    content = getattr(msg, "content", None)
    if type(content) is str:
        return (content,) if len(content) >= MIN_CHARS else ()
    if type(content) is not list:
        return ()
    found: list[str] = []
    for part in content:
        if type(part) is str:
            values: Iterable[Any] = (part,)
        elif type(part) is dict:
            values = part.values()
        else:
            continue
        found.extend(v for v in values if type(v) is str and len(v) >= MIN_CHARS)
    return tuple(found)


class ReadBack:
    """Message object -> (tenant context, the content strings it had when it was read)."""

    def __init__(self, enabled: bool = True) -> None:
        self._seen = IdentityCache(MAX_MESSAGES if enabled else 0,
                                   MAX_MESSAGES * ENTRY_SIZE * 8)

    def remember(self, ctx: bytes, value: Any) -> None:
        """Record the messages of ``value`` (a channel value just read) for ``ctx``.

        Only the last :data:`MAX_MESSAGES` items are looked at (the cache keeps no more: the
        earlier ones would be evicted by the later), and plain values are skipped at once: a
        read of a list of 1,000,000 strings walked all of them, holding the GIL for 1.2 s
        per read while other tenants' turns waited (benchmarks/noisy_neighbour.py). A
        message not remembered is only analyzed again, and charged, at its next write."""
        if type(value) is not list:
            return
        for msg in value[-MAX_MESSAGES:]:
            if type(msg) in _PLAIN:
                continue
            strings = content_strings(msg)
            if strings:
                self._seen.put(msg, ENTRY_SIZE, ctx, strings)

    def exempt(self, ctx: bytes, msg: Any) -> dict[int, str] | None:
        """The strings of ``msg`` that were read back for ``ctx`` (by id), if any."""
        entry = self._seen.get(msg)
        if entry is None or entry[2] != ctx:
            return None
        return {id(s): s for s in entry[3]}

    def clear(self) -> None:
        self._seen.clear()
