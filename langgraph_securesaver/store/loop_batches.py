"""Registry work of one event loop's tasks, made together: what SecureStore's async deletes
and put confirmations share.

One registry transaction per async call made a burst of concurrent calls (LangGraph's
``test_large_batches_async``: thousands at once) wait on the registry one by one, and on
SQLite commit so often beside the inner store's own transactions on the same file that the
inner store's batches kept losing their snapshot ("database is locked"). Here the requests of
one event loop that arrive while a call runs are collected and handed to the next call
together, off the loop; each waiter gets its own result, or the call's exception.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from ..offthread import to_thread

Request = TypeVar("Request")
Result = TypeVar("Result")


class _Queue(Generic[Request, Result]):
    """The requests waiting on one event loop (futures belong to their loop)."""

    def __init__(self) -> None:
        self.pending: list[tuple[Request, asyncio.Future[Result]]] = []
        self.flushing = False
        self.task: asyncio.Task[None] | None = None  # kept: the loop holds tasks weakly


class LoopBatches(Generic[Request, Result]):
    """``run(requests)`` (blocking; one result per request, in order) called off the event
    loop for every request of a loop that arrived while the previous call ran."""

    def __init__(self, run: Callable[[list[Request]], Sequence[Result]]) -> None:
        self._run = run
        self._queues: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, _Queue[Request, Result]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    async def submit(self, request: Request) -> Result:
        loop = asyncio.get_running_loop()
        with self._lock:
            queue = self._queues.get(loop)
            if queue is None:
                queue = self._queues[loop] = _Queue()
        future: asyncio.Future[Result] = loop.create_future()
        queue.pending.append((request, future))
        if not queue.flushing:
            queue.flushing = True
            queue.task = loop.create_task(self._flush(queue))
        return await future

    async def _flush(self, queue: _Queue[Request, Result]) -> None:
        try:
            while queue.pending:
                taken, queue.pending = queue.pending, []
                try:
                    results = await to_thread(self._run, [r for r, _f in taken])
                except Exception as exc:  # noqa: BLE001  # each waiter raises it in its task
                    for _r, future in taken:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                except BaseException:  # the flush was cancelled (loop closing): so are they
                    for _r, future in taken:
                        future.cancel()
                    raise
                for (_r, future), result in zip(taken, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            queue.flushing = False
            for _r, future in queue.pending:  # cancelled meanwhile: nobody flushes them
                if not future.done():
                    future.cancel()
            queue.pending = []
