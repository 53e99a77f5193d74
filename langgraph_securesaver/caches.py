"""In-process caches that keep per-turn work proportional to what changed.

Keyed by (tenant, thread, namespace, channel), bounded, thread-safe, and holding only what
this process sealed or authenticated itself.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from .tenancy import ThreadRef


class TokenCache:
    """The latest sealed token of each (tenant, thread, namespace, channel), by version.

    LangGraph passes every channel value to every ``put``, changed or not. A channel whose
    version did not change holds the value of a token this process already sealed or
    authenticated, so that token is reused instead of redacting, serializing and encrypting
    the value again. Only versions with a random component (what the shipped savers' and
    SecureSaver's ``get_next_version`` produce) are cached: with plain integer versions a fork
    could reuse a version number for a different value. Bounded by total token bytes.
    """

    def __init__(self, max_bytes: int = 32 * 1024 * 1024) -> None:
        self._entries: OrderedDict[tuple[str, str, str, str], tuple[str, bytes]] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes
        self._lock = threading.Lock()

    @staticmethod
    def cacheable(version: Any) -> bool:
        return isinstance(version, str) and "." in version

    def get(self, ref: ThreadRef, channel: str, version: Any) -> bytes | None:
        if not self.cacheable(version):
            return None
        key = (ref.tenant, ref.thread_id, ref.checkpoint_ns, channel)
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or hit[0] != version:
                return None
            self._entries.move_to_end(key)
            return hit[1]

    def put(self, ref: ThreadRef, channel: str, version: Any, token: bytes) -> None:
        if not self.cacheable(version) or len(token) > self._max // 4:
            return
        key = (ref.tenant, ref.thread_id, ref.checkpoint_ns, channel)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old[1])
            self._entries[key] = (version, token)
            self._bytes += len(token)
            while self._bytes > self._max and self._entries:
                _key, (_v, dropped) = self._entries.popitem(last=False)
                self._bytes -= len(dropped)

    def forget_thread(self, tenant: str, thread_id: str) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == tenant and k[1] == thread_id]:
                self._bytes -= len(self._entries.pop(key)[1])
