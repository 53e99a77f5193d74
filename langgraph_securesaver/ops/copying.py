"""``copy_thread``: one body for both APIs.

:func:`copy_steps` is the whole operation as a generator of requests to the saver's own
checkpointer methods (``("get_tuple", config)``, ``("list", config)``, ``("put", args)``,
``("put_writes", args)``; send back the method's result), driven by :func:`.steps.run_steps`
or :func:`.steps.arun_steps` with :func:`serving` the sync or the async methods. Knows the
checkpointer contract only (every copied checkpoint is read, verified and re-sealed through it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata

from ..errors import ConfigurationError
from ..steps import Steps


def copy_steps(tenant: str, source: str, target: str,
               namespaces: Iterable[str] = ()) -> Steps[int]:
    """Copy every checkpoint (oldest first) and its pending writes from ``source`` to
    ``target`` of ``tenant``; returns the number of checkpoints copied. ``namespaces``: the
    subgraph namespaces the source was written in (:mod:`..registry.namespaces`), listed one
    by one too, for savers whose listing of a thread returns its root namespace only."""
    src: RunnableConfig = {"configurable": {"thread_id": source, "tenant_id": tenant}}
    dst: RunnableConfig = {"configurable": {"thread_id": target, "tenant_id": tenant}}
    if (yield ("get_tuple", dst)) is not None:
        raise ConfigurationError(f"copy_thread target {target!r} already has checkpoints")
    tuples = list(reversed((yield ("list", src))))
    seen = {_key(t) for t in tuples}
    for ns in namespaces:
        listed = yield ("list", {"configurable": {**src["configurable"], "checkpoint_ns": ns}})
        tuples += [t for t in reversed(listed) if _key(t) not in seen]
        seen |= {_key(t) for t in listed}
    for tup in tuples:
        for cfg, ckpt, md, versions, writes in _copy_plan(tup, dst):
            saved = yield ("put", (cfg, ckpt, md, versions))
            for task_id, task_writes in writes.items():
                yield ("put_writes", (saved, task_writes, task_id))
    return len(tuples)


def _key(tup: Any) -> tuple[str, str]:
    conf = tup.config["configurable"]
    return str(conf.get("checkpoint_ns", "")), str(conf["checkpoint_id"])


def serving(methods: Mapping[str, Callable[..., Any]]) -> Callable[[str, Any], Any]:
    """The requests of :func:`copy_steps` served by ``methods`` (a tuple argument spread);
    async methods give awaitables, for :func:`.steps.arun_steps`."""
    def serve(name: str, arg: Any) -> Any:
        return methods[name](*arg) if isinstance(arg, tuple) else methods[name](arg)
    return serve


def _copy_plan(tup: Any, dst: RunnableConfig) -> Iterator[
        tuple[RunnableConfig, Checkpoint, CheckpointMetadata, ChannelVersions,
              dict[str, list[tuple[str, Any]]]]]:
    conf = dict(dst["configurable"])
    conf["checkpoint_ns"] = tup.config["configurable"].get("checkpoint_ns", "")
    if tup.parent_config is not None:
        conf["checkpoint_id"] = tup.parent_config["configurable"]["checkpoint_id"]
    writes: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in tup.pending_writes or []:
        writes.setdefault(task_id, []).append((channel, value))
    checkpoint = tup.checkpoint
    yield ({"configurable": conf}, checkpoint, tup.metadata,
           dict(checkpoint["channel_versions"]), writes)
