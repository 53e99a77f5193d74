"""The SQL of :mod:`.ops` as named constants (reviewable in one place), with the two
helpers that pick a statement (the PostgreSQL tenant-range form, IN-list placeholders) and
the two that read a database's identity from its answer.

Statements only: no transactions, no saver objects, no policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# --- SQLite (langgraph-checkpoint-sqlite schema) ---------------------------------------------
SQLITE_DELTA_THREAD = """
SELECT 1 FROM checkpoints WHERE thread_id = ? AND (
    json_extract(CAST(metadata AS TEXT), '$.counters_since_delta_snapshot') IS NOT NULL
    OR json_extract(CAST(metadata AS TEXT), '$.delta_writes_versioned') IS NOT NULL
) LIMIT 1
"""
SQLITE_HEADS = """
SELECT checkpoint_ns, MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ? GROUP BY checkpoint_ns
"""
SQLITE_PRUNE_WRITES = """
DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id < ?
"""
SQLITE_PRUNE_CHECKPOINTS = """
DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id < ?
"""
SQLITE_DETACH_HEAD = """
UPDATE checkpoints SET parent_checkpoint_id = NULL
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
SQLITE_RUN_CHECKPOINTS = """
SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints
WHERE substr(thread_id, 1, ?) = ?
AND json_extract(CAST(metadata AS TEXT), '$.run_id') IN ({placeholders})
"""
SQLITE_DELETE_CHECKPOINT = """
DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
SQLITE_COUNT = "SELECT count(*) FROM checkpoints WHERE thread_id = ?"
# one tenant's threads by a range on the primary key (SQLite compares TEXT bytewise)
SQLITE_THREADS_IN_RANGE = """
SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id >= ? AND thread_id < ?
"""
SQLITE_DELETE_CHECKPOINT_WRITES = """
DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""

# --- PostgreSQL (langgraph-checkpoint-postgres schema) ---------------------------------------
PG_COUNT = "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s"
# a range on the primary key when the column sorts bytewise (C/POSIX/C.UTF-8 collations);
# otherwise the same range under COLLATE "C" (correct, but not an index range)
PG_THREADS_IN_RANGE = """
SELECT DISTINCT thread_id AS thread_id FROM checkpoints
WHERE thread_id >= %(lo)s AND thread_id < %(hi)s
"""
PG_THREADS_IN_RANGE_C = """
SELECT DISTINCT thread_id AS thread_id FROM checkpoints
WHERE thread_id COLLATE "C" >= %(lo)s AND thread_id COLLATE "C" < %(hi)s
"""
PG_BYTEWISE_COLLATION = """
SELECT coalesce(c.collname, d.datcollate) AS coll
FROM pg_attribute a
JOIN pg_class t ON t.oid = a.attrelid
LEFT JOIN pg_collation c ON c.oid = a.attcollation AND c.collname <> 'default'
CROSS JOIN (SELECT datcollate FROM pg_database WHERE datname = current_database()) d
WHERE t.oid = to_regclass('checkpoints') AND a.attname = 'thread_id'
"""
BYTEWISE_COLLATIONS = {"C", "POSIX", "C.UTF-8", "C.utf8", "ucs_basic"}


def prefix_range(prefix: str) -> tuple[str, str]:
    """[lo, hi) holding exactly the strings that start with ``prefix`` in code-point order
    (tenant prefixes end with ':', so hi ends with ';')."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def pg_threads_sql(cur: Any) -> str:
    """The query listing the thread ids in a ``[lo, hi)`` range: plain comparisons when the
    ``thread_id`` column's collation is bytewise, ``COLLATE "C"`` otherwise."""
    cur.execute(PG_BYTEWISE_COLLATION)
    row = cur.fetchone()
    coll = None if row is None else (row["coll"] if isinstance(row, dict) else row[0])
    return PG_THREADS_IN_RANGE if coll in BYTEWISE_COLLATIONS else PG_THREADS_IN_RANGE_C
PG_DELETE_RUNS = """
WITH gone AS (
    DELETE FROM checkpoints
    WHERE left(thread_id, %(plen)s) = %(prefix)s AND metadata ->> 'run_id' = ANY(%(runs)s)
    RETURNING thread_id, checkpoint_ns, checkpoint_id
), writes_gone AS (
    DELETE FROM checkpoint_writes w USING gone g
    WHERE w.thread_id = g.thread_id AND w.checkpoint_ns = g.checkpoint_ns
    AND w.checkpoint_id = g.checkpoint_id
    RETURNING 1
)
SELECT DISTINCT thread_id FROM gone
"""


# --- whole-thread deletes of a batch, inside a transaction of the registry's engine ----------
# (used when the registry and the inner saver share a database: the pruner then deletes a batch
# of threads, their companion records and registry rows and writes their receipts in ONE
# transaction, so a kill at any point leaves every thread of the batch untouched or gone)
PG_IDENTITY = """
SELECT pg_postmaster_start_time()::text AS started, current_database() AS db,
       to_regclass('checkpoints')::oid::bigint AS c,
       to_regclass('checkpoint_blobs')::oid::bigint AS b,
       to_regclass('checkpoint_writes')::oid::bigint AS w
"""
PG_BATCH_DELETE = """
WITH w AS (DELETE FROM checkpoint_writes WHERE thread_id = ANY(:ids)),
     b AS (DELETE FROM checkpoint_blobs WHERE thread_id = ANY(:ids)),
     c AS (DELETE FROM checkpoints WHERE thread_id = ANY(:ids) RETURNING thread_id)
SELECT thread_id, count(*) FROM c GROUP BY thread_id
"""
PG_BATCH_COUNT = """
SELECT thread_id, count(*) AS n FROM checkpoints WHERE thread_id = ANY(%s) GROUP BY thread_id
"""
PG_BATCH_LATEST_TS = """
SELECT t.id AS thread_id, h.checkpoint_id, h.ts, h.parses
FROM unnest(%s::text[]) AS t(id)
LEFT JOIN LATERAL (
    SELECT c.checkpoint_id, c.checkpoint ->> 'ts' AS ts,
           jsonb_typeof(c.checkpoint) = 'object' AS parses FROM checkpoints c
    WHERE c.thread_id = t.id AND c.checkpoint_ns = ''
    ORDER BY c.checkpoint_id DESC LIMIT 1) h ON true
"""
SQLITE_BATCH_COUNT = """
SELECT thread_id, count(*) FROM checkpoints WHERE thread_id IN ({ids}) GROUP BY thread_id
"""
SQLITE_BATCH_DELETE_WRITES = "DELETE FROM writes WHERE thread_id IN ({ids})"
SQLITE_BATCH_DELETE_CHECKPOINTS = "DELETE FROM checkpoints WHERE thread_id IN ({ids})"
SQLITE_BATCH_LATEST = """
SELECT c.thread_id, c.checkpoint_id, c.type, c.checkpoint, c.metadata FROM checkpoints c
JOIN (SELECT thread_id, max(checkpoint_id) AS head FROM checkpoints
      WHERE thread_id IN ({ids}) AND checkpoint_ns = '' GROUP BY thread_id) h
ON c.thread_id = h.thread_id AND c.checkpoint_ns = '' AND c.checkpoint_id = h.head
"""


def placeholders(n: int, mark: str = "?") -> str:
    """``n`` bind markers separated by commas, for an ``IN ({ids})`` list."""
    return ",".join([mark] * n)


# deletion hygiene (SQLite): deleted content is overwritten in the pages it leaves, and the
# WAL, which still holds the pages as they were before the deletion, is emptied afterwards
SQLITE_SECURE_DELETE = "PRAGMA secure_delete=ON"
SQLITE_WAL_TRUNCATE = "PRAGMA wal_checkpoint(TRUNCATE)"


def pg_identity(row: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What names PostgreSQL storage, from the answer to PG_IDENTITY."""
    if not row or None in (row.get("c"), row.get("b"), row.get("w")):
        return None
    return ("postgresql", row["started"], row["db"], row["c"], row["b"], row["w"])


def sqlite_identity(rows: Sequence[Any]) -> tuple[Any, ...] | None:
    """What names a SQLite database file, from ``PRAGMA database_list``."""
    import os
    for row in rows:
        if row[1] == "main" and row[2]:
            return ("sqlite", os.path.realpath(row[2]))
    return None  # an in-memory database is never shared between connections
