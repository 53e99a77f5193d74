"""What the BaseCheckpointSaver API lacks, done natively on the inner saver's own storage.

``keep_latest`` pruning and ``delete_for_runs`` must work on every supported backend, and must
never be a delete-then-rewrite: each operation below deletes older rows inside one transaction
(or one synchronous step for the in-memory saver), so the latest checkpoint is never at risk.
Threads that use a ``DeltaChannel`` are refused for ``keep_latest`` (see the base-class warning):
their latest value is rebuilt from the older checkpoints this would delete.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver

from ..errors import DeltaChannelPruneError, TamperedDataError, parse_failure, refusing_rows
from ..offthread import to_thread
from .flush import asqlite_flush, bridged_flush, sqlite_flush
from .sql import (
    BYTEWISE_COLLATIONS,
    PG_BATCH_COUNT,
    PG_BATCH_DELETE,
    PG_BATCH_LATEST_TS,
    PG_BYTEWISE_COLLATION,
    PG_COUNT,
    PG_DELETE_RUNS,
    PG_IDENTITY,
    PG_THREADS_IN_RANGE,
    PG_THREADS_IN_RANGE_C,
    SQLITE_BATCH_COUNT,
    SQLITE_BATCH_DELETE_CHECKPOINTS,
    SQLITE_BATCH_DELETE_WRITES,
    SQLITE_BATCH_LATEST,
    SQLITE_COUNT,
    SQLITE_DELETE_CHECKPOINT,
    SQLITE_DELETE_CHECKPOINT_WRITES,
    SQLITE_DELTA_THREAD,
    SQLITE_DETACH_HEAD,
    SQLITE_HEADS,
    SQLITE_PRUNE_CHECKPOINTS,
    SQLITE_PRUNE_WRITES,
    SQLITE_RUN_CHECKPOINTS,
    SQLITE_SECURE_DELETE,
    SQLITE_THREADS_IN_RANGE,
    pg_identity,
    pg_threads_sql,
    placeholders,
    prefix_range,
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


def _sqlite_keep_latest_statements(cur: Any, thread_id: str) -> None:
    if cur.execute(SQLITE_DELTA_THREAD, (thread_id,)).fetchone():
        raise DeltaChannelPruneError(
            f"thread {thread_id!r} uses a DeltaChannel; keep_latest would rebuild it as empty. "
            "Use strategy='delete' or leave the thread unpruned."
        )
    for ns, head in cur.execute(SQLITE_HEADS, (thread_id,)).fetchall():
        cur.execute(SQLITE_PRUNE_WRITES, (thread_id, ns, head))
        cur.execute(SQLITE_PRUNE_CHECKPOINTS, (thread_id, ns, head))
        cur.execute(SQLITE_DETACH_HEAD, (thread_id, ns, head))


class StorageOps:
    """Fallback: use the inner saver's own implementation if it has one."""

    def __init__(self, inner: BaseCheckpointSaver) -> None:
        self.inner = inner

    def _has(self, name: str) -> bool:
        return getattr(type(self.inner), name, None) is not getattr(BaseCheckpointSaver, name)

    def _unsupported(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self.inner).__name__} does not implement {what}, and SecureSaver has no "
            "native implementation for it; use InMemorySaver, SQLite or Postgres savers, or "
            f"implement {what} on your saver"
        )

    def keep_latest(self, inner_ids: Sequence[str]) -> None:
        if not self._has("prune"):
            raise self._unsupported("prune(strategy='keep_latest')")
        self.inner.prune(inner_ids, strategy="keep_latest")

    async def akeep_latest(self, inner_ids: Sequence[str]) -> None:
        if not self._has("aprune"):
            raise self._unsupported("aprune(strategy='keep_latest')")
        await self.inner.aprune(inner_ids, strategy="keep_latest")

    def delete_threads(self, inner_ids: Sequence[str]) -> None:
        for tid in inner_ids:
            self.inner.delete_thread(tid)

    async def adelete_threads(self, inner_ids: Sequence[str]) -> None:
        for tid in inner_ids:
            await self.inner.adelete_thread(tid)

    def delete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        """Delete the runs' checkpoints and writes under ``prefix``: the thread ids touched."""
        raise self._unsupported("delete_for_runs scoped to one tenant")

    async def adelete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        raise self._unsupported("delete_for_runs scoped to one tenant")

    def count_checkpoints(self, inner_id: str) -> int:
        """How many checkpoints a thread holds (for deletion receipts)."""
        with refusing(inner_id, "(listing)"):
            return sum(1 for _ in self.inner.list({"configurable": {"thread_id": inner_id}}))

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
        out: dict[str, float | None] = {}
        for tid in inner_ids:
            config: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
            with refusing(tid):
                tup = self.inner.get_tuple(config)
            out[tid] = None if tup is None else checkpoint_epoch(tup.checkpoint.get("ts"))
        return out

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

    def flush_deleted(self) -> None:
        """After a deletion batch: empty what keeps deleted rows (SQLite: the WAL); best effort."""

    async def aflush_deleted(self) -> None:
        self.flush_deleted()

    def bridge(self, coro: Any) -> Any:
        """Run an async-only saver's coroutine from a worker thread on the saver's own loop."""
        import asyncio
        loop = getattr(self.inner, "loop", None)
        if loop is None or not loop.is_running():
            coro.close()
            raise NotImplementedError(
                f"{type(self.inner).__name__} is async-only: use the async API from its loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()


def checkpoint_epoch(ts: Any) -> float | None:
    from datetime import datetime
    try:
        return datetime.fromisoformat(str(ts)).timestamp()
    except (TypeError, ValueError):
        return None


def _sqlite_latest_times(serde: Any, ids: Sequence[str], rows: Sequence[Any]
                         ) -> dict[str, float | None]:
    """The latest checkpoint rows of ``SQLITE_BATCH_LATEST`` parsed as (Async)SqliteSaver's
    get_tuple parses them -- the body with the inner saver's own serde (SecureSaver gives it
    one that evaluates nothing), the clear metadata as JSON -- and nothing else (no writes)."""
    out: dict[str, float | None] = {tid: None for tid in ids}
    for tid, cid, type_, blob, metadata in rows:
        with refusing(str(tid), f"checkpoint {cid!r}"):
            checkpoint = serde.loads_typed((type_, blob))
            if metadata is not None:
                json.loads(metadata)
        out[str(tid)] = checkpoint_epoch(checkpoint.get("ts"))
    return out


def _pg_latest_times(ids: Sequence[str], rows: Sequence[Any]) -> dict[str, float | None]:
    """The rows of ``PG_BATCH_LATEST_TS``: each thread's latest root checkpoint's ``ts``, read
    in SQL from its JSONB body (no blobs, no writes); a body (Async)PostgresSaver's get_tuple
    cannot read is the TamperedDataError naming it."""
    for r in rows:
        if r["parses"] is False:
            raise parse_failure(
                f"stored thread {r['thread_id']!r} namespace '' checkpoint "
                f"{r['checkpoint_id']!r}",
                TamperedDataError("its checkpoint body is not a JSON object (altered bytes)"))
    return {tid: None for tid in ids} | {
        str(r["thread_id"]): checkpoint_epoch(r["ts"]) for r in rows}


class MemoryOps(StorageOps):
    """InMemorySaver: its dictionaries are its storage; each operation is one synchronous step."""

    inner: InMemorySaver

    def _delete_checkpoints(self, thread_id: str, ns: str, ids: Sequence[str]) -> None:
        by_ns = self.inner.storage.get(thread_id, {})
        for cid in ids:
            by_ns.get(ns, {}).pop(cid, None)
            self.inner.writes.pop((thread_id, ns, cid), None)
        self._collect_blobs(thread_id, ns)

    def _collect_blobs(self, thread_id: str, ns: str) -> None:
        serde = self.inner.serde
        referenced: set[tuple[str, Any]] = set()
        for saved, _md, _parent in self.inner.storage.get(thread_id, {}).get(ns, {}).values():
            for ch, ver in serde.loads_typed(saved).get("channel_versions", {}).items():
                referenced.add((ch, ver))
        for key in [k for k in self.inner.blobs if k[0] == thread_id and k[1] == ns]:
            if (key[2], key[3]) not in referenced:
                del self.inner.blobs[key]

    def keep_latest(self, inner_ids: Sequence[str]) -> None:
        serde = self.inner.serde
        for tid in inner_ids:
            namespaces = self.inner.storage.get(tid, {})
            for by_id in namespaces.values():
                for _saved, md, _parent in by_id.values():
                    if any(k in serde.loads_typed(md) for k in DELTA_METADATA_KEYS):
                        raise DeltaChannelPruneError(
                            f"thread {tid!r} uses a DeltaChannel; keep_latest refused"
                        )
            for ns, by_id in list(namespaces.items()):
                if not by_id:
                    continue
                head = max(by_id)
                saved, md, _parent = by_id[head]
                by_id[head] = (saved, md, None)
                self._delete_checkpoints(tid, ns, [c for c in by_id if c != head])

    async def akeep_latest(self, inner_ids: Sequence[str]) -> None:
        self.keep_latest(inner_ids)

    def count_checkpoints(self, inner_id: str) -> int:
        return sum(len(by_id) for by_id in self.inner.storage.get(inner_id, {}).values())

    def thread_ids(self, prefix: str) -> list[str] | None:
        # the dict's keys only: other tenants' checkpoints are never decoded
        return sorted(t for t in list(self.inner.storage) if t.startswith(prefix))

    def delete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        wanted = set(run_ids)
        serde = self.inner.serde
        touched: set[str] = set()
        for tid, namespaces in list(self.inner.storage.items()):
            if not tid.startswith(prefix):
                continue
            for ns, by_id in list(namespaces.items()):
                doomed = [cid for cid, (_s, md, _p) in by_id.items()
                          if serde.loads_typed(md).get("run_id") in wanted]
                if doomed:
                    self._delete_checkpoints(tid, ns, doomed)
                    touched.add(tid)
        return touched

    async def adelete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        return self.delete_for_runs(prefix, run_ids)


class SqliteOps(StorageOps):
    """SqliteSaver: SQL on its connection, one IMMEDIATE transaction per operation."""

    def _transaction(self, body: Any) -> None:
        inner: Any = self.inner
        inner.setup()
        with inner.lock:
            conn = inner.conn
            if conn.in_transaction:
                conn.commit()
            cur = conn.cursor()
            try:
                cur.execute(SQLITE_SECURE_DELETE)   # what this deletes is overwritten
                cur.execute("BEGIN IMMEDIATE")
                body(cur)
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            finally:
                cur.close()

    def flush_deleted(self) -> None:
        sqlite_flush(self.inner)

    def keep_latest(self, inner_ids: Sequence[str]) -> None:
        for tid in inner_ids:
            self._transaction(lambda cur, tid=tid: _sqlite_keep_latest_statements(cur, tid))

    async def akeep_latest(self, inner_ids: Sequence[str]) -> None:
        await to_thread(self.keep_latest, inner_ids)

    def delete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        touched: set[str] = set()
        if not run_ids:
            return touched
        sql = SQLITE_RUN_CHECKPOINTS.format(placeholders=",".join("?" * len(run_ids)))

        def body(cur: Any) -> None:
            rows = cur.execute(sql, (len(prefix), prefix, *run_ids)).fetchall()
            for row in rows:
                cur.execute(SQLITE_DELETE_CHECKPOINT_WRITES, row)
                cur.execute(SQLITE_DELETE_CHECKPOINT, row)
                touched.add(str(row[0]))

        self._transaction(body)
        return touched

    async def adelete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        return await to_thread(self.delete_for_runs, prefix, run_ids)

    def count_checkpoints(self, inner_id: str) -> int:
        inner: Any = self.inner
        inner.setup()
        with inner.lock:
            return int(inner.conn.execute(SQLITE_COUNT, (inner_id,)).fetchone()[0])

    def count_checkpoints_many(self, inner_ids: Sequence[str]) -> dict[str, int]:
        ids = list(inner_ids)
        if not ids:
            return {}
        inner: Any = self.inner
        inner.setup()
        with inner.lock:
            rows = inner.conn.execute(SQLITE_BATCH_COUNT.format(
                ids=placeholders(len(ids))), ids).fetchall()
        return {tid: 0 for tid in ids} | {str(t): int(n) for t, n in rows}

    def delete_threads(self, inner_ids: Sequence[str]) -> None:
        ids = list(inner_ids)
        if not ids:
            return
        marks = placeholders(len(ids))

        def body(cur: Any) -> None:
            cur.execute(SQLITE_BATCH_DELETE_WRITES.format(ids=marks), ids)
            cur.execute(SQLITE_BATCH_DELETE_CHECKPOINTS.format(ids=marks), ids)

        self._transaction(body)

    def latest_checkpoint_times(self, inner_ids: Sequence[str]) -> dict[str, float | None]:
        ids = list(inner_ids)
        if not ids:
            return {}
        inner: Any = self.inner
        inner.setup()
        with inner.lock:
            rows = inner.conn.execute(SQLITE_BATCH_LATEST.format(
                ids=placeholders(len(ids))), ids).fetchall()
        return _sqlite_latest_times(inner.serde, ids, rows)

    def storage_identity(self) -> tuple[Any, ...] | None:
        inner: Any = self.inner
        inner.setup()
        with inner.lock:
            return sqlite_identity(inner.conn.execute("PRAGMA database_list").fetchall())

    def thread_ids(self, prefix: str) -> list[str] | None:
        inner: Any = self.inner
        inner.setup()
        with inner.lock:
            rows = inner.conn.execute(SQLITE_THREADS_IN_RANGE, prefix_range(prefix)).fetchall()
        return [r[0] for r in rows]


class _AsyncOnlyOps(StorageOps):
    """For async-only savers: the sync operations run the async ones on the saver's loop
    (from a worker thread; see StorageOps.bridge)."""

    async def acount_checkpoints(self, inner_id: str) -> int:
        raise NotImplementedError

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

    async def alatest_checkpoint_times(self, inner_ids: Sequence[str]
                                       ) -> dict[str, float | None]:
        """:meth:`StorageOps.latest_checkpoint_times` on the saver's loop (this fallback reads
        ``aget_tuple``; the SQLite and PostgreSQL savers read the checkpoint rows only)."""
        out: dict[str, float | None] = {}
        for tid in inner_ids:
            config: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
            with refusing(tid):
                tup = await self.inner.aget_tuple(config)
            out[tid] = None if tup is None else checkpoint_epoch(tup.checkpoint.get("ts"))
        return out


class AsyncSqliteOps(_AsyncOnlyOps):
    """AsyncSqliteSaver: the same SQL through aiosqlite, one IMMEDIATE transaction each."""

    async def _atransaction(self, body: Any) -> None:
        inner: Any = self.inner
        await inner.setup()
        async with inner.lock:
            conn = inner.conn
            if conn.in_transaction:
                await conn.commit()
            try:
                await conn.execute(SQLITE_SECURE_DELETE)
                await conn.execute("BEGIN IMMEDIATE")
                await body(conn)
                await conn.commit()
            except BaseException:
                await conn.rollback()
                raise

    async def aflush_deleted(self) -> None:
        await asqlite_flush(self.inner)

    def flush_deleted(self) -> None:
        bridged_flush(self)

    async def akeep_latest(self, inner_ids: Sequence[str]) -> None:
        for tid in inner_ids:
            async def body(conn: Any, tid: str = tid) -> None:
                async with conn.execute(SQLITE_DELTA_THREAD, (tid,)) as cur:
                    if await cur.fetchone():
                        raise DeltaChannelPruneError(
                            f"thread {tid!r} uses a DeltaChannel; keep_latest refused")
                async with conn.execute(SQLITE_HEADS, (tid,)) as cur:
                    heads = await cur.fetchall()
                for ns, head in heads:
                    await conn.execute(SQLITE_PRUNE_WRITES, (tid, ns, head))
                    await conn.execute(SQLITE_PRUNE_CHECKPOINTS, (tid, ns, head))
                    await conn.execute(SQLITE_DETACH_HEAD, (tid, ns, head))
            await self._atransaction(body)

    async def acount_checkpoints(self, inner_id: str) -> int:
        inner: Any = self.inner
        await inner.setup()
        async with inner.lock, inner.conn.execute(SQLITE_COUNT, (inner_id,)) as cur:
            row = await cur.fetchone()
        return int(row[0])

    async def alatest_checkpoint_times(self, inner_ids: Sequence[str]
                                       ) -> dict[str, float | None]:
        ids = list(inner_ids)
        if not ids:
            return {}
        inner: Any = self.inner
        await inner.setup()
        async with inner.lock, inner.conn.execute(SQLITE_BATCH_LATEST.format(
                ids=placeholders(len(ids))), ids) as cur:
            rows = await cur.fetchall()
        return _sqlite_latest_times(inner.serde, ids, rows)

    async def athread_ids(self, prefix: str) -> list[str] | None:
        inner: Any = self.inner
        await inner.setup()
        async with inner.lock, inner.conn.execute(SQLITE_THREADS_IN_RANGE,
                                                  prefix_range(prefix)) as cur:
            rows = await cur.fetchall()
        return [r[0] for r in rows]

    def thread_ids(self, prefix: str) -> list[str] | None:
        return list(self.bridge(self.athread_ids(prefix)))


    async def adelete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        touched: set[str] = set()
        if not run_ids:
            return touched
        sql = SQLITE_RUN_CHECKPOINTS.format(placeholders=",".join("?" * len(run_ids)))

        async def body(conn: Any) -> None:
            async with conn.execute(sql, (len(prefix), prefix, *run_ids)) as cur:
                rows = await cur.fetchall()
            for row in rows:
                await conn.execute(SQLITE_DELETE_CHECKPOINT_WRITES, tuple(row))
                await conn.execute(SQLITE_DELETE_CHECKPOINT, tuple(row))
                touched.add(str(row[0]))

        await self._atransaction(body)
        return touched


class PostgresOps(StorageOps):
    """PostgresSaver: keep_latest is upstream's native prune; delete_for_runs is one statement."""

    def delete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        inner: Any = self.inner
        with inner._cursor() as cur:
            cur.execute(PG_DELETE_RUNS, {"plen": len(prefix), "prefix": prefix,
                                         "runs": list(run_ids)})
            return {str(r["thread_id"]) for r in cur.fetchall()}

    def delete_threads(self, inner_ids: Sequence[str]) -> None:
        self.inner.prune(list(inner_ids), strategy="delete")

    def count_checkpoints(self, inner_id: str) -> int:
        inner: Any = self.inner
        with inner._cursor() as cur:
            cur.execute(PG_COUNT, (inner_id,))
            return int(cur.fetchone()["n"])

    def count_checkpoints_many(self, inner_ids: Sequence[str]) -> dict[str, int]:
        ids = list(inner_ids)
        inner: Any = self.inner
        with inner._cursor() as cur:
            cur.execute(PG_BATCH_COUNT, (ids,))
            rows = cur.fetchall()
        return {tid: 0 for tid in ids} | {str(r["thread_id"]): int(r["n"]) for r in rows}

    def latest_checkpoint_times(self, inner_ids: Sequence[str]) -> dict[str, float | None]:
        ids = list(inner_ids)
        if not ids:
            return {}
        inner: Any = self.inner
        with inner._cursor() as cur:
            cur.execute(PG_BATCH_LATEST_TS, (ids,))
            rows = cur.fetchall()
        return _pg_latest_times(ids, rows)

    def storage_identity(self) -> tuple[Any, ...] | None:
        inner: Any = self.inner
        with inner._cursor() as cur:
            cur.execute(PG_IDENTITY)
            row = cur.fetchone()
        return pg_identity(dict(row) if row else None)

    def thread_ids(self, prefix: str) -> list[str] | None:
        inner: Any = self.inner
        lo, hi = prefix_range(prefix)
        with inner._cursor() as cur:
            sql = self.__dict__.get("_range_sql") or pg_threads_sql(cur)
            self.__dict__["_range_sql"] = sql
            cur.execute(sql, {"lo": lo, "hi": hi})
            return [r["thread_id"] for r in cur.fetchall()]


class AsyncPostgresOps(_AsyncOnlyOps):
    async def adelete_for_runs(self, prefix: str, run_ids: Sequence[str]) -> set[str]:
        if not run_ids:
            return set()
        inner: Any = self.inner
        async with inner._cursor() as cur:
            await cur.execute(PG_DELETE_RUNS, {"plen": len(prefix), "prefix": prefix,
                                               "runs": list(run_ids)})
            return {str(r["thread_id"]) for r in await cur.fetchall()}

    async def adelete_threads(self, inner_ids: Sequence[str]) -> None:
        await self.inner.aprune(list(inner_ids), strategy="delete")

    async def acount_checkpoints(self, inner_id: str) -> int:
        inner: Any = self.inner
        async with inner._cursor() as cur:
            await cur.execute(PG_COUNT, (inner_id,))
            return int((await cur.fetchone())["n"])

    async def alatest_checkpoint_times(self, inner_ids: Sequence[str]
                                       ) -> dict[str, float | None]:
        ids = list(inner_ids)
        if not ids:
            return {}
        inner: Any = self.inner
        async with inner._cursor() as cur:
            await cur.execute(PG_BATCH_LATEST_TS, (ids,))
            rows = await cur.fetchall()
        return _pg_latest_times(ids, rows)

    def storage_identity(self) -> tuple[Any, ...] | None:
        async def identity() -> Any:
            inner: Any = self.inner
            async with inner._cursor() as cur:
                await cur.execute(PG_IDENTITY)
                return await cur.fetchone()
        row = self.bridge(identity())
        return pg_identity(dict(row) if row else None)

    async def athread_ids(self, prefix: str) -> list[str] | None:
        inner: Any = self.inner
        lo, hi = prefix_range(prefix)
        async with inner._cursor() as cur:
            sql = self.__dict__.get("_range_sql")
            if sql is None:
                await cur.execute(PG_BYTEWISE_COLLATION)
                row = await cur.fetchone()
                sql = (PG_THREADS_IN_RANGE if row is not None and row["coll"] in BYTEWISE_COLLATIONS
                       else PG_THREADS_IN_RANGE_C)
                self.__dict__["_range_sql"] = sql
            await cur.execute(sql, {"lo": lo, "hi": hi})
            return [r["thread_id"] for r in await cur.fetchall()]

    def thread_ids(self, prefix: str) -> list[str] | None:
        return list(self.bridge(self.athread_ids(prefix)))



def ops_for(inner: BaseCheckpointSaver) -> StorageOps:
    """Pick the native implementation for the inner saver's type."""
    if isinstance(inner, InMemorySaver):
        return MemoryOps(inner)
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    except ImportError:  # pragma: no cover - sqlite saver is a core dependency
        SqliteSaver = AsyncSqliteSaver = None  # type: ignore[assignment,misc]
    if SqliteSaver is not None and isinstance(inner, SqliteSaver):
        return SqliteOps(inner)
    if AsyncSqliteSaver is not None and isinstance(inner, AsyncSqliteSaver):
        return AsyncSqliteOps(inner)
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    except ImportError:
        return StorageOps(inner)
    if isinstance(inner, PostgresSaver):
        return PostgresOps(inner)
    if isinstance(inner, AsyncPostgresSaver):
        return AsyncPostgresOps(inner)
    return StorageOps(inner)
