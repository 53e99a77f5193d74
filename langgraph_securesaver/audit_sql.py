"""The audit aggregated by the database: one grouped statement over the registry, the inner
saver's tables and the PII tables (SQLite and PostgreSQL forms), streamed, folded into the
per-tenant totals; and :class:`AuditDatabase`, the light source the CLI opens on a URL (the
registry's engine alone: no inner saver, no keyring, no LangGraph).

Knows the tables' layouts and the report types; nothing of keys, sealing or the saver.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .audit_report import (
    AGE_BUCKETS,
    UNKNOWN_AGE,
    TenantAudit,
    ThreadAudit,
    _checkpoint_epoch,
    iso,
)
from .crypto import MIN_TOKEN_BYTES, is_token
from .tenancy import thread_prefix

if TYPE_CHECKING:
    from typing import TypeAlias

    from .raw_tables import CheckpointRow
    from .registry import Registry
    from .services import SaverLike as SecureSaver

    _Source: TypeAlias = "SecureSaver | AuditDatabase"   # what the audit and the trail read

logger = logging.getLogger("langgraph_securesaver.audit")


# the row predicates both the Python walk (:mod:`.audit`) and the statements use
def _checkpoint_unsealed(row: CheckpointRow) -> bool:
    """A checkpoint row SecureSaver could not have written (parse error, a foreign payload,
    no sealed metadata, or a channel value that is not a ciphertext)."""
    return (row.error is not None or row.foreign is not None
            or not isinstance((row.metadata or {}).get("__securesaver__"), str)
            or not all(is_token(v) for v in row.channel_values.values()))


def _value_unsealed(type_: str | None, value: bytes) -> bool:
    """A blob or write that is not a typed-``bytes`` ciphertext."""
    return type_ != "bytes" or not is_token(value)


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


class AuditDatabase:
    """The audit's and the trail's view of a database opened by URL, where the registry and
    the inner saver's tables live together (what the CLI opens): the registry's engine only.
    No inner saver, no keyring, no LangGraph import -- the grouped statements need none.
    Operator access: it refuses to run inside a tenant scope (use a SecureSaver there)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def admin_tenant(self, operation: str, tenant: Any = None) -> str | None:
        """The scope rule of an AuditDatabase: operator only (refused inside a tenant scope)."""
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
