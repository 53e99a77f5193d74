"""Swapping one set of tokens for another in a redacted value, on the way to storage.

The redactor tokenizes with a keyed HMAC of each value; what storage holds is the random
public token of the value's vault entry (see :mod:`..pii_layer`). :class:`TokenTranslator`
replaces the one by the other in what :meth:`.Redactor.redact_value` returned. Its result is
serialized and sealed, never handed to the graph, so it may share objects with earlier
results: the ``messages`` channel, redacted again on every turn, comes back from the
redactor as the same (cached, read-only) message objects for the part of the conversation
seen before, and their translations are reused for that identical prefix as long as every
token they hold still maps to the same public token. Only the new tail is walked.

Knows tokens and the walker; nothing of keys, the vault or storage.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .caches import Cache
from .tokens import TOKEN_RE, dump_message, tokens_in_dump
from .walker import Walker


class TokenTranslator:
    """Thread-safe; keeps the last translation of a few hundred conversations."""

    def __init__(self, *, lists: int = 1024, max_chars: int = 4_000_000) -> None:
        # per conversation: (input messages, their translations, {token: public} they used)
        self._lists = Cache(lists, max_chars)

    def translate(self, value: Any, mapping: Mapping[str, str], max_depth: int) -> Any:
        """``value`` with each token ``mapping`` names replaced by its mapped token (the
        others stay). Read-only result; unchanged sub-objects are shared with ``value``.
        Raises ``RedactionError`` for values nested deeper than ``max_depth``."""
        if not mapping:
            return value

        def sub(m: re.Match[str]) -> str:
            return mapping.get(m.group(0), m.group(0))

        def on_str(s: str, depth: int, is_key: bool) -> str:
            # both tokens are ``<KIND:32 hex>``: nothing to escape inside JSON text
            if "<" not in s or not TOKEN_RE.search(s):
                return s
            out = TOKEN_RE.sub(sub, s)
            return s if out == s else out

        def on_str_list(strings: Sequence[str], depth: int) -> Sequence[str]:
            # each distinct string once (a list often repeats a string)
            changed = {s: out for s in set(strings) if (out := on_str(s, depth, False)) is not s}
            if not changed:
                return strings
            return [changed.get(s, s) for s in strings]

        def one(msg: Any, depth: int) -> tuple[Any, dict[str, str | None]]:
            dumped = dump_message(msg)
            if dumped is None:     # not marshalable: walk it, record nothing
                return walker.walk_message_guarded(msg, depth), {}
            found = tokens_in_dump(dumped)
            if not found:
                return msg, {}
            used = {t: mapping.get(t) for t in found}
            if not any(used.values()):
                return msg, used
            return walker.walk_message_guarded(msg, depth), used

        def on_message(msg: Any, depth: int) -> Any:
            return one(msg, depth)[0]

        def on_message_list(messages: list[Any], depth: int) -> list[Any]:
            first = messages[0]
            content = getattr(first, "content", None)
            key = (type(first), getattr(first, "id", None),
                   content if type(content) is str else None)
            state = self._lists.get(key)
            prefix = 0
            # (index, tokens it holds -> their public token, tokens it holds unmapped)
            marked: list[tuple[int, dict[str, str], list[str]]] = []
            if state is not None:   # the same objects as last time, mapped the same way
                old_in, old_out, old_marked = state
                same = list(map(operator.is_, messages, old_in))
                prefix = same.index(False) if False in same else len(same)
                for i, present, absent in old_marked:
                    if i >= prefix:
                        break
                    # every token maps as before: to the same public token, or (None) still
                    # to nothing (dict views: C-level)
                    if not (present.items() <= mapping.items()
                            and mapping.keys().isdisjoint(absent)):
                        prefix = i
                        break
                    marked.append((i, present, absent))
            out = list(old_out[:prefix]) if prefix else []
            for i in range(prefix, len(messages)):
                result, used = one(messages[i], depth + 1)
                out.append(result)
                if used:
                    marked.append((i, {t: p for t, p in used.items() if p is not None},
                                   [t for t, p in used.items() if p is None]))
            if len(messages) > 1:   # a one-message list has no prefix to reuse
                self._lists.put(key, (list(messages), out, marked), 64 * len(messages))
            return messages if all(map(operator.is_, out, messages)) else out

        walker = Walker(on_str, max_depth=max_depth, on_message=on_message,
                        on_message_list=on_message_list, on_str_list=on_str_list)
        return walker.walk(value)
