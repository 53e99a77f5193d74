"""Reading rows from the inner saver safely: every parse failure a stored row causes becomes
a :class:`TamperedDataError` naming the row (never its bytes), listings are closed however
the loop over them ends, per-thread listings merge newest first, and returned configs equal
the inner saver's (their thread ids carry the tenant when the caller's config did).

Knows the inner saver's rows and configs; nothing of keys, sealing rules or redaction.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from .errors import PARSE_ERRORS, TamperedDataError, parse_failure, refusing_rows
from .tenancy import ThreadRef, tagged_thread_id, thread_id_tenant

logger = logging.getLogger("langgraph_securesaver.saver")
FIRST_ROW = "(first row)"


def named_refusal(ref: ThreadRef, tup: CheckpointTuple, exc: TamperedDataError
                  ) -> TamperedDataError:
    """The refusal, naming the stored checkpoint it concerns (never a value)."""
    conf = tup.config.get("configurable") or {}
    return TamperedDataError(
        f"checkpoint {str(conf.get('checkpoint_id'))!r} of tenant {ref.tenant!r} thread "
        f"{ref.thread_id!r} namespace {str(conf.get('checkpoint_ns', '') or '')!r} (as the "
        f"inner saver stores it, with its pending writes) was refused: {exc}")


def row_ref(ref: ThreadRef, tup: CheckpointTuple) -> ThreadRef:
    """The ref of the row as stored (its own namespace: get_tuple may not name one)."""
    ns = str((tup.config.get("configurable") or {}).get("checkpoint_ns", "") or "")
    return ref if ns == ref.checkpoint_ns else ThreadRef(ref.tenant, ref.thread_id, ns)


def parent_config(ref: ThreadRef, tup: CheckpointTuple, parent: str) -> RunnableConfig:
    conf = tup.config.get("configurable") or {}
    return {"configurable": {"thread_id": conf.get("thread_id", ref.inner_id),
                             "checkpoint_ns": ref.checkpoint_ns, "checkpoint_id": parent}}


def decoding(ref: ThreadRef, inner_config: RunnableConfig,
             locate_in: BaseCheckpointSaver | None = None) -> AbstractContextManager[None]:
    """Inner-saver reads: every parse failure a stored row causes is a TamperedDataError
    naming the row (never its bytes). With ``locate_in`` (a sync SQLite/Postgres saver, on
    sync paths only), the table and row key are looked up too."""
    return refusing_rows(lambda: refused_row(ref, inner_config, locate_in))


def refused_row(ref: ThreadRef, inner_config: RunnableConfig,
                locate_in: BaseCheckpointSaver | None) -> str:
    """The row a read of ``inner_config`` refused, as :func:`decoding` names it."""
    conf = inner_config.get("configurable") or {}
    cid = conf.get("checkpoint_id")
    ns = str(conf.get("checkpoint_ns", ref.checkpoint_ns) or "")
    row = locate_refused(locate_in, str(conf.get("thread_id", ref.inner_id)), ns, cid)
    return (f"tenant {ref.tenant!r} thread {ref.thread_id!r} namespace {ns!r} "
            + (f"checkpoint {cid!r}" if cid else "(latest checkpoint)")
            + (f": {row}" if row else " (in the inner saver's storage)"))


def locate_refused(inner: BaseCheckpointSaver | None, thread_id: str, ns: str,
                    checkpoint_id: str | None) -> str | None:
    if inner is None:
        return None
    try:
        from .storage.raw_tables import raw_tables_for
        return raw_tables_for(inner).locate_refused(thread_id, ns, checkpoint_id)
    except Exception:  # naming the row is best effort; the refusal stands
        logger.debug("could not locate the refused row", exc_info=True)
        return None


def listing(tenant: str, make: Callable[[], Any], after: str = FIRST_ROW) -> Rows:
    """The inner listing for list(), its parse failures (eager ones included) as
    TamperedDataError. ``after`` names the row listed before it (a listing that starts
    after a ``before`` checkpoint)."""
    with refusing_listing(tenant):
        return Rows(make(), tenant, after)


def refusing_listing(tenant: str) -> AbstractContextManager[None]:
    """Opening a listing of ``tenant``: an eager parse failure names the listing."""
    return refusing_rows(lambda: f"tenant {tenant!r} (listing)")


class Rows:
    """An inner listing whose parse failures surface as TamperedDataError. ``drain()`` reads
    the rest into memory and releases the inner cursor (and its lock), so a row's parent can
    be looked up while the listing is still being consumed."""

    def __init__(self, rows: Any, tenant: str, after: str = FIRST_ROW) -> None:
        self._it = iter(rows)
        self._buf: collections.deque[CheckpointTuple] | None = None
        self._tenant = tenant
        self._last = after

    def __iter__(self) -> Rows:
        return self

    def _pull(self) -> CheckpointTuple:
        try:
            tup = next(self._it)
        except StopIteration:
            raise
        except PARSE_ERRORS as exc:
            raise parse_failure(f"tenant {self._tenant!r}, listed after {self._last}",
                                 exc) from None
        self._last = row_name(tup)
        return tup

    def __next__(self) -> CheckpointTuple:
        if self._buf is None:
            return self._pull()
        if not self._buf:
            raise StopIteration
        return self._buf.popleft()

    def drain(self) -> None:
        if self._buf is None:
            buf: collections.deque[CheckpointTuple] = collections.deque()
            try:
                while True:
                    buf.append(self._pull())
            except StopIteration:
                pass
            self._buf = buf
            self.close()

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


class ARows:
    """The async twin of :class:`Rows`."""

    def __init__(self, rows: AsyncIterator[CheckpointTuple], tenant: str,
                 after: str = FIRST_ROW) -> None:
        self._it = rows.__aiter__()
        self._buf: collections.deque[CheckpointTuple] | None = None
        self._tenant = tenant
        self._last = after

    def __aiter__(self) -> ARows:
        return self

    async def _pull(self) -> CheckpointTuple:
        try:
            tup = await self._it.__anext__()
        except StopAsyncIteration:
            raise
        except PARSE_ERRORS as exc:
            raise parse_failure(f"tenant {self._tenant!r}, listed after {self._last}",
                                 exc) from None
        self._last = row_name(tup)
        return tup

    async def __anext__(self) -> CheckpointTuple:
        if self._buf is None:
            return await self._pull()
        if not self._buf:
            raise StopAsyncIteration
        return self._buf.popleft()

    async def drain(self) -> None:
        if self._buf is None:
            buf: collections.deque[CheckpointTuple] = collections.deque()
            try:
                while True:
                    buf.append(await self._pull())
            except StopAsyncIteration:
                pass
            self._buf = buf
            await self.aclose()

    async def aclose(self) -> None:
        aclose = getattr(self._it, "aclose", None)
        if aclose is not None:
            await aclose()


def row_name(tup: CheckpointTuple) -> str:
    return config_name(tup.config)


def config_name(config: RunnableConfig) -> str:
    """A stored row by its inner config (as :func:`row_name` names a listed one)."""
    conf = config.get("configurable") or {}
    return (f"thread {str(conf.get('thread_id'))!r} namespace "
            f"{str(conf.get('checkpoint_ns', ''))!r} checkpoint "
            f"{str(conf.get('checkpoint_id'))!r}")



def config_carries_tenant(config: RunnableConfig | None) -> bool:
    """Whether the caller's config carries the tenant: ``tenant_id`` or a thread id returned
    for a config that did (then returned thread ids carry it on)."""
    conf = (config or {}).get("configurable") or {}
    return conf.get("tenant_id") is not None or thread_id_tenant(conf.get("thread_id")) is not None


@contextmanager
def closing(rows: Any) -> Iterator[Any]:
    """Close an inner saver's iterator however the loop over it ends (limit, error, caller
    gone): SqliteSaver/PostgresSaver hold a lock and a cursor until their generator closes."""
    try:
        yield rows
    finally:
        close = getattr(rows, "close", None)
        if callable(close):
            close()


@asynccontextmanager
async def aclosing(rows: Any) -> AsyncIterator[Any]:
    """Async twin of :func:`closing` (AsyncSqliteSaver/AsyncPostgresSaver generators)."""
    try:
        yield rows
    finally:
        aclose = getattr(rows, "aclose", None)
        if callable(aclose):
            await aclose()
        else:
            close = getattr(rows, "close", None)
            if callable(close):
                close()


def named_tup(tup: CheckpointTuple, config: RunnableConfig | None, tenant: str
               ) -> CheckpointTuple:
    """``tup`` with thread ids that carry the tenant when the caller's config carried it."""
    if not config_carries_tenant(config):
        return tup
    return tup._replace(config=named_cfg(tup.config, config, tenant),
                        parent_config=None if tup.parent_config is None
                        else named_cfg(tup.parent_config, config, tenant))


def named_cfg(out: RunnableConfig, config: RunnableConfig | None, tenant: str
               ) -> RunnableConfig:
    """A returned config: equal to the inner saver's (no key added: LangGraph merges returned
    configs into the run and copies configurable scalars into metadata). When the caller's
    config carried the tenant, its thread id carries it on (:class:`.tenancy.TenantThreadId`,
    equal to the plain id): LangGraph builds subgraph state configs from the id alone, and a
    returned config reused as is acts for the same tenant."""
    if not config_carries_tenant(config):
        return out
    conf = out.get("configurable") or {}
    if not isinstance(conf.get("thread_id"), str):
        return out
    return {**out, "configurable": {**conf,
                                    "thread_id": tagged_thread_id(conf["thread_id"], tenant)}}


def newest_first(per_thread: Sequence[Sequence[CheckpointTuple]]
                  ) -> Iterator[CheckpointTuple]:
    """Merge per-thread listings (each newest first) into one, newest first, like an inner
    ``list(None)`` orders them."""
    import heapq
    return heapq.merge(*per_thread, key=lambda t: str(t.config["configurable"]["checkpoint_id"]),
                       reverse=True)


async def aiter_rows(rows: Any) -> AsyncIterator[Any]:
    async with aclosing(rows):  # closing this closes the inner listing too
        if hasattr(rows, "__aiter__"):
            async for row in rows:
                yield row
        else:
            for row in rows:
                yield row
