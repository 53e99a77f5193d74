"""Refused cross-tenant attempts, coalesced per actor: a flood costs the registry a few rows,
not one row (and one lock of a chain head) per attempt, whatever targets it names.

The first attempt of an (actor, operation) is written at once, in the target's chain. Further
attempts of the same actor and operation within ``window`` seconds -- whichever targets they
name, made-up ones included -- are counted in memory and written as ONE ``access_denied``
event carrying ``count`` (the attempts it stands for), ``first_at`` and ``last_at``, when the
window closes; while the attempts go on, each window adds one such summary. A summary whose
attempts all named one target goes to that target's chain; one over several targets goes to
the actor's own chain with ``distinct_targets`` and the first :data:`NAMED_TARGETS` names
(a spray over made-up tenants starts no chains). Operations are a fixed set of names, so the
rows per actor are bounded. Summing ``count`` over the events gives the exact number of refused
attempts, across processes too (each process counts its own). Pending counts are flushed by a
background thread, by :meth:`DenialLog.flush` (the saver's ``close``) and at interpreter
exit; a summary that cannot be written is kept and retried, and logged as an error, never
dropped silently.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

DEFAULT_WINDOW = 5.0
WRITE_ATTEMPTS = 3
NAMED_TARGETS = 8     # target names a multi-target summary lists
COUNTED_TARGETS = 1024  # distinct targets counted per summary (past it: "at least")

# record(kind, tenant, thread_id, actor, detail) -> None (raises when it could not write)
Recorder = Callable[[str, str, "str | None", str, dict[str, object]], None]


@dataclass
class _Open:
    """The attempts of one (actor, operation) not written yet."""

    window_end: float
    count: int = 0
    first_at: float = 0.0
    last_at: float = 0.0
    threads: set[str | None] = field(default_factory=set)
    targets: dict[str, None] = field(default_factory=dict)  # insertion order, capped

    def add_targets(self, targets: dict[str, None]) -> None:
        for t in targets:
            if len(self.targets) >= COUNTED_TARGETS:
                return
            self.targets[t] = None


class DenialLog:
    """The coalescing record of refused attempts for one registry (one per process)."""

    def __init__(self, record: Recorder, window: float = DEFAULT_WINDOW,
                 clock: Callable[[], float] = time.time) -> None:
        self._record = record
        self.window = float(window)
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._open: dict[tuple[str, str], _Open] = {}
        self._flusher: threading.Thread | None = None
        self._flush_lock = threading.Lock()  # one writer of summaries at a time
        self.failing = False  # the last write to the registry failed
        _LOGS.add(self)

    def attempt(self, actor: str, target: str, operation: str,
                thread_id: str | None) -> bool:
        """Count one refused attempt. True: it is the first of its window and the caller
        must write it now (:meth:`write_first`); False: it is counted for the summary."""
        now = self._clock()
        key = (actor, operation)
        with self._lock:
            state = self._open.get(key)
            if state is None:
                self._open[key] = _Open(window_end=now + self.window)
                self._ensure_flusher()
                return True
            if state.count == 0:
                state.first_at = now
            state.count += 1
            state.last_at = now
            if len(state.threads) < 2:
                state.threads.add(thread_id)
            state.add_targets({target: None})
            return False

    def write_first(self, actor: str, target: str, operation: str,
                    thread_id: str | None) -> None:
        """Write the first attempt of a window now (raises when it cannot)."""
        try:
            self._record("access_denied", target, thread_id, actor, {"operation": operation})
        except Exception:
            self.failing = True
            raise
        self.failing = False

    def defer(self, actor: str, target: str, operation: str, thread_id: str | None) -> None:
        """A first attempt that could not be written now: counted for the next summary."""
        now = self._clock()
        self._requeue((actor, operation),
                      _Open(window_end=now + self.window, count=1, first_at=now, last_at=now,
                            threads={thread_id}, targets={target: None}))
        with self._lock:
            self._ensure_flusher()

    def flush(self, everything: bool = True) -> int:
        """Write the pending summaries (every one, or those whose window closed); returns
        the number of attempts written. A summary that fails is kept for the next flush."""
        with self._flush_lock:
            now = self._clock()
            due: list[tuple[tuple[str, str], _Open]] = []
            with self._lock:
                for key, state in list(self._open.items()):
                    if not everything and state.window_end > now:
                        continue
                    if state.count == 0:
                        del self._open[key]  # a quiet window: the next attempt is a first
                        continue
                    due.append((key, state))
                    self._open[key] = _Open(window_end=now + self.window)
            written = 0
            for key, state in due:
                if self._write_summary(key, state):
                    written += state.count
                else:
                    self._requeue(key, state)
            return written

    def pending(self) -> int:
        with self._lock:
            return sum(s.count for s in self._open.values())

    def _write_summary(self, key: tuple[str, str], state: _Open) -> bool:
        actor, operation = key
        thread_id = next(iter(state.threads)) if len(state.threads) == 1 else None
        detail: dict[str, object] = {"operation": operation, "count": state.count,
                                     "first_at": state.first_at, "last_at": state.last_at,
                                     "coalesced": True}
        if len(state.targets) == 1:
            target = next(iter(state.targets))
        else:  # several targets (made-up ones, maybe): the actor's own chain
            target = actor
            thread_id = None
            detail["targets"] = list(state.targets)[:NAMED_TARGETS]
            detail["distinct_targets"] = len(state.targets)
            detail["distinct_targets_capped"] = len(state.targets) >= COUNTED_TARGETS
        failure: Exception | None = None
        for attempt in range(WRITE_ATTEMPTS):
            try:
                self._record("access_denied", target, thread_id, actor, detail)
                self.failing = False
                return True
            except Exception as exc:  # noqa: BLE001 - kept and retried, logged below
                failure = exc
                time.sleep(0.05 * (attempt + 1))
        self.failing = True
        logger.error("could not record %d coalesced access-denied attempts of tenant %r "
                     "(%s); they are kept and retried", state.count, actor,
                     type(failure).__name__)
        return False

    def _requeue(self, key: tuple[str, str], state: _Open) -> None:
        with self._lock:
            current = self._open.setdefault(key, _Open(window_end=self._clock() + self.window))
            if current.count == 0:
                current.first_at = state.first_at
            else:
                current.first_at = min(current.first_at, state.first_at)
            current.count += state.count
            current.last_at = max(current.last_at, state.last_at)
            current.threads |= state.threads
            current.add_targets(state.targets)

    def _ensure_flusher(self) -> None:  # called with the lock held
        if self._flusher is None or not self._flusher.is_alive():
            ref = weakref.ref(self)
            self._flusher = threading.Thread(target=_flush_loop, args=(ref,), daemon=True,
                                             name="securesaver-denials")
            self._flusher.start()
        self._wake.notify()


def _flush_loop(ref: weakref.ReferenceType[DenialLog]) -> None:
    """Write each summary when its window closes; exit once nothing is open."""
    while True:
        log = ref()
        if log is None:
            return
        with log._lock:
            if not log._open:
                log._flusher = None
                return
            soonest = min(s.window_end for s in log._open.values())
            wait = soonest - log._clock()
            if wait > 0:
                log._wake.wait(min(wait, 1.0))
                continue
        log.flush(everything=False)
        del log


_LOGS: weakref.WeakSet[DenialLog] = weakref.WeakSet()


@atexit.register
def flush_all() -> None:
    """Write every pending summary of the process (at exit; also callable directly)."""
    for log in list(_LOGS):
        try:
            log.flush()
        except Exception as exc:  # noqa: BLE001 - logged: never lost silently
            logger.error("could not flush access-denied summaries at exit (%s); %d attempts "
                         "are not recorded", type(exc).__name__, log.pending())


_BY_REGISTRY: weakref.WeakKeyDictionary[object, DenialLog] = weakref.WeakKeyDictionary()
_BY_REGISTRY_LOCK = threading.Lock()


def log_for(registry: object) -> DenialLog:
    """The denial log of ``registry`` (anything with ``record_event``; one per object)."""
    with _BY_REGISTRY_LOCK:
        log = _BY_REGISTRY.get(registry)
        if log is None:
            ref = weakref.ref(registry)

            def record(kind: str, tenant: str, thread_id: str | None, actor: str,
                       detail: dict[str, object]) -> None:
                target = ref()
                if target is None:
                    raise RuntimeError("the registry is gone")
                target.record_event(kind, tenant=tenant, thread_id=thread_id,  # type: ignore[attr-defined]
                                    actor=actor, **detail)

            log = _BY_REGISTRY[registry] = DenialLog(record)
        return log


def flush_for(registry: object) -> None:
    """Write the pending summaries of ``registry`` (before it is disposed)."""
    with _BY_REGISTRY_LOCK:
        log = _BY_REGISTRY.get(registry)
    if log is not None:
        log.flush()
