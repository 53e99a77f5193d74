"""The SQLite savers' native operations: ``SqliteSaver`` and ``AsyncSqliteSaver`` run the same
SQL (:mod:`.sql`), one ``BEGIN IMMEDIATE`` transaction per operation with ``secure_delete``
on, and empty the WAL after a deletion batch (:mod:`.flush`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import DeltaChannelPruneError
from ..offthread import to_thread
from .flush import asqlite_flush, bridged_flush, sqlite_flush
from .ops import AsyncOnlyOps, StorageOps, checkpoint_epoch, refusing
from .sql import (
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
    placeholders,
    prefix_range,
    sqlite_identity,
)


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

    def _rows_for(self, sql: str, ids: list[str]) -> Any:
        """The rows of ``sql`` (a statement with an ``IN ({ids})`` list) for ``ids``."""
        inner: Any = self.inner
        inner.setup()
        with inner.lock:
            return inner.conn.execute(sql.format(ids=placeholders(len(ids))), ids).fetchall()

    def count_checkpoints_many(self, inner_ids: Sequence[str]) -> dict[str, int]:
        ids = list(inner_ids)
        if not ids:
            return {}
        rows = self._rows_for(SQLITE_BATCH_COUNT, ids)
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
        rows = self._rows_for(SQLITE_BATCH_LATEST, ids)
        return _sqlite_latest_times(self.inner.serde, ids, rows)

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


class AsyncSqliteOps(AsyncOnlyOps):
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
