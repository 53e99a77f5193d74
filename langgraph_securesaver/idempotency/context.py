"""Where an idempotent call runs: the active key, replay state, and the graph run around it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig

from .errors import NoIdempotencyContext
from .keys import KeyScope, parent_namespace, strip_task_ids

if TYPE_CHECKING:
    from ..services import SaverLike

# the keys LangGraph 1.2 puts in config["configurable"] of a running task
CONFIG_KEY_CHECKPOINTER = "__pregel_checkpointer"
CONFIG_KEY_TASK_ID = "__pregel_task_id"
CONFIG_KEY_DURABILITY = "__pregel_durability"
CONFIG_KEY_CHECKPOINT_MAP = "checkpoint_map"


@dataclass(frozen=True)
class ActiveCall:
    """The idempotent call whose code is running (or being replayed) in this context."""

    scope: KeyScope
    fencing_token: int
    replayed: bool
    tool_call_id: str | None = None


_active: ContextVar[ActiveCall | None] = ContextVar("securesaver_idempotent_call", default=None)

# tasks (thread_id, task_id) in which at least one call was served from the store
_replayed_tasks: OrderedDict[tuple[str, str], None] = OrderedDict()
_replayed_lock = threading.Lock()
_MAX_REPLAYED_TASKS = 10_000


@contextmanager
def active_call(call: ActiveCall) -> Iterator[ActiveCall]:
    token = _active.set(call)
    try:
        yield call
    finally:
        _active.reset(token)


def current_call() -> ActiveCall | None:
    return _active.get()


def current_idempotency_key() -> str:
    """The key of the idempotent call running here: pass it downstream (``Idempotency-Key``).

    The same string is returned on every attempt of the same logical call (retries, resumes,
    takeovers by another worker). Raises :class:`NoIdempotencyContext` outside an idempotent
    call, so a downstream request is never sent without its key by mistake.
    """
    call = _active.get()
    if call is None:
        raise NoIdempotencyContext(
            "current_idempotency_key() is only available inside an @idempotent function or a "
            "tool call run by IdempotentToolCalls")
    return call.scope.key


def current_fencing_token() -> int:
    """The fencing token of the running attempt (grows by one on every takeover); pass it to
    stores that can reject writes from stale holders."""
    call = _active.get()
    if call is None:
        raise NoIdempotencyContext("current_fencing_token() needs an active idempotent call")
    return call.fencing_token


def note_replayed_task(thread_id: str, task_id: str) -> None:
    with _replayed_lock:
        _replayed_tasks[(thread_id, task_id)] = None
        _replayed_tasks.move_to_end((thread_id, task_id))
        while len(_replayed_tasks) > _MAX_REPLAYED_TASKS:
            _replayed_tasks.popitem(last=False)


def is_replaying() -> bool:
    """True while the current code is a replay rather than a first execution.

    * inside an idempotent call: True when its result is being served from the store;
    * elsewhere in a graph task (a node body, the code between effects): True once any
      idempotent call of this task was served from the store, i.e. the task is re-running
      after a crash or retry. Use it to skip cost accounting or to mark spans/logs.
    """
    call = _active.get()
    if call is not None:
        return call.replayed
    config = _config_or_none()
    if config is None:
        return False
    conf = config.get("configurable") or {}
    thread_id, task_id = conf.get("thread_id"), conf.get(CONFIG_KEY_TASK_ID)
    if thread_id is None or task_id is None:
        return False
    return (str(thread_id), str(task_id)) in _replayed_tasks


def _config_or_none() -> RunnableConfig | None:
    try:
        from langgraph.config import get_config
        return get_config()
    except RuntimeError:
        return None


@dataclass(frozen=True)
class RunContext:
    """The identity of the graph task an idempotent call runs in."""

    config: RunnableConfig
    saver: SaverLike | None
    thread_id: str
    checkpoint_ns: str
    graph_path: str
    parent_ns: str
    parent_checkpoint_id: str | None
    task_id: str | None
    durability: str

    @property
    def configurable(self) -> Mapping[str, Any]:
        return self.config.get("configurable") or {}


def run_context(config: RunnableConfig | None = None) -> RunContext:
    """Read the task identity from ``config`` (default: the current run's config)."""
    if config is None:
        config = _config_or_none()
    if config is None:
        raise NoIdempotencyContext(
            "an idempotent call without an explicit key must run inside a LangGraph graph "
            "(no run config found); pass key=... or call it from a node or tool")
    conf = config.get("configurable") or {}
    thread_id = conf.get("thread_id")
    if thread_id is None or thread_id == "":
        raise NoIdempotencyContext(
            "the run has no config['configurable']['thread_id']: idempotency keys are derived "
            "from persisted thread identity, so compile the graph with a SecureSaver and pass "
            "a thread_id")
    ns = str(conf.get("checkpoint_ns") or "")
    parent = parent_namespace(ns)
    cmap = conf.get(CONFIG_KEY_CHECKPOINT_MAP) or {}
    parent_cid = cmap.get(parent) if isinstance(cmap, Mapping) else None
    saver = _secure_saver(conf.get(CONFIG_KEY_CHECKPOINTER))
    task_id = conf.get(CONFIG_KEY_TASK_ID)
    return RunContext(
        config=config, saver=saver, thread_id=str(thread_id), checkpoint_ns=ns,
        graph_path=strip_task_ids(ns), parent_ns=parent,
        parent_checkpoint_id=str(parent_cid) if parent_cid else None,
        task_id=str(task_id) if task_id else None,
        durability=str(conf.get(CONFIG_KEY_DURABILITY) or "async"),
    )


def _secure_saver(checkpointer: Any) -> SaverLike | None:
    """The running checkpointer when it is a SecureSaver (it offers ``services``)."""
    from ..services import services_of
    return checkpointer if services_of(checkpointer) is not None else None
