"""The PostgreSQL savers' native operations: ``keep_latest`` and whole-thread deletes are
upstream's own ``prune``; per-run deletes, checkpoint counts, the latest checkpoint times and
one tenant's thread ids are one statement each (:mod:`.sql`) on the saver's cursor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import TamperedDataError, parse_failure
from .ops import AsyncOnlyOps, StorageOps, checkpoint_epoch
from .sql import (
    BYTEWISE_COLLATIONS,
    PG_BATCH_COUNT,
    PG_BATCH_LATEST_TS,
    PG_BYTEWISE_COLLATION,
    PG_COUNT,
    PG_DELETE_RUNS,
    PG_IDENTITY,
    PG_THREADS_IN_RANGE,
    PG_THREADS_IN_RANGE_C,
    pg_identity,
    pg_threads_sql,
    prefix_range,
)


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


class AsyncPostgresOps(AsyncOnlyOps):
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
