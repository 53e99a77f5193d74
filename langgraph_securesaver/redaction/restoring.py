"""Restoring read-back messages: which tokens each message of a conversation holds (with
reuse of the previous read's answers) and what a restored message changed.

Knows messages, tokens and the redactor's caches; nothing of keys or the vault.
"""

from __future__ import annotations

import marshal
from typing import Any

from .caches import Cache
from .tokens import dump_message, tokens_in_dump


def tokens_per_message(cache: Cache, messages: list[Any]
                       ) -> tuple[list[list[str]], list[Any]] | None:
    """The tokens in each message of a list (the ``messages`` channel read back), reusing
    the previous read's answers for the longest prefix whose fields equal a deep (marshal)
    snapshot taken then: a conversation read every turn is scanned only in its new tail.
    None when some message cannot be snapshotted (the caller then checks each one).

    With the tokens comes a memo aligned with the messages, kept with the snapshot: the
    caller stores at index i what restoring message i changed, and the next read applies it
    to a message equal to the snapshot's i-th without dumping it again. Entries past the
    matched prefix start empty."""
    try:
        values = [(tuple(m.__dict__.values()), m.__pydantic_extra__) for m in messages]
    except AttributeError:
        return None
    first = messages[0]
    head = values[0][0]
    key = ("restore-list", type(first), getattr(first, "id", None),
           head[0] if head and type(head[0]) is str else None)
    state = cache.get(key)
    prefix = 0
    if state is not None:
        old_values = state[0]
        n = len(old_values)
        if n <= len(values) and values[:n] == old_values:
            prefix = n
        else:
            for i, (new, old) in enumerate(zip(values, old_values, strict=False)):
                if new != old:
                    break
                prefix = i + 1
    if state is not None and prefix == len(values):
        return list(state[1][:prefix]), state[3]
    try:  # a private deep copy of the new tail: later in-place edits cannot match it
        tail_blob = marshal.dumps(values[prefix:], 0)
    except ValueError:
        return None
    found_per: list[list[str]] = list(state[1][:prefix]) if state is not None else []
    for m in messages[prefix:]:
        dumped = dump_message(m)
        if dumped is None:
            return None
        found_per.append(tokens_in_dump(dumped))
    tail = marshal.loads(tail_blob)  # noqa: S302 - bytes this process just wrote
    snapshot = (list(state[0][:prefix]) if state is not None else []) + tail
    size = (state[2] if state is not None and prefix == len(state[0]) else 0) + len(tail_blob)
    memo: list[Any] = (state[3][:prefix] if state is not None else []) + [None] * (
        len(values) - prefix)
    cache.put(key, (snapshot, found_per, size, memo), size + 64)
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
