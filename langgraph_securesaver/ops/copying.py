"""``copy_thread``: one body for both APIs.

:func:`copy_steps` is the whole operation as a generator of requests to the saver's own
checkpointer methods (``("get_tuple", config)``, ``("list", config)``, ``("put", args)``,
``("put_writes", args)``; send back the method's result); :func:`run_steps` and
:func:`arun_steps` drive it with the sync or the async methods. Knows the checkpointer
contract only (every copied checkpoint is read, verified and re-sealed through it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata

from ..errors import ConfigurationError

Steps = Generator[tuple[str, Any], Any, int]


def copy_steps(tenant: str, source: str, target: str) -> Steps:
    """Copy every checkpoint (oldest first) and its pending writes from ``source`` to
    ``target`` of ``tenant``; returns the number of checkpoints copied."""
    src: RunnableConfig = {"configurable": {"thread_id": source, "tenant_id": tenant}}
    dst: RunnableConfig = {"configurable": {"thread_id": target, "tenant_id": tenant}}
    if (yield ("get_tuple", dst)) is not None:
        raise ConfigurationError(f"copy_thread target {target!r} already has checkpoints")
    tuples = yield ("list", src)
    for tup in reversed(tuples):
        for cfg, ckpt, md, versions, writes in _copy_plan(tup, dst):
            saved = yield ("put", (cfg, ckpt, md, versions))
            for task_id, task_writes in writes.items():
                yield ("put_writes", (saved, task_writes, task_id))
    return len(tuples)


def run_steps(steps: Steps, methods: Mapping[str, Callable[..., Any]]) -> int:
    reply: Any = None
    while True:
        try:
            name, arg = steps.send(reply)
        except StopIteration as done:
            return int(done.value)
        reply = methods[name](*arg) if isinstance(arg, tuple) else methods[name](arg)


async def arun_steps(steps: Steps, methods: Mapping[str, Callable[..., Awaitable[Any]]]) -> int:
    reply: Any = None
    while True:
        try:
            name, arg = steps.send(reply)
        except StopIteration as done:
            return int(done.value)
        reply = await (methods[name](*arg) if isinstance(arg, tuple) else methods[name](arg))


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
