"""The inner saver, reached the right way: the sync API on an async-only saver only from
outside its loop, the async API on a sync-only saver in a worker thread, listings of an
async-only saver driven and closed on its own loop, only the optional parameters the inner
method accepts, and thread ids translated between the caller's and the inner namespace.

Knows the inner saver and the tenant id scheme; nothing of keys, sealing or redaction.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.memory import InMemorySaver

from .errors import AsyncOnlySaverError, TamperedDataError
from .offthread import to_thread
from .tenancy import ThreadRef, looks_tagged, outer_thread_id

T = TypeVar("T")


class InnerAccess:
    """How one saver reaches its ``inner`` saver (see the module docstring)."""

    def __init__(self, inner: BaseCheckpointSaver) -> None:
        self.inner = inner
        self.async_only = is_async_only(inner)
        self.sync_only = is_sync_only(inner)
        # savers that keep each channel version once (as a blob) and ignore values whose
        # version did not change: those values need not be sealed at all
        self.versioned_blobs = stores_versioned_blobs(inner)
        self._accepted: dict[str, frozenset[str]] = {}

    def sync(self, operation: str) -> BaseCheckpointSaver:
        if self.async_only:
            loop = getattr(self.inner, "loop", None)
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if loop is None or not loop.is_running() or running is loop:
                raise AsyncOnlySaverError(
                    f"{type(self.inner).__name__} is async-only: call a{operation}() (or "
                    "graph.ainvoke/astream) instead of the sync API, or wrap a sync saver")
        return self.inner

    def listing(self, inner: BaseCheckpointSaver, config: RunnableConfig | None,
                **kwargs: Any) -> Iterator[CheckpointTuple]:
        """The inner saver's listing for the sync API. An async-only saver's own sync bridge
        abandons its async generator when closed early (finalized later, in whatever thread);
        here it is driven on its loop and closed there."""
        if not self.async_only:
            return inner.list(config, **kwargs)
        return bridged(inner.alist(config, **kwargs), self.inner.loop)  # type: ignore[attr-defined]

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.sync_only:
            return await to_thread(getattr(self.inner, name), *args, **kwargs)
        return await getattr(self.inner, "a" + name)(*args, **kwargs)

    def optional(self, operation: str, **params: Any) -> dict[str, Any]:
        """The optional BaseCheckpointSaver parameters the inner saver's method accepts.

        Decided from the method's signature, as LangGraph decides for ``task_path``
        (``put_writes_accepts_task_path``): a saver written before a parameter existed keeps
        working wrapped exactly as it does raw. The sync-only path of the async API calls the
        sync method, so that one's signature counts there."""
        name = operation if self.sync_only else "a" + operation
        accepted = self._accepted.get(name)
        if accepted is None:
            accepted = self._accepted[name] = accepted_params(getattr(self.inner, name))
        return {k: v for k, v in params.items() if k in accepted}

    @staticmethod
    def config(ref: ThreadRef, config: RunnableConfig | None = None,
               *, with_ns: bool = True) -> RunnableConfig:
        conf = (config or {}).get("configurable") or {}
        out: dict[str, Any] = {"thread_id": ref.inner_id}
        if with_ns:
            out["checkpoint_ns"] = ref.checkpoint_ns
        if conf.get("checkpoint_id"):
            out["checkpoint_id"] = conf["checkpoint_id"]
        return {"configurable": out}

    def outer(self, tenant: str) -> Callable[[RunnableConfig | None], RunnableConfig | None]:
        """Configs as the caller sees them: the inner saver's, with the thread id unprefixed.
        Tenant namespacing stays invisible (``tenant_id`` is added back by
        :func:`.listing.named_tup` / :func:`.listing.named_cfg` only when the caller's own
        config named it: LangGraph merges returned configs into the run config and copies
        configurable scalars into later checkpoints' metadata, so anything added here would
        spread)."""
        def convert(config: RunnableConfig | None) -> RunnableConfig | None:
            if config is None:
                return None
            conf = dict(config["configurable"])
            thread = outer_thread_id(tenant, str(conf["thread_id"]))
            if thread is None:
                raise TamperedDataError("inner saver returned a thread of another tenant")
            conf["thread_id"] = thread
            return {"configurable": conf}
        return convert

    def ref_of(self, tenant: str, tup: CheckpointTuple) -> ThreadRef | None:
        conf = tup.config["configurable"]
        thread = outer_thread_id(tenant, str(conf["thread_id"]))
        if thread is None:
            return None
        return ThreadRef(tenant, thread, str(conf.get("checkpoint_ns", "") or ""))


def raw_thread_ids(raw: BaseCheckpointSaver) -> list[str]:
    """Thread ids a saver holds that SecureSaver did not write (a raw saver wrote them)."""
    seen: set[str] = set()
    for tup in raw.list(None):
        thread = str(tup.config["configurable"]["thread_id"])
        if not looks_tagged(thread):
            seen.add(thread)
    return sorted(seen)


def accepted_params(method: Callable[..., Any]) -> frozenset[str]:
    """The parameter names in ``method``'s signature (LangGraph's test for ``task_path``:
    named there, not merely swallowed by ``**kwargs``)."""
    try:
        return frozenset(inspect.signature(method).parameters)
    except (TypeError, ValueError):  # no introspectable signature: pass nothing optional
        return frozenset()


def bridged(rows: AsyncIterator[T], loop: asyncio.AbstractEventLoop) -> Iterator[T]:
    """Iterate an async generator from a worker thread on ``loop``; closed there, however the
    iteration ends."""
    try:
        while True:
            try:
                yield asyncio.run_coroutine_threadsafe(
                    rows.__anext__(), loop).result()  # type: ignore[arg-type]
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(rows, "aclose", None)
        if callable(aclose):
            asyncio.run_coroutine_threadsafe(aclose(), loop).result()


def stores_versioned_blobs(inner: BaseCheckpointSaver) -> bool:
    """InMemorySaver and the Postgres savers store a channel value once per version and only
    for the channels in ``new_versions``; SqliteSaver stores every value in every row."""
    if isinstance(inner, InMemorySaver):
        return True
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError:
        return False
    return isinstance(inner, (PostgresSaver, AsyncPostgresSaver))


def is_async_only(inner: BaseCheckpointSaver) -> bool:
    return isinstance(getattr(inner, "loop", None), asyncio.AbstractEventLoop)


def is_sync_only(inner: BaseCheckpointSaver) -> bool:
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        if isinstance(inner, SqliteSaver):
            return True
    except ImportError:  # pragma: no cover
        pass
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        if isinstance(inner, PostgresSaver):
            return True
    except ImportError:
        pass
    return type(inner).aget_tuple is BaseCheckpointSaver.aget_tuple
