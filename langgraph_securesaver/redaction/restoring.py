"""Restoring read-back messages: which tokens each message of a conversation holds (with
reuse of the previous read's answers) and what a restored message changed.

Knows messages, tokens and the redactor's caches; nothing of keys or the vault.
"""

from __future__ import annotations

from typing import Any

from .caches import Cache
from .snapshots import equal_prefix, fields_of, snapshot_all
from .tokens import dump_message, tokens_in_dump


def tokens_per_message(cache: Cache, messages: list[Any]
                       ) -> tuple[list[list[str]], list[Any]] | None:
    """The tokens in each message of a list (the ``messages`` channel read back), reusing
    the previous read's answers for the longest prefix whose fields equal the snapshots
    (:mod:`.snapshots`) taken then: a conversation read every turn is scanned only in its
    new tail. None when some message cannot be snapshotted (the caller then checks each one).

    With the tokens comes a memo aligned with the messages, kept with the snapshots: the
    caller stores at index i what restoring message i changed, and the next read applies it
    to a message equal to the snapshot's i-th without dumping it again. Entries past the
    matched prefix start empty."""
    live = fields_of(messages)
    if live is None:
        return None
    fields, extras = live
    first = messages[0]
    head = next(iter(fields[0].values()), None)
    key = ("restore-list", type(first), getattr(first, "id", None),
           head if type(head) is str else None)
    state = cache.get(key)
    prefix = 0 if state is None else equal_prefix(fields, extras, state[0], state[1])
    if state is not None and prefix == len(messages):
        return list(state[2][:prefix]), state[4]
    tail = snapshot_all(fields[prefix:], extras[prefix:])
    if tail is None:
        return None
    found_per: list[list[str]] = list(state[2][:prefix]) if state is not None else []
    sizes = 0
    for m in messages[prefix:]:
        dumped = dump_message(m)
        if dumped is None:
            return None
        sizes += len(dumped)
        found_per.append(tokens_in_dump(dumped))
    snaps = (list(state[0][:prefix]) if state is not None else []) + tail[0]
    snap_extras = (list(state[1][:prefix]) if state is not None else []) + tail[1]
    size = (state[3] if state is not None and prefix == len(state[0]) else 0) + sizes
    memo: list[Any] = (state[4][:prefix] if state is not None else []) + [None] * (
        len(messages) - prefix)
    cache.put(key, (snaps, snap_extras, found_per, size, memo), size + 64)
    return found_per, memo


def text_changes(msg: Any, restored: Any) -> dict[str, str] | None:
    """The fields ``restored`` (a restored copy of ``msg``) changed, when every one of them is
    text (immutable: a cached answer can be applied to another copy of ``msg`` in place,
    sharing the strings); None when a changed field is anything else, or extras differ."""
    if restored is msg:
        return {}
    old, new = getattr(msg, "__dict__", None), getattr(restored, "__dict__", None)
    if not isinstance(old, dict) or not isinstance(new, dict) or old.keys() != new.keys() \
            or getattr(msg, "__pydantic_extra__", None) != getattr(
                restored, "__pydantic_extra__", None):
        return None
    changes = {k: v for k, v in new.items() if v is not old[k]}
    return changes if all(type(v) is str for v in changes.values()) else None
