"""The redactor's bounded caches: by value (:class:`Cache`) and by object identity
(:class:`IdentityCache`, for the same object passed again on every turn).

Thread-safe containers; no knowledge of detection.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .types import Entity, VaultEntry


# --------------------------------------------------------------------------------------------
# Caches
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cached:
    text: str
    vault: tuple[VaultEntry, ...]
    entities: tuple[Entity, ...]


class Cache:
    """A bounded map: at most ``max_entries`` entries and about ``max_chars`` characters.

    Reads take no lock (a dict lookup is atomic); writes take one. Eviction is first-in,
    first-out: an entry that is still in use is simply recomputed (and re-cached) after
    eviction, which costs one analysis.
    """

    def __init__(self, max_entries: int, max_chars: int) -> None:
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._max_entries = max_entries
        self._max_chars = max_chars
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        item = self._data.get(key)
        return None if item is None else item[0]

    def get_many(self, keys: Iterable[Hashable]) -> list[Any]:
        """:meth:`get` of each key, in order (one list comprehension: for large values)."""
        data = self._data
        return [None if (item := data.get(key)) is None else item[0] for key in keys]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        if self._max_entries <= 0 or size > self._max_chars // 4:
            return  # one huge value must not flush everything else
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._chars -= old[1]
            self._data[key] = (value, size)
            self._chars += size
            while self._data and (len(self._data) > self._max_entries
                                  or self._chars > self._max_chars):
                self._chars -= self._data.popitem(last=False)[1][1]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._chars = 0

    def __len__(self) -> int:
        return len(self._data)


class _StrongRef:
    """Stands in for a weak reference to an object that does not support weak references."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


class IdentityCache:
    """Per-object results, first-in first-out, lock-free reads, bounded by entry count and an
    approximate size budget.

    Entries are keyed by ``id(obj)`` and hold only a weak reference to ``obj`` (the cache
    never keeps a message alive). When an object dies its key is queued and purged on the
    next write; until then ``get`` ignores the entry because the reference is dead.
    """

    def __init__(self, max_entries: int, max_chars: int) -> None:
        self._data: OrderedDict[int, tuple[Any, ...]] = OrderedDict()
        self._max_entries = max_entries
        self._max_chars = max_chars
        self._chars = 0
        self._dead: list[int] = []
        self._lock = threading.Lock()

    def get(self, obj: Any) -> tuple[Any, ...] | None:
        entry = self._data.get(id(obj))
        if entry is None or entry[0]() is not obj:
            return None
        return entry

    def put(self, obj: Any, size: int, *fields: Any) -> None:
        if self._max_entries <= 0 or size > self._max_chars // 4:
            return
        key = id(obj)
        try:
            ref: Any = weakref.KeyedRef(obj, self._gone, key)
        except TypeError:
            ref = _StrongRef(obj)
        with self._lock:
            while self._dead:
                dead = self._dead.pop()
                entry = self._data.get(dead)
                if entry is not None and entry[0]() is None:
                    self._chars -= self._data.pop(dead)[1]
            old = self._data.pop(key, None)
            if old is not None:
                self._chars -= old[1]
            self._data[key] = (ref, size, *fields)
            self._chars += size
            while self._data and (len(self._data) > self._max_entries
                                  or self._chars > self._max_chars):
                self._chars -= self._data.popitem(last=False)[1][1]

    def _gone(self, ref: Any) -> None:
        self._dead.append(ref.key)  # no dict mutation here: this may run inside a GC pass

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._dead.clear()
            self._chars = 0


def vault_size(vault: Sequence[VaultEntry]) -> int:
    return sum(len(v.value) + 80 for v in vault)
