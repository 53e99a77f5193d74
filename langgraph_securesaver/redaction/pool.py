"""Redaction worker processes: CPU-heavy analysis off the serving process's GIL.

A write whose analysis grows past ``offload_after`` characters sends its further strings to a
worker process (:mod:`.worker`), so that one tenant's large write cannot starve the other
requests of the same process: the serving thread only waits on a pipe (the GIL is free) while
the worker runs presidio. Small writes never pay the round trip.

Workers are separate interpreters started with ``subprocess`` (no ``fork`` of a process that
has threads, no re-import of the caller's ``__main__``). Only the text and the detection
settings go to a worker; only spans, kinds and scores come back; tokens are made in the
parent with the tenant's key. A worker acknowledges each request as it takes it: one that dies
or stops answering after that fails the write it was serving with :class:`RedactionError`
(nothing is stored in clear) and is replaced; one that is gone before it took the request
(killed while idle) is replaced and costs no write, the string is analyzed in-process. While
no worker is ready the analysis runs in-process as before.

``SECURESAVER_REDACTION_WORKERS`` (or :func:`configure_pool`) sets the number of workers;
0 turns offloading off.
"""

from __future__ import annotations

import atexit
import functools
import io
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from .errors import RedactionError
from .frames import read_frame, write_frame

logger = logging.getLogger(__name__)

DEFAULT_OFFLOAD_AFTER = 16_000  # characters a write analyzes in-process before offloading
START_TIMEOUT = 120.0  # seconds a new worker may take to build its engine
RETRY_START = 60.0  # seconds before starting workers again after one failed to start
GRACE = 5.0  # seconds past a request's own deadline before its worker counts as stuck
TAKE_WAIT = 0.05  # seconds a lone redaction waits for a busy worker before analyzing here
# seconds a large write waits for a busy worker before analyzing in-process: its analysis
# stays off the serving process (and its GIL) while the workers catch up; the scheduler
# bounds how many writes of one tenant wait at once (redaction/scheduler.py)
QUEUE_WAIT = 30.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def default_workers() -> int:
    env = os.environ.get("SECURESAVER_REDACTION_WORKERS")
    if env is not None and env.strip():
        try:
            return max(0, int(env))
        except ValueError:
            logger.warning("SECURESAVER_REDACTION_WORKERS=%r is not a number; using 1", env)
            return 1
    return max(1, min(4, (os.cpu_count() or 1) - 1))


class Worker:
    """One worker process and its pipes (used by one request at a time)."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH"))
                                            if p)
        env.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "langgraph_securesaver.redaction.worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        self.pid = self.proc.pid

    @property
    def stdin(self) -> IO[bytes]:
        if self.proc.stdin is None:  # pragma: no cover - always piped
            raise RedactionError("redaction worker has no input pipe")
        return self.proc.stdin

    @property
    def stdout(self) -> IO[bytes]:
        if self.proc.stdout is None:  # pragma: no cover - always piped
            raise RedactionError("redaction worker has no output pipe")
        return self.proc.stdout

    @functools.cached_property
    def replies(self) -> IO[bytes]:
        """The output pipe, unbuffered: :meth:`receive` asks ``select`` whether the pipe holds
        a frame, and a buffered reader may already hold the next one (the answer, read in with
        the acknowledgement before it), where ``select`` cannot see it."""
        return io.FileIO(self.stdout.fileno(), "rb", closefd=False)

    def receive(self, timeout: float) -> Any:
        ready, _, _ = select.select([self.replies], [], [], max(0.0, timeout))
        if not ready:
            raise TimeoutError("the redaction worker did not answer in time")
        doc = read_frame(self.replies)
        if doc is None:
            raise EOFError("the redaction worker exited")
        return doc

    def stop(self) -> None:
        try:
            self.proc.kill()
        except OSError:  # pragma: no cover - already gone
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            logger.warning("redaction worker %d did not exit", self.pid)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:  # pragma: no cover
                    pass


@dataclass(frozen=True, slots=True)
class Request:
    """A request a worker took and has not answered yet (see :meth:`RedactionPool.send`)."""

    worker: Worker
    deadline: float


class RedactionPool:
    """A fixed number of worker processes, started on first need and replaced when one dies."""

    def __init__(self, workers: int, offload_after: int = DEFAULT_OFFLOAD_AFTER) -> None:
        self.size = max(0, int(workers))
        self.offload_after = int(offload_after)
        self._idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live: dict[int, Worker] = {}  # pid -> worker (idle, busy or starting)
        self._starting = 0
        self._closed = False
        self._failed_at = -RETRY_START  # when a worker last failed to start
        self.busy: set[int] = set()  # pids serving a request now (accepted, not answered)

    @property
    def enabled(self) -> bool:
        return self.size > 0 and not self._closed

    def warm(self) -> None:
        """Start the missing workers in the background (returns at once)."""
        with self._lock:
            if not self.enabled or time.monotonic() - self._failed_at < RETRY_START:
                return
            missing = self.size - len(self._live) - self._starting
            self._starting += max(0, missing)
        for _ in range(max(0, missing)):
            threading.Thread(target=self._start_one, name="securesaver-redaction-start",
                             daemon=True).start()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> bool:
        """Start the workers and wait until one is ready (benchmarks and tests)."""
        self.warm()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self._live) > 0 and self._starting == 0:
                    return True
            time.sleep(0.05)
        return False

    def _start_one(self) -> None:
        worker: Worker | None = None
        try:
            worker = Worker()
            hello = worker.receive(START_TIMEOUT)
            if not isinstance(hello, dict) or "ready" not in hello:
                raise RedactionError("the redaction worker did not start")
        except Exception as exc:  # noqa: BLE001 - logged; analysis stays in-process
            logger.error("a redaction worker could not start (%s); analysis runs in-process",
                         type(exc).__name__)
            if worker is not None:
                worker.stop()
            with self._lock:
                self._starting -= 1
                self._failed_at = time.monotonic()
            return
        with self._lock:
            self._starting -= 1
            if self._closed:
                worker.stop()
                return
            self._live[worker.pid] = worker
        logger.debug("redaction worker %d ready", worker.pid)
        self._idle.put(worker)

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(self._live)

    def _take(self, timeout: float) -> Worker | None:
        with self._lock:
            if not self._live:
                starting = self._starting
            else:
                starting = -1
        if starting >= 0:  # nothing ready: start (once) and analyze in-process meanwhile
            if starting == 0:
                self.warm()
            return None
        try:
            return self._idle.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def detect(self, text: str, params: dict[str, Any], seconds: float
               ) -> tuple[dict[tuple[str, int, int], float] | None, str | None, float] | None:
        """(raw detections or None, why not, seconds taken) from a worker; None when no
        worker is free within ``TAKE_WAIT`` (the caller then analyzes in-process): one
        write's strings never queue behind another write holding every worker."""
        request = self.send(text, params, seconds)
        return None if request is None else self.answer(request)

    def send(self, text: str, params: dict[str, Any], seconds: float,
             wait: float = TAKE_WAIT) -> Request | None:
        """Hand ``text`` to a free worker and return at once (the first half of
        :meth:`detect`): the caller does other work -- finishing the previous batch -- while
        the worker analyzes, then collects the answer with :meth:`answer`, which it must
        (:meth:`abandon` on an error path). None when no worker is free within ``wait``
        seconds (the caller then analyzes in-process)."""
        worker = self._take(wait)
        if worker is None:
            return None
        if worker.proc.poll() is not None:  # died while idle: nothing was sent to it
            self._lost_idle(worker)
            return None
        deadline = time.monotonic() + seconds + GRACE
        try:
            write_frame(worker.stdin, {"text": text, "params": params, "seconds": seconds})
            accepted = worker.receive(deadline - time.monotonic())
        except (BrokenPipeError, EOFError):
            # gone before it took the request: killed while idle, even if poll() could not
            # tell yet (a killed process stays unreaped, its pipes open, until its last
            # thread has exited). Nothing of this write ran there: it costs no write.
            self._lost_idle(worker)
            return None
        except Exception as exc:  # noqa: BLE001 - stuck or broken: fails the write
            self._fail(worker, exc)
        if not isinstance(accepted, dict) or accepted.get("accepted") is not True:
            self._fail(worker, RedactionError("malformed worker answer"))
        self.busy.add(worker.pid)
        return Request(worker, deadline)

    def answer(self, request: Request
               ) -> tuple[dict[tuple[str, int, int], float] | None, str | None, float]:
        """The worker's answer to ``request`` (see :meth:`detect`); the worker is free again."""
        worker = request.worker
        try:
            reply = worker.receive(request.deadline - time.monotonic())
            raw, reason, took = _parse(reply)
        except Exception as exc:  # noqa: BLE001 - any failure of the worker fails the write
            self.busy.discard(worker.pid)
            self._fail(worker, exc)
        self.busy.discard(worker.pid)
        self._idle.put(worker)
        return raw, reason, took

    def abandon(self, request: Request) -> None:
        """Collect and drop the answer to ``request`` (its write failed meanwhile), so that
        the worker serves the next write with nothing of this one left in its pipe."""
        try:
            self.answer(request)
        except RedactionError:
            pass  # the worker was retired and replaced

    def _lost_idle(self, worker: Worker) -> None:
        """A worker found dead before it took a request: replaced (the caller analyzes the
        string in-process)."""
        logger.error("redaction worker %d had exited; replacing it", worker.pid)
        self._retire(worker)

    def _fail(self, worker: Worker, exc: BaseException) -> NoReturn:
        """A worker that died, stalled or answered nonsense while serving a request: the
        write is refused (the text may be what broke it, so it is not analyzed again)."""
        self._retire(worker)
        logger.error("a redaction worker failed (%s); the write is refused",
                     type(exc).__name__)
        raise RedactionError(
            f"the redaction worker failed ({type(exc).__name__}); nothing was stored"
        ) from None

    def _retire(self, worker: Worker) -> None:
        worker.stop()
        with self._lock:
            self._live.pop(worker.pid, None)
        self.warm()  # a replacement, in the background

    def close(self) -> None:
        with self._lock:
            self._closed = True
            live = list(self._live.values())
            self._live.clear()
        for worker in live:
            worker.stop()


def _parse(reply: Any) -> tuple[dict[tuple[str, int, int], float] | None, str | None, float]:
    """A worker's answer, checked field by field (never trusted to be well formed)."""
    if not isinstance(reply, dict):
        raise RedactionError("malformed worker answer")
    took = reply.get("took")
    took = float(took) if isinstance(took, (int, float)) else 0.0
    if "error" in reply:
        raise RedactionError(f"worker error {str(reply['error'])[:64]}")
    if "overrun" in reply:
        return None, str(reply["overrun"])[:64], took
    items = reply.get("raw")
    if not isinstance(items, list):
        raise RedactionError("malformed worker answer")
    raw: dict[tuple[str, int, int], float] = {}
    for item in items:
        if (not isinstance(item, list) or len(item) != 4 or not isinstance(item[0], str)
                or type(item[1]) is not int or type(item[2]) is not int
                or not isinstance(item[3], (int, float))):
            raise RedactionError("malformed worker answer")
        raw[(item[0], item[1], item[2])] = float(item[3])
    return raw, None, took


_POOL: RedactionPool | None = None
_POOL_LOCK = threading.Lock()


def shared_pool() -> RedactionPool:
    """The process's pool (created on first use, with :func:`default_workers` workers)."""
    global _POOL
    pool = _POOL
    if pool is not None:
        return pool
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = RedactionPool(default_workers())
        return _POOL


def configure_pool(workers: int | None = None, *,
                   offload_after: int = DEFAULT_OFFLOAD_AFTER) -> RedactionPool:
    """Replace the process's pool (``workers=0``: analysis always in-process)."""
    global _POOL
    with _POOL_LOCK:
        old, _POOL = _POOL, RedactionPool(default_workers() if workers is None else workers,
                                          offload_after)
        new = _POOL
    if old is not None:
        old.close()
    return new


@atexit.register
def _close_at_exit() -> None:
    pool = _POOL
    if pool is not None:
        pool.close()
