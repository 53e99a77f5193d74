"""Restoring: tokens back to the originals the vault still holds, for the owning tenant.

:class:`Restoration` is the redactor's read half (finding tokens, restoring values, messages
restored in place when the caller owns them); :func:`tokens_per_message` says which tokens
each message of a conversation holds, reusing the previous read's answers, and
:func:`text_changes` what a restored message changed.

Knows messages, tokens, the walker and the redactor's caches; nothing of keys or the vault.
"""

from __future__ import annotations

import copy
import json
import marshal
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .caches import Cache
from .policy import RedactionPolicy
from .snapshots import equal_prefix, fields_of, snapshot_all
from .tokens import TOKEN_RE, dump_message, tokens_in_dump
from .view import looks_like_json
from .walker import Walker


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
    if len(messages) > 1:   # a one-message list has no prefix to reuse
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


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
    except (ValueError, RecursionError):
        return False
    return True


class Restoration:
    """The redactor's read half: tokens found in a value, and the value restored."""

    policy: RedactionPolicy
    _list_cache: Cache
    _restore_cache: Cache

    def find_tokens(self, value: Any) -> list[str]:
        """The distinct tokens in ``value``, in order of first appearance."""
        return list(self._find_tokens(value, None))

    def _find_tokens(self, value: Any,
                     dumps: dict[int, tuple[Any, bytes, list[str]]] | None) -> dict[str, None]:
        found: dict[str, None] = {}

        def on_str(s: str, depth: int, is_key: bool) -> str:
            if "<" in s:
                for m in TOKEN_RE.finditer(s):
                    found.setdefault(m.group(0), None)
            return s

        def on_message(msg: Any, depth: int) -> Any:
            dumped = dump_message(msg)
            if dumped is None:
                return walker.walk_message_guarded(msg, depth)
            tokens = tokens_in_dump(dumped)
            for token in tokens:
                found.setdefault(token, None)
            if dumps is not None:
                dumps[id(msg)] = (msg, dumped, tokens)
            return msg

        walker = Walker(on_str, max_depth=self.policy.max_depth, on_message=on_message)
        walker.walk(value)
        return found

    def restore_value(self, value: Any,
                      lookup: Callable[[Sequence[str]], Mapping[str, str]], *,
                      originals: Mapping[str, str] | None = None, owned: bool = False) -> Any:
        """A copy of ``value`` with tokens replaced by the originals ``lookup`` returns.

        ``lookup`` gets every distinct token once and returns the originals it still has;
        tokens it does not return (erased values) stay as they are. A caller that already
        knows the tokens' originals passes them as ``originals`` (one walk instead of two).
        Inside JSON strings the
        originals are inserted JSON-escaped. Masked values (``<KIND:masked>``) stay masked.
        Unchanged sub-objects (e.g. messages without tokens) are shared with ``value``;
        messages that change are new objects owned by the caller. ``owned``: ``value`` is the
        caller's own (e.g. just deserialized), so its messages may be restored in place.
        """
        dumps: dict[int, tuple[Any, bytes, list[str]]] = {}
        if originals is None:
            tokens = self._find_tokens(value, dumps)
            if not tokens:
                return value
            originals = dict(lookup(list(tokens)))
        # ``originals`` given: the caller already knows the tokens (e.g. from a scan of the
        # serialized bytes) and their values, so the separate token-finding pass is skipped
        originals = {t: v for t, v in originals.items() if isinstance(v, str)}
        if not originals:
            return value

        def replace(m: re.Match[str], escape: bool) -> str:
            original = originals.get(m.group(0))
            if original is None:
                return m.group(0)
            return json.dumps(original, ensure_ascii=False)[1:-1] if escape else original

        def on_str(s: str, depth: int, is_key: bool) -> str:
            if "<" not in s or not TOKEN_RE.search(s):
                return s
            escape = not is_key and looks_like_json(s) and _is_json(s)
            out = TOKEN_RE.sub(lambda m: replace(m, escape), s)
            return s if out == s else out

        def restore_message(msg: Any, depth: int) -> tuple[Any, dict[str, str] | None]:
            """(the restored message, the text fields it changed when only text changed)."""
            seen = dumps.get(id(msg))
            if seen is not None and seen[0] is msg:
                dumped, found = seen[1], seen[2]
            else:
                maybe = dump_message(msg)
                if maybe is None:
                    return walker.walk_message_guarded(msg, depth), None
                dumped, found = maybe, tokens_in_dump(maybe)
            if originals.keys().isdisjoint(found):
                return msg, {}  # nothing to put back in this message
            key = (type(msg), dumped, tuple(map(originals.get, found)))
            hit = self._restore_cache.get(key)
            if hit is not None and owned and hit[1] is not None:
                msg.__dict__.update(hit[1])   # only text changed: in place, nothing to copy
                return msg, hit[1]
            restored_dump = hit[0] if hit is not None else None
            if restored_dump is not None:  # rebuild a private copy (the graph may mutate it)
                values, extra = marshal.loads(restored_dump)  # noqa: S302 - our own bytes
                update = dict(zip(msg.__dict__, values, strict=True))
                if extra:
                    update.update(extra)
                    return msg.model_copy(update=update), None
                clone = copy.copy(msg)  # pydantic's __copy__: own __dict__, fields set, extras
                clone.__dict__.update(update)
                return clone, hit[1]
            restored = walker.walk_message_guarded(msg, depth)
            restored_dump = dump_message(restored)
            changes = text_changes(msg, restored)
            if restored_dump is not None:
                self._restore_cache.put(key, (restored_dump, changes),
                                        len(dumped) + 2 * len(restored_dump) + 256)
            return restored, changes

        def on_message(msg: Any, depth: int) -> Any:
            return restore_message(msg, depth)[0]

        def on_message_list(messages: list[Any], depth: int) -> list[Any]:
            per = self._tokens_per_message(messages)
            if per is None:  # a message that marshal cannot copy: one at a time
                each = [on_message(m, depth + 1) for m in messages]
                return messages if all(a is b for a, b in zip(each, messages, strict=True)) \
                    else each
            found_per, memo = per
            keys = originals.keys()
            out: list[Any] | None = None  # a new list only once a message is replaced
            for i, found in enumerate(found_per):
                if not found or keys.isdisjoint(found):
                    continue
                msg = messages[i]
                wanted = tuple(map(originals.get, found))
                done = memo[i]
                if owned and done is not None and done[0] == wanted:
                    # equal to what was restored at this index last read, with the same
                    # originals: the same text changes, applied without dumping it again
                    msg.__dict__.update(done[1])
                    continue
                restored, changes = restore_message(msg, depth + 1)
                if owned and changes is not None:
                    memo[i] = (wanted, changes)
                if restored is not msg:
                    if out is None:
                        out = list(messages)
                    out[i] = restored
            return messages if out is None else out

        walker = Walker(on_str, max_depth=self.policy.max_depth, on_message=on_message,
                        on_message_list=on_message_list)
        return walker.walk(value)

    def _tokens_per_message(self, messages: list[Any]
                            ) -> tuple[list[list[str]], list[Any]] | None:
        return tokens_per_message(self._list_cache, messages)
