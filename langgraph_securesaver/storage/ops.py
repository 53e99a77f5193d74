"""What the BaseCheckpointSaver API lacks, done natively on the inner saver's own storage.

``keep_latest`` pruning and ``delete_for_runs`` must work on every supported backend, and must
never be a delete-then-rewrite: each operation deletes older rows inside one transaction
(or one synchronous step for the in-memory saver), so the latest checkpoint is never at risk.
Threads that use a ``DeltaChannel`` are refused for ``keep_latest`` (see the base-class warning):
their latest value is rebuilt from the older checkpoints this would delete.

Here: :class:`StorageOps`, the operations every backend offers and the fallback through the
inner saver's own API; :class:`AsyncOnlyOps`, the bridge for async-only savers; the helpers
the backends share. Each backend's implementation is in :mod:`.ops_memory`,
:mod:`.ops_sqlite` or :mod:`.ops_postgres`; :func:`.ops_select.ops_for` picks one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from ..errors import AsyncOnlySaverError, UnsupportedBySaverError, refusing_rows
from ..offthread import CALLER_LOOP
from .sql import (
    PG_BATCH_DELETE,
    PG_IDENTITY,
    SQLITE_BATCH_COUNT,
    SQLITE_BATCH_DELETE_CHECKPOINTS,
    SQLITE_BATCH_DELETE_WRITES,
    pg_identity,
    placeholders,
    sqlite_identity,
)

logger = logging.getLogger(__name__)

DELTA_METADATA_KEYS = ("counters_since_delta_snapshot", "delta_writes_versioned")


def refusing(inner_id: str, what: str = "(latest checkpoint)") -> AbstractContextManager[None]:
    """Reads of stored rows here (retention's re-check, receipt counts): a row that does not
    parse is the TamperedDataError naming it, in the words ``get_tuple`` uses, never a raw
    decoder error."""
    return refusing_rows(lambda: f"stored thread {inner_id!r} namespace '' {what}")


def delete_threads_in(conn: Any, dialect: str, inner_ids: Sequence[str]) -> dict[str, int]:
    """Delete the checkpoints, blobs and writes of ``inner_ids`` on a SQLAlchemy connection
    (the caller's transaction) with set-based statements; returns checkpoints deleted per id."""
    import sqlalchemy as sa
    ids = list(inner_ids)
    if not ids:
        return {}
    if dialect == "postgresql":
        rows = conn.execute(sa.text(PG_BATCH_DELETE), {"ids": ids}).all()
        return {str(t): int(n) for t, n in rows}
    marks = placeholders(len(ids))
    counts = {str(t): int(n) for t, n in conn.exec_driver_sql(
        SQLITE_BATCH_COUNT.format(ids=marks), tuple(ids)).all()}
    conn.exec_driver_sql(SQLITE_BATCH_DELETE_WRITES.format(ids=marks), tuple(ids))
    conn.exec_driver_sql(SQLITE_BATCH_DELETE_CHECKPOINTS.format(ids=marks), tuple(ids))
    return counts


def registry_identity(engine: Any) -> tuple[Any, ...] | None:
    """What names the inner tables as the registry's engine sees them (see
    :meth:`StorageOps.storage_identity`)."""
    import sqlalchemy as sa
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                row = conn.execute(sa.text(PG_IDENTITY)).mappings().first()
                return pg_identity(dict(row) if row else None)
            if engine.dialect.name == "sqlite":
                return sqlite_identity(conn.exec_driver_sql("PRAGMA database_list").all())
    except Exception as exc:  # noqa: BLE001 - unknown: use the two-step path
        logger.debug("cannot identify the registry database: %s", exc)
    return None


class StorageOps:
    """Fallback for any other saver: its own API, in the caller's mode. Called from the async
    API (in a worker thread of :func:`..offthread.to_thread`), it drives the saver's async
    methods on the caller's loop when the saver has them (AsyncRedisSaver has no sync ones);
    from the sync API, its sync methods. What the base API cannot do (delete some checkpoints
    of a thread) is refused with :class:`UnsupportedBySaverError` before anything changes."""

    def __init__(self, inner: BaseCheckpointSaver) -> None:
        self.inner = inner

    def _has(self, name: str) -> bool:
        return getattr(type(self.inner), name, None) is not getattr(BaseCheckpointSaver, name)

    def _unsupported(self, what: str, why: str = "the BaseCheckpointSaver API deletes whole "
                     "threads only") -> UnsupportedBySaverError:
        return UnsupportedBySaverError(
            f"{type(self.inner).__name__} does not implement {what}, and SecureSaver cannot do "
            f"it another way ({why}); nothing was changed. Savers with native support: "
            "InMemorySaver, SQLite and PostgreSQL savers, or a saver that implements "
            f"{what} (docs/savers.md)")

    def async_mode(self) -> bool:
        """Whether to reach the saver through its async API: it is async-only, or this is
        the async API's worker and the saver has async methods of its own."""
        import asyncio
        if isinstance(getattr(self.inner, "loop", None), asyncio.AbstractEventLoop):
            return True  # async-only, bound to its loop (as inner_access.is_async_only)
        return CALLER_LOOP.get() is not None and self.has_async_api()

    def has_async_api(self) -> bool:
        """Whether the saver implements the async API itself (SqliteSaver and PostgresSaver
        define async methods that only refuse; as inner_access.is_sync_only)."""
        from langgraph.checkpoint.sqlite import SqliteSaver
        sync_only: tuple[type, ...] = (SqliteSaver,)
        try:
            from langgraph.checkpoint.postgres import PostgresSaver
            sync_only += (PostgresSaver,)
        except ImportError:
            pass
        return not isinstance(self.inner, sync_only) and self._has("aget_tuple")

    def either(self, make_async: Callable[[], Any], run_sync: Callable[[], Any]) -> Any:
        """In async mode, the saver's async method on the caller's loop; a saver whose async
        methods only refuse (plainredis's sync RedisSaver raises NotImplementedError) is
        reached through its sync ones. Otherwise the sync ones."""
        if self.async_mode():
            try:
                return self.bridge(make_async())
            except UnsupportedBySaverError:
                raise
            except NotImplementedError:
                if isinstance(getattr(self.inner, "loop", None), asyncio.AbstractEventLoop):
                    raise  # async-only: there is no sync API to fall back to
        return run_sync()

    def keep_latest(self, inner_ids: Sequence[str]) -> None:
        def run_sync() -> None:
            if not self._has("prune"):
                raise self._unsupported("prune(strategy='keep_latest')")
            self.inner.prune(inner_ids, strategy="keep_latest")
        self.either(lambda: self.akeep_latest(inner_ids), run_sync)

    async def akeep_latest(self, inner_ids: Sequence[str]) -> None:
        if not self._has("aprune"):
            raise self._unsupported("prune(strategy='keep_latest')")
        await self.inner.aprune(inner_ids, strategy="keep_latest")

    def check_delete_thread(self) -> None:
        """Refuse, before anything changes, a saver that cannot delete a thread."""
        if not (self._has("delete_thread") or self._has("adelete_thread")):
            raise self._unsupported("delete_thread", "it is the only way to delete through the "
                                    "BaseCheckpointSaver API")

    def delete_threads(self, inner_ids: Sequence[str]) -> None:
        self.check_delete_thread()

        def run_sync() -> None:
            for tid in inner_ids:
                self.inner.delete_thread(tid)
        self.either(lambda: self.adelete_threads(inner_ids), run_sync)

    async def adelete_threads(self, inner_ids: Sequence[str]) -> None:
        self.check_delete_thread()
        for tid in inner_ids:
            await self.inner.adelete_thread(tid)

    def delete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        """Delete the runs' checkpoints and writes under ``prefix``: the thread ids touched."""
        raise self._unsupported("delete_for_runs scoped to one tenant")

    async def adelete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        raise self._unsupported("delete_for_runs scoped to one tenant")

    def count_checkpoints(self, inner_id: str) -> int:
        """How many checkpoints a thread holds (for deletion receipts)."""
        def run_sync() -> int:
            with refusing(inner_id, "(listing)"):
                return sum(1 for _ in self.inner.list(
                    {"configurable": {"thread_id": inner_id}}))
        return int(self.either(lambda: self.acount_checkpoints(inner_id), run_sync))

    async def acount_checkpoints(self, inner_id: str) -> int:
        with refusing(inner_id, "(listing)"):
            return len([t async for t in self.inner.alist(
                {"configurable": {"thread_id": inner_id}})])

    def count_checkpoints_many(self, inner_ids: Sequence[str]) -> dict[str, int]:
        return {tid: self.count_checkpoints(tid) for tid in inner_ids}

    def latest_checkpoint_times(self, inner_ids: Sequence[str]) -> dict[str, float | None]:
        """Epoch time of each thread's latest root-namespace checkpoint (None: none stored).

        What the retention sweep decides an expired thread's fate on, in its batches and
        thread by thread alike. The SQLite and PostgreSQL savers (sync and async) read the
        latest checkpoint rows only, with SQL: a row that does not parse is the
        TamperedDataError naming it, while the thread's channel blobs and pending writes are
        not read at all (retention is not an integrity check; ``scan --verify`` is). This
        fallback, for savers without native SQL, reads ``get_tuple``, which decodes those
        too."""
        def run_sync() -> dict[str, float | None]:
            out: dict[str, float | None] = {}
            for tid in inner_ids:
                config: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
                with refusing(tid):
                    tup = self.inner.get_tuple(config)
                out[tid] = None if tup is None else checkpoint_epoch(tup.checkpoint.get("ts"))
            return out
        return dict(self.either(lambda: self.alatest_checkpoint_times(list(inner_ids)),
                                run_sync))

    def storage_identity(self) -> tuple[Any, ...] | None:
        """What names the inner tables (cluster + database + table oids on PostgreSQL, the
        file on SQLite). Equal to :func:`registry_identity` of the registry's engine when the
        registry's connections see the very same tables; None when unknown."""
        return None

    def shares_database(self, engine: Any) -> bool:
        """Whether ``engine`` (the registry's) reaches the inner saver's very tables, so one
        of its transactions can delete storage and registry rows together. Cached per
        engine; unknown counts as no (the two-step path is always safe)."""
        cache: dict[int, bool] = self.__dict__.setdefault("_shares", {})
        if id(engine) not in cache:
            try:
                mine = self.storage_identity()
            except Exception as exc:  # noqa: BLE001 - unknown: not shared
                logger.debug("cannot identify the inner saver's database: %s", exc)
                mine = None
            cache[id(engine)] = mine is not None and mine == registry_identity(engine)
        return cache[id(engine)]

    def thread_ids(self, prefix: str) -> list[str] | None:
        """The inner thread ids that start with ``prefix`` (one tenant's threads), read
        without touching other tenants' rows where the backend allows; None when this saver
        offers no such query (the caller then lists everything and filters)."""
        return None

    async def athread_ids(self, prefix: str) -> list[str] | None:
        return self.thread_ids(prefix)

    def lists_across_threads(self) -> bool:
        """Whether ``list(None)`` works on this saver (ObjectStorageSaver requires a thread id
        and fails with its own TypeError): probed once, with ``limit=1``. Where it does not,
        SecureSaver lists a tenant's threads from its registry instead."""
        known: bool | None = self.__dict__.get("_lists_all")
        if known is None:
            try:
                self.either(self._aprobe_list,
                            lambda: next(iter(self.inner.list(None, limit=1)), None))
                known = True
            except (TypeError, AttributeError, ValueError, KeyError, NotImplementedError):
                known = False
            except Exception:  # noqa: BLE001 - it listed (a row it refused is not our question)
                known = True
            self.__dict__["_lists_all"] = known
        return known

    async def alists_across_threads(self) -> bool:
        known: bool | None = self.__dict__.get("_lists_all")
        if known is None:
            try:
                await self._aprobe_list()
                known = True
            except (TypeError, AttributeError, ValueError, KeyError, NotImplementedError):
                known = False
            except Exception:  # noqa: BLE001 - as lists_across_threads
                known = True
            self.__dict__["_lists_all"] = known
        return known

    async def _aprobe_list(self) -> None:
        rows = self.inner.alist(None, limit=1)
        try:
            async for _ in rows:
                break
        finally:
            aclose = getattr(rows, "aclose", None)
            if callable(aclose):
                await aclose()

    def flush_deleted(self) -> None:
        """After a deletion batch: empty what keeps deleted rows (SQLite: the WAL); best effort."""

    async def aflush_deleted(self) -> None:
        self.flush_deleted()

    def bridge(self, coro: Any) -> Any:
        """Run a coroutine of the saver's from a worker thread: on the saver's own loop
        (async-only savers bound to one), else on the loop of the async call this worker
        serves."""
        import asyncio
        loop = getattr(self.inner, "loop", None)
        if not isinstance(loop, asyncio.AbstractEventLoop):
            loop = CALLER_LOOP.get()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or not loop.is_running() or running is loop:
            coro.close()
            raise AsyncOnlySaverError(
                f"{type(self.inner).__name__} is async-only: use the async API from its loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    async def alatest_checkpoint_times(self, inner_ids: Sequence[str]
                                       ) -> dict[str, float | None]:
        """:meth:`latest_checkpoint_times` through the saver's async API (this fallback reads
        ``aget_tuple``; the SQLite and PostgreSQL savers read the checkpoint rows only)."""
        out: dict[str, float | None] = {}
        for tid in inner_ids:
            config: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
            with refusing(tid):
                tup = await self.inner.aget_tuple(config)
            out[tid] = None if tup is None else checkpoint_epoch(tup.checkpoint.get("ts"))
        return out


def checkpoint_epoch(ts: Any) -> float | None:
    from datetime import datetime
    try:
        return datetime.fromisoformat(str(ts)).timestamp()
    except (TypeError, ValueError):
        return None


class AsyncOnlyOps(StorageOps):
    """For async-only savers: the sync operations run the async ones on the saver's loop
    (from a worker thread; see StorageOps.bridge)."""

    async def acount_checkpoints(self, inner_id: str) -> int:
        raise NotImplementedError

    def async_mode(self) -> bool:
        return True

    def keep_latest(self, inner_ids: Sequence[str]) -> None:
        self.bridge(self.akeep_latest(inner_ids))

    def delete_threads(self, inner_ids: Sequence[str]) -> None:
        self.bridge(self.adelete_threads(inner_ids))

    def delete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        return set(self.bridge(self.adelete_for_runs(prefix, run_ids)))

    def count_checkpoints(self, inner_id: str) -> int:
        return int(self.bridge(self.acount_checkpoints(inner_id)))

    def latest_checkpoint_times(self, inner_ids: Sequence[str]) -> dict[str, float | None]:
        return dict(self.bridge(self.alatest_checkpoint_times(list(inner_ids))))
