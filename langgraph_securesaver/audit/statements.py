"""The audit's inventory statement, one form per dialect, as named constants: registry rows
joined with per-thread storage aggregates of the inner saver's tables and the PII kinds,
ordered by (tenant, thread). Values are bound parameters; only constants are formatted in.

Knows the tables' layouts and the token format; nothing of keys, sealing or the saver.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any

from ..keys.tokens import MAGIC, MIN_TOKEN_BYTES, TEXT_PREFIX
from ..tenancy import thread_prefix
from .report import AGE_BUCKETS, _checkpoint_epoch

PREFIX_LEN = len(thread_prefix("x"))     # "t" + 24 hex + ":"
#: SQLite's aggregate ``(type, checkpoint, metadata, size, now)`` over a thread's checkpoint
#: rows (registered by ``audit_sql``, which reads its result)
CHECKPOINT_FOLD = "securesaver_ckpt_fold"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def ts_threshold(now: float, upper: float) -> str:
    """The least ts text of LangGraph's form (TS_SHAPES, microseconds) younger than ``upper``
    as the walk reckons it (``now - epoch(ts) < upper``, floats and all): a ts is younger
    exactly when its text sorts at or after this one. Below or past the years 1-9999: a text
    before or after every such ts."""
    def text(us: int) -> str:
        return (_EPOCH + timedelta(microseconds=us)).isoformat()

    def younger(us: int) -> bool:
        return now - (_checkpoint_epoch(text(us)) or 0.0) < upper

    us = int((now - upper) * 1_000_000)
    try:
        while younger(us - 1):
            us -= 1
        while not younger(us):
            us += 1
        return text(us)
    except OverflowError:
        return "0" if now - upper < 0 else "~"


# SQLite's storage columns of a thread (``st``), in the order both arms of ``rows`` give them
_SQLITE_ST = ("inner_id", "n", "ck_bytes", "fold", "bl_bytes", "wr_bytes", "wv", "ub", "uw")
# a stored id's thread part, cut as bytes: SQLite's substr() of a TEXT stops at a NUL, which
# a database writer can put in an id (the tag is ASCII: its bytes are its characters)
_SQLITE_THREAD_PART = f"CAST(substr(CAST(st.inner_id AS BLOB), {PREFIX_LEN + 1}) AS TEXT)"
# SQLite's rows: every stored thread, with its tenant's tag and its registry row looked up by
# primary key (and matched on the whole id), then the registered threads that store nothing
# (no row in either table, by primary key). No join of two computed tables: SQLite scans those
# in a nested loop (an audit of 20k threads spent a minute there). Owner then thread.
_SQLITE_AUDIT_ROWS = f"""rows AS (
    SELECT tg.tenant AS owner, CASE WHEN tg.tenant IS NULL THEN st.inner_id
           ELSE {_SQLITE_THREAD_PART} END AS thread,
           CASE WHEN r.tenant IS NULL THEN 0 ELSE 1 END AS registered, r.created_at,
           r.last_activity, r.expires_at, r.legal_hold, r.policy_source, r.idle_ttl,
           r.max_age, r.state, {", ".join(f"st.{c}" for c in _SQLITE_ST)}
    FROM st LEFT JOIN tags tg ON tg.prefix = substr(st.inner_id, 1, {PREFIX_LEN})
    LEFT JOIN securesaver_threads r ON r.tenant = tg.tenant
        AND r.thread_id = {_SQLITE_THREAD_PART} AND tg.prefix || r.thread_id = st.inner_id
    UNION ALL
    SELECT reg.tenant, reg.thread_id, 1, reg.created_at, reg.last_activity, reg.expires_at,
           reg.legal_hold, reg.policy_source, reg.idle_ttl, reg.max_age, reg.state,
           {", ".join("NULL" for _ in _SQLITE_ST)}
    FROM reg
    WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = reg.inner_id)
      AND NOT EXISTS (SELECT 1 FROM writes w WHERE w.thread_id = reg.inner_id))
SELECT rows.*, pii.kinds FROM rows
LEFT JOIN pii ON pii.tenant = rows.owner AND pii.thread_id = rows.thread
ORDER BY CASE WHEN rows.owner IS NULL THEN 1 ELSE 0 END, rows.owner, rows.thread
"""  # noqa: S608


def inventory_sqlite(tenants: list[str], tenant: str | None, now: float,
                     only: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """SQLite: one grouped statement, registry rows joined with per-thread storage aggregates
    and PII kinds, ordered by (tenant, thread). Runs on the registry's engine when it shares
    the inner saver's database (see :func:`~langgraph_securesaver.ops.pruner.shares_database`).

    The checkpoint body is msgpack: only the strict serializer can read it as the walk does,
    so a thread's checkpoint rows are folded by one Python aggregate function (``fold``: ts,
    age buckets, key versions, unsealed rows; see ``audit_sql.CheckpointFold``) that is called
    once per row and decodes each row once."""
    params: dict[str, Any] = {}
    values = []
    for i, name in enumerate(tenants):
        params[f"tn{i}"], params[f"tp{i}"] = name, thread_prefix(name)
        values.append(f"(:tn{i}, :tp{i})")
    # every fragment below is a constant of this function; values are bound parameters
    tags = "VALUES " + ", ".join(values)
    params["now"] = now
    size = "(coalesce(length(c.checkpoint), 0) + coalesce(length(c.metadata), 0))"
    blob_len, hexv = "length({0})", "hex(substr({0}, 4, 4))"
    magic = "substr({0}, 1, 3) = X'535301'"
    agg = "group_concat(DISTINCT {0})"
    # JSON [type, kind, count] triples, not a separated list: a kind is free text in the
    # database, or any SQLite value (a blob travels as hex: its text need not be UTF-8)
    kinds = ("json_group_array(json_array(typeof(p.kind), CASE WHEN typeof(p.kind) = 'blob' "
             "THEN hex(p.kind) ELSE p.kind END, p.n))")
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
        if only is not None:      # these registered threads of the tenant only (summaries)
            params["only_inner"] = json.dumps([thread_prefix(tenant) + t for t in only])
            params["only"] = json.dumps(only)
            where_ck += " AND c.thread_id IN (SELECT value FROM json_each(:only_inner))"
            where_st += " AND x.thread_id IN (SELECT value FROM json_each(:only_inner))"
            where_reg += " AND r.thread_id IN (SELECT value FROM json_each(:only))"
            where_pii += " AND r.thread_id IN (SELECT value FROM json_each(:only))"

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

    writes = side("writes", "value")
    # the fold is named once: SQLite calls an aggregate's step once per row of its group
    sql = f"""
WITH tags(tenant, prefix) AS ({tags}),
ck AS (
    SELECT c.thread_id, count(*) AS n, sum({size}) AS bytes,
           {CHECKPOINT_FOLD}(c.type, c.checkpoint, c.metadata, {size}, :now) AS fold
    FROM checkpoints c {where_ck} GROUP BY c.thread_id),
wr AS ({writes}),
st AS (
    SELECT thread_id AS inner_id, sum(n) AS n, sum(ck_bytes) AS ck_bytes, max(fold) AS fold,
           NULL AS bl_bytes, sum(wr_bytes) AS wr_bytes, max(wv) AS wv, NULL AS ub,
           sum(uw) AS uw
    FROM (SELECT thread_id, n, bytes AS ck_bytes, fold, NULL AS wr_bytes, NULL AS wv,
                 NULL AS uw FROM ck
          UNION ALL SELECT thread_id, NULL, NULL, NULL, bytes, v, u FROM wr)
    GROUP BY thread_id),
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
{_SQLITE_AUDIT_ROWS}"""  # noqa: S608
    return sql, params


# PostgreSQL's statement. Each inner table is folded per thread on its own (a parallel partial
# aggregate: no OFFSET fences, no DISTINCT aggregates). For the checkpoints, the costly part is
# reading the JSONB documents (~0.3 us a key lookup), so each row's document is read once, in a
# projection of its own (``per_row``): its ts, sealed-metadata token, channel values and size.
# That projection carries a set-returning ``generate_series(1, 1)`` (one row per row): a
# subquery with one is never flattened into the aggregate above, which would otherwise
# re-evaluate each lookup in every aggregate that names it (a naive per-table form took 33 s)
# and sort the whole documents with the groups (an external merge of 140 MB per worker); a
# LATERAL jsonb_to_record does the same for ~3x the cost of the lookups (a function scan
# materializes its one row per row). The first fold groups the rows by thread, age bucket, the
# token's first 13 characters (the header but for the key version's two lowest bits, which the
# 14th character shares with the nonce: those two bits are folded by a bit_or beside it; a
# longer key would be a group per row, the nonce being random), odd ts and the unsealed flag;
# the second per thread. The key version is decoded per thread in Python; the age bucket is one
# width_bucket over the bucket bounds.
# a text token (``ss1.`` + base64url of the binary one) starts with this: the prefix, then
# the magic's three bytes as four characters
SEALED_TEXT_PREFIX = TEXT_PREFIX + base64.urlsafe_b64encode(MAGIC).decode()
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"  # by value
# A checkpoint's ts in the form LangGraph writes (UTC, whole seconds or microseconds:
# ``datetime.now(timezone.utc).isoformat()``) is bucketed and ordered as text; any other ts
# (another offset or separator, a date only, a number, an object) is grouped by its JSON value
# and aged in Python as the walk ages it. The shape is tested with LIKE, not a regular
# expression: PostgreSQL's regex costs 2-5 us a row (+2.7 s on the 1M-checkpoint build), LIKE
# 0.04 us. So a text of the shape that is no date ("2026-02-30T...", hour 24, letters for
# digits) -- which only an edit in the database can put there -- is aged by its text where the
# walk says "unknown age"; its bytes and counts are reported all the same.
TS_SHAPES = ("____-__-__T__:__:__+00:00", "____-__-__T__:__:__.______+00:00")
_PG_CHECKPOINTS = """ck AS (
    SELECT thread_id, sum(n) AS n, sum(bytes) AS bytes,
           min(first_ts) FILTER (WHERE wb IS NOT NULL) AS first_ts,
           max(last_ts) FILTER (WHERE wb IS NOT NULL) AS last_ts, {buckets},
           sum(bytes) FILTER (WHERE wb IS NULL AND o IS NULL) AS au,
           array_agg(o) FILTER (WHERE o IS NOT NULL) AS ots,
           array_agg(bytes) FILTER (WHERE o IS NOT NULL) AS obytes,
           array_agg(substr(k, 9, 5) || '.' || lo) FILTER (WHERE k LIKE :sealed_like) AS mv,
           coalesce(sum(n) FILTER (WHERE unsealed AND k LIKE :sealed_like), 0)
           + coalesce(sum(n) FILTER (WHERE k IS NULL OR k NOT LIKE :sealed_like), 0) AS u
    FROM (SELECT thread_id, width_bucket(CASE WHEN shaped THEN raw END,
                                         CAST(:bounds AS text[])) AS wb,
                 substr(token, 1, 13) AS k,
                 CASE WHEN raw IS NULL OR shaped THEN NULL ELSE doc -> 'ts' END AS o, unsealed,
                 count(*) AS n,
                 bit_or(1 << ((strpos(:b64, substr(token, 14, 1)) - 1) / 16)) AS lo,
                 sum(size) AS bytes, min(raw) AS first_ts, max(raw) AS last_ts
          FROM (SELECT *, raw LIKE :shape0 OR raw LIKE :shape1 AS shaped
                FROM (SELECT x.thread_id, x.checkpoint AS doc,
                             (x.checkpoint ->> 'ts') COLLATE "C" AS raw,
                             substr(x.metadata ->> '__securesaver__', 1, 14) AS token,
                             -- (the common {{}} answers the first test: one lookup)
                             (jsonb_typeof(x.checkpoint) IS DISTINCT FROM 'object'
                              OR coalesce(x.checkpoint -> 'channel_values' <> '{{}}'::jsonb
                                  AND jsonb_typeof(x.checkpoint -> 'channel_values')
                                      = 'object', false)) AS unsealed,
                             pg_column_size(x.checkpoint) + pg_column_size(x.metadata) AS size,
                             generate_series(1, 1) AS once
                      FROM checkpoints x {where}) per_row) r
          GROUP BY 1, 2, 3, 4, 5) c
    GROUP BY thread_id)"""
# Blobs and pending writes: grouped by thread and the 4 version bytes of a ciphertext's header
# (as is_token), decoded per group. Only slices of a value are read (length, and substring,
# which detoasts a prefix): get_byte detoasts the whole value -- four of them on a 200 kB
# compressed blob cost 100x the slices.
_PG_BINARY = f"""SELECT thread_id, sum(bytes) AS bytes,
           bit_or(1::bigint << v::int) FILTER (WHERE v < 63) AS vmask,
           array_agg(v) FILTER (WHERE v >= 63) AS vbig, sum(u) AS u
    FROM (SELECT thread_id, (get_byte(h, 0)::bigint << 24) | (get_byte(h, 1) << 16)
                 | (get_byte(h, 2) << 8) | get_byte(h, 3) AS v, bytes, u
          FROM (SELECT x.thread_id,
                       CASE WHEN length(x.blob) >= {MIN_TOKEN_BYTES}
                            AND substring(x.blob from 1 for 3) = '\\x535301'::bytea
                       THEN substring(x.blob from 4 for 4) END AS h,
                       sum(length(x.blob)) AS bytes,
                       sum(CASE WHEN x.blob IS NOT NULL AND (x.type IS DISTINCT FROM 'bytes'
                           OR length(x.blob) < {MIN_TOKEN_BYTES}
                           OR substring(x.blob from 1 for 3) <> '\\x535301'::bytea)
                           THEN 1 ELSE 0 END) AS u
                FROM {{table}} x {{where}} GROUP BY 1, 2) g) y
    GROUP BY thread_id"""  # noqa: S608 - constants only
# sums leave as bigint, not numeric: the driver reads numeric as Decimal, ~1 s per 100k
# threads of the audit's time
_PG_INVENTORY = """
WITH tags(tenant, prefix) AS (SELECT * FROM (VALUES {tags}) AS v(tenant, prefix)),
{checkpoints},
bl AS ({blobs}),
wr AS ({writes}),
st AS (
    SELECT thread_id AS inner_id, ck.n::bigint AS n, ck.bytes::bigint AS ck_bytes,
           bl.bytes::bigint AS bl_bytes, wr.bytes::bigint AS wr_bytes, ck.first_ts,
           ck.last_ts, {ages}, ck.au::bigint AS au, ck.ots, ck.obytes,
           coalesce(bl.vmask, 0) | coalesce(wr.vmask, 0) AS vmask,
           array_cat(bl.vbig, wr.vbig) AS vbig, ck.mv, ck.u::bigint AS uc,
           bl.u::bigint AS ub, wr.u::bigint AS uw
    FROM ck FULL JOIN bl USING (thread_id) FULL JOIN wr USING (thread_id)),
reg AS (
    SELECT r.tenant, r.thread_id, r.created_at, r.last_activity, r.expires_at, r.legal_hold,
           r.policy_source, r.idle_ttl, r.max_age, r.state, tags.prefix || r.thread_id AS inner_id
    FROM securesaver_threads r JOIN tags ON tags.tenant = r.tenant {reg_where}),
pii AS (
    SELECT p.tenant, p.thread_id, json_object_agg(p.kind, p.n) AS kinds
    FROM (SELECT r.tenant, r.thread_id, r.kind, count(*) AS n FROM securesaver_pii_refs r
          JOIN securesaver_pii_vault v ON v.tenant = r.tenant AND v.token = r.token {reg_where}
          GROUP BY r.tenant, r.thread_id, r.kind) p
    GROUP BY p.tenant, p.thread_id),
{rows}"""


# PostgreSQL's rows: one FULL JOIN of the registry with the storage aggregates (nothing is
# materialized twice); a stored thread with no registry row is owned by the tenant its tag names;
# ordered by code point (what the walk's sort gives) whatever the database's collation
_PG_AUDIT_ROWS = f"""rows AS (
    SELECT coalesce(reg.tenant, tg.tenant) AS owner,
           CASE WHEN reg.tenant IS NOT NULL THEN reg.thread_id
                WHEN tg.tenant IS NULL THEN st.inner_id
                ELSE substr(st.inner_id, {PREFIX_LEN + 1}) END AS thread,
           CASE WHEN reg.tenant IS NULL THEN 0 ELSE 1 END AS registered, reg.created_at,
           reg.last_activity, reg.expires_at, reg.legal_hold, reg.policy_source, reg.idle_ttl,
           reg.max_age, reg.state, st.*
    FROM reg FULL JOIN st ON st.inner_id = reg.inner_id
    LEFT JOIN tags tg ON reg.tenant IS NULL AND tg.prefix = substr(st.inner_id, 1, {PREFIX_LEN}))
SELECT rows.*, pii.kinds FROM rows
LEFT JOIN pii ON pii.tenant = rows.owner AND pii.thread_id = rows.thread
ORDER BY CASE WHEN rows.owner IS NULL THEN 1 ELSE 0 END, rows.owner COLLATE "C",
         rows.thread COLLATE "C"
"""  # noqa: S608


def inventory_pg(tenants: list[str], tenant: str | None, now: float,
                 only: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """PostgreSQL's form of the inventory statement (see the constants above)."""
    params: dict[str, Any] = {"sealed_like": SEALED_TEXT_PREFIX + "%", "b64": B64URL,
                              "shape0": TS_SHAPES[0], "shape1": TS_SHAPES[1]}
    values = []
    for i, name in enumerate(tenants):
        params[f"tn{i}"], params[f"tp{i}"] = name, thread_prefix(name)
        values.append(f"(:tn{i}, :tp{i})")
    # width_bucket wants the lower bounds ascending: age bucket k is width bucket n - k, and
    # the ISO texts compare in byte order (the ts column is COLLATE "C")
    params["bounds"] = [ts_threshold(now, upper) for _label, upper in reversed(AGE_BUCKETS[:-1])]
    n = len(AGE_BUCKETS) - 1
    where = reg_where = ""
    if tenant is not None:
        # LIKE with a constant prefix (the tag is hex, no wildcard): exact in every collation,
        # and a range scan of the primary key under C / C.UTF-8
        params.update(like=thread_prefix(tenant) + "%", tenant=tenant)
        where = "WHERE x.thread_id LIKE :like"
        reg_where = "WHERE r.tenant = :tenant"
        if only is not None:      # these registered threads of the tenant only (summaries)
            params["only_inner"] = [thread_prefix(tenant) + t for t in only]
            params["only"] = list(only)
            where += " AND x.thread_id = ANY(CAST(:only_inner AS text[]))"
            reg_where += " AND r.thread_id = ANY(CAST(:only AS text[]))"
    checkpoints = _PG_CHECKPOINTS.format(
        buckets=", ".join(f"sum(bytes) FILTER (WHERE wb = {n - k}) AS a{k}"
                          for k in range(n + 1)), where=where)

    def binary(table: str) -> str:
        return _PG_BINARY.format(table=table, where=where)

    sql = _PG_INVENTORY.format(
        tags=", ".join(values), checkpoints=checkpoints, blobs=binary("checkpoint_blobs"),
        writes=binary("checkpoint_writes"),
        ages=", ".join(f"ck.a{k}::bigint AS a{k}" for k in range(n + 1)),
        reg_where=reg_where, rows=_PG_AUDIT_ROWS)
    return sql, params
