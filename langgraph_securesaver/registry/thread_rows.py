"""Thread rows and retention policies: registering a thread on its first write, moving its
last activity forward, the stored policies (the default, per tenant, per thread) and the expiry
each row derives from them -- every field MACed as it is written.

A base class of :class:`~.core.Registry` (it uses the registry's engine, transactions and
integrity helper); the pruner's claims on these rows are :mod:`.claims`, their verification
:mod:`.verify`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import TamperedDataError
from ..retention import DEFAULT_POLICY_KEY, NO_RETENTION, RetentionPolicy
from . import integrity as mac
from .base import RegistryBase
from .dialects import greatest, upsert, upsert_returning
from .integrity import RESERVED_TENANT
from .schema import (
    ThreadRow,
    _policy_ref,
    _thread_ref,
    expires_expr,
    policies,
    tenant_keys,
    threads,
)

logger = logging.getLogger("langgraph_securesaver.registry.core")


class RegistryThreads(RegistryBase):
    """Thread rows (registration, last activity) and the retention policies they follow."""

    # threads ----------------------------------------------------------------------------------
    def touch_thread(self, tenant: str, thread_id: str, now: float | None = None,
                     policy: RetentionPolicy | None = None, state: str = "active",
                     within: Callable[[Connection, str, float], None] | None = None) -> float:
        """Register a thread (first write, with the given effective policy) or move its last
        activity forward and recompute its expiry from its stored TTLs. ``state``: "active"
        for a write (it also clears an ``emptied`` mark); "emptied" for ``delete_for_runs``
        leaving the thread without a checkpoint (:meth:`mark_emptied`); "deleting" for a
        deletion fencing the thread off (:meth:`fence_thread`). ``within(conn, state,
        last_activity)`` runs in the same transaction with the row as it stands (a write's
        lease, docs/key-lifecycle.md: it may raise to roll the touch back). Returns the row's
        last activity."""
        now = float(time.time() if now is None else now)
        policy = policy or NO_RETENTION
        integ = self._keyed()
        row = {"tenant": tenant, "thread_id": thread_id, "created_at": now, "last_activity": now,
               **policy.as_row(), "policy_source": "default",
               "expires_at": policy.expires_at(now, now), "state": state}
        row["policy_mac"] = integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(row))
        row["activity_mac"] = integ.mac(mac.THREAD_ACTIVITY, *mac.thread_activity_parts(row))

        def on_conflict(new: Any) -> dict[str, Any]:
            last = greatest(self.dialect, threads.c.last_activity, new.last_activity)
            return {
                # the MAC moves with the value it covers; every SET here reads the stored
                # row, so last_activity is set last (MySQL assigns left to right)
                "activity_mac": sa.case((new.last_activity > threads.c.last_activity,
                                         new.activity_mac), else_=threads.c.activity_mac),
                "expires_at": expires_expr(threads.c.created_at, last, threads.c.idle_ttl,
                                           threads.c.max_age, threads.c.legal_hold),
                "state": sa.case((threads.c.state == "deleting", "deleting"), else_=state),
                "last_activity": last,
            }

        with self.begin() as conn:
            stood_row = upsert_returning(
                conn, self.dialect, threads, row, [threads.c.tenant, threads.c.thread_id],
                on_conflict, [threads.c.state, threads.c.last_activity])
            stood, last = stood_row["state"], stood_row["last_activity"]
            if within is not None:
                within(conn, str(stood), float(last))
        return float(last)

    def fence_thread(self, tenant: str, thread_id: str) -> float:
        """Mark the thread ``deleting`` (registering it if it has no row): from the commit on,
        no write is granted a lease on its key. Returns its last activity: the latest lease
        granted before ends by then plus ``LEASE_FENCE``."""
        return self.touch_thread(tenant, thread_id, now=0.0, state="deleting")

    def mark_emptied(self, tenant: str, thread_ids: Sequence[str], now: float | None = None,
                     policy: RetentionPolicy | None = None) -> None:
        """``delete_for_runs`` left these threads without a checkpoint: mark them
        ``emptied`` (their last activity moves to ``now``). The retention sweep deletes such
        a thread -- key included -- once it has stayed empty and unwritten for its grace
        (:meth:`..ops.pruner.Sweep.emptied_grace`); a write first clears the mark."""
        for thread_id in thread_ids:
            self.touch_thread(tenant, thread_id, now=now, policy=policy, state="emptied")

    def get_thread(self, tenant: str, thread_id: str) -> ThreadRow | None:
        with self.begin() as conn:
            r = conn.execute(sa.select(threads).where(
                threads.c.tenant == tenant, threads.c.thread_id == thread_id)).mappings().first()
        return ThreadRow(**r) if r else None

    def list_threads(self, tenant: str | None = None) -> list[ThreadRow]:
        q = sa.select(threads).order_by(threads.c.tenant, threads.c.thread_id)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(q).mappings()]

    def tenants(self) -> list[str]:
        with self.begin() as conn:
            found = set(conn.execute(sa.select(threads.c.tenant).distinct()).scalars())
            found |= set(conn.execute(sa.select(tenant_keys.c.tenant).distinct()).scalars())
        found.discard(RESERVED_TENANT)  # the registry MAC key, not a tenant
        return sorted(found)

    def forget_thread(self, tenant: str, thread_id: str) -> None:
        """Drop a deleted thread's registry and subject rows (no receipt)."""
        from .schema import thread_namespaces, thread_subjects
        with self.begin() as conn:
            conn.execute(threads.delete().where(
                threads.c.tenant == tenant, threads.c.thread_id == thread_id))
            conn.execute(thread_namespaces.delete().where(
                thread_namespaces.c.tenant == tenant,
                thread_namespaces.c.thread_id == thread_id))
            conn.execute(thread_subjects.delete().where(
                thread_subjects.c.tenant == tenant, thread_subjects.c.thread_id == thread_id))

    # retention policies ---------------------------------------------------------------------
    def set_policy(self, tenant: str, policy: RetentionPolicy | None) -> None:
        """Store the default (tenant ``"*"``) or a tenant's policy and re-derive the expiry of
        every thread that follows it (threads with their own override keep it)."""
        integ = self._keyed()
        with self.begin() as conn:
            if policy is None:
                conn.execute(policies.delete().where(policies.c.tenant == tenant))
            else:   # an upsert: processes starting together save the same default at once
                row = {"tenant": tenant, **policy.as_row(), "updated_at": time.time()}
                row["mac"] = integ.mac(mac.POLICY, *mac.policy_parts(row))
                conn.execute(upsert(self.dialect, policies, row, [policies.c.tenant],
                                    lambda new: {k: v for k, v in row.items() if k != "tenant"}))
            self._reapply(conn, tenant)

    def get_policy(self, tenant: str) -> RetentionPolicy | None:
        """A stored policy; with the keyring attached, one whose MAC does not verify is
        refused with TamperedDataError (key-less readers such as audit get it unverified)."""
        with self.begin() as conn:
            r = conn.execute(sa.select(policies).where(policies.c.tenant == tenant)
                             ).mappings().first()
        if r is None:
            return None
        self._check_policy(r)
        return RetentionPolicy(r["idle_ttl"], r["max_age"], r["strategy"], r["legal_hold"])

    def _check_policy(self, r: Any) -> None:
        if self.integrity.available and not self.integrity.check(
                r["mac"], mac.POLICY, *mac.policy_parts(r)):
            raise TamperedDataError(
                f"securesaver_policies row {_policy_ref(r['tenant'])} does not verify (altered "
                "or inserted without the registry key); refusing to apply it")

    def effective_policy(self, tenant: str) -> tuple[RetentionPolicy, str]:
        own = self.get_policy(tenant)
        if own is not None:
            return own, "tenant"
        return self.get_policy(DEFAULT_POLICY_KEY) or NO_RETENTION, "default"

    def _reapply(self, conn: Connection, tenant: str) -> None:
        if tenant == DEFAULT_POLICY_KEY:
            overridden = sa.select(policies.c.tenant).where(policies.c.tenant != DEFAULT_POLICY_KEY)
            where = sa.and_(threads.c.policy_source == "default",
                            threads.c.tenant.not_in(overridden))
            source = "default"
        else:
            where = sa.and_(threads.c.tenant == tenant, threads.c.policy_source != "thread")
            source = "tenant"
        row = conn.execute(sa.select(policies).where(policies.c.tenant == tenant)
                           ).mappings().first()
        if row is None and tenant != DEFAULT_POLICY_KEY:
            row = conn.execute(sa.select(policies).where(
                policies.c.tenant == DEFAULT_POLICY_KEY)).mappings().first()
            source = "default"
        if row is not None:
            self._check_policy(row)
        values = ({"idle_ttl": row["idle_ttl"], "max_age": row["max_age"],
                   "strategy": row["strategy"], "legal_hold": bool(row["legal_hold"])}
                  if row is not None else NO_RETENTION.as_row())
        # only rows that change are rewritten (and re-MACed); a row whose MAC does not verify
        # is left as it is (reported by `events --verify`, refused by the pruner): re-MACing
        # it would launder a forged created_at
        changed = sa.or_(threads.c.policy_source != source, threads.c.policy_mac.is_(None),
                         *(threads.c[k].is_distinct_from(v) for k, v in values.items()))
        integ = self.integrity
        updates = []
        for r in conn.execute(sa.select(threads).where(where, changed)).mappings():
            if not integ.check(r["policy_mac"], mac.THREAD_POLICY, *mac.thread_policy_parts(r)):
                logger.error("securesaver_threads row %s does not verify; its retention was "
                             "not re-applied", _thread_ref(r["tenant"], r["thread_id"]))
                continue
            new = {**r, **values, "policy_source": source}
            updates.append({"b_tenant": r["tenant"], "b_thread": r["thread_id"],
                            "b_mac": integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(new))})
        if updates:
            pk = (threads.c.tenant == sa.bindparam("b_tenant"),
                  threads.c.thread_id == sa.bindparam("b_thread"))
            conn.execute(threads.update().where(*pk).values(
                policy_source=source, policy_mac=sa.bindparam("b_mac"), **values), updates)
            conn.execute(threads.update().where(*pk).values(expires_at=expires_expr(
                threads.c.created_at, threads.c.last_activity, threads.c.idle_ttl,
                threads.c.max_age, threads.c.legal_hold)),
                [{"b_tenant": u["b_tenant"], "b_thread": u["b_thread"]} for u in updates])

    def set_thread_retention(self, tenant: str, thread_id: str, **changes: Any) -> ThreadRow:
        """Per-thread override of idle_ttl / max_age / strategy / legal_hold. A row whose MAC
        does not verify is refused (re-MACing it would launder the forged fields)."""
        integ = self._keyed()
        pk = (threads.c.tenant == tenant, threads.c.thread_id == thread_id)
        with self.begin() as conn:
            q = sa.select(threads).where(*pk)
            if self.dialect != "sqlite":   # SQLite: one writer at a time
                q = q.with_for_update()
            current = conn.execute(q).mappings().first()
            if current is None:
                raise LookupError(f"tenant {tenant!r} has no thread {thread_id!r}")
            if not integ.check(current["policy_mac"], mac.THREAD_POLICY,
                               *mac.thread_policy_parts(current)):
                raise TamperedDataError(
                    f"securesaver_threads row {_thread_ref(tenant, thread_id)} does not verify "
                    "(altered or inserted without the registry key); refusing to change it")
            new = {**current, **changes, "policy_source": "thread"}
            conn.execute(threads.update().where(*pk).values(
                policy_source="thread", **changes,
                policy_mac=integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(new))))
            conn.execute(threads.update().where(*pk).values(expires_at=expires_expr(
                threads.c.created_at, threads.c.last_activity, threads.c.idle_ttl,
                threads.c.max_age, threads.c.legal_hold)))
        row = self.get_thread(tenant, thread_id)
        if row is None:  # deleted concurrently
            raise LookupError(f"tenant {tenant!r} has no thread {thread_id!r}")
        return row
