"""Crypto-erasing deleted store items, in as few registry transactions as possible.

Deleting an item destroys its key row (:mod:`..registry.thread_keys`, scope ITEM) and drops
the vault originals recorded under its owner id that nothing else uses
(:meth:`..registry.pii_vault.PiiVault.delete_threads_in`), in one transaction that runs
*before* the inner store deletes the row: whatever copy of the item survives (a WAL, a dead
tuple, a backup, a row put back) no longer opens. One transaction per deleted item made a
burst of concurrent async deletes wait on the registry one by one; here the async deletes of
one event loop that arrive while a transaction runs are collected and handled by the next one
together (:mod:`.loop_batches`), and a batch's deletes share one transaction. A delete
reaches the inner store only once its keys and originals are gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from ..keys.tokens import ITEM
from ..registry.core import Registry
from ..registry.pii_vault import PiiVault
from ..registry.thread_keys import ThreadKeyStore
from .loop_batches import LoopBatches

logger = logging.getLogger(__name__)


class ItemDeletes:
    """Per store: bulk key and vault deletion for (tenant, item) pairs, sync and coalesced
    async."""

    def __init__(self, registry: Registry, keys: ThreadKeyStore, vault: PiiVault | None
                 ) -> None:
        self._registry = registry
        self._keys = keys
        self._vault = vault
        #: (tenant, item) -> deletions of it this process has under way (key destroyed, row
        #: not yet deleted): a read meeting such an item without its key reads it as absent
        self._under_way: dict[tuple[str, str], int] = {}
        self._under_way_lock = threading.Lock()
        #: a count of every start and end of a write or deletion in this process, and the
        #: count at each item's latest one (what a read taken before it cannot rely on)
        self.tick = 0
        self._changed_at: dict[tuple[str, str], int] = {}
        self._forgets: LoopBatches[list[tuple[str, str]], None] = LoopBatches(self._forget_all)

    def forget(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Destroy the keys and drop the originals of these (tenant, item) pairs in one
        transaction."""
        wanted = list(dict.fromkeys(pairs))
        if not wanted:
            return
        with self._registry.begin() as conn:
            self._keys.delete_in(conn, wanted, ITEM)
            if self._vault is not None:
                self._vault.delete_threads_in(conn, wanted)

    def begin(self, pairs: Sequence[tuple[str, str]]) -> None:
        """These items' deletions start here (before their keys are destroyed)."""
        with self._under_way_lock:
            self.tick += 1
            for p in pairs:
                self._under_way[p] = self._under_way.get(p, 0) + 1
                self._changed_at[p] = self.tick

    def end(self, pairs: Sequence[tuple[str, str]]) -> None:
        """These items' deletions are over (their rows deleted, or the batch failed)."""
        with self._under_way_lock:
            self.tick += 1
            for p in pairs:
                self._changed_at[p] = self.tick
                left = self._under_way.get(p, 0) - 1
                if left > 0:
                    self._under_way[p] = left
                else:
                    self._under_way.pop(p, None)
            if len(self._changed_at) > 100_000:      # bounded: a read older than this retries
                self._changed_at = {p: t for p, t in self._changed_at.items()
                                    if p in self._under_way}

    def under_way(self, tenant: str, item: str, since: int) -> bool:
        """Whether this process writes or deletes the item now, or did since its count was
        ``since`` (a read taken then may hold what such a write or deletion left)."""
        p = (tenant, item)
        return p in self._under_way or self._changed_at.get(p, 0) > since

    def destroy_keys(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Destroy the keys of these (tenant, item) pairs (the originals stay: the caller
        counts what it erases of them)."""
        if pairs:
            with self._registry.begin() as conn:
                self._keys.delete_in(conn, list(dict.fromkeys(pairs)), ITEM)

    async def aforget(self, pairs: Sequence[tuple[str, str]]) -> None:
        """:meth:`forget` off the event loop, sharing a transaction with the deletes that
        other tasks of this loop request meanwhile."""
        if pairs:
            await self._forgets.submit(list(pairs))

    def _forget_all(self, requests: list[list[tuple[str, str]]]) -> list[None]:
        self.forget([p for pairs in requests for p in pairs])
        return [None] * len(requests)
