"""Raw rows of the inner saver's tables (SQLite and PostgreSQL).

Audits, at-rest scans and re-encryption all need what the ``BaseCheckpointSaver`` API hides:
every stored row exactly as it sits on disk, and a way to rewrite one ciphertext in place.
This module is that layer, shared by :mod:`..audit.inventory`, :mod:`..audit.scan` and
:mod:`..ops.rotation`:

* page through ``checkpoints`` / ``writes`` (and Postgres' ``checkpoint_blobs``) in primary-key
  order (keyset pagination: each page is one short query, safe on live databases);
* compare-and-swap updates: a row is rewritten only ``WHERE`` it still holds what was read, so a
  concurrent write by a running graph is never clobbered (the caller sees ``False`` and retries
  on a later pass).

Every ``securesaver_*`` table of the registry, known or not, is read and rewritten by
:mod:`.registry_tables`.

Every SQL statement is a named constant in :mod:`.raw_sql` so it can be reviewed in one place.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, TamperedDataError
from ..tenancy import tenant_tag
from .raw_sql import (
    BLOBS_START,
    DEFAULT_PAGE,
    PG_BLOBS_PAGE,
    PG_CAS_BLOB,
    PG_CAS_SEALED_METADATA,
    PG_CAS_WRITE,
    PG_CHECKPOINTS_PAGE,
    PG_COUNTS,
    PG_LATEST_ROW,
    PG_ONE_ROW,
    PG_ROW_BLOB,
    PG_ROW_WRITES,
    PG_WRITES_PAGE,
    SQLITE_CAS_CHECKPOINT,
    SQLITE_CAS_WRITE,
    SQLITE_CHECKPOINTS_PAGE,
    SQLITE_COUNT_CHECKPOINTS,
    SQLITE_COUNT_WRITES,
    SQLITE_LATEST_ROW,
    SQLITE_ONE_ROW,
    SQLITE_ROW_WRITES,
    SQLITE_START,
    SQLITE_WRITES_PAGE,
    WRITES_START,
    keyset_pages,
)
from .stored_json import lenient_json_loads  # (used here; importable from here as before)
from .strict_serde import StrictSerializer, inspect_msgpack

if TYPE_CHECKING:  # (companions import this module to register sealed columns: keep it light)
    from langgraph.checkpoint.base import BaseCheckpointSaver

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# rows
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointRow:
    """One row of the inner ``checkpoints`` table.

    ``checkpoint`` is the decoded checkpoint (SQLite: the whole msgpack document, channel values
    included; Postgres: the JSONB document, whose ``channel_values`` hold only inlined
    primitives), ``None`` with ``error`` set when it cannot be decoded. ``raw_checkpoint`` /
    ``raw_metadata`` are the column values as read, for compare-and-swap updates.
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint: dict[str, Any] | None
    metadata: dict[str, Any] | None
    size: int
    raw_checkpoint: Any = None
    raw_metadata: Any = None
    type: str | None = None
    error: str | None = None
    # set when the document holds what SecureSaver never writes (e.g. a msgpack extension /
    # constructor payload): it was parsed for inspection with placeholders, never evaluated
    foreign: str | None = None

    @property
    def channel_values(self) -> dict[str, Any]:
        values = (self.checkpoint or {}).get("channel_values") or {}
        return dict(values) if isinstance(values, Mapping) else {}

    @property
    def channel_versions(self) -> dict[str, Any]:
        versions = (self.checkpoint or {}).get("channel_versions") or {}
        return dict(versions) if isinstance(versions, Mapping) else {}

    @property
    def ts(self) -> str | None:
        ts = (self.checkpoint or {}).get("ts")
        return str(ts) if ts is not None else None


@dataclass(frozen=True)
class BlobRow:
    """One row of Postgres' ``checkpoint_blobs`` (a channel value, shared by checkpoints)."""

    thread_id: str
    checkpoint_ns: str
    channel: str
    version: str
    type: str | None
    blob: bytes | None


@dataclass(frozen=True)
class WriteRow:
    """One pending write (SQLite ``writes.value`` / Postgres ``checkpoint_writes.blob``)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    type: str | None
    value: bytes | None
    task_path: str


# --------------------------------------------------------------------------------------------
# tenants behind inner thread ids
# --------------------------------------------------------------------------------------------
class TenantIndex:
    """Maps inner thread ids (``<tag>:<thread>``) back to (tenant, thread)."""

    def __init__(self, tenants: list[str]) -> None:
        self.by_tag = {tenant_tag(t): t for t in tenants}

    def split(self, inner_id: str) -> tuple[str | None, str]:
        """(tenant, outer thread id); tenant is None when the tag names no known tenant (the
        thread part is then the whole inner id)."""
        tag, sep, rest = inner_id.partition(":")
        if sep and tag in self.by_tag:
            return self.by_tag[tag], rest
        return None, inner_id


def decode_sqlite_checkpoint(row: tuple[Any, ...], serde: StrictSerializer | None = None
                             ) -> CheckpointRow:
    """A SQLite ``checkpoints`` row ``(thread_id, ns, id, parent, type, checkpoint, metadata)``
    as a CheckpointRow, decoded as plain containers only (the audit's SQL counting function
    uses this too, so both see the same rows as foreign or undecodable)."""
    serde = serde if serde is not None else StrictSerializer()
    thread_id, ns, cid, parent, type_, raw_ckpt, raw_md = row
    size = len(raw_ckpt or b"") + len(raw_md or b"")
    checkpoint: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    error = None
    foreign = None
    try:
        try:
            loaded = serde.loads_typed((type_, raw_ckpt))
        except TamperedDataError as exc:
            if type_ != "msgpack" or not isinstance(raw_ckpt, bytes):
                raise
            loaded, foreign = inspect_msgpack(raw_ckpt), str(exc)
        checkpoint = loaded if isinstance(loaded, dict) else None
        if checkpoint is None:
            error = "checkpoint is not a mapping"
    except Exception as exc:  # noqa: BLE001 - an undecodable row is reported, never fatal
        error = (f"checkpoint undecodable: {exc}" if isinstance(exc, TamperedDataError)
                 else f"checkpoint undecodable ({type(exc).__name__})")
    try:
        loaded_md = json.loads(raw_md) if raw_md is not None else {}
        metadata = loaded_md if isinstance(loaded_md, dict) else None
        if metadata is None:
            error = error or "metadata is not a JSON object"
    except (TypeError, ValueError, UnicodeDecodeError):
        error = error or "metadata is not JSON"
    return CheckpointRow(thread_id, ns, cid, parent, checkpoint, metadata, size,
                         raw_ckpt, raw_md, type_, error, foreign)


# --------------------------------------------------------------------------------------------
# inner tables
# --------------------------------------------------------------------------------------------
class RawTables:
    """Page through the inner saver's tables and rewrite ciphertexts in place (CAS)."""

    backend = "unknown"
    has_blobs = False

    def counts(self) -> dict[str, int]:
        raise NotImplementedError

    def checkpoints(self, page: int = DEFAULT_PAGE) -> Iterator[list[CheckpointRow]]:
        raise NotImplementedError

    def blobs(self, page: int = DEFAULT_PAGE) -> Iterator[list[BlobRow]]:
        return iter(())

    def writes(self, page: int = DEFAULT_PAGE) -> Iterator[list[WriteRow]]:
        raise NotImplementedError

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several CAS updates into one transaction (one commit per batch)."""
        raise NotImplementedError
        yield  # pragma: no cover

    def update_checkpoint(self, row: CheckpointRow, *,
                          channel_values: Mapping[str, Any] | None = None,
                          metadata_key: str | None = None,
                          metadata_value: str | None = None) -> bool:
        """Replace some channel values and/or one metadata value of a checkpoint row, only if
        the row is unchanged since it was read. Returns whether it was rewritten."""
        raise NotImplementedError

    def update_blob(self, row: BlobRow, blob: bytes) -> bool:
        raise NotImplementedError(f"{self.backend} keeps channel values in the checkpoint rows")

    def update_write(self, row: WriteRow, value: bytes) -> bool:
        raise NotImplementedError

    def locate_refused(self, thread_id: str, ns: str, checkpoint_id: str | None) -> str | None:
        """Which stored row of a checkpoint (the latest with ``checkpoint_id=None``) the strict
        serializer refuses: ``"<table> row (<key>)"``, or None (used to name the row in a
        TamperedDataError; the bytes are parsed as plain containers only)."""
        return None

    def _refuses(self, type_: Any, value: Any) -> bool:
        try:
            StrictSerializer().loads_typed((type_, value))
        except TamperedDataError:
            return True
        return False


class SqliteRawTables(RawTables):
    """``SqliteSaver``'s tables, through its own connection and lock."""

    backend = "sqlite"

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        # never the inner saver's own serde: a raw row is decoded as plain containers only
        self.serde = StrictSerializer()
        self._cur: Any = None
        inner.setup()

    @contextmanager
    def _locked(self) -> Iterator[Any]:
        with self.inner.lock:
            yield self.inner.conn

    def counts(self) -> dict[str, int]:
        with self._locked() as conn:
            return {"checkpoints": int(conn.execute(SQLITE_COUNT_CHECKPOINTS).fetchone()[0]),
                    "writes": int(conn.execute(SQLITE_COUNT_WRITES).fetchone()[0])}

    def _decode(self, row: tuple[Any, ...]) -> CheckpointRow:
        return decode_sqlite_checkpoint(row, self.serde)

    def _page(self, sql: str, page: int) -> Callable[[tuple[Any, ...]], list[Any]]:
        def fetch(after: tuple[Any, ...]) -> list[Any]:
            with self._locked() as conn:
                return list(conn.execute(sql, (*after, page)).fetchall())
        return fetch

    def checkpoints(self, page: int = DEFAULT_PAGE) -> Iterator[list[CheckpointRow]]:
        return keyset_pages(self._page(SQLITE_CHECKPOINTS_PAGE, page), SQLITE_START,
                            lambda rows: [self._decode(r) for r in rows])

    def writes(self, page: int = DEFAULT_PAGE) -> Iterator[list[WriteRow]]:
        return keyset_pages(self._page(SQLITE_WRITES_PAGE, page), WRITES_START, _write_rows)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._locked() as conn:
            if conn.in_transaction:
                conn.commit()
            cur = conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
                self._cur = cur
                yield
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            finally:
                self._cur = None
                cur.close()

    def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        if self._cur is None:
            with self.transaction():
                return self._execute(sql, params)
        return int(self._cur.execute(sql, params).rowcount)

    def update_checkpoint(self, row: CheckpointRow, *,
                          channel_values: Mapping[str, Any] | None = None,
                          metadata_key: str | None = None,
                          metadata_value: str | None = None) -> bool:
        if row.checkpoint is None or row.metadata is None or row.foreign is not None:
            raise ValueError("cannot rewrite an undecodable checkpoint row")
        checkpoint = dict(row.checkpoint)
        if channel_values:
            checkpoint["channel_values"] = {**row.channel_values, **channel_values}
        type_, blob = self.serde.dumps_typed(checkpoint)
        if type_ != row.type:
            raise ValueError(f"checkpoint re-encodes as {type_!r}, the row holds {row.type!r}")
        metadata = dict(row.metadata)
        if metadata_key is not None:
            metadata[metadata_key] = metadata_value
        raw_md = json.dumps(metadata, ensure_ascii=False)
        if isinstance(row.raw_metadata, bytes):
            raw_md_out: Any = raw_md.encode("utf-8")
        else:
            raw_md_out = raw_md
        return self._execute(SQLITE_CAS_CHECKPOINT, (
            blob, raw_md_out, row.thread_id, row.checkpoint_ns, row.checkpoint_id,
            row.raw_checkpoint, row.raw_metadata)) == 1

    def update_write(self, row: WriteRow, value: bytes) -> bool:
        return self._execute(SQLITE_CAS_WRITE, (
            value, row.thread_id, row.checkpoint_ns, row.checkpoint_id, row.task_id, row.idx,
            row.value)) == 1

    def locate_refused(self, thread_id: str, ns: str, checkpoint_id: str | None) -> str | None:
        with self._locked() as conn:
            if checkpoint_id is None:
                found = conn.execute(SQLITE_LATEST_ROW, (thread_id, ns)).fetchone()
            else:
                found = conn.execute(SQLITE_ONE_ROW, (thread_id, ns, checkpoint_id)).fetchone()
            if found is None:
                return None
            cid, type_, body, metadata = found
            if self._refuses(type_, body):
                return f"checkpoints row (checkpoint {cid!r}), column checkpoint"
            try:
                json.loads(metadata) if metadata is not None else None
            except (TypeError, ValueError):
                return f"checkpoints row (checkpoint {cid!r}), column metadata"
            for task_id, idx, wtype, value in conn.execute(SQLITE_ROW_WRITES,
                                                           (thread_id, ns, cid)):
                if self._refuses(wtype, value):
                    return (f"writes row (checkpoint {cid!r}, task {task_id!r}, idx {idx}), "
                            "column value")
        return None


class PostgresRawTables(RawTables):
    """``PostgresSaver``'s tables, through its pool (or its connection and lock)."""

    backend = "postgres"
    has_blobs = True

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._conn: Any = None

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        if self._conn is not None:
            yield self._conn
            return
        conn = self.inner.conn
        try:
            from psycopg_pool import ConnectionPool
        except ImportError:  # pragma: no cover - the postgres extra ships the pool
            ConnectionPool = None  # type: ignore[assignment,misc]
        if ConnectionPool is not None and isinstance(conn, ConnectionPool):
            with conn.connection() as c:
                yield c
        else:
            with self.inner.lock:
                yield conn

    def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        from psycopg.rows import tuple_row
        from psycopg.types.json import set_json_loads
        with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            set_json_loads(lenient_json_loads, cur)
            cur.execute(sql, params)
            return list(cur.fetchall())

    def counts(self) -> dict[str, int]:
        (row,) = self._fetch(PG_COUNTS, ())
        return {"checkpoints": int(row[0]), "blobs": int(row[1]), "writes": int(row[2])}

    def _page(self, sql: str, page: int) -> Callable[[tuple[Any, ...]], list[Any]]:
        return lambda after: self._fetch(sql, (*after, page))

    def checkpoints(self, page: int = DEFAULT_PAGE) -> Iterator[list[CheckpointRow]]:
        return keyset_pages(self._page(PG_CHECKPOINTS_PAGE, page), SQLITE_START,
                            _pg_checkpoint_rows)

    def blobs(self, page: int = DEFAULT_PAGE) -> Iterator[list[BlobRow]]:
        return keyset_pages(self._page(PG_BLOBS_PAGE, page), BLOBS_START, lambda rows: [
            BlobRow(r[0], r[1], r[2], r[3], r[4], None if r[5] is None else bytes(r[5]))
            for r in rows])

    def writes(self, page: int = DEFAULT_PAGE) -> Iterator[list[WriteRow]]:
        return keyset_pages(self._page(PG_WRITES_PAGE, page), WRITES_START, _write_rows)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._conn is not None:  # nested: join the outer transaction
            yield
            return
        with self._connection() as conn, conn.transaction():
            self._conn = conn
            try:
                yield
            finally:
                self._conn = None

    def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        with self._connection() as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return int(cur.rowcount)

    def update_checkpoint(self, row: CheckpointRow, *,
                          channel_values: Mapping[str, Any] | None = None,
                          metadata_key: str | None = None,
                          metadata_value: str | None = None) -> bool:
        if channel_values:
            raise ValueError("Postgres keeps channel values in checkpoint_blobs; use update_blob")
        if metadata_key is None or metadata_value is None or row.metadata is None:
            return False
        old = row.metadata.get(metadata_key)
        if not isinstance(old, str):
            return False
        return self._execute(PG_CAS_SEALED_METADATA, (
            metadata_key, metadata_value, row.thread_id, row.checkpoint_ns, row.checkpoint_id,
            metadata_key, old)) == 1

    def update_blob(self, row: BlobRow, blob: bytes) -> bool:
        if row.blob is None:
            return False
        return self._execute(PG_CAS_BLOB, (
            blob, row.thread_id, row.checkpoint_ns, row.channel, row.version, row.blob)) == 1

    def update_write(self, row: WriteRow, value: bytes) -> bool:
        if row.value is None:
            return False
        return self._execute(PG_CAS_WRITE, (
            value, row.thread_id, row.checkpoint_ns, row.checkpoint_id, row.task_id, row.idx,
            row.value)) == 1

    def locate_refused(self, thread_id: str, ns: str, checkpoint_id: str | None) -> str | None:
        if checkpoint_id is None:
            found = self._fetch(PG_LATEST_ROW, (thread_id, ns))
        else:
            found = self._fetch(PG_ONE_ROW, (thread_id, ns, checkpoint_id))
        if not found:
            return None
        cid, body = found[0]
        versions = (body or {}).get("channel_versions") if isinstance(body, dict) else None
        for channel, version in (versions or {}).items():
            for type_, blob in self._fetch(PG_ROW_BLOB, (thread_id, ns, channel, str(version))):
                if type_ != "empty" and self._refuses(type_, blob):
                    return (f"checkpoint_blobs row (channel {channel!r}, version "
                            f"{str(version)!r})")
        for task_id, idx, type_, blob in self._fetch(PG_ROW_WRITES, (thread_id, ns, cid)):
            if self._refuses(type_, blob):
                return f"checkpoint_writes row (checkpoint {cid!r}, task {task_id!r}, idx {idx})"
        return None


def _write_rows(rows: Any) -> list[WriteRow]:
    return [WriteRow(r[0], r[1], r[2], r[3], int(r[4]), r[5], r[6],
                     None if r[7] is None else bytes(r[7]), r[8] or "") for r in rows]


def _pg_checkpoint_rows(rows: Any) -> list[CheckpointRow]:
    out = []
    for tid, ns, cid, parent, ckpt, md, size in rows:
        error = None
        if not isinstance(ckpt, dict):
            error = "checkpoint is not a JSON object"
        if not isinstance(md, dict):
            error = error or "metadata is not a JSON object"
        out.append(CheckpointRow(
            tid, ns, cid, parent, ckpt if isinstance(ckpt, dict) else None,
            md if isinstance(md, dict) else None, int(size or 0), None, md, "jsonb", error))
    return out


def raw_tables_for(inner: BaseCheckpointSaver) -> RawTables:
    """The raw-table access for an inner saver (sync ``SqliteSaver`` or ``PostgresSaver``)."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    if isinstance(inner, SqliteSaver):
        return SqliteRawTables(inner)
    try:
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:
        PostgresSaver = None  # type: ignore[assignment,misc]
    if PostgresSaver is not None and isinstance(inner, PostgresSaver):
        return PostgresRawTables(inner)
    raise ConfigurationError(
        f"re-encryption and the table audit rewrite and read the tables of a sync SqliteSaver "
        f"or PostgresSaver; {type(inner).__name__} is not one. On a SQLite or PostgreSQL "
        "database open it with SecureSaver.from_url(url) (the CLI does); on other savers "
        "rotate without re-encryption (every data key is rewrapped under the new master "
        "version, which is all retiring the old ones needs; docs/savers.md)")
