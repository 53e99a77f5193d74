"""The audit aggregated by the database: one grouped statement over the registry, the inner
saver's tables and the PII tables (SQLite and PostgreSQL forms), streamed, folded into the
per-tenant totals; :class:`~.db.AuditDatabase` (the light source the CLI opens on a
URL) is re-exported.

Knows the tables' layouts and the report types; nothing of keys, sealing or the saver.
"""

from __future__ import annotations

import base64
import json
import logging
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..errors import TamperedDataError
from ..keys.tokens import from_text, is_token, token_key_version
from .db import AuditDatabase
from .report import (
    AGE_BUCKETS,
    UNKNOWN_AGE,
    TenantAudit,
    ThreadAudit,
    _checkpoint_epoch,
    registry_number,
)
from .statements import (
    B64URL,
    CHECKPOINT_FOLD,
    SEALED_TEXT_PREFIX,
    inventory_pg,
    inventory_sqlite,
)

if TYPE_CHECKING:
    from typing import TypeAlias

    from ..services import SaverLike as SecureSaver
    from ..storage.raw_tables import CheckpointRow

    _Source: TypeAlias = "SecureSaver | AuditDatabase"   # what the audit and the trail read

logger = logging.getLogger("langgraph_securesaver.audit.inventory")


# what a checkpoint row says, for both the Python walk (:mod:`.inventory`) and the statements
def checkpoint_unsealed(row: CheckpointRow) -> bool:
    """A checkpoint row SecureSaver could not have written (parse error, a foreign payload,
    no sealed metadata -- a text token's head, what the PostgreSQL statement can test -- or a
    channel value that is not a ciphertext)."""
    sealed = (row.metadata or {}).get("__securesaver__")
    return (row.error is not None or row.foreign is not None
            or not (isinstance(sealed, str) and sealed.startswith(SEALED_TEXT_PREFIX))
            or not all(is_token(v) for v in row.channel_values.values()))


def checkpoint_versions(row: CheckpointRow) -> set[int]:
    """The key versions a checkpoint row names: its channel values' ciphertexts and its sealed
    metadata's text token."""
    found = {token_key_version(v) for v in row.channel_values.values() if is_token(v)}
    sealed = (row.metadata or {}).get("__securesaver__")
    if isinstance(sealed, str):
        try:
            token = from_text(sealed)
            if is_token(token):
                found.add(token_key_version(token))
        except TamperedDataError:
            pass
    return found


def value_unsealed(type_: str | None, value: bytes) -> bool:
    """A blob or write that is not a typed-``bytes`` ciphertext."""
    return type_ != "bytes" or not is_token(value)


def _vault_kinds(saver: _Source, tenant: str | None) -> dict[str, dict[str, int]]:
    from ..registry.pii_vault import pii_vault
    q = sa.select(pii_vault.c.tenant, pii_vault.c.kind, sa.func.count()).group_by(
        pii_vault.c.tenant, pii_vault.c.kind)
    if tenant is not None:
        q = q.where(pii_vault.c.tenant == tenant)
    out: dict[str, dict[str, int]] = {}
    with saver.registry.begin() as conn:
        for t, kind, n in conn.execute(q):
            out.setdefault(t, {})[kind] = int(n)
    return out


# --------------------------------------------------------------------------------------------
# the inventory, aggregated by the database
# --------------------------------------------------------------------------------------------
MAX_ORPHANS_LISTED = 1000


class _VersionReader:
    """The sorted key versions of a thread's aggregate columns. Threads share a handful of
    combinations (a tenant's current and previous data keys), so each is decoded once."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], list[int]] = {}

    def of(self, r: dict[str, Any]) -> list[int]:
        if "vmask" in r:
            key: tuple[Any, ...] = (r["vmask"], frozenset(r["vbig"] or ()),
                                    frozenset(r["mv"] or ()))
        else:
            key = (tuple(r["cv"] or ()), r["wv"])
        found = self._seen.get(key)
        if found is None:
            found = _row_versions(r)
            if len(self._seen) < 10_000:
                self._seen[key] = found
        return list(found)


def _row_versions(r: Any) -> list[int]:
    if "vmask" in r:
        mask = int(r["vmask"] or 0)
        found = {int(v) for v in (r["vbig"] or ())}
        while mask:
            low = mask & -mask
            found.add(low.bit_length() - 1)
            mask ^= low
        found |= _text_token_versions(r["mv"])
        return sorted(found)
    # SQLite: the checkpoints' versions as the fold found them, the writes' as hex headers
    return sorted({int(v) for v in r["cv"] or ()} | _hex_versions(r["wv"]))


def _text_token_versions(items: Any) -> set[int]:
    """Versions of text tokens from the statement's ``chunk.mask`` items: base64url
    characters 9-13 (header bytes 3-5 and the top of byte 6) and a mask of the values the
    14th character's top two bits took (byte 6's lowest two bits; its other four are nonce)."""
    import binascii
    out: set[int] = set()
    for item in set(items or ()):
        chunk, _, mask_text = str(item).partition(".")
        try:
            mask = int(mask_text)
        except ValueError:
            continue
        for low in range(4):
            if not mask >> low & 1:
                continue
            try:
                raw = base64.urlsafe_b64decode(chunk + B64URL[low * 16] + "AA")
            except (ValueError, binascii.Error):
                continue
            if len(raw) >= 4:
                out.add(int.from_bytes(raw[:4], "big"))
    return out


def _hex_versions(field_value: Any) -> set[int]:
    """Key versions from an aggregate column of the 4 version bytes of binary tokens, in hex
    (SQLite's writes)."""
    out: set[int] = set()
    for item in str(field_value or "").split(","):
        item = item.strip()
        if item:
            try:
                out.add(int(item, 16))
            except ValueError:
                continue
    return out


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return _checkpoint_epoch(str(value))


def _sqlite_functions(conn: Any) -> None:
    """The aggregate function the SQLite inventory folds msgpack checkpoint rows with."""
    raw = conn.connection.driver_connection
    raw.create_aggregate(CHECKPOINT_FOLD, 5, CheckpointFold)


_AGES = len(AGE_BUCKETS)
#: what a thread without checkpoints has in place of :meth:`CheckpointFold.finalize`'s columns
NO_CHECKPOINTS: dict[str, Any] = {"first_ts": None, "last_ts": None, "au": None, "cv": None,
                                  "uc": None, **{f"a{k}": None for k in range(_AGES)}}


class CheckpointFold:
    """A thread's SQLite checkpoint rows folded as the Python walk folds them: each row is
    decoded once, exactly as the walk decodes it (strict serializer, inert placeholders;
    nothing is evaluated), so a crafted document gets the walk's answers; the statement calls
    :meth:`step` once per row (one Python call a row, nothing compared or cached).
    :meth:`finalize` gives the columns the other dialect's statement computes (JSON text)."""

    def __init__(self) -> None:
        from ..storage.raw_tables import decode_sqlite_checkpoint
        self._decode = decode_sqlite_checkpoint
        self.first: float | None = None
        self.last: float | None = None
        self.ages = [0] * (_AGES + 1)       # the last slot: unknown age
        self.versions: set[int] = set()
        self.unsealed = 0

    def step(self, type_: Any, checkpoint: Any, metadata: Any, size: Any, now: Any) -> None:
        try:
            row: CheckpointRow | None = self._decode(
                ("", "", "", None, type_, checkpoint, metadata))
        except Exception:  # noqa: BLE001 - a row this cannot even look at is not ours
            row = None
        ts = None
        if row is None or checkpoint_unsealed(row):
            self.unsealed += 1
        if row is not None:
            self.versions |= checkpoint_versions(row)
            ts = _checkpoint_epoch(row.ts)
        if ts is not None:
            self.first = ts if self.first is None else min(self.first, ts)
            self.last = ts if self.last is None else max(self.last, ts)
        self.ages[_slot(float(now), ts)] += int(size or 0)

    def finalize(self) -> str:
        out: dict[str, Any] = {f"a{k}": n or None for k, n in enumerate(self.ages[:-1])}
        out.update(first_ts=self.first, last_ts=self.last, au=self.ages[-1] or None,
                   cv=sorted(self.versions), uc=self.unsealed)
        return json.dumps(out)


def unfold(r: dict[str, Any]) -> None:
    """Put the SQLite fold's columns into a statement row (no-op for other dialects)."""
    if "fold" in r:
        fold = r.pop("fold")
        r.update(NO_CHECKPOINTS if fold is None else json.loads(fold))


class _Totals:
    """Per-tenant totals, age buckets, orphans and problems, accumulated as threads stream."""

    def __init__(self, saver: _Source, tenants: list[str],
                 tenant: str | None, now: float) -> None:
        self.saver = saver
        self.now = now
        self.tenant = tenant
        self.names = [tenant] if tenant is not None else list(tenants)
        self.by_tenant = {n: TenantAudit(n) for n in self.names}
        self._versions: dict[str, set[int]] = {n: set() for n in self.names}
        self.age_bytes: dict[str, dict[str, int]] = {}
        self._slots: dict[str, list[int]] = {}
        self.orphans: list[dict[str, Any]] = []
        self.orphan_count = 0
        # rows holding what SecureSaver never writes, per table (counted by the statement)
        self.unsealed: dict[str, int] = {}
        self.writes_table = "checkpoint_writes" if saver.registry.dialect == "postgresql" \
            else "writes"
        self.threads = 0
        self.overdue = 0
        self.unregistered = 0
        self.complete = False            # every row of the statement was folded in

    def age_slots(self, tenant_key: str) -> list[int]:
        """Stored bytes per age bucket (the last slot: unknown age) of a tenant."""
        per = self._slots.get(tenant_key)
        if per is None:
            per = self._slots[tenant_key] = [0] * (len(AGE_BUCKETS) + 1)
        return per

    def _fold_ages(self) -> None:
        labels = [label for label, _ in AGE_BUCKETS] + [UNKNOWN_AGE]
        for key, per in self._slots.items():
            kept = {label: int(n) for label, n in zip(labels, per, strict=True) if n}
            if kept:
                self.age_bytes[key] = kept

    def thread(self, th: ThreadAudit) -> None:
        self.threads += 1
        t = self.by_tenant.get(th.tenant)
        if t is None:
            return
        t.threads += 1
        t.checkpoints += th.checkpoints
        t.stored_bytes += th.stored_bytes
        self._versions[th.tenant].update(th.key_versions)
        if th.created_at is not None:
            t.first_created = (th.created_at if t.first_created is None
                               else min(t.first_created, th.created_at))
        t.overdue += th.overdue
        t.held += th.legal_hold
        t.unregistered += not th.registered
        self.overdue += th.overdue
        self.unregistered += not th.registered

    def unsealed_rows(self, r: Any) -> dict[str, int]:
        """Count a statement row's unsealed rows in; returns them per table."""
        found: dict[str, int] = {}
        for column, table in (("uc", "checkpoints"), ("ub", "checkpoint_blobs"),
                              ("uw", self.writes_table)):
            n = int(r[column] or 0)
            if n:
                self.unsealed[table] = self.unsealed.get(table, 0) + n
                found[table] = n
        return found

    def orphan(self, inner_id: str, checkpoints: int, stored_bytes: int) -> None:
        self.orphan_count += 1
        if len(self.orphans) < MAX_ORPHANS_LISTED:
            self.orphans.append({"thread_id": inner_id, "checkpoints": checkpoints,
                                 "stored_bytes": stored_bytes})

    def finish(self) -> tuple[list[TenantAudit], list[str]]:
        self._fold_ages()
        registry = self.saver.registry
        vault = _vault_kinds(self.saver, self.tenant)
        keys_by_tenant: dict[str, list[Any]] = {}
        from ..registry.schema import tenant_keys
        q = sa.select(tenant_keys.c.tenant, tenant_keys.c.purpose, tenant_keys.c.version,
                      tenant_keys.c.master_version)
        if self.tenant is not None:
            q = q.where(tenant_keys.c.tenant == self.tenant)
        with registry.begin() as conn:
            for row in conn.execute(q):
                keys_by_tenant.setdefault(row[0], []).append(row)
        out = []
        for name in self.names:
            t = self.by_tenant[name]
            keys = keys_by_tenant.get(name, [])
            data = sorted(int(r[2]) for r in keys if r[1] == "data")
            policy, source = registry.effective_policy(name)
            t.key_versions = sorted(self._versions[name])
            t.current_data_key = data[-1] if data else None
            t.data_keys = data
            t.master_versions = sorted({str(r[3]) for r in keys})
            t.pii = vault.get(name, {})
            t.policy = {"source": source, **policy.as_row()}
            out.append(t)
        problems = []
        if self.overdue:
            problems.append(
                f"{self.overdue} thread(s) past their expiry are still stored: retention is "
                "not being executed (schedule `securesaver prune`)")
        if self.unregistered:
            problems.append(
                f"{self.unregistered} stored thread(s) have no registry row: no retention "
                "policy applies to them")
        if self.orphan_count:
            problems.append(f"{self.orphan_count} stored thread(s) belong to no known tenant")
        return out, problems


def _iter_sql(saver: _Source, tenants: list[str], tenant: str | None, now: float,
              totals: _Totals, progress: Callable[[int, int], None] | None,
              only: list[str] | None = None,
              per_thread: Callable[[ThreadAudit, list[int], dict[str, int]], None] | None = None
              ) -> Iterator[ThreadAudit]:
    """Stream ThreadAudits from the grouped statement, as its rows arrive. ``only``: these
    registered threads of ``tenant`` alone; ``per_thread`` is told each thread's age slots and
    unsealed rows (what the maintained summaries keep)."""
    registry = saver.registry
    if not tenants:
        totals.complete = True
        return
    if registry.dialect == "postgresql":
        sql, params = inventory_pg(tenants, tenant, now, only)
    else:
        sql, params = inventory_sqlite(tenants, tenant, now, only)
    total = 0
    if progress:
        from ..registry.core import threads as threads_table
        q = sa.select(sa.func.count()).select_from(threads_table)
        if tenant is not None:
            q = q.where(threads_table.c.tenant == tenant)
        with registry.begin() as conn:
            total = int(conn.execute(q).scalar() or 0)
    done = 0
    versions = _VersionReader()
    with registry.begin() as conn:
        for r in _stream_rows(conn, registry.dialect, sql, params):
            unfold(r)
            done += 1
            if progress and done % 1000 == 0:
                progress(done, max(total, done))
            checkpoints = int(r["n"] or 0)
            stored = int(r["ck_bytes"] or 0) + int(r["bl_bytes"] or 0) + int(r["wr_bytes"] or 0)
            owner = r["owner"]
            first, last = _epoch(r["first_ts"]), _epoch(r["last_ts"])
            # checkpoints whose ts the statement could not order as text (PostgreSQL)
            odd = [(_checkpoint_epoch(None if v is None else str(v)), int(size or 0))
                   for v, size in zip(r.get("ots") or (), r.get("obytes") or (), strict=True)]
            for ts, _size in odd:
                if ts is not None:
                    first = ts if first is None else min(first, ts)
                    last = ts if last is None else max(last, ts)
            slots: list[int] | None = None
            unsealed: dict[str, int] = {}
            if r["inner_id"] is not None:
                slots = _ages(totals, "(unknown tenant)" if owner is None else owner, r, first,
                              last, odd, per_thread is not None)
                unsealed = totals.unsealed_rows(r)
            if owner is None:
                totals.orphan(r["thread"], checkpoints, stored)
                continue
            registered = bool(r["registered"])
            hold = bool(r["legal_hold"]) if registered else False
            expires = registry_number(r["expires_at"])
            created = registry_number(r["created_at"])
            activity = registry_number(r["last_activity"])
            idle, max_age = registry_number(r["idle_ttl"]), registry_number(r["max_age"])
            held_past = hold and (
                (idle is not None and activity is not None and activity + idle <= now)
                or (max_age is not None and created is not None and created + max_age <= now))
            th = ThreadAudit(
                owner, r["thread"], created, activity, expires, hold,
                r["policy_source"], idle, max_age, r["state"], checkpoints, stored,
                versions.of(r),
                _kinds_of(r["kinds"]) if r["kinds"] else {}, first, last,
                registered=registered,
                overdue=registered and expires is not None and expires <= now and not hold,
                held_past_ttl=bool(held_past))
            totals.thread(th)
            if per_thread is not None:
                per_thread(th, slots or [0] * (len(AGE_BUCKETS) + 1), unsealed)
            yield th
    totals.complete = True
    if progress:
        progress(done, max(total, done))


def psycopg_pq_version() -> int:
    import psycopg
    return int(psycopg.pq.version())


def _stream_rows(conn: sa.Connection, dialect: str, sql: str, params: dict[str, Any]
                 ) -> Iterator[dict[str, Any]]:
    """The statement's rows as dicts (a tenth of the cost of a Row mapping's per-key lookups),
    read as they arrive. On PostgreSQL through libpq's chunked mode, not a server-side cursor:
    PostgreSQL never runs a cursor's plan in parallel (the parallel plan is twice as fast)."""
    names: list[str] = []
    for row in _stream_tuples(conn, dialect, sql, params, names):
        yield dict(zip(names, row, strict=True))


def _stream_tuples(conn: sa.Connection, dialect: str, sql: str, params: dict[str, Any],
                   names: list[str] | None = None) -> Iterator[Sequence[Any]]:
    """:func:`_stream_rows` as the driver's rows (tuples; SQLAlchemy rows on SQLite) in the
    statement's column order, for a caller that unpacks every column (no dict per row).
    ``names`` is given the column names before the first row."""
    if dialect != "postgresql":
        if dialect == "sqlite":
            _sqlite_functions(conn)
        result = conn.execution_options(stream_results=True, yield_per=2000).execute(
            sa.text(sql), params)
        if names is not None:
            names[:] = result.keys()
        yield from result
        return
    # one big aggregate: JIT compilation costs more than it saves, and a little more memory
    # keeps the hash tables and the ordering off disk
    conn.exec_driver_sql("SET LOCAL jit = off")
    conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")
    compiled = sa.text(sql).compile(dialect=conn.dialect)
    raw = conn.connection.driver_connection
    with raw.cursor() as cur:   # type: ignore[union-attr]
        from psycopg.types.json import set_json_loads

        from ..storage.stored_json import lenient_json_loads
        set_json_loads(lenient_json_loads, cur)   # an odd ts of 5,000 digits must not raise
        # chunks of rows need libpq >= 17; older ones stream row by row (slower, as flat)
        size = 2000 if psycopg_pq_version() >= 170000 else 1
        for row in cur.stream(compiled.string, compiled.construct_params(params), size=size):
            if names is not None and not names:
                names[:] = [d.name for d in cur.description or ()]
            yield row

_AGE_COLUMNS = list(enumerate(f"a{k}" for k in range(len(AGE_BUCKETS))))
_UPPERS = [upper for _label, upper in AGE_BUCKETS]
_LAST = len(AGE_BUCKETS) - 1


def _ages(totals: _Totals, key: str, r: Any, first: float | None, last: float | None,
          odd: list[tuple[float | None, int]], own: bool = False) -> list[int] | None:
    """Add a statement row's bytes to its tenant's age slots; with ``own``, also return the
    row's own slots."""
    per = totals.age_slots(key)
    mine = [0] * (_AGES + 1)
    for k, column in _AGE_COLUMNS:
        size = r[column]
        if size:
            mine[k] += size
    mine[-1] += r["au"] or 0
    for ts, size in odd:
        mine[_slot(totals.now, ts)] += size
    # blobs are aged by the thread's first checkpoint (a channel value's history goes back
    # that far), pending writes by its latest one
    if r["bl_bytes"]:
        mine[_slot(totals.now, first)] += r["bl_bytes"]
    if r["wr_bytes"]:
        mine[_slot(totals.now, last)] += r["wr_bytes"]
    for k, size in enumerate(mine):
        if size:
            per[k] += size
    return mine if own else None


def _slot(now: float, ts: float | None) -> int:
    """The age bucket of ``ts`` (the first whose upper bound the age is below), or the
    unknown-age slot."""
    if ts is None:
        return len(AGE_BUCKETS)
    return min(bisect_right(_UPPERS, max(0.0, now - ts)), _LAST)


def _kinds_of(value: Any) -> dict[Any, int]:
    """The PII kinds column: a JSON object of kind to count (PostgreSQL), or the text of
    [SQLite type, kind, count] triples (a blob's kind in hex), read back as the walk reads
    the column."""
    if isinstance(value, dict):
        return {kind: int(n) for kind, n in value.items()}
    out: dict[Any, int] = {}
    for type_, kind, n in json.loads(value):
        out[bytes.fromhex(kind) if type_ == "blob" else kind] = int(n)
    return out
