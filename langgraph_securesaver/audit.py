"""Inventory: what is held per tenant and thread, since when, until when, under which keys.

:func:`audit` joins three sources without decrypting anything (no keyring needed):

* the registry (``securesaver_threads``): created, last activity, effective retention, expiry,
  legal hold; threads past their expiry that are still here mean retention is not running;
* the inner saver's raw rows: checkpoints, stored bytes, the data-key versions the
  ciphertexts name, and the age of every stored byte;
* the PII vault: which kinds of personal data each thread holds (distinct values).

:func:`events` is the audit trail: security events and deletion receipts, filtered.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from json.encoder import encode_basestring_ascii as _json_str
from typing import TYPE_CHECKING, Any, TextIO

import sqlalchemy as sa

from .crypto import MIN_TOKEN_BYTES, from_text, is_token, token_key_version
from .errors import ConfigurationError, TamperedDataError
from .tenancy import thread_prefix

if TYPE_CHECKING:
    from typing import TypeAlias

    from .raw_tables import CheckpointRow, TenantIndex
    from .registry import Registry
    from .saver import SecureSaver

    _Source: TypeAlias = "SecureSaver | AuditDatabase"   # what the audit and the trail read

# (raw_tables, and through it LangGraph, is imported by the Python walk only: the grouped
# statement needs the registry's engine and nothing else)

logger = logging.getLogger(__name__)

DAY = 86400.0
AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("< 1 day", DAY),
    ("1-7 days", 7 * DAY),
    ("7-30 days", 30 * DAY),
    ("30-90 days", 90 * DAY),
    ("90-365 days", 365 * DAY),
    ("> 1 year", math.inf),
)
UNKNOWN_AGE = "unknown"


def age_bucket(age: float | None) -> str:
    if age is None:
        return UNKNOWN_AGE
    for label, upper in AGE_BUCKETS:
        if age < upper:
            return label
    return AGE_BUCKETS[-1][0]


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    try:  # the same text as datetime.isoformat(timespec="seconds") in UTC, 4x faster
        return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds")


def _checkpoint_epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None


@dataclass
class ThreadAudit:
    tenant: str
    thread_id: str
    created_at: float | None
    last_activity: float | None
    expires_at: float | None
    legal_hold: bool
    policy_source: str | None
    idle_ttl: float | None
    max_age: float | None
    state: str | None
    checkpoints: int = 0
    stored_bytes: int = 0
    key_versions: list[int] = field(default_factory=list)
    pii: dict[str, int] = field(default_factory=dict)
    first_checkpoint: float | None = None
    last_checkpoint: float | None = None
    registered: bool = True
    overdue: bool = False          # past expiry, not held: retention is not being executed
    held_past_ttl: bool = False    # would have expired, kept by a legal hold

    def as_dict(self) -> dict[str, Any]:
        # (by hand rather than dataclasses.asdict: the streamed audit calls this per thread)
        out = {f.name: getattr(self, f.name) for f in _THREAD_FIELDS}
        out["key_versions"] = list(self.key_versions)
        out["pii"] = dict(self.pii)
        for key in ("created_at", "last_activity", "expires_at", "first_checkpoint",
                    "last_checkpoint"):
            out[key] = iso(out[key])
        return out


_THREAD_FIELDS = fields(ThreadAudit)


def _json_value(value: Any) -> str:
    """``json.dumps(value, default=str)`` for one field, without its per-call set-up on the
    common types (the streamed audit writes 19 of them per thread)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is str:
        return _json_str(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    return json.dumps(value, default=str)


def _json_iso(ts: float | None) -> str:
    """``json.dumps(iso(ts))``: the text is digits, ``-``, ``:``, ``T`` and ``+``."""
    if ts is None:
        return "null"
    try:
        return time.strftime('"%Y-%m-%dT%H:%M:%S+00:00"', time.gmtime(ts))
    except (OverflowError, OSError, ValueError, TypeError):
        return _json_value(iso(ts))


def thread_json(th: ThreadAudit) -> str:
    """One thread as the JSON text of ``json.dumps(th.as_dict(), default=str)`` (same keys,
    order, separators and escaping), built directly."""
    versions = th.key_versions
    if all(type(v) is int for v in versions):
        versions_text = "[" + ", ".join(map(int.__repr__, versions)) + "]"
    else:
        versions_text = json.dumps(list(versions), default=str)
    pii = th.pii
    if all(type(k) is str and type(n) is int for k, n in pii.items()):
        pii_text = "{" + ", ".join(f"{_json_str(k)}: {n!r}" for k, n in pii.items()) + "}"
    else:
        pii_text = json.dumps(dict(pii), default=str)
    v, q = _json_value, _json_iso
    return (f'{{"tenant": {v(th.tenant)}, "thread_id": {v(th.thread_id)}, '
            f'"created_at": {q(th.created_at)}, "last_activity": {q(th.last_activity)}, '
            f'"expires_at": {q(th.expires_at)}, "legal_hold": {v(th.legal_hold)}, '
            f'"policy_source": {v(th.policy_source)}, "idle_ttl": {v(th.idle_ttl)}, '
            f'"max_age": {v(th.max_age)}, "state": {v(th.state)}, '
            f'"checkpoints": {v(th.checkpoints)}, "stored_bytes": {v(th.stored_bytes)}, '
            f'"key_versions": {versions_text}, "pii": {pii_text}, '
            f'"first_checkpoint": {q(th.first_checkpoint)}, '
            f'"last_checkpoint": {q(th.last_checkpoint)}, '
            f'"registered": {v(th.registered)}, "overdue": {v(th.overdue)}, '
            f'"held_past_ttl": {v(th.held_past_ttl)}}}')


@dataclass
class TenantAudit:
    tenant: str
    threads: int = 0
    checkpoints: int = 0
    stored_bytes: int = 0
    key_versions: list[int] = field(default_factory=list)   # named by stored ciphertexts
    current_data_key: int | None = None
    data_keys: list[int] = field(default_factory=list)
    master_versions: list[str] = field(default_factory=list)
    pii: dict[str, int] = field(default_factory=dict)        # distinct values in the vault
    first_created: float | None = None
    overdue: int = 0
    held: int = 0
    unregistered: int = 0
    policy: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["first_created"] = iso(out["first_created"])
        return out


@dataclass
class AuditReport:
    generated_at: float
    backend: str
    tenant_filter: str | None
    tenants: list[TenantAudit]
    threads: list[ThreadAudit]
    orphans: list[dict[str, Any]]               # stored threads whose tag names no tenant
    age_bytes: dict[str, dict[str, int]]        # tenant -> age bucket -> stored bytes
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def overdue(self) -> list[ThreadAudit]:
        return [t for t in self.threads if t.overdue]

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "generated_at": iso(self.generated_at), "backend": self.backend,
            "tenant": self.tenant_filter, "problems": self.problems,
            "tenants": [t.as_dict() for t in self.tenants],
            "threads": [t.as_dict() for t in self.threads],
            "orphans": self.orphans,
            "stored_bytes_by_age": self.age_bytes,
            "age_buckets": [label for label, _ in AGE_BUCKETS] + [UNKNOWN_AGE],
        }


@dataclass
class _Stored:
    checkpoints: int = 0
    stored_bytes: int = 0
    versions: set[int] = field(default_factory=set)
    first: float | None = None
    last: float | None = None


def _versions_of(row: CheckpointRow) -> set[int]:
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


def _checkpoint_unsealed(row: CheckpointRow) -> bool:
    """A checkpoint row SecureSaver could not have written (parse error, a foreign payload,
    no sealed metadata, or a channel value that is not a ciphertext)."""
    return (row.error is not None or row.foreign is not None
            or not isinstance((row.metadata or {}).get("__securesaver__"), str)
            or not all(is_token(v) for v in row.channel_values.values()))


def _value_unsealed(type_: str | None, value: bytes) -> bool:
    """A blob or write that is not a typed-``bytes`` ciphertext."""
    return type_ != "bytes" or not is_token(value)


class _StorageWalk:
    """One pass over the inner tables: per inner thread id, what is stored and how old."""

    def __init__(self, saver: SecureSaver, index: TenantIndex, tenant: str | None, now: float,
                 progress: Callable[[int, int], None] | None) -> None:
        from .raw_tables import raw_tables_for
        self.raw = raw_tables_for(saver.inner)
        self.index = index
        self.tenant = tenant
        self.now = now
        self.progress = progress
        self.threads: dict[str, _Stored] = {}
        self.age_bytes: dict[str, dict[str, int]] = {}
        self._ckpt_ts: dict[tuple[str, str, str], float | None] = {}
        self._blob_ts: dict[tuple[str, str, str, str], float] = {}
        self._done = 0
        self._total = 0
        # rows that hold something SecureSaver never stores (never decoded: just counted)
        self.unsealed: dict[str, int] = {}

    def _unsealed(self, table: str) -> None:
        self.unsealed[table] = self.unsealed.get(table, 0) + 1

    def _wanted(self, thread_id: str) -> bool:
        if self.tenant is None:
            return True
        return self.index.split(thread_id)[0] == self.tenant

    def _age(self, tenant_key: str, size: int, ts: float | None) -> None:
        bucket = age_bucket(None if ts is None else max(0.0, self.now - ts))
        per = self.age_bytes.setdefault(tenant_key, {})
        per[bucket] = per.get(bucket, 0) + size

    def _tenant_key(self, thread_id: str) -> str:
        tenant = self.index.split(thread_id)[0]
        return tenant if tenant is not None else "(unknown tenant)"

    def _tick(self, n: int) -> None:
        self._done += n
        if self.progress:
            self.progress(self._done, self._total)

    def run(self) -> None:
        self._total = sum(self.raw.counts().values())
        for rows in self.raw.checkpoints():
            for row in rows:
                if self._wanted(row.thread_id):
                    self._checkpoint(row)
            self._tick(len(rows))
        for blobs in self.raw.blobs():
            for blob in blobs:
                if not self._wanted(blob.thread_id) or blob.blob is None:
                    continue
                if _value_unsealed(blob.type, blob.blob):
                    self._unsealed("checkpoint_blobs")
                stored = self.threads.setdefault(blob.thread_id, _Stored())
                stored.stored_bytes += len(blob.blob)
                if is_token(blob.blob):
                    stored.versions.add(token_key_version(blob.blob))
                ts = self._blob_ts.get((blob.thread_id, blob.checkpoint_ns, blob.channel,
                                        blob.version), stored.last)
                self._age(self._tenant_key(blob.thread_id), len(blob.blob), ts)
            self._tick(len(blobs))
        for writes in self.raw.writes():
            for w in writes:
                if not self._wanted(w.thread_id) or w.value is None:
                    continue
                if _value_unsealed(w.type, w.value):
                    self._unsealed("checkpoint_writes" if self.raw.has_blobs else "writes")
                stored = self.threads.setdefault(w.thread_id, _Stored())
                stored.stored_bytes += len(w.value)
                if is_token(w.value):
                    stored.versions.add(token_key_version(w.value))
                ts = self._ckpt_ts.get((w.thread_id, w.checkpoint_ns, w.checkpoint_id),
                                       stored.last)
                self._age(self._tenant_key(w.thread_id), len(w.value), ts)
            self._tick(len(writes))

    def _checkpoint(self, row: CheckpointRow) -> None:
        if _checkpoint_unsealed(row):
            self._unsealed("checkpoints")
        stored = self.threads.setdefault(row.thread_id, _Stored())
        stored.checkpoints += 1
        stored.stored_bytes += row.size
        stored.versions |= _versions_of(row)
        ts = _checkpoint_epoch(row.ts)
        if ts is not None:
            stored.first = ts if stored.first is None else min(stored.first, ts)
            stored.last = ts if stored.last is None else max(stored.last, ts)
        self._ckpt_ts[(row.thread_id, row.checkpoint_ns, row.checkpoint_id)] = ts
        if self.raw.has_blobs and ts is not None:
            for channel, version in row.channel_versions.items():
                key = (row.thread_id, row.checkpoint_ns, channel, str(version))
                known = self._blob_ts.get(key)
                self._blob_ts[key] = ts if known is None else min(known, ts)
        self._age(self._tenant_key(row.thread_id), row.size, ts)


def _vault_kinds(saver: _Source, tenant: str | None) -> dict[str, dict[str, int]]:
    from .pii_vault import pii_vault
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
PREFIX_LEN = len(thread_prefix("x"))     # "t" + 24 hex + ":"
_SEP_KIND, _SEP_ITEM = "\x1e", "\x1f"


def _bucket_bounds(now: float) -> list[float]:
    """Epoch lower bounds of the age buckets (a row at ts falls in bucket k when
    ts > bounds[k] and ts <= bounds[k-1])."""
    return [now - upper for _label, upper in AGE_BUCKETS[:-1]]


# the part of the audit statement both dialects share: registered and unregistered threads
# with their storage aggregates and PII kinds, owner then thread
_AUDIT_ROWS = f"""rows AS (
    SELECT reg.tenant AS owner, reg.thread_id AS thread, 1 AS registered, reg.created_at,
           reg.last_activity, reg.expires_at, reg.legal_hold, reg.policy_source, reg.idle_ttl,
           reg.max_age, reg.state, st.*
    FROM reg LEFT JOIN st ON st.inner_id = reg.inner_id
    UNION ALL
    SELECT tg.tenant AS owner, CASE WHEN tg.tenant IS NULL THEN st.inner_id
           ELSE substr(st.inner_id, {PREFIX_LEN + 1}) END AS thread, 0 AS registered,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, st.*
    FROM st LEFT JOIN tags tg ON tg.prefix = substr(st.inner_id, 1, {PREFIX_LEN})
    WHERE NOT EXISTS (SELECT 1 FROM reg WHERE reg.inner_id = st.inner_id))
SELECT rows.*, pii.kinds FROM rows
LEFT JOIN pii ON pii.tenant = rows.owner AND pii.thread_id = rows.thread
ORDER BY CASE WHEN rows.owner IS NULL THEN 1 ELSE 0 END, rows.owner, rows.thread
"""  # noqa: S608


# "a checkpoint row SecureSaver could not have written" (_checkpoint_unsealed) on PostgreSQL's
# JSONB rows: the body is not an object, the metadata holds no sealed string (``->`` on a NULL or
# a non-object metadata is NULL: counted too), or channel_values inlines a value (JSON holds no
# ciphertext bytes: any value there is plain). 1 or 0, summed per thread.
_PG_CHECKPOINT_UNSEALED = """(CASE WHEN jsonb_typeof({x}.checkpoint) IS DISTINCT FROM 'object'
    OR jsonb_typeof({x}.metadata -> '__securesaver__') IS DISTINCT FROM 'string'
    OR (jsonb_typeof({x}.checkpoint -> 'channel_values') = 'object'
        AND {x}.checkpoint -> 'channel_values' <> '{{}}'::jsonb) THEN 1 ELSE 0 END)"""
# a blob or write that is not a typed-bytes ciphertext (_value_unsealed); NULL values are not
# stored bytes and are not counted
_PG_VALUE_UNSEALED = ("(CASE WHEN x.blob IS NOT NULL AND (x.type IS DISTINCT FROM 'bytes' OR "
                      "length(x.blob) < {n} OR substring(x.blob from 1 for 3) <> "
                      "'\\x535301'::bytea) THEN 1 ELSE 0 END)")


def _sql_inventory(dialect: str, tenants: list[str], tenant: str | None, now: float
                   ) -> tuple[str, dict[str, Any]]:
    """One grouped statement: registry rows joined with per-thread storage aggregates and PII
    kinds, ordered by (tenant, thread). Runs on the registry's engine when it shares the inner
    saver's database (see :func:`~langgraph_securesaver.pruner.shares_database`)."""
    pg = dialect == "postgresql"
    params: dict[str, Any] = {}
    values = []
    for i, name in enumerate(tenants):
        params[f"tn{i}"], params[f"tp{i}"] = name, thread_prefix(name)
        values.append(f"(:tn{i}, :tp{i})")
    # every fragment below is a constant of this function; values are bound parameters
    tags = "SELECT * FROM (VALUES " + ", ".join(values) + ") AS v(tenant, prefix)" if pg else (  # noqa: S608
        "VALUES " + ", ".join(values))
    bounds = _bucket_bounds(now)
    if pg:
        size = "(pg_column_size(c.checkpoint) + pg_column_size(c.metadata))"
        ts = "((c.checkpoint ->> 'ts') COLLATE \"C\")"
        ts_ok = f"{ts} ~ '^[0-9]{{4}}-[0-9][0-9]-[0-9][0-9]T'"
        for k, b in enumerate(bounds):
            params[f"b{k}"] = iso(b)
        md_text = "(c.metadata ->> '__securesaver__')"
        ck_versions = "NULL"
        blob_len, hexv = "length({0})", "encode(substring({0} from 4 for 4), 'hex')"
        magic = "substring({0} from 1 for 3) = '\\x535301'::bytea"
        agg = "string_agg(DISTINCT {0}, ',')"
        kinds = "string_agg(p.kind || chr(30) || p.n, chr(31))"
        ck_unsealed = _PG_CHECKPOINT_UNSEALED.format(x="c")
    else:
        size = "(length(c.checkpoint) + coalesce(length(c.metadata), 0))"
        ts = "securesaver_ckpt_ts(c.type, c.checkpoint)"
        ts_ok = f"{ts} IS NOT NULL"
        for k, b in enumerate(bounds):
            params[f"b{k}"] = b
        md_text = "json_extract(CAST(c.metadata AS TEXT), '$.__securesaver__')"
        ck_versions = "group_concat(DISTINCT securesaver_token_versions(c.checkpoint))"
        blob_len, hexv = "length({0})", "hex(substr({0}, 4, 4))"
        magic = "substr({0}, 1, 3) = X'535301'"
        agg = "group_concat(DISTINCT {0})"
        kinds = "group_concat(p.kind || char(30) || p.n, char(31))"
        # the checkpoint body is msgpack: only the strict serializer can tell a foreign
        # payload, so the row predicate itself runs as a scalar function inside this pass
        ck_unsealed = "securesaver_ckpt_unsealed(c.type, c.checkpoint, c.metadata)"
    where_ck = where_st = where_reg = where_pii = ""
    if tenant is not None:
        params["prefix"], params["tenant"] = thread_prefix(tenant), tenant
        # a key range on the primary key (binary collation: byte order), then the exact test
        params["prefix_end"] = thread_prefix(tenant)[:-1] + chr(ord(":") + 1)
        where_ck = ("WHERE c.thread_id >= :prefix AND c.thread_id < :prefix_end "
                    "AND substr(c.thread_id, 1, :plen) = :prefix")
        where_st = ("WHERE x.thread_id >= :prefix AND x.thread_id < :prefix_end "
                    "AND substr(x.thread_id, 1, :plen) = :prefix")
        where_reg = "WHERE r.tenant = :tenant"
        where_pii = "WHERE r.tenant = :tenant"
        params["plen"] = PREFIX_LEN
    buckets = []
    for k in range(len(bounds)):
        lower = f"{ts} > :b{k}"
        upper = f" AND {ts} <= :b{k - 1}" if k else ""
        buckets.append(f"sum(CASE WHEN {ts_ok} AND {lower}{upper} THEN {size} END) AS a{k}")
    buckets.append(f"sum(CASE WHEN {ts_ok} AND {ts} <= :b{len(bounds) - 1} THEN {size} END)"
                   f" AS a{len(bounds)}")
    token_v = f"CASE WHEN {md_text} LIKE 'ss1.%' THEN substr({md_text}, 5, 12) END"

    def side(table: str, column: str) -> str:
        col = f"x.{column}"
        length = blob_len.format(col)
        version = (f"CASE WHEN {length} >= 35 AND {magic.format(col)} "
                   f"THEN {hexv.format(col)} END")
        unsealed = (f"CASE WHEN {col} IS NOT NULL AND (x.type IS NULL OR x.type <> 'bytes' "
                    f"OR {length} < {MIN_TOKEN_BYTES} OR NOT ({magic.format(col)})) "
                    "THEN 1 ELSE 0 END")
        return (f"SELECT x.thread_id, sum({length}) AS bytes, {agg.format(version)} AS v, "  # noqa: S608
                f"sum({unsealed}) AS u FROM {table} x {where_st} GROUP BY x.thread_id")

    blobs = side("checkpoint_blobs", "blob") if pg else (
        "SELECT NULL AS thread_id, NULL AS bytes, NULL AS v, NULL AS u WHERE 0")
    writes = side("checkpoint_writes", "blob") if pg else side("writes", "value")
    first, last = (f"min(CASE WHEN {ts_ok} THEN {ts} END)", f"max(CASE WHEN {ts_ok} THEN {ts} END)")
    sql = f"""
WITH tags(tenant, prefix) AS ({tags}),
ck AS (
    SELECT c.thread_id, count(*) AS n, sum({size}) AS bytes, {first} AS first_ts,
           {last} AS last_ts, {", ".join(buckets)},
           sum(CASE WHEN NOT ({ts_ok}) OR {ts} IS NULL THEN {size} END) AS au,
           {agg.format(token_v)} AS mv, {ck_versions} AS cv, sum({ck_unsealed}) AS uc
    FROM checkpoints c {where_ck} GROUP BY c.thread_id),
bl AS ({blobs}),
wr AS ({writes}),
ids AS (SELECT thread_id FROM ck UNION SELECT thread_id FROM bl UNION SELECT thread_id FROM wr),
st AS (
    SELECT ids.thread_id AS inner_id, ck.n, ck.bytes AS ck_bytes, ck.first_ts, ck.last_ts,
           {", ".join(f"ck.a{k}" for k in range(len(bounds) + 1))}, ck.au, ck.mv, ck.cv,
           bl.bytes AS bl_bytes, bl.v AS bv, wr.bytes AS wr_bytes, wr.v AS wv, ck.uc,
           bl.u AS ub, wr.u AS uw
    FROM ids LEFT JOIN ck ON ck.thread_id = ids.thread_id
    LEFT JOIN bl ON bl.thread_id = ids.thread_id LEFT JOIN wr ON wr.thread_id = ids.thread_id),
reg AS (
    SELECT r.tenant, r.thread_id, r.created_at, r.last_activity, r.expires_at, r.legal_hold,
           r.policy_source, r.idle_ttl, r.max_age, r.state, tags.prefix || r.thread_id AS inner_id
    FROM securesaver_threads r JOIN tags ON tags.tenant = r.tenant {where_reg}),
pii AS (
    SELECT p.tenant, p.thread_id, {kinds} AS kinds FROM (
        SELECT r.tenant, r.thread_id, r.kind, count(*) AS n FROM securesaver_pii_refs r
        JOIN securesaver_pii_vault v ON v.tenant = r.tenant AND v.token = r.token {where_pii}
        GROUP BY r.tenant, r.thread_id, r.kind) p
    GROUP BY p.tenant, p.thread_id),
{_AUDIT_ROWS}"""  # noqa: S608
    return sql, params


def _sql_inventory_pg(tenants: list[str], tenant: str | None, now: float
                      ) -> tuple[str, dict[str, Any]]:
    """PostgreSQL: every stored row is projected once (size, timestamp, age bucket, key
    version from the ciphertext header) and folded by ONE hash aggregate per thread (no
    DISTINCT aggregates, so the planner can hash and parallelize); key versions are a bit
    mask (versions < 63) plus a list of larger ones."""
    params: dict[str, Any] = {}
    values = []
    for i, name in enumerate(tenants):
        params[f"tn{i}"], params[f"tp{i}"] = name, thread_prefix(name)
        values.append(f"(:tn{i}, :tp{i})")
    bounds = _bucket_bounds(now)
    for k, b in enumerate(bounds):
        params[f"b{k}"] = iso(b)
    where = reg_where = pii_where = ""
    if tenant is not None:
        # LIKE with a constant prefix (the tag is hex, no wildcard): exact in every collation,
        # and a range scan of the primary key under C / C.UTF-8
        params.update(like=thread_prefix(tenant) + "%", tenant=tenant)
        where = "WHERE x.thread_id LIKE :like"
        reg_where = pii_where = "WHERE r.tenant = :tenant"
    bucket = " ".join(f"WHEN ts > :b{k} THEN {k}" for k in range(len(bounds)))
    n_buckets = len(bounds) + 1
    version = ("CASE WHEN vb IS NOT NULL AND length(vb) >= 7 AND "
               "substring(vb from 1 for 3) = '\\x535301'::bytea THEN "
               "(get_byte(vb, 3)::bigint << 24) | (get_byte(vb, 4) << 16) | "
               "(get_byte(vb, 5) << 8) | get_byte(vb, 6) END")

    def binary(table: str, kind: str) -> str:
        return f"""
    SELECT thread_id, 0 AS n, 0 AS ckb, {"size" if kind == "bl" else "0"} AS blb,
           {"size" if kind == "wr" else "0"} AS wrb, NULL::text AS ts, NULL::int AS bk,
           {version} AS v, 0 AS uc, {"bad" if kind == "bl" else "0"} AS ub,
           {"bad" if kind == "wr" else "0"} AS uw
    FROM (SELECT x.thread_id, length(x.blob) AS size,
                 CASE WHEN length(x.blob) >= 35 THEN substring(x.blob from 1 for 7) END AS vb,
                 {_PG_VALUE_UNSEALED.format(n=MIN_TOKEN_BYTES)} AS bad
          FROM {table} x {where} OFFSET 0) y"""  # noqa: S608

    sql = f"""
WITH tags(tenant, prefix) AS (SELECT * FROM (VALUES {", ".join(values)}) AS v(tenant, prefix)),
u AS (
    SELECT thread_id, 1 AS n, size AS ckb, 0 AS blb, 0 AS wrb, ts,
           CASE WHEN ts IS NULL THEN {n_buckets} {bucket} ELSE {n_buckets - 1} END AS bk,
           {version} AS v, uc, 0 AS ub, 0 AS uw
    FROM (SELECT thread_id, size, uc, CASE WHEN t LIKE '____-__-__T%' THEN t END AS ts,
                 CASE WHEN m ~ '^ss1\\.[A-Za-z0-9_-]{{12}}'
                      THEN decode(translate(substr(m, 5, 12), '-_', '+/'), 'base64') END AS vb
          FROM (SELECT x.thread_id,
                       pg_column_size(x.checkpoint) + pg_column_size(x.metadata) AS size,
                       (x.checkpoint ->> 'ts') COLLATE "C" AS t,
                       x.metadata ->> '__securesaver__' AS m,
                       {_PG_CHECKPOINT_UNSEALED.format(x="x")} AS uc
                FROM checkpoints x {where} OFFSET 0) c0
          OFFSET 0) c1
    UNION ALL {binary("checkpoint_blobs", "bl")}
    UNION ALL {binary("checkpoint_writes", "wr")}),
st AS (
    SELECT thread_id AS inner_id, sum(n) AS n, sum(ckb) AS ck_bytes, sum(blb) AS bl_bytes,
           sum(wrb) AS wr_bytes, min(ts) AS first_ts, max(ts) AS last_ts,
           {", ".join(f"sum(ckb) FILTER (WHERE bk = {k}) AS a{k}" for k in range(n_buckets))},
           sum(ckb) FILTER (WHERE bk = {n_buckets}) AS au,
           bit_or(1::bigint << v::int) FILTER (WHERE v < 63) AS vmask,
           array_agg(v) FILTER (WHERE v >= 63) AS vbig,
           sum(uc) AS uc, sum(ub) AS ub, sum(uw) AS uw
    FROM u GROUP BY thread_id),
reg AS (
    SELECT r.tenant, r.thread_id, r.created_at, r.last_activity, r.expires_at, r.legal_hold,
           r.policy_source, r.idle_ttl, r.max_age, r.state, tags.prefix || r.thread_id AS inner_id
    FROM securesaver_threads r JOIN tags ON tags.tenant = r.tenant {reg_where}),
pii AS (
    SELECT p.tenant, p.thread_id, string_agg(p.kind || chr(30) || p.n, chr(31)) AS kinds
    FROM (SELECT r.tenant, r.thread_id, r.kind, count(*) AS n FROM securesaver_pii_refs r
          JOIN securesaver_pii_vault v ON v.tenant = r.tenant AND v.token = r.token {pii_where}
          GROUP BY r.tenant, r.thread_id, r.kind) p
    GROUP BY p.tenant, p.thread_id),
{_AUDIT_ROWS}"""  # noqa: S608
    return sql, params


def _row_versions(r: Any) -> list[int]:
    if "vmask" in r:
        mask = int(r["vmask"] or 0)
        found = {int(v) for v in (r["vbig"] or ())}
        while mask:
            low = mask & -mask
            found.add(low.bit_length() - 1)
            mask ^= low
        return sorted(found)
    return sorted(_versions(("b64", r["mv"]), ("dec", r["cv"]), ("hex", r["bv"]),
                            ("hex", r["wv"])))


def _versions(*fields: Any) -> set[int]:
    """Key versions from the aggregate columns: hex of the 4 version bytes (binary tokens),
    base64url chunks of text tokens' headers, or decimal lists (SQLite's scan function)."""
    import base64
    import binascii
    out: set[int] = set()
    for kind, field_value in fields:
        if not field_value:
            continue
        for item in str(field_value).split(","):
            item = item.strip()
            if not item:
                continue
            try:
                if kind == "hex":
                    out.add(int(item, 16))
                elif kind == "dec":
                    out.add(int(item))
                else:
                    raw = base64.urlsafe_b64decode(item + "=" * (-len(item) % 4))
                    if raw[:3] == b"SS\x01" and len(raw) >= 7:
                        out.add(int.from_bytes(raw[3:7], "big"))
            except (ValueError, binascii.Error):
                continue
    return out


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return _checkpoint_epoch(str(value))


def _sqlite_functions(conn: Any) -> None:
    """Scalar functions the SQLite inventory uses on msgpack checkpoint rows (no decoding of
    the document: the timestamp and the ciphertext headers are found by their encoding)."""
    raw = conn.connection.driver_connection
    raw.create_function("securesaver_ckpt_ts", 2, _msgpack_ts, deterministic=True)
    raw.create_function("securesaver_token_versions", 1, _msgpack_token_versions,
                        deterministic=True)
    raw.create_function("securesaver_ckpt_unsealed", 3, _sqlite_checkpoint_unsealed,
                        deterministic=True)


def _sqlite_checkpoint_unsealed(type_: Any, checkpoint: Any, metadata: Any) -> int:
    """_checkpoint_unsealed of a SQLite checkpoints row, decoded exactly as the Python walk
    decodes it (strict serializer, inert placeholders; nothing is evaluated)."""
    from .raw_tables import decode_sqlite_checkpoint
    try:
        row = decode_sqlite_checkpoint(("", "", "", None, type_, checkpoint, metadata))
        return 1 if _checkpoint_unsealed(row) else 0
    except Exception:  # noqa: BLE001 - a row this cannot even look at is not SecureSaver's
        return 1


def _msgpack_ts(type_: Any, blob: Any) -> float | None:
    if not isinstance(blob, bytes) or type_ != "msgpack":
        return None
    at = blob.find(b"\xa2ts")
    while at >= 0:
        head = at + 3
        if head < len(blob):
            marker = blob[head]
            if 0xA0 <= marker <= 0xBF:
                start, length = head + 1, marker & 0x1F
            elif marker == 0xD9 and head + 1 < len(blob):
                start, length = head + 2, blob[head + 1]
            else:
                start, length = -1, 0
            if start > 0:
                try:
                    return datetime.fromisoformat(
                        blob[start:start + length].decode("ascii")).timestamp()
                except (UnicodeDecodeError, ValueError):
                    pass
        at = blob.find(b"\xa2ts", at + 1)
    return None


def _msgpack_token_versions(blob: Any) -> str | None:
    """Versions of the ciphertexts stored as msgpack bin values in a checkpoint document."""
    from .crypto import MIN_TOKEN_BYTES
    if not isinstance(blob, bytes):
        return None
    found: set[int] = set()
    at = blob.find(b"SS\x01")
    while at >= 0:
        size = None
        if at >= 2 and blob[at - 2] == 0xC4:
            size = blob[at - 1]
        elif at >= 3 and blob[at - 3] == 0xC5:
            size = int.from_bytes(blob[at - 2:at], "big")
        elif at >= 5 and blob[at - 5] == 0xC6:
            size = int.from_bytes(blob[at - 4:at], "big")
        if size is not None and MIN_TOKEN_BYTES <= size <= len(blob) - at:
            found.add(int.from_bytes(blob[at + 3:at + 7], "big"))
            at = blob.find(b"SS\x01", at + size)
        else:
            at = blob.find(b"SS\x01", at + 1)
    return ",".join(str(v) for v in sorted(found)) or None


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

    def unsealed_rows(self, r: Any) -> None:
        for column, table in (("uc", "checkpoints"), ("ub", "checkpoint_blobs"),
                              ("uw", self.writes_table)):
            n = int(r[column] or 0)
            if n:
                self.unsealed[table] = self.unsealed.get(table, 0) + n

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
        from .registry import tenant_keys
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
              totals: _Totals, progress: Callable[[int, int], None] | None
              ) -> Iterator[ThreadAudit]:
    """Stream ThreadAudits from the grouped statement (server-side cursor on PostgreSQL)."""
    registry = saver.registry
    if not tenants:
        return
    if registry.dialect == "postgresql":
        sql, params = _sql_inventory_pg(tenants, tenant, now)
    else:
        sql, params = _sql_inventory(registry.dialect, tenants, tenant, now)
    total = 0
    if progress:
        from .registry import threads as threads_table
        q = sa.select(sa.func.count()).select_from(threads_table)
        if tenant is not None:
            q = q.where(threads_table.c.tenant == tenant)
        with registry.begin() as conn:
            total = int(conn.execute(q).scalar() or 0)
    done = 0
    with registry.begin() as conn:
        if registry.dialect == "sqlite":
            _sqlite_functions(conn)
        elif registry.dialect == "postgresql":
            # one big aggregate: JIT compilation costs more than it saves, and a little more
            # sort memory keeps the ordering off disk
            conn.exec_driver_sql("SET LOCAL jit = off")
            conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")
        result = conn.execution_options(stream_results=True, yield_per=2000).execute(
            sa.text(sql), params)
        for r in result.mappings():
            done += 1
            if progress and done % 1000 == 0:
                progress(done, max(total, done))
            checkpoints = int(r["n"] or 0)
            stored = int(r["ck_bytes"] or 0) + int(r["bl_bytes"] or 0) + int(r["wr_bytes"] or 0)
            owner = r["owner"]
            first, last = _epoch(r["first_ts"]), _epoch(r["last_ts"])
            if r["inner_id"] is not None:
                _ages(totals, "(unknown tenant)" if owner is None else owner, r, first, last)
                totals.unsealed_rows(r)
            if owner is None:
                totals.orphan(r["thread"], checkpoints, stored)
                continue
            registered = bool(r["registered"])
            hold = bool(r["legal_hold"]) if registered else False
            expires = r["expires_at"]
            created, activity = r["created_at"], r["last_activity"]
            idle, max_age = r["idle_ttl"], r["max_age"]
            held_past = hold and (
                (idle is not None and activity is not None and activity + idle <= now)
                or (max_age is not None and created is not None and created + max_age <= now))
            th = ThreadAudit(
                owner, r["thread"], created, activity, expires, hold,
                r["policy_source"], idle, max_age, r["state"], checkpoints, stored,
                _row_versions(r),
                _kinds_of(r["kinds"]) if r["kinds"] else {}, first, last,
                registered=registered,
                overdue=registered and expires is not None and expires <= now and not hold,
                held_past_ttl=bool(held_past))
            totals.thread(th)
            yield th
    if progress:
        progress(done, max(total, done))


_AGE_COLUMNS = [f"a{k}" for k in range(len(AGE_BUCKETS))]


def _ages(totals: _Totals, key: str, r: Any, first: float | None, last: float | None) -> None:
    per = totals.age_slots(key)
    for k, column in enumerate(_AGE_COLUMNS):
        per[k] += r[column] or 0
    per[-1] += r["au"] or 0
    # blobs are aged by the thread's first checkpoint (a channel value's history goes back
    # that far), pending writes by its latest one
    if r["bl_bytes"]:
        per[_slot(totals.now, first)] += r["bl_bytes"]
    if r["wr_bytes"]:
        per[_slot(totals.now, last)] += r["wr_bytes"]


def _slot(now: float, ts: float | None) -> int:
    if ts is None:
        return len(AGE_BUCKETS)
    age = max(0.0, now - ts)
    for k, (_label, upper) in enumerate(AGE_BUCKETS):
        if age < upper:
            return k
    return len(AGE_BUCKETS) - 1


def _kinds_of(text: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in str(text or "").split(_SEP_ITEM):
        kind, sep, n = item.rpartition(_SEP_KIND)
        if sep:
            out[kind] = out.get(kind, 0) + int(n)
    return out


@dataclass
class AuditSummary:
    """What a streamed audit knows at its end (the thread rows went to the output)."""

    generated_at: float
    backend: str
    tenant_filter: str | None
    tenants: list[TenantAudit]
    orphans: list[dict[str, Any]]
    age_bytes: dict[str, dict[str, int]]
    problems: list[str]
    threads: int
    overdue: int
    orphan_count: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


class AuditDatabase:
    """The audit's and the trail's view of a database opened by URL, where the registry and
    the inner saver's tables live together (what the CLI opens): the registry's engine only.
    No inner saver, no keyring, no LangGraph import -- the grouped statements need none.
    Operator access: it refuses to run inside a tenant scope (use a SecureSaver there)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def _admin_tenant(self, operation: str, tenant: Any = None) -> str | None:
        from .errors import AccessDenied
        from .tenancy import current_tenant_scope, validate_tenant
        if current_tenant_scope() is not None:
            raise AccessDenied(f"{operation} on an AuditDatabase is operator access; inside a "
                               "tenant scope use the SecureSaver's own methods")
        return None if tenant is None else validate_tenant(tenant)

    @staticmethod
    def inner_tables(dialect: str) -> tuple[str, ...]:
        """The inner saver's tables the grouped statements read."""
        if dialect == "postgresql":
            return ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
        return ("checkpoints", "writes")

    def has_inner_tables(self) -> bool:
        inspector = sa.inspect(self.registry.engine)
        return all(inspector.has_table(name)
                   for name in self.inner_tables(self.registry.dialect))


def _shares_database(saver: _Source) -> bool:
    if isinstance(saver, AuditDatabase):
        return True
    from .pruner import shares_database
    return shares_database(saver)


def iter_audit(saver: _Source, *, tenant: str | None = None, now: float | None = None,
               progress: Callable[[int, int], None] | None = None
               ) -> tuple[Iterator[ThreadAudit], Callable[[], AuditSummary]]:
    """The inventory as a stream: ``(threads, finish)``. Iterate ``threads`` (sorted by tenant
    and thread) to the end, then call ``finish()`` for the per-tenant totals and problems.

    With the registry in the inner saver's database (``from_url``) everything is aggregated
    by one grouped statement and streamed with a server-side cursor: memory stays flat however
    many threads there are. Otherwise the rows are walked in Python (see :func:`audit`)."""
    from .timeargs import to_epoch
    tenant = saver._admin_tenant("audit", tenant)
    now = time.time() if now is None else float(to_epoch(now, "now") or 0.0)
    registry = saver.registry
    all_tenants = registry.tenants()
    if tenant is not None and tenant not in all_tenants:
        raise ConfigurationError(f"unknown tenant {tenant!r}: it has no threads or keys here")
    if not isinstance(saver, AuditDatabase) and not _shares_database(saver):
        report = _audit_walk(saver, all_tenants, tenant, now, progress)

        def finish_walk() -> AuditSummary:
            return AuditSummary(report.generated_at, report.backend, tenant, report.tenants,
                                report.orphans, report.age_bytes, report.problems,
                                len(report.threads), len(report.overdue), len(report.orphans))
        return iter(report.threads), finish_walk
    backend = "postgres" if registry.dialect == "postgresql" else "sqlite"
    totals = _Totals(saver, all_tenants, tenant, now)
    stream = _iter_sql(saver, all_tenants, tenant, now, totals, progress)

    def finish() -> AuditSummary:
        tenants, problems = totals.finish()
        problems += _unsealed_problems(totals.unsealed)
        return AuditSummary(now, backend, tenant, tenants, totals.orphans,
                            totals.age_bytes, problems, totals.threads, totals.overdue,
                            totals.orphan_count)
    return stream, finish


def _unsealed_problems(unsealed: dict[str, int]) -> list[str]:
    return [f"{n} row(s) of {table} hold data SecureSaver never writes (undecodable, or not a "
            "sealed ciphertext): tampered; run `securesaver scan --verify` for where"
            for table, n in sorted(unsealed.items())]


def audit(saver: _Source, *, tenant: str | None = None, now: float | None = None,
          progress: Callable[[int, int], None] | None = None) -> AuditReport:
    """Inventory of the database behind ``saver`` (optionally one tenant). Reads only.
    Inside a tenant scope it covers that tenant only (see SecureSaver._admin_tenant).

    Builds the whole report in memory; :func:`audit_stream` writes it out as it is read."""
    stream, finish = iter_audit(saver, tenant=tenant, now=now, progress=progress)
    threads = list(stream)
    summary = finish()
    return AuditReport(summary.generated_at, summary.backend, tenant, summary.tenants,
                       threads, summary.orphans, summary.age_bytes, summary.problems)


def audit_stream(saver: _Source, out: TextIO, *, tenant: str | None = None,
                 now: float | None = None,
                 progress: Callable[[int, int], None] | None = None) -> AuditSummary:
    """Write the inventory as one JSON object, streamed: ``threads`` first (one thread per
    line, as read), then ``tenants``, ``orphans``, ``stored_bytes_by_age``, ``problems`` and
    ``ok`` (the same keys as ``AuditReport.as_dict()``). Memory stays flat."""
    stream, finish = iter_audit(saver, tenant=tenant, now=now, progress=progress)
    out.write('{"threads": [')
    first = True
    for th in stream:
        out.write("\n" if first else ",\n")
        out.write(thread_json(th))
        first = False
    summary = finish()
    tail = {
        "tenants": [t.as_dict() for t in summary.tenants], "orphans": summary.orphans,
        "orphan_count": summary.orphan_count, "stored_bytes_by_age": summary.age_bytes,
        "age_buckets": [label for label, _ in AGE_BUCKETS] + [UNKNOWN_AGE],
        "generated_at": iso(summary.generated_at), "backend": summary.backend,
        "tenant": tenant, "problems": summary.problems, "ok": summary.ok}
    out.write("\n],\n")
    out.write(",\n".join(f"{json.dumps(k)}: {json.dumps(v, default=str)}"
                         for k, v in tail.items()))
    out.write("}\n")
    return summary


def _audit_walk(saver: SecureSaver, all_tenants: list[str], tenant: str | None, now: float,
                progress: Callable[[int, int], None] | None) -> AuditReport:
    """The inventory when the registry is not in the inner saver's database: one pass over
    the raw rows in Python (memory grows with the number of threads)."""
    registry = saver.registry
    from .raw_tables import TenantIndex
    index = TenantIndex(all_tenants)
    walk = _StorageWalk(saver, index, tenant, now, progress)
    walk.run()
    inventory = saver.pii_inventory(tenant)
    held_past = {(r.tenant, r.thread_id) for r in registry.expired_but_held(now, tenant)}

    threads: list[ThreadAudit] = []
    covered: set[str] = set()
    for row in registry.list_threads(tenant):
        inner_id = _inner_id(row.tenant, row.thread_id)
        covered.add(inner_id)
        stored = walk.threads.get(inner_id, _Stored())
        threads.append(ThreadAudit(
            row.tenant, row.thread_id, row.created_at, row.last_activity, row.expires_at,
            bool(row.legal_hold), row.policy_source, row.idle_ttl, row.max_age, row.state,
            stored.checkpoints, stored.stored_bytes, sorted(stored.versions),
            inventory.get((row.tenant, row.thread_id), {}), stored.first, stored.last,
            registered=True,
            overdue=row.expires_at is not None and row.expires_at <= now
            and not row.legal_hold,
            held_past_ttl=(row.tenant, row.thread_id) in held_past))
    orphans: list[dict[str, Any]] = []
    for inner_id, stored in sorted(walk.threads.items()):
        if inner_id in covered:
            continue
        owner, thread = index.split(inner_id)
        if owner is None:
            orphans.append({"thread_id": inner_id, "checkpoints": stored.checkpoints,
                            "stored_bytes": stored.stored_bytes})
            continue
        threads.append(ThreadAudit(
            owner, thread, None, None, None, False, None, None, None, None, stored.checkpoints,
            stored.stored_bytes, sorted(stored.versions), inventory.get((owner, thread), {}),
            stored.first, stored.last, registered=False))
    threads.sort(key=lambda t: (t.tenant, t.thread_id))

    vault = _vault_kinds(saver, tenant)
    tenants: list[TenantAudit] = []
    for name in ([tenant] if tenant is not None else all_tenants):
        mine = [t for t in threads if t.tenant == name]
        keys = registry.load_key_rows(name)
        data = sorted(r.version for r in keys if r.purpose == "data")
        policy, source = registry.effective_policy(name)
        created = [t.created_at for t in mine if t.created_at is not None]
        tenants.append(TenantAudit(
            name, threads=len(mine), checkpoints=sum(t.checkpoints for t in mine),
            stored_bytes=sum(t.stored_bytes for t in mine),
            key_versions=sorted({v for t in mine for v in t.key_versions}),
            current_data_key=data[-1] if data else None, data_keys=data,
            master_versions=sorted({r.master_version for r in keys}),
            pii=vault.get(name, {}), first_created=min(created) if created else None,
            overdue=sum(t.overdue for t in mine), held=sum(t.legal_hold for t in mine),
            unregistered=sum(not t.registered for t in mine),
            policy={"source": source, **policy.as_row()}))

    report = AuditReport(now, walk.raw.backend, tenant, tenants, threads, orphans,
                         walk.age_bytes)
    overdue = report.overdue
    if overdue:
        report.problems.append(
            f"{len(overdue)} thread(s) past their expiry are still stored: retention is not "
            "being executed (schedule `securesaver prune`)")
    unregistered = [t for t in threads if not t.registered]
    if unregistered:
        report.problems.append(
            f"{len(unregistered)} stored thread(s) have no registry row: no retention policy "
            "applies to them")
    if orphans:
        report.problems.append(
            f"{len(orphans)} stored thread(s) belong to no known tenant")
    report.problems += _unsealed_problems(walk.unsealed)
    return report


def _inner_id(tenant: str, thread_id: str) -> str:
    from .tenancy import inner_thread_id
    return inner_thread_id(tenant, thread_id)


# --------------------------------------------------------------------------------------------
# the audit trail
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrailEntry:
    """An event (``kind`` as recorded) or a deletion receipt (``kind`` = ``receipt:<action>``)."""

    at: float
    kind: str
    tenant: str | None
    thread_id: str | None
    actor: str | None
    detail: dict[str, Any]
    source: str            # "event" | "receipt"
    ref: str               # event id or receipt id

    def as_dict(self) -> dict[str, Any]:
        return {"at": iso(self.at), "kind": self.kind, "tenant": self.tenant,
                "thread_id": self.thread_id, "actor": self.actor, "detail": self.detail,
                "source": self.source, "id": self.ref}


def _kind_matches(kind: str, wanted: str | None) -> bool:
    return wanted is None or kind == wanted or kind.split(":", 1)[0] == wanted


def events(saver: _Source, *, tenant: str | None = None, thread_id: str | None = None,
           kind: str | None = None, since: float | None = None, until: float | None = None,
           limit: int | None = None) -> list[TrailEntry]:
    """Audit events and deletion receipts, oldest first. ``kind`` matches an event kind
    (``access_denied``), ``receipt`` (every receipt) or ``receipt:deleted`` (one action).
    Inside a tenant scope: that tenant's entries only."""
    tenant = saver._admin_tenant("events", tenant)
    registry = saver.registry
    out: list[TrailEntry] = []
    if kind is None or not kind.startswith("receipt"):
        for e in registry.list_events(kind=kind, tenant=tenant, thread_id=thread_id,
                                      since=since, until=until):
            out.append(TrailEntry(e.at, e.kind, e.tenant, e.thread_id, e.actor, e.detail,
                                  "event", str(e.id)))
    if kind is None or kind.startswith("receipt"):
        for r in registry.list_receipts(tenant=tenant, thread_id=thread_id, since=since,
                                        until=until):
            entry_kind = f"receipt:{r.action}"
            if not _kind_matches(entry_kind, kind):
                continue
            detail = {"reason": r.reason, **r.detail}
            out.append(TrailEntry(r.deleted_at, entry_kind, r.tenant, r.thread_id,
                                  r.requested_by, detail, "receipt", r.receipt_id))
    out.sort(key=lambda e: (e.at, e.source, e.ref))
    if limit is not None:
        out = out[-limit:]
    return out
