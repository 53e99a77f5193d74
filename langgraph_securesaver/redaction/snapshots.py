"""Snapshots of message fields, to find the unchanged prefix of a conversation cheaply.

The ``messages`` channel is redacted on every put and restored on every read; both reuse
the previous call's answers for the longest prefix of messages whose fields still equal a
snapshot taken then. A snapshot is a dict of the message's fields holding its immutable
values (``str``, numbers, ``None``, ``bytes``) as the very objects, so comparing a message
that was not touched short-cuts on identity without reading its text, and a private deep
(marshal) copy of every other value, so an edit made in place inside a dict or a list is
still seen. Strings cannot change in place; a field given a new string compares by value.

Knows messages only.
"""

from __future__ import annotations

import marshal
from collections.abc import Sequence
from typing import Any

#: field value types held by reference in a snapshot (immutable, compared by value)
IMMUTABLE: frozenset[type] = frozenset({str, int, float, bool, bytes, type(None)})


def fields_of(messages: Sequence[Any]) -> tuple[list[dict[str, Any]], list[Any]] | None:
    """Each message's field dict and pydantic extras (the objects themselves), or None when a
    message has neither (the caller then handles messages one by one)."""
    try:
        return ([m.__dict__ for m in messages],
                [m.__pydantic_extra__ for m in messages])
    except AttributeError:
        return None


def snapshot(fields: dict[str, Any], copied: Sequence[Any]) -> dict[str, Any]:
    """The snapshot of one message: ``fields`` with every value that is not immutable
    replaced by its deep copy from ``copied`` (aligned with ``fields.values()``)."""
    return {k: v if type(v) in IMMUTABLE else c
            for (k, v), c in zip(fields.items(), copied, strict=True)}


def snapshot_all(fields: Sequence[dict[str, Any]], extras: Sequence[Any]
                 ) -> tuple[list[dict[str, Any]], list[Any]] | None:
    """Snapshots of many messages and deep copies of their extras at once (one marshal round
    trip), or None when a value cannot be marshalled."""
    try:
        blob = marshal.dumps(([tuple(f.values()) for f in fields], list(extras)), 0)
    except ValueError:
        return None
    copied, extras_copy = marshal.loads(blob)  # noqa: S302 - bytes this process just wrote
    return [snapshot(f, c) for f, c in zip(fields, copied, strict=True)], extras_copy


def equal_prefix(fields: Sequence[dict[str, Any]], extras: Sequence[Any],
                 old_fields: Sequence[dict[str, Any]], old_extras: Sequence[Any]) -> int:
    """How many leading messages equal the snapshots (C-level list and dict equality)."""
    n = len(old_fields)
    if n <= len(fields) and fields[:n] == old_fields and extras[:n] == old_extras:
        return n
    for i, (f, e, old_f, old_e) in enumerate(zip(fields, extras, old_fields, old_extras,
                                                 strict=False)):
        if f != old_f or e != old_e:
            return i
    return min(len(fields), len(old_fields))
