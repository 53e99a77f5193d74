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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import ConfigurationError
from ..keys.tokens import is_token, token_key_version
from ..textsafety import json_safe
from .report import (
    AGE_BUCKETS,
    UNKNOWN_AGE,
    AuditReport,
    AuditSummary,
    TenantAudit,
    ThreadAudit,
    _checkpoint_epoch,
    age_bucket,
    iso,
    registry_number,
    thread_json,
)
from .sql import (
    AuditDatabase,
    _iter_sql,
    _Totals,
    _vault_kinds,
    checkpoint_unsealed,
    checkpoint_versions,
    value_unsealed,
)

if TYPE_CHECKING:

    from ..services import SaverLike as SecureSaver
    from ..storage.raw_tables import CheckpointRow, TenantIndex
    from .sql import _Source

# (raw_tables, and through it LangGraph, is imported by the Python walk only: the grouped
# statement needs the registry's engine and nothing else)

logger = logging.getLogger(__name__)

@dataclass
class _Stored:
    checkpoints: int = 0
    stored_bytes: int = 0
    versions: set[int] = field(default_factory=set)
    first: float | None = None
    last: float | None = None


class _StorageWalk:
    """One pass over the inner tables: per inner thread id, what is stored and how old."""

    def __init__(self, saver: SecureSaver, index: TenantIndex, tenant: str | None, now: float,
                 progress: Callable[[int, int], None] | None) -> None:
        from ..storage.raw_tables import raw_tables_for
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
        if not size:                     # (an empty value ages nothing, as in the statement)
            return
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
                if not self._wanted(blob.thread_id):
                    continue
                # a row without a value still names its thread (as in the statement)
                stored = self.threads.setdefault(blob.thread_id, _Stored())
                if blob.blob is None:
                    continue
                if value_unsealed(blob.type, blob.blob):
                    self._unsealed("checkpoint_blobs")
                stored.stored_bytes += len(blob.blob)
                if is_token(blob.blob):
                    stored.versions.add(token_key_version(blob.blob))
                ts = self._blob_ts.get((blob.thread_id, blob.checkpoint_ns, blob.channel,
                                        blob.version), stored.last)
                self._age(self._tenant_key(blob.thread_id), len(blob.blob), ts)
            self._tick(len(blobs))
        for writes in self.raw.writes():
            for w in writes:
                if not self._wanted(w.thread_id):
                    continue
                stored = self.threads.setdefault(w.thread_id, _Stored())
                if w.value is None:
                    continue
                if value_unsealed(w.type, w.value):
                    self._unsealed("checkpoint_writes" if self.raw.has_blobs else "writes")
                stored.stored_bytes += len(w.value)
                if is_token(w.value):
                    stored.versions.add(token_key_version(w.value))
                ts = self._ckpt_ts.get((w.thread_id, w.checkpoint_ns, w.checkpoint_id),
                                       stored.last)
                self._age(self._tenant_key(w.thread_id), len(w.value), ts)
            self._tick(len(writes))

    def _checkpoint(self, row: CheckpointRow) -> None:
        if checkpoint_unsealed(row):
            self._unsealed("checkpoints")
        stored = self.threads.setdefault(row.thread_id, _Stored())
        stored.checkpoints += 1
        stored.stored_bytes += row.size
        stored.versions |= checkpoint_versions(row)
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


def _admin_tenant(saver: _Source, operation: str, tenant: Any) -> str | None:
    """The scope rule of whatever the audit reads (a saver's tenant gate, or the operator-only
    rule of an AuditDatabase)."""
    if isinstance(saver, AuditDatabase):
        return saver.admin_tenant(operation, tenant)
    return saver.services.gate.admin_tenant(operation, tenant)


def _shares_database(saver: _Source) -> bool:
    """Whether the registry's connections see the inner saver's tables (an AuditDatabase is
    opened on one database)."""
    if isinstance(saver, AuditDatabase):
        return True
    services = saver.services
    return services.storage.shares_database(services.registry.engine)


SOURCES = ("auto", "summaries", "recount")


def iter_audit(saver: _Source, *, tenant: str | None = None, now: float | None = None,
               progress: Callable[[int, int], None] | None = None, source: str = "auto"
               ) -> tuple[Iterator[ThreadAudit], Callable[[], AuditSummary]]:
    """The inventory as a stream: ``(threads, finish)``. Iterate ``threads`` (sorted by tenant
    and thread, in code-point order), then call ``finish()`` for the per-tenant totals and
    problems: they cover every thread even if the iteration stopped early (the rest is read
    then, or read again if the stream was closed).

    With the registry in the inner saver's database (``from_url``) everything is aggregated
    by one grouped statement and streamed as its rows arrive: memory stays flat however
    many threads there are. Otherwise the rows are walked in Python (see :func:`audit`).

    ``source``: ``recount`` reads every raw row (the grouped statement); ``summaries`` reads
    the maintained summaries (:mod:`.summaries`: one row per thread, the raw rows of the
    threads whose summary is due); ``auto`` the summaries once they are built and the scope
    holds at least ``summaries.AUTO_THRESHOLD`` threads. From summaries, stored threads
    without a registry row are not listed: ``scan --verify`` reports them."""
    if source not in SOURCES:
        raise ConfigurationError(f"source must be one of {', '.join(SOURCES)}")
    from ..timeargs import to_epoch
    tenant = _admin_tenant(saver, "audit", tenant)
    now = time.time() if now is None else float(to_epoch(now, "now") or 0.0)
    registry = saver.registry
    all_tenants = registry.tenants()
    if tenant is not None and tenant not in all_tenants:
        raise ConfigurationError(f"unknown tenant {tenant!r}: it has no threads or keys here")
    if not isinstance(saver, AuditDatabase) and not _shares_database(saver):
        report = _audit_walk(saver, all_tenants, tenant, now, progress)

        def finish_walk() -> AuditSummary:
            return _with_store(saver, all_tenants, tenant, now, AuditSummary(
                report.generated_at, report.backend, tenant, report.tenants,
                report.orphans, report.age_bytes, report.problems,
                len(report.threads), len(report.overdue), len(report.orphans)))
        return iter(report.threads), finish_walk
    backend = "postgres" if registry.dialect == "postgresql" else "sqlite"
    totals = _Totals(saver, all_tenants, tenant, now)
    due = _summaries_plan(saver, all_tenants, tenant, now, source)
    if due is not None:
        from .summaries import iter_summaries

        def read(t: _Totals) -> Iterator[ThreadAudit]:
            return iter_summaries(saver, all_tenants, tenant, now, t, due)
    else:
        def read(t: _Totals) -> Iterator[ThreadAudit]:
            return _iter_sql(saver, all_tenants, tenant, now, t, progress)
    stream = read(totals)

    def finish() -> AuditSummary:
        # a caller that stopped early still gets every thread's totals, as from the walk
        nonlocal totals
        for _ in stream:
            pass
        if not totals.complete:          # the stream was closed before its end: read again
            totals = _Totals(saver, all_tenants, tenant, now)
            for _ in read(totals):
                pass
        tenants, problems = totals.finish()
        problems += _unsealed_problems(totals.unsealed)
        return _with_store(saver, all_tenants, tenant, now, AuditSummary(
            now, backend, tenant, tenants, totals.orphans, totals.age_bytes, problems,
            totals.threads, totals.overdue, totals.orphan_count))
    return stream, finish


def _with_store(saver: _Source, all_tenants: list[str], tenant: str | None, now: float,
                summary: AuditSummary) -> AuditSummary:
    """The summary plus the SecureStore items of the database (:mod:`.store_items`)."""
    from .store_items import audit_store
    store = audit_store(saver.registry.engine, all_tenants, tenant, now)
    if store is not None:
        summary.store = store.as_dict()
        summary.problems = [*summary.problems, *store.problems]
    return summary


def _summaries_plan(saver: _Source, tenants: list[str], tenant: str | None, now: float,
                    source: str) -> dict[str, list[str]] | None:
    """The due threads per tenant when the audit reads summaries; None: the raw rows
    (``recount``; ``auto`` below the threshold, before the summaries were built, or when
    more than half the scope is due: then one statement over everything is faster)."""
    if source == "recount":
        return None
    from . import summaries
    if source == "auto" and not summaries.built(saver.registry):
        return None
    size, due = summaries.plan(saver.registry, tenants, tenant, now)
    if source == "auto" and (size < summaries.AUTO_THRESHOLD
                             or 2 * sum(len(v) for v in due.values()) > size):
        return None
    return due


def _unsealed_problems(unsealed: dict[str, int]) -> list[str]:
    return [f"{n} row(s) of {table} hold data SecureSaver never writes (undecodable, or not a "
            "sealed ciphertext): tampered; run `securesaver scan --verify` for where"
            for table, n in sorted(unsealed.items())]


def audit(saver: _Source, *, tenant: str | None = None, now: float | None = None,
          progress: Callable[[int, int], None] | None = None, source: str = "auto"
          ) -> AuditReport:
    """Inventory of the database behind ``saver`` (optionally one tenant). Reads only.
    Inside a tenant scope it covers that tenant only (see :meth:`..gate.TenantGate.admin_tenant`).

    Builds the whole report in memory; :func:`audit_stream` writes it out as it is read."""
    stream, finish = iter_audit(saver, tenant=tenant, now=now, progress=progress,
                                source=source)
    threads = list(stream)
    summary = finish()
    return AuditReport(summary.generated_at, summary.backend, tenant, summary.tenants,
                       threads, summary.orphans, summary.age_bytes, summary.problems,
                       store=summary.store)


def audit_stream(saver: _Source, out: TextIO, *, tenant: str | None = None,
                 now: float | None = None,
                 progress: Callable[[int, int], None] | None = None, source: str = "auto"
                 ) -> AuditSummary:
    """Write the inventory as one JSON object, streamed: ``threads`` first (one thread per
    line, as read), then ``tenants``, ``orphans``, ``stored_bytes_by_age``, ``problems`` and
    ``ok`` (the same keys as ``AuditReport.as_dict()``). Memory stays flat."""
    stream, finish = iter_audit(saver, tenant=tenant, now=now, progress=progress,
                                source=source)
    out.write('{"threads": [')
    lines: list[str] = []
    separator = "\n"
    for th in stream:
        lines.append(thread_json(th))
        if len(lines) == 256:     # one write per few hundred threads, not two per thread
            out.write(separator + ",\n".join(lines))
            lines.clear()
            separator = ",\n"
    if lines:
        out.write(separator + ",\n".join(lines))
    summary = finish()
    tail = {
        "tenants": [t.as_dict() for t in summary.tenants], "orphans": summary.orphans,
        "orphan_count": summary.orphan_count, "stored_bytes_by_age": summary.age_bytes,
        "age_buckets": [label for label, _ in AGE_BUCKETS] + [UNKNOWN_AGE],
        "generated_at": iso(summary.generated_at), "backend": summary.backend,
        "tenant": tenant, "problems": summary.problems, "ok": summary.ok,
        **({"store": summary.store} if summary.store is not None else {})}
    out.write("\n],\n")
    out.write(",\n".join(f"{json.dumps(k)}: {json_safe(json.dumps(v, default=str))}"
                         for k, v in tail.items()))
    out.write("}\n")
    return summary


def _audit_walk(saver: SecureSaver, all_tenants: list[str], tenant: str | None, now: float,
                progress: Callable[[int, int], None] | None) -> AuditReport:
    """The inventory when the registry is not in the inner saver's database: one pass over
    the raw rows in Python (memory grows with the number of threads)."""
    registry = saver.registry
    from ..storage.raw_tables import TenantIndex
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
        expires = registry_number(row.expires_at)
        threads.append(ThreadAudit(
            row.tenant, row.thread_id, registry_number(row.created_at),
            registry_number(row.last_activity), expires, bool(row.legal_hold),
            row.policy_source, registry_number(row.idle_ttl), registry_number(row.max_age),
            row.state, stored.checkpoints, stored.stored_bytes, sorted(stored.versions),
            inventory.get((row.tenant, row.thread_id), {}), stored.first, stored.last,
            registered=True,
            overdue=expires is not None and expires <= now and not row.legal_hold,
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
    from ..tenancy import inner_thread_id
    return inner_thread_id(tenant, thread_id)
