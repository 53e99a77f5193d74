"""Confirming the versions of async puts, in as few registry transactions as possible.

Every put confirms the version it sealed under once its inner write landed
(:func:`..registry.item_versions.confirm_many`): a registry write. One transaction per put made a
burst of concurrent async puts (LangGraph's ``test_large_batches_async``: thousands at once)
commit one by one -- on SQLite, beside the inner store's own transactions on the same file,
so often that the inner store's batches kept losing their snapshot ("database is locked").
Here the confirmations of one event loop that arrive while a call runs are collected and made
by the next one together (one transaction on SQLite; on PostgreSQL one connection, a statement
each).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from ..offthread import to_thread
from ..registry.item_versions import Version
from ..registry.thread_keys import ThreadKeyStore

#: (tenant, store, item -> (key row, version sealed under))
Written = tuple[str, str, dict[str, tuple[float, Version]]]


class _LoopQueue:
    """The confirmations waiting on one event loop (futures belong to their loop)."""

    def __init__(self) -> None:
        self.pending: list[tuple[Written, asyncio.Future[list[str]]]] = []
        self.flushing = False
        self.task: asyncio.Task[None] | None = None  # kept: the loop holds tasks weakly


class ItemConfirms:
    """Per store: the async puts' confirmations, coalesced per event loop."""

    def __init__(self, keys: ThreadKeyStore) -> None:
        self._keys = keys
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopQueue] = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    async def aconfirm(self, written: Written) -> list[str]:
        """The items of ``written`` whose confirmation was refused (see
        :meth:`..registry.thread_keys.ThreadKeyStore.confirm_items`)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            queue = self._queues.get(loop)
            if queue is None:
                queue = self._queues[loop] = _LoopQueue()
        future: asyncio.Future[list[str]] = loop.create_future()
        queue.pending.append((written, future))
        if not queue.flushing:
            queue.flushing = True
            queue.task = loop.create_task(self._flush(queue))
        return await future

    async def _flush(self, queue: _LoopQueue) -> None:
        try:
            while queue.pending:
                taken, queue.pending = queue.pending, []
                try:
                    refused: Any = await to_thread(self._keys.confirm_items,
                                                   [w for w, _f in taken])
                except Exception as exc:  # noqa: BLE001  # each waiter raises it in its task
                    for _w, future in taken:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:  # the flush was cancelled (loop closing): so are they
                    for _w, future in taken:
                        future.cancel()
                    raise
                for (_w, future), names in zip(taken, refused, strict=True):
                    if not future.done():
                        future.set_result(names)
        finally:
            queue.flushing = False
            for _w, future in queue.pending:  # cancelled meanwhile: nobody flushes them
                if not future.done():
                    future.cancel()
            queue.pending = []
