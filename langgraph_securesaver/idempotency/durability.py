"""The durability guard of idempotent calls: refuse, warn about or wait out a run whose
idempotency key might not survive a crash (``durability='exit'``, or ``'async'`` before the
checkpoint the task started from is persisted -- the fence).

One body (:func:`_durability_steps`) driven by a sync and an async runner. Knows the run
context, the policy and the store's fence cache; nothing of the saver.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Generator
from typing import Any, cast

from langchain_core.runnables import RunnableConfig

from .context import CONFIG_KEY_CHECKPOINTER, RunContext
from .errors import DurabilityError
from .policy import IdempotencyPolicy
from .store import IdempotencyStore

logger = logging.getLogger("langgraph_securesaver.idempotency.decorators")

_warned: set[tuple[str, str, str]] = set()
_warned_lock = threading.Lock()


def _warn_once(ctx: RunContext, message: str) -> None:
    """Log once per thread, step (parent checkpoint) and problem, not once per tool call."""
    seen = (ctx.thread_id, ctx.parent_checkpoint_id or "", message)
    with _warned_lock:
        if seen in _warned:
            return
        if len(_warned) > 10_000:
            _warned.clear()
        _warned.add(seen)
    logger.warning("%s", message)


def _durability_problem(ctx: RunContext, policy: IdempotencyPolicy) -> str | None:
    """A reason the key may not survive a crash (before the fence), or None."""
    if ctx.durability == "exit":
        return ("idempotent call under durability='exit': no checkpoint is saved before the "
                "run ends, so after a crash the model is called again, every id changes and the "
                "effect runs twice. Use durability='sync' (or 'async' with the fence).")
    if ctx.durability == "async" and not policy.fence:
        return ("idempotent call under durability='async' without the checkpoint fence: the "
                "checkpoint holding the tool call may not be saved when the effect runs")
    return None


def _fence_config(ctx: RunContext) -> RunnableConfig | None:
    if ctx.parent_checkpoint_id is None:
        return None
    conf: dict[str, Any] = {"thread_id": ctx.thread_id, "checkpoint_ns": ctx.parent_ns,
                            "checkpoint_id": ctx.parent_checkpoint_id}
    if ctx.configurable.get("tenant_id") is not None:
        conf["tenant_id"] = ctx.configurable["tenant_id"]
    return {"configurable": conf}


def _needs_fence(store: IdempotencyStore, ctx: RunContext, tenant: str,
                 policy: IdempotencyPolicy) -> bool:
    return (ctx.durability == "async" and policy.fence and policy.durability != "ignore"
            and ctx.parent_checkpoint_id is not None
            and not store.fenced(tenant, ctx.thread_id, ctx.parent_ns, ctx.parent_checkpoint_id))


def _fence_failed(ctx: RunContext, policy: IdempotencyPolicy) -> str:
    return (f"the checkpoint {ctx.parent_checkpoint_id} this task started from was not "
            f"persisted within fence_timeout={policy.fence_timeout}s (durability='async'); a "
            "crash now could lose the tool call and change its key")


def _violation(ctx: RunContext, policy: IdempotencyPolicy, problem: str) -> None:
    if policy.durability == "refuse":
        raise DurabilityError(problem + " (policy durability='refuse')")
    if policy.durability == "warn":
        _warn_once(ctx, problem)


def _durability_steps(store: IdempotencyStore, ctx: RunContext, tenant: str,
                      policy: IdempotencyPolicy) -> Generator[tuple[str, Any], Any, None]:
    """The durability guard, once for both runners: it yields ``("read", config)`` (send back
    the checkpointer's tuple for that config, or None) and ``("sleep", seconds)``; it returns
    when the parent checkpoint is persisted, when there is nothing to wait for, or after
    reporting a violation (raised under ``durability='refuse'``)."""
    if policy.durability == "ignore":
        return
    problem = _durability_problem(ctx, policy)
    if problem is not None:
        _violation(ctx, policy, problem)
        return
    if not _needs_fence(store, ctx, tenant, policy):
        return
    cfg = _fence_config(ctx)
    if ctx.configurable.get(CONFIG_KEY_CHECKPOINTER) is None or cfg is None:
        return
    deadline = time.monotonic() + policy.fence_timeout
    delay = 0.002
    while True:
        if (yield ("read", cfg)) is not None:
            store.remember_fence(tenant, ctx.thread_id, ctx.parent_ns,
                                 cast(str, ctx.parent_checkpoint_id))
            return
        if time.monotonic() >= deadline:
            _violation(ctx, policy, _fence_failed(ctx, policy))
            return
        yield ("sleep", delay)
        delay = min(delay * 2, 0.1)


def guard_durability(store: IdempotencyStore, ctx: RunContext, tenant: str,
                     policy: IdempotencyPolicy) -> None:
    """Before a sync effect: the guard's steps, with blocking reads and sleeps."""
    checkpointer: Any = ctx.configurable.get(CONFIG_KEY_CHECKPOINTER)
    steps = _durability_steps(store, ctx, tenant, policy)
    reply: Any = None
    while True:
        try:
            kind, arg = steps.send(reply)
        except StopIteration:
            return
        if kind == "read":
            reply = checkpointer.get_tuple(arg)
        else:
            time.sleep(arg)
            reply = None


async def aguard_durability(store: IdempotencyStore, ctx: RunContext, tenant: str,
                            policy: IdempotencyPolicy) -> None:
    """Before an async effect: the same steps, awaited (never blocks the event loop)."""
    checkpointer: Any = ctx.configurable.get(CONFIG_KEY_CHECKPOINTER)
    steps = _durability_steps(store, ctx, tenant, policy)
    reply: Any = None
    while True:
        try:
            kind, arg = steps.send(reply)
        except StopIteration:
            return
        if kind == "read":
            reply = await checkpointer.aget_tuple(arg)
        else:
            await asyncio.sleep(arg)
            reply = None
