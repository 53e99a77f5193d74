"""Blocking work of the async API, off the event loop, in SecureSaver's own threads.

``asyncio.to_thread`` runs on the loop's default executor: ``min(32, cpus + 4)`` threads,
shared with the whole application. SecureSaver's hops block on its registry database (PII
vault writes, erasure-epoch reads) as well as on CPU, so with many concurrent conversations
on a small machine every default thread can be waiting on the database while the
application's own work queues behind them (and the other way round). :func:`to_thread` is
``asyncio.to_thread`` (the caller's context variables go along, e.g. ``tenant_scope``) on a
pool of SecureSaver's own.

:data:`CALLER_LOOP` tells the worker which event loop the async call it serves runs on, so
that an operation reaching an inner saver from the worker uses that saver's async API on the
caller's loop (the caller's mode), not its sync API.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
MAX_THREADS = 16  # mostly waiting on a database; more only contend for the GIL

#: in a worker of :func:`to_thread`: the event loop of the async call it serves
CALLER_LOOP: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "securesaver_caller_loop", default=None)

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    pool = _pool
    if pool is None:
        with _lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="securesaver")
            pool = _pool
    return pool


def _forget_in_child() -> None:  # a forked child has none of the parent's threads
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


async def to_thread(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``func(*args, **kwargs)`` in SecureSaver's thread pool, in the caller's context."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    ctx.run(CALLER_LOOP.set, loop)
    return await loop.run_in_executor(_executor(), functools.partial(ctx.run, func, *args,
                                                                     **kwargs))
