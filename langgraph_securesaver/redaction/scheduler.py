"""One scheduler for all redaction and restoring work, fair between tenants.

Every write that is redacted (a checkpoint put, a put_writes, a store put) and every read that
restores tokens runs as a job of its tenant here, in a few threads of its own (never on an
event loop; the analysis of a large write goes on to the :mod:`.pool` worker processes). Each
tenant has its own queue:

* a free thread takes the next job of the tenant with the fewest jobs running (ties: the one
  served least recently), and no tenant runs more than ``per_tenant`` jobs at once, so a tenant
  sending many large writes queues behind itself: another tenant's job takes the next free
  thread, and with ``per_tenant`` below ``slots`` there is always one for it;
* a tenant's queue is bounded: past ``queue_limit`` waiting jobs, a new one is refused at once
  with :class:`RedactionError`, before any of its work is done and nothing of it stored.

A job submitted from inside a job (a store put inside a graph node running in a write, say)
runs in place: a tenant never waits for itself. The caller's context variables (tenant scope,
write budget) go with the job.

``SECURESAVER_REDACTION_SLOTS`` / :func:`configure_scheduler` set the threads.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ..errors import ConfigurationError
from .budget import write_scope
from .errors import RedactionError

T = TypeVar("T")
DEFAULT_SLOTS = 8
DEFAULT_QUEUE = 1024  # jobs a tenant may have waiting (an async app's burst fits)


def _default_slots() -> int:
    env = os.environ.get("SECURESAVER_REDACTION_SLOTS", "").strip()
    return max(2, int(env)) if env.isdigit() else DEFAULT_SLOTS


class _Job:
    __slots__ = ("ctx", "fn", "future")

    def __init__(self, fn: Callable[[], Any], ctx: contextvars.Context) -> None:
        self.fn = fn
        self.ctx = ctx
        self.future: Future[Any] = Future()


class FairScheduler:
    """Per-tenant queues served by ``slots`` threads (see the module docstring)."""

    def __init__(self, slots: int | None = None, per_tenant: int | None = None,
                 queue_limit: int = DEFAULT_QUEUE) -> None:
        self.slots = _default_slots() if slots is None else int(slots)
        self.per_tenant = max(1, self.slots // 2) if per_tenant is None else int(per_tenant)
        self.queue_limit = int(queue_limit)
        if self.slots < 1 or not 1 <= self.per_tenant <= self.slots or self.queue_limit < 1:
            raise ConfigurationError("scheduler: slots >= 1, 1 <= per_tenant <= slots, "
                                     "queue_limit >= 1")
        self._queues: dict[str, deque[_Job]] = {}
        self._running: dict[str, int] = {}
        self._served: dict[str, int] = {}  # when each tenant last got a thread (a tick)
        self._ticks = 0
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._local = threading.local()

    # -- submitting --------------------------------------------------------------------------
    def submit(self, tenant: str, fn: Callable[..., T], *args: Any, **kwargs: Any
               ) -> Future[T]:
        """Queue ``fn(*args, **kwargs)`` as a job of ``tenant``; RedactionError when the
        tenant's queue is full (nothing of the job done)."""
        future = self._try_submit(tenant, fn, *args, **kwargs)
        if future is None:
            raise RedactionError(
                f"the tenant has {self.queue_limit} writes and reads waiting for redaction "
                f"(at most {self.queue_limit}); this one was refused and nothing of it was "
                "stored: retry later")
        return future

    def _try_submit(self, tenant: str, fn: Callable[..., T], *args: Any, **kwargs: Any
                    ) -> Future[T] | None:
        """The job's future, or None when the tenant's queue is full."""
        ctx = contextvars.copy_context()
        job = _Job(lambda: fn(*args, **kwargs), ctx)
        with self._cond:
            queue = self._queues.setdefault(tenant, deque())
            if len(queue) >= self.queue_limit:
                return None
            queue.append(job)
            self._start_threads()
            self._cond.notify()
        return job.future

    def call(self, tenant: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` as a job of ``tenant``, waited for in this thread (in place
        when this thread is running a job already)."""
        if getattr(self._local, "inside", False):
            return fn(*args, **kwargs)
        return self.submit(tenant, fn, *args, **kwargs).result()

    async def arun(self, tenant: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` as a job of ``tenant``, awaited (the loop is never
        blocked by it). While the tenant's queue is full the coroutine waits for room
        instead of being refused: an async burst (LangGraph's stores batch thousands of
        concurrent calls) is slowed, never failed, and only its own tenant waits; each
        waiting coroutine already holds its arguments, so the queue bound still caps the
        work queued."""
        delay = 0.001
        while (future := self._try_submit(tenant, fn, *args, **kwargs)) is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return await asyncio.wrap_future(future)

    def running_here(self) -> bool:
        """Whether this thread is one of the scheduler's, running a job."""
        return bool(getattr(self._local, "inside", False))

    # -- serving -----------------------------------------------------------------------------
    def _start_threads(self) -> None:  # with the lock held
        self._threads = [t for t in self._threads if t.is_alive()]
        while len(self._threads) < self.slots:
            thread = threading.Thread(target=self._serve, daemon=True,
                                      name=f"securesaver-redaction-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()

    def _next(self) -> tuple[str, _Job] | None:  # with the lock held
        best: tuple[int, int, str] | None = None
        for tenant in self._queues:  # in order of arrival of their queues
            running = self._running.get(tenant, 0)
            if running < self.per_tenant:
                rank = (running, self._served.get(tenant, -1), tenant)
                if best is None or rank[:2] < best[:2]:
                    best = rank
        if best is None:
            return None
        tenant = best[2]
        job = self._queues[tenant].popleft()
        if not self._queues[tenant]:
            del self._queues[tenant]
        self._ticks += 1
        self._served[tenant] = self._ticks
        if len(self._served) > 4 * self.queue_limit + 4096:  # forget idle tenants
            self._served = {t: n for t, n in self._served.items()
                            if t in self._queues or t in self._running or t == tenant}
        self._running[tenant] = self._running.get(tenant, 0) + 1
        return tenant, job

    def _serve(self) -> None:
        self._local.inside = True
        while True:
            with self._cond:
                picked = self._next()
                while picked is None:
                    self._cond.wait()
                    picked = self._next()
            tenant = picked[0]
            try:
                _run(picked[1])
            finally:
                picked = None  # the job's values are not kept while the thread waits
                with self._cond:
                    left = self._running[tenant] - 1
                    if left:
                        self._running[tenant] = left
                    else:
                        del self._running[tenant]
                    self._cond.notify_all()

    def waiting(self, tenant: str) -> int:
        with self._cond:
            return len(self._queues.get(tenant, ()))


def _run(job: _Job) -> None:
    if job.future.set_running_or_notify_cancel():
        try:
            result = job.ctx.run(job.fn)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)


_SCHEDULER: FairScheduler | None = None
_LOCK = threading.Lock()


def shared_scheduler() -> FairScheduler:
    """The process's scheduler (made on first use)."""
    global _SCHEDULER
    if _SCHEDULER is None:
        with _LOCK:
            if _SCHEDULER is None:
                _SCHEDULER = FairScheduler()
    return _SCHEDULER


def configure_scheduler(slots: int | None = None, per_tenant: int | None = None,
                        queue_limit: int = DEFAULT_QUEUE) -> FairScheduler:
    """Replace the process's scheduler (jobs already queued finish on the old one)."""
    global _SCHEDULER
    with _LOCK:
        _SCHEDULER = FairScheduler(slots, per_tenant, queue_limit)
    return _SCHEDULER


def _forget_in_child() -> None:  # a forked child has none of the parent's threads
    global _SCHEDULER, _LOCK
    _SCHEDULER, _LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _in_scope(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    with write_scope():  # one write budget per job (a saver's put opened its own: joined)
        return fn(*args, **kwargs)


def redaction_job(tenant: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """THE entry point for redaction and restoring work (sync callers; the store calls this):
    ``fn(*args, **kwargs)`` run as a job of ``tenant`` on the shared scheduler, all its
    redactions sharing one write budget."""
    return shared_scheduler().call(tenant, _in_scope, fn, *args, **kwargs)


async def aredaction_job(tenant: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """:func:`redaction_job` for async callers (never blocks the event loop)."""
    return await shared_scheduler().arun(tenant, _in_scope, fn, *args, **kwargs)
