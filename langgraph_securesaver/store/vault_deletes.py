"""Dropping the PII originals of deleted store items, in as few vault transactions as possible.

Deleting an item drops the vault originals recorded under its owner id that nothing else uses
(:meth:`..registry.pii_vault.PiiVault.delete_threads_in`). One transaction per deleted item made a
burst of concurrent async deletes wait on the registry one by one; here the async deletes of
one event loop that arrive while a vault transaction runs are collected and handled by the
next one together, and a batch's deletes share one transaction. A delete returns only once
its originals are gone (same guarantee as before, fewer round trips).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Sequence

from ..offthread import to_thread
from ..registry.core import Registry
from ..registry.pii_vault import PiiVault

logger = logging.getLogger(__name__)


class _LoopQueue:
    """The deletes waiting on one event loop (futures belong to their loop)."""

    def __init__(self) -> None:
        self.pending: list[tuple[list[tuple[str, str]], asyncio.Future[None]]] = []
        self.flushing = False
        self.task: asyncio.Task[None] | None = None  # kept: the loop holds tasks weakly


class VaultDeletes:
    """Per store: bulk vault deletion for (tenant, owner) pairs, sync and coalesced async."""

    def __init__(self, registry: Registry, vault: PiiVault) -> None:
        self._registry = registry
        self._vault = vault
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopQueue] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def forget(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Drop the originals of these (tenant, owner) pairs in one transaction."""
        wanted = list(dict.fromkeys(pairs))
        if not wanted:
            return
        with self._registry.begin() as conn:
            self._vault.delete_threads_in(conn, wanted)

    async def aforget(self, pairs: Sequence[tuple[str, str]]) -> None:
        """:meth:`forget` off the event loop, sharing a transaction with the deletes that
        other tasks of this loop request meanwhile."""
        if not pairs:
            return
        loop = asyncio.get_running_loop()
        with self._lock:
            queue = self._queues.get(loop)
            if queue is None:
                queue = self._queues[loop] = _LoopQueue()
        future: asyncio.Future[None] = loop.create_future()
        queue.pending.append((list(pairs), future))
        if not queue.flushing:
            queue.flushing = True
            queue.task = loop.create_task(self._flush(queue))
        await future

    async def _flush(self, queue: _LoopQueue) -> None:
        try:
            while queue.pending:
                taken, queue.pending = queue.pending, []
                pairs = [p for wanted, _f in taken for p in wanted]
                try:
                    await to_thread(self.forget, pairs)
                except Exception as exc:  # noqa: BLE001  # each waiter raises it in its task
                    for _wanted, future in taken:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:  # the flush was cancelled (loop closing): so are they
                    for _wanted, future in taken:
                        future.cancel()
                    raise
                for _wanted, future in taken:
                    if not future.done():
                        future.set_result(None)
        finally:
            queue.flushing = False
            for _wanted, future in queue.pending:  # cancelled meanwhile: nobody flushes them
                if not future.done():
                    future.cancel()
            queue.pending = []
