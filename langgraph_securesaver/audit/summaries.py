"""Maintained audit summaries: per-thread and per-tenant storage totals kept in SecureSaver's
own tables, so the audit of a large database reads one row per thread instead of every
checkpoint, blob and write ever stored.

Not kept on the write path (a turn writes nothing more than before): a thread's summary is
*due* while it may miss a write --

* it has no summary row, or one refreshed before the thread's last activity plus the writers'
  activity resolution (a write is at most that long after the registry's last activity: see
  ``SaverServices.touch_due``), or one marked changed at or after its refresh (the paths that
  change stored rows without touching the activity: ``prune(keep_latest)``,
  ``delete_for_runs``, ``forget_pii``), or one dated in the future, or one that says "nothing
  stored" (an emptied row never hides a thread's data).

:func:`refresh` recomputes the due threads from the raw rows (the audit's own grouped
statement, restricted to them) and is run by ``SecureSaver.setup()`` on a database without
summaries (with progress logging), by the pruner's sweep, and by ``securesaver summaries``.
The audit (:func:`iter_summaries`) reads the summaries of the threads that are not due and
recomputes the due ones from the raw rows, so its answer is exact for every thread but for an
age-bucket shift of at most the time since the summary's refresh. :func:`recount` recomputes
everything and reports drift (``scan --verify``, ``audit --recount``).

Only where the registry shares the inner saver's database (what the grouped statement needs).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..registry.dialects import upsert
from ..registry.schema import meta_table, tenant_summaries, thread_summaries, threads
from .report import AGE_BUCKETS, ThreadAudit, registry_number
from .sql import AuditDatabase, _iter_sql, _kinds_of, _stream_tuples, _Totals

if TYPE_CHECKING:
    from ..registry.core import Registry
    from .sql import _Source

logger = logging.getLogger("langgraph_securesaver.audit.summaries")

BUILT_KEY = "summaries_built_at"
RESOLUTION_KEY = "summaries_resolution"
#: the resolution assumed until a writer records its own (the saver's default)
DEFAULT_RESOLUTION = 60.0
#: ``auto``: the audit reads summaries for scopes of at least this many threads (below, the
#: grouped statement over the raw rows answers in well under a second)
AUTO_THRESHOLD = 1_000
BATCH = 500
#: a summary's stored bytes by age are as of its refresh: one older than this is due (so the
#: age buckets the audit reports are at most this far behind)
AGE_STALENESS = 86400.0
_SLOTS = len(AGE_BUCKETS) + 1


def _meta(registry: Registry, key: str) -> str | None:
    with registry.begin() as conn:
        value = conn.execute(sa.select(meta_table.c.value).where(
            meta_table.c.key == key)).scalar()
    return None if value is None else str(value)


def _set_meta(conn: Any, registry: Registry, key: str, value: str) -> None:
    conn.execute(upsert(registry.dialect, meta_table, {"key": key, "value": value},
                        [meta_table.c.key], lambda new: {"value": value}))


def resolution(registry: Registry) -> float:
    """The largest activity resolution a writer of this database recorded."""
    value = _meta(registry, RESOLUTION_KEY)
    try:
        return DEFAULT_RESOLUTION if value is None else max(0.0, float(value))
    except ValueError:
        return DEFAULT_RESOLUTION


def note_resolution(registry: Registry, seconds: float) -> None:
    """Record a writer's activity resolution (the largest one counts): once per saver setup."""
    known = _meta(registry, RESOLUTION_KEY)
    if known is not None and float(seconds) <= resolution(registry):
        return
    with registry.begin() as conn:
        _set_meta(conn, registry, RESOLUTION_KEY, repr(float(seconds)))


def built(registry: Registry) -> bool:
    """Whether the summaries of this database were built (by setup() or a refresh)."""
    return _meta(registry, BUILT_KEY) is not None


# --------------------------------------------------------------------------------------------
# the erasure and change paths
# --------------------------------------------------------------------------------------------
def mark_changed(registry: Registry, tenant: str, thread_ids: Sequence[str] | None = None,
                 now: float | None = None) -> None:
    """Stored rows of these threads (all of the tenant's: None) changed without a touch of
    their activity: their summaries are due. Called after the change committed."""
    now = time.time() if now is None else now
    q = thread_summaries.update().where(thread_summaries.c.tenant == tenant)
    with registry.begin() as conn:
        if thread_ids is None:
            conn.execute(q.values(changed_at=now))
            return
        for i in range(0, len(thread_ids), BATCH):
            conn.execute(q.where(thread_summaries.c.thread_id.in_(
                list(thread_ids[i:i + BATCH]))).values(changed_at=now))


def drop(registry: Registry, tenant: str, thread_ids: Sequence[str] | None = None,
         conn: Any = None) -> None:
    """Deleted threads (all of the tenant's: None) have no summary."""
    def run(c: Any) -> None:
        if thread_ids is None:
            c.execute(thread_summaries.delete().where(thread_summaries.c.tenant == tenant))
            c.execute(tenant_summaries.delete().where(tenant_summaries.c.tenant == tenant))
            return
        for i in range(0, len(thread_ids), BATCH):
            c.execute(thread_summaries.delete().where(
                thread_summaries.c.tenant == tenant,
                thread_summaries.c.thread_id.in_(list(thread_ids[i:i + BATCH]))))
    if conn is not None:
        run(conn)
        return
    with registry.begin() as c:
        run(c)


def drop_pairs(conn: Any, dialect: str, pairs: Sequence[tuple[str, str]]) -> None:
    """Deleted threads have no summary (in the caller's transaction: the pruner's batch)."""
    from ..registry.schema import pairs_in
    if pairs:
        conn.execute(thread_summaries.delete().where(pairs_in(
            dialect, thread_summaries.c.tenant, thread_summaries.c.thread_id, pairs)))


# --------------------------------------------------------------------------------------------
# which summaries are due
# --------------------------------------------------------------------------------------------
def _due_clause(now: float, res: float) -> Any:
    s = thread_summaries.c
    return sa.or_(s.thread_id.is_(None), s.refreshed_at.is_(None),
                  s.refreshed_at < threads.c.last_activity + res,
                  s.refreshed_at > now + res,          # (clocks a little apart are fine)
                  s.refreshed_at < now - AGE_STALENESS,
                  s.changed_at >= s.refreshed_at,
                  sa.and_(s.checkpoints <= 0, s.stored_bytes <= 0))


def _joined() -> Any:
    return threads.outerjoin(thread_summaries, sa.and_(
        thread_summaries.c.tenant == threads.c.tenant,
        thread_summaries.c.thread_id == threads.c.thread_id))


def due_threads(registry: Registry, tenant: str, now: float) -> list[str]:
    """The tenant's registered threads whose summary may miss a write (module docstring)."""
    q = (sa.select(threads.c.thread_id).select_from(_joined())
         .where(threads.c.tenant == tenant, _due_clause(now, resolution(registry))))
    with registry.begin() as conn:
        return [str(t) for t in conn.execute(q).scalars()]


def scope_size(registry: Registry, tenant: str | None) -> int:
    q = sa.select(sa.func.count()).select_from(threads)
    if tenant is not None:
        q = q.where(threads.c.tenant == tenant)
    with registry.begin() as conn:
        return int(conn.execute(q).scalar() or 0)


# --------------------------------------------------------------------------------------------
# recomputing from the raw rows
# --------------------------------------------------------------------------------------------
_Live = dict[str, tuple[ThreadAudit, list[int], dict[str, int]]]


def _live(source: _Source, tenants: list[str], tenant: str, now: float,
          only: list[str], whole: bool = False) -> _Live:
    """These registered threads of ``tenant`` recomputed from the raw rows, by thread id
    (``whole``: by one statement over the tenant's rows, when most of them are due)."""
    out: _Live = {}
    wanted = set(only) if whole else None

    def keep(th: ThreadAudit, slots: list[int], unsealed: dict[str, int]) -> None:
        if th.registered and (wanted is None or th.thread_id in wanted):
            out[th.thread_id] = (th, slots, unsealed)
    if whole:
        totals = _Totals(source, tenants, tenant, now)
        for _ in _iter_sql(source, tenants, tenant, now, totals, None, per_thread=keep):
            pass
        return out
    for i in range(0, len(only), BATCH):
        totals = _Totals(source, tenants, tenant, now)
        for _ in _iter_sql(source, tenants, tenant, now, totals, None,
                           only=only[i:i + BATCH], per_thread=keep):
            pass
    return out


def _kinds_text(kinds: dict[Any, int]) -> str:
    return json.dumps([["blob", k.hex(), n] if isinstance(k, bytes) else ["text", k, n]
                       for k, n in sorted(kinds.items(), key=lambda kv: repr(kv[0]))])


def _row(tenant: str, th: ThreadAudit, slots: list[int], unsealed: dict[str, int],
         now: float) -> dict[str, Any]:
    return {"tenant": tenant, "thread_id": th.thread_id, "checkpoints": th.checkpoints,
            "stored_bytes": th.stored_bytes, "first_ts": th.first_checkpoint,
            "last_ts": th.last_checkpoint, "key_versions": ",".join(map(str, th.key_versions)),
            "pii": _kinds_text(th.pii), "ages": json.dumps(slots),
            "unsealed": json.dumps(unsealed, sort_keys=True), "refreshed_at": now}


def refresh(source: _Source, *, tenant: str | None = None, now: float | None = None,
            progress: Callable[[int, int], None] | None = None,
            limit: int | None = None) -> int:
    """Recompute the due summaries (of one tenant, or all) from the raw rows; the number of
    threads refreshed. ``limit``: at most about this many (the pruner's sweep bounds its
    work); the rest stay due. Marks the summaries built when it covered every tenant."""
    registry = source.registry
    now = time.time() if now is None else now
    tenants = registry.tenants()
    names = [tenant] if tenant is not None else tenants
    due = {name: due_threads(registry, name, now) for name in names}
    total, done = sum(len(v) for v in due.values()), 0
    complete = True
    for name in names:
        ids = due[name]
        # most of a tenant due (a first build): one statement over its rows beats batches
        whole = len(ids) > BATCH and (limit is None or done + len(ids) <= limit) \
            and 2 * len(ids) > scope_size(registry, name)
        step = len(ids) if whole else BATCH
        for i in range(0, len(ids), step):
            if limit is not None and done >= limit:
                complete = False
                break
            found = _live(source, tenants, name, now, ids[i:i + step], whole)
            rows = [_row(name, th, slots, unsealed, now) for th, slots, unsealed in
                    found.values()]
            for j in range(0, len(rows), 5000):
                _upsert(registry, rows[j:j + 5000])
            done += len(rows)
            if progress:
                progress(done, total)
            logger.info("summaries: %d of %d due thread(s) refreshed", done, total)
        _tenant_row(registry, name, now)
    if tenant is None and complete:
        with registry.begin() as conn:
            _set_meta(conn, registry, BUILT_KEY, repr(now))
            # summaries of threads the registry no longer has (a deletion racing a refresh)
            gone = sa.select(threads.c.thread_id).where(
                threads.c.tenant == thread_summaries.c.tenant,
                threads.c.thread_id == thread_summaries.c.thread_id)
            conn.execute(thread_summaries.delete().where(~sa.exists(gone)))
    return done


def _upsert(registry: Registry, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    cols = [c for c in rows[0] if c not in ("tenant", "thread_id")]
    stmt = upsert(registry.dialect, thread_summaries, None,
                  [thread_summaries.c.tenant, thread_summaries.c.thread_id],
                  lambda new: {c: getattr(new, c) for c in cols})
    with registry.begin() as conn:
        conn.execute(stmt, rows)


def _tenant_row(registry: Registry, tenant: str, now: float) -> None:
    """The tenant's sums of its thread summaries (O(threads of the tenant), at refresh)."""
    s = thread_summaries.c
    q = sa.select(s.checkpoints, s.stored_bytes, s.first_ts, s.last_ts, s.key_versions,
                  s.unsealed).where(s.tenant == tenant)
    n = checkpoints = stored = 0
    first: float | None = None
    last: float | None = None
    versions: set[int] = set()
    unsealed: dict[str, int] = {}
    with registry.begin() as conn:
        for c, b, f, la, v, u in conn.execute(q):
            n += 1
            checkpoints += int(c)
            stored += int(b)
            if f is not None:
                first = f if first is None else min(first, f)
            if la is not None:
                last = la if last is None else max(last, la)
            versions |= _versions(v)
            for table, k in json.loads(u or "{}").items():
                unsealed[table] = unsealed.get(table, 0) + int(k)
        row = {"tenant": tenant, "threads": n, "checkpoints": checkpoints,
               "stored_bytes": stored, "first_ts": first, "last_ts": last,
               "key_versions": ",".join(map(str, sorted(versions))),
               "unsealed": json.dumps(unsealed, sort_keys=True), "refreshed_at": now}
        conn.execute(upsert(registry.dialect, tenant_summaries, row, [tenant_summaries.c.tenant],
                            lambda new: {k: v for k, v in row.items() if k != "tenant"}))


def tenant_totals(registry: Registry) -> list[dict[str, Any]]:
    """Every tenant's summary row (O(tenants)): as of each tenant's last refresh."""
    with registry.begin() as conn:
        rows = conn.execute(sa.select(tenant_summaries).order_by(tenant_summaries.c.tenant))
        return [dict(m) for m in rows.mappings()]


def _versions(text: Any) -> set[int]:
    out: set[int] = set()
    for part in str(text or "").split(","):
        try:
            out.add(int(part))
        except ValueError:
            continue
    return out


# --------------------------------------------------------------------------------------------
# the audit's reading
# --------------------------------------------------------------------------------------------
def plan(registry: Registry, tenants: list[str], tenant: str | None, now: float
         ) -> tuple[int, dict[str, list[str]]]:
    """The scope's thread count and its due threads per tenant (of ``tenants``, or
    ``tenant``): one statement for the scope, not one per tenant."""
    names = [tenant] if tenant is not None else tenants
    q = (sa.select(threads.c.tenant, threads.c.thread_id).select_from(_joined())
         .where(_due_clause(now, resolution(registry))))
    if tenant is not None:
        q = q.where(threads.c.tenant == tenant)
    found: dict[str, list[str]] = {}
    with registry.begin() as conn:
        for name, thread in conn.execute(q):
            found.setdefault(name, []).append(str(thread))
    return scope_size(registry, tenant), {n: found[n] for n in names if n in found}


def iter_summaries(source: _Source, tenants: list[str], tenant: str | None, now: float,
                   totals: _Totals, due: dict[str, list[str]] | None = None
                   ) -> Iterator[ThreadAudit]:
    """The registered threads of the scope in (tenant, thread) code-point order: summaries
    where they are not due, the raw rows where they are. Folds each into ``totals``. Stored
    threads without a registry row are not seen here: ``scan --verify`` reports them."""
    registry = source.registry
    if due is None:
        due = plan(registry, tenants, tenant, now)[1]
    live = {name: _live(source, tenants, name, now, ids, len(ids) > BATCH
                        and 2 * len(ids) > scope_size(registry, name))
            for name, ids in due.items()}
    pg = registry.dialect == "postgresql"
    params: dict[str, Any]
    if tenant is not None:
        where, params = "r.tenant = :tenant", {"tenant": tenant}
    elif pg:
        where, params = "r.tenant = ANY(CAST(:tenants AS text[]))", {"tenants": list(tenants)}
    else:
        where = "r.tenant IN (SELECT value FROM json_each(:tenants))"
        params = {"tenants": json.dumps(tenants)}
    sql = _READ.format(where=where, c=' COLLATE "C"' if pg else "")
    version_cache: dict[str, list[int]] = {}
    kinds_cache: dict[str, dict[Any, int]] = {}
    per_tenant: str | None = None
    per: list[int] = []
    with registry.begin() as conn:
        # the driver's rows as they arrive (chunked on PostgreSQL), as the grouped statement;
        # tuples in _READ's column order (a dict per row cost more than its reading)
        for row in _stream_tuples(conn, registry.dialect, sql, params):
            name, thread = row[0], row[1]
            pending = live.get(name)
            hit = pending.pop(thread, None) if pending else None
            if hit is None and row[_CHECKPOINTS] is None:   # registered since the plan
                hit = _live(source, tenants, name, now, [thread]).get(thread)
            if hit is not None:
                th, slots, unsealed = hit
            else:
                th, slots, unsealed = _from_summary(row, now, version_cache, kinds_cache)
            if name != per_tenant:
                per, per_tenant = totals.age_slots(name), name
            for k, size in enumerate(slots):
                if size:
                    per[k] += size
            if unsealed:
                for table, n in unsealed.items():
                    totals.unsealed[table] = totals.unsealed.get(table, 0) + n
            totals.thread(th)
            yield th
    totals.complete = True


# the registry rows of a scope joined with their summaries, in code-point order
_READ = """SELECT r.tenant, r.thread_id, r.created_at, r.last_activity, r.expires_at,
       r.legal_hold, r.policy_source, r.idle_ttl, r.max_age, r.state, s.checkpoints,
       s.stored_bytes, s.first_ts, s.last_ts, s.key_versions, s.pii, s.ages, s.unsealed
FROM securesaver_threads r LEFT JOIN securesaver_thread_summaries s
    ON s.tenant = r.tenant AND s.thread_id = r.thread_id
WHERE {where}
ORDER BY r.tenant{c}, r.thread_id{c}"""
#: the position of ``s.checkpoints`` in a row of ``_READ`` (NULL: the thread has no summary)
_CHECKPOINTS = 10
_RAW_DECODE = json.JSONDecoder().raw_decode


def _json_column(text: Any) -> Any:
    """``json.loads(text)`` for the summaries' JSON columns, without its per-call checks when
    ``text`` is one JSON document with nothing around it (what a refresh writes); any other
    value goes through ``json.loads``, its errors included."""
    try:
        value, end = _RAW_DECODE(text)
    except (TypeError, ValueError):
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def _from_summary(row: Sequence[Any], now: float, version_cache: dict[str, list[int]],
                  kinds_cache: dict[str, dict[Any, int]]
                  ) -> tuple[ThreadAudit, list[int], dict[str, int]]:
    (name, thread, created, activity, expires, hold, source, idle, max_age, state,
     checkpoints, stored, first, last, versions_text, pii, ages, unsealed) = row
    hold = bool(hold)
    expires, created = registry_number(expires), registry_number(created)
    activity = registry_number(activity)
    idle, max_age = registry_number(idle), registry_number(max_age)
    held_past = hold and (
        (idle is not None and activity is not None and activity + idle <= now)
        or (max_age is not None and created is not None and created + max_age <= now))
    versions = version_cache.get(versions_text)
    if versions is None:
        versions = sorted(_versions(versions_text))
        if len(version_cache) < 10_000:
            version_cache[versions_text] = versions
    kinds = kinds_cache.get(pii)
    if kinds is None:
        kinds = _kinds_of(pii) if pii and pii != "[]" else {}
        if len(kinds_cache) < 10_000:
            kinds_cache[pii] = kinds
    slots = _json_column(ages) if ages else [0] * _SLOTS
    th = ThreadAudit(   # (positional: registered, overdue, held_past_ttl)
        name, thread, created, activity, expires, hold, source, idle, max_age, state,
        int(checkpoints or 0), int(stored or 0), list(versions), dict(kinds),
        registry_number(first), registry_number(last), True,
        expires is not None and expires <= now and not hold, bool(held_past))
    return th, slots, _json_column(unsealed) if unsealed and unsealed != "{}" else {}


# --------------------------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------------------------
_COMPARED = ("checkpoints", "stored_bytes", "first_ts", "last_ts", "key_versions", "pii",
             "unsealed")


def recount(source: _Source, *, tenant: str | None = None, now: float | None = None
            ) -> list[dict[str, Any]]:
    """Recompute every thread of the scope from the raw rows and compare with the summaries
    that are not due: one finding per drifted thread (``kind`` ``summary_drift``, the fields
    that differ), and per stored thread without a registry row (``unregistered_thread``:
    the audit that reads summaries does not list those)."""
    registry = source.registry
    now = time.time() if now is None else now
    tenants = registry.tenants()
    findings: list[dict[str, Any]] = []
    fresh: dict[tuple[str, str], dict[str, Any]] = {}

    def keep(th: ThreadAudit, slots: list[int], unsealed: dict[str, int]) -> None:
        if th.registered:
            fresh[(th.tenant, th.thread_id)] = _row(th.tenant, th, slots, unsealed, now)
        else:
            findings.append({"kind": "unregistered_thread", "tenant": th.tenant,
                             "thread_id": th.thread_id, "fields": []})
    if not tenants:
        return findings
    totals = _Totals(source, tenants, tenant, now)
    for _ in _iter_sql(source, tenants, tenant, now, totals, None, per_thread=keep):
        pass
    s = thread_summaries.c
    res = resolution(registry)
    q = (sa.select(thread_summaries, threads.c.last_activity)
         .select_from(thread_summaries.join(threads, sa.and_(
             threads.c.tenant == s.tenant, threads.c.thread_id == s.thread_id))))
    if tenant is not None:
        q = q.where(s.tenant == tenant)
    with registry.begin() as conn:
        for m in conn.execute(q).mappings():
            key = (m["tenant"], m["thread_id"])
            refreshed, activity = m["refreshed_at"], registry_number(m["last_activity"])
            if (refreshed is None or (activity is not None and refreshed < activity + res)
                    or (m["changed_at"] is not None and m["changed_at"] >= refreshed)):
                continue             # due: the audit reads the raw rows for it anyway
            want = fresh.get(key)
            if want is None:
                continue
            differ = [f for f in _COMPARED if _norm(f, m[f]) != _norm(f, want[f])]
            if refreshed > now + res:    # (due too, but nothing a refresh writes)
                differ.append("refreshed_at")
            if differ:
                findings.append({"kind": "summary_drift", "tenant": key[0],
                                 "thread_id": key[1], "fields": differ})
    return findings


def _norm(field: str, value: Any) -> Any:
    if field in ("first_ts", "last_ts"):
        return None if value is None else round(float(value), 3)
    if field in ("pii", "unsealed"):
        return json.loads(value or ("[]" if field == "pii" else "{}"))
    if field == "key_versions":
        return sorted(_versions(value))
    return int(value or 0)


def on_setup(saver: Any) -> None:
    """``SecureSaver.setup()``: record the writer's activity resolution and, on a database
    whose summaries were never built (a new one, or one written by an older version), build
    them once from the raw rows, logging progress. Nothing where the registry does not share
    the inner saver's database (the audit walks the rows in Python there)."""
    if not saver.services.storage.shares_database(saver.registry.engine):
        return
    registry = saver.registry
    note_resolution(registry, saver.services.activity_resolution)
    if built(registry) or not AuditDatabase(registry).has_inner_tables():
        return
    started = time.monotonic()
    logger.info("building the audit summaries from the stored rows (once)")

    def log(done: int, total: int) -> None:
        logger.info("audit summaries: %d of %d thread(s)", done, total)
    n = refresh(saver, progress=log)
    logger.info("audit summaries built: %d thread(s) in %.1f s", n, time.monotonic() - started)
