"""The tenant of each LangGraph run, for the checkpointer calls LangGraph makes outside it.

LangGraph makes some checkpointer calls of a run where the caller's context is gone: the sync
loop files a task's writes from a future's done callback, which runs in an executor thread's
own (empty) context, so a ``tenant_scope`` set around ``graph.invoke`` is not visible there.
Every config LangGraph passes during a run carries the run's ``Runtime``, and every runtime of
one run (its subgraphs' too) holds the same ``RunControl`` object, created for that run.

:class:`RunTenants` remembers, per run control and thread id, the tenant that an explicit call
of the run (scope or config) acted for. A later call of the same run that names no tenant acts
for that tenant. The binding is keyed by object identity (a control object is held here, so its
id cannot be reused while the binding exists) *and* by thread id, so two runs never share one;
a control or thread that two tenants claim is ambiguous and resolves nobody (fail closed).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

#: where LangGraph keeps the run's Runtime in a config's configurable
RUNTIME_KEY = "__pregel_runtime"
#: live runs remembered at most (least recently used are dropped: their tenant-less calls
#: then fail closed with TenantRequired)
MAX_RUNS = 65536
_AMBIGUOUS = object()

try:
    from langgraph.runtime import RunControl as _RunControl
    _RUN_CONTROL: type | None = _RunControl
except ImportError:  # pragma: no cover - a LangGraph without run controls: no binding
    _RUN_CONTROL = None


def run_of(configurable: Mapping[str, Any] | None) -> object | None:
    """The run-control object of the LangGraph run a config belongs to, if any.

    Only a real ``RunControl`` counts: anything else (no runtime, LangGraph's shared default
    runtime, whose control is None, or an object of another type) gives None."""
    if not configurable:
        return None
    runtime = configurable.get(RUNTIME_KEY)
    if runtime is None:
        return None
    control = getattr(runtime, "control", None)
    return control if _RUN_CONTROL is not None and type(control) is _RUN_CONTROL else None


class _Run:
    __slots__ = ("control", "threads")

    def __init__(self, control: object) -> None:
        self.control = control
        self.threads: dict[str, object] = {}


def _only_held_here() -> int | None:
    """``sys.getrefcount`` of an object referenced by nothing but a ``_Run`` (measured, so the
    count holds on this interpreter); None where reference counts are not available."""
    getrefcount = getattr(sys, "getrefcount", None)
    if getrefcount is None:  # pragma: no cover - not CPython
        return None
    run = _Run(object())
    return int(getrefcount(run.control))


_ONLY_HELD_HERE = _only_held_here()


class RunTenants:
    """Per saver: run control -> thread id -> the tenant the run acts for (thread-safe)."""

    def __init__(self, max_runs: int = MAX_RUNS) -> None:
        self.max_runs = max_runs
        self._runs: OrderedDict[int, _Run] = OrderedDict()
        self._lock = threading.Lock()
        self._next_sweep = 256

    def bind(self, control: object, thread_id: str, tenant: str) -> str | None:
        """Record that ``control``'s run acts for ``tenant`` on ``thread_id``. Returns the
        other tenant when the run already acts for another one there: the binding becomes
        ambiguous (no tenant-less call of that run and thread resolves any more; the calls
        that name a tenant keep acting for it)."""
        with self._lock:
            run = self._runs.get(id(control))
            if run is None or run.control is not control:
                run = _Run(control)
                self._runs[id(control)] = run
                self._shrink()
            else:
                self._runs.move_to_end(id(control))
            bound = run.threads.get(thread_id)
            if bound is None:
                run.threads[thread_id] = tenant
                return None
            if bound == tenant or bound is _AMBIGUOUS:  # refused once, when it became so
                return None
            run.threads[thread_id] = _AMBIGUOUS
        logger.warning("a LangGraph run acts for two tenants on one thread id; its calls that "
                       "name no tenant are refused from now on")
        return str(bound)

    def tenant_of(self, control: object, thread_id: str) -> str | None:
        """The tenant ``control``'s run acts for on ``thread_id``; None when unknown or
        ambiguous."""
        with self._lock:
            run = self._runs.get(id(control))
            if run is None or run.control is not control:
                return None
            self._runs.move_to_end(id(control))
            bound = run.threads.get(thread_id)
        return bound if isinstance(bound, str) else None

    def is_ambiguous(self, control: object, thread_id: str) -> bool:
        """True when two tenants claimed ``control``'s run on ``thread_id``: its tenant-less
        calls act for nobody, not even a saver's default tenant."""
        with self._lock:
            run = self._runs.get(id(control))
            return (run is not None and run.control is control
                    and run.threads.get(thread_id) is _AMBIGUOUS)

    def __len__(self) -> int:
        return len(self._runs)

    def _shrink(self) -> None:
        """Drop runs that ended (nothing but this table holds their control any more), then
        the least recently used beyond ``max_runs``. Amortized: a sweep when the table has
        doubled since the last one."""
        if len(self._runs) >= self._next_sweep and _ONLY_HELD_HERE is not None:
            for key in [k for k, run in self._runs.items()
                        if sys.getrefcount(run.control) <= _ONLY_HELD_HERE]:
                del self._runs[key]
            self._next_sweep = max(256, 2 * len(self._runs))
        while len(self._runs) > self.max_runs:
            self._runs.popitem(last=False)
