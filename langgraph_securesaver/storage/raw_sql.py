"""The SQL of :mod:`.raw_tables`, as named constants (reviewable in one place), and the one
keyset-pagination loop every raw-table listing uses.

Holds statements and a generic pager only: no row types, no decoding, no knowledge of the
saver or of what is sealed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

R = TypeVar("R")

#: rows per page of a raw-table listing (the inner tables and the registry's)
DEFAULT_PAGE = 500

# --- SQLite (langgraph-checkpoint-sqlite schema) ---------------------------------------------
SQLITE_CHECKPOINTS_PAGE = """
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
FROM checkpoints
WHERE (thread_id, checkpoint_ns, checkpoint_id) > (?, ?, ?)
ORDER BY thread_id, checkpoint_ns, checkpoint_id
LIMIT ?
"""
SQLITE_WRITES_PAGE = """
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, value, task_path
FROM writes
WHERE (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) > (?, ?, ?, ?, ?)
ORDER BY thread_id, checkpoint_ns, checkpoint_id, task_id, idx
LIMIT ?
"""
SQLITE_COUNT_CHECKPOINTS = "SELECT count(*) FROM checkpoints"
SQLITE_COUNT_WRITES = "SELECT count(*) FROM writes"
# compare-and-swap: only if the row still holds exactly what was read
SQLITE_CAS_CHECKPOINT = """
UPDATE checkpoints SET checkpoint = ?, metadata = ?
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
AND checkpoint IS ? AND metadata IS ?
"""
SQLITE_CAS_WRITE = """
UPDATE writes SET value = ?
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? AND task_id = ? AND idx = ?
AND value IS ?
"""

# --- PostgreSQL (langgraph-checkpoint-postgres schema) ---------------------------------------
PG_CHECKPOINTS_PAGE = """
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata,
       pg_column_size(checkpoint) + pg_column_size(metadata) AS size
FROM checkpoints
WHERE (thread_id, checkpoint_ns, checkpoint_id) > (%s, %s, %s)
ORDER BY thread_id, checkpoint_ns, checkpoint_id
LIMIT %s
"""
PG_BLOBS_PAGE = """
SELECT thread_id, checkpoint_ns, channel, version, type, blob
FROM checkpoint_blobs
WHERE (thread_id, checkpoint_ns, channel, version) > (%s, %s, %s, %s)
ORDER BY thread_id, checkpoint_ns, channel, version
LIMIT %s
"""
PG_WRITES_PAGE = """
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path
FROM checkpoint_writes
WHERE (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) > (%s, %s, %s, %s, %s)
ORDER BY thread_id, checkpoint_ns, checkpoint_id, task_id, idx
LIMIT %s
"""
PG_COUNTS = """
SELECT (SELECT count(*) FROM checkpoints) AS checkpoints,
       (SELECT count(*) FROM checkpoint_blobs) AS blobs,
       (SELECT count(*) FROM checkpoint_writes) AS writes
"""
# Blob and regular-write upserts are ON CONFLICT DO NOTHING upstream: re-putting a row through
# the saver would keep the old ciphertext, so rows are rewritten here, natively, with a CAS.
PG_CAS_SEALED_METADATA = """
UPDATE checkpoints SET metadata = jsonb_set(metadata, ARRAY[%s], to_jsonb(%s::text))
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
AND metadata ->> %s = %s
"""
PG_CAS_BLOB = """
UPDATE checkpoint_blobs SET blob = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND channel = %s AND version = %s AND blob = %s
"""
PG_CAS_WRITE = """
UPDATE checkpoint_writes SET blob = %s
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s AND task_id = %s AND idx = %s
AND blob = %s
"""

# locating the row a read refused (failure path only)
SQLITE_LATEST_ROW = """
SELECT checkpoint_id, type, checkpoint, metadata FROM checkpoints
WHERE thread_id = ? AND checkpoint_ns = ? ORDER BY checkpoint_id DESC LIMIT 1
"""
SQLITE_ONE_ROW = """
SELECT checkpoint_id, type, checkpoint, metadata FROM checkpoints
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
SQLITE_ROW_WRITES = """
SELECT task_id, idx, type, value FROM writes
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ? ORDER BY task_id, idx
"""
PG_LATEST_ROW = """
SELECT checkpoint_id, checkpoint FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = %s ORDER BY checkpoint_id DESC LIMIT 1
"""
PG_ONE_ROW = """
SELECT checkpoint_id, checkpoint FROM checkpoints
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s
"""
PG_ROW_BLOB = """
SELECT type, blob FROM checkpoint_blobs
WHERE thread_id = %s AND checkpoint_ns = %s AND channel = %s AND version = %s
"""
PG_ROW_WRITES = """
SELECT task_id, idx, type, blob FROM checkpoint_writes
WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s ORDER BY task_id, idx
"""


SQLITE_START = ("", "", "")
WRITES_START: tuple[Any, ...] = ("", "", "", "", -(2 ** 62))
BLOBS_START = ("", "", "", "")


def keyset_pages(fetch: Callable[[tuple[Any, ...]], Sequence[Any]], start: tuple[Any, ...],
                 decode: Callable[[Sequence[Any]], list[R]]) -> Iterator[list[R]]:
    """Pages of a keyset-paginated listing: ``fetch(after)`` returns the next page of rows in
    primary-key order whose first ``len(start)`` columns are the key, ``start`` sorts before
    every key; each page is yielded decoded, until a page comes back empty."""
    after = start
    while True:
        rows = fetch(after)
        if not rows:
            return
        after = tuple(rows[-1][:len(start)])
        yield decode(rows)
