"""The pruner's claims on registry thread rows: claiming expired threads under a lease and a
fencing token, batches of claimed threads, the re-checks that refuse rows no longer due (or
whose MACs do not verify), and the fenced deletes that finish them.

A base class of :class:`~.core.Registry` (it uses the registry's engine and
transactions); it knows nothing of the inner saver or of receipts' contents.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..errors import TamperedDataError
from ..keys.lifecycle import LEASE_FENCE
from . import integrity as mac
from .base import RegistryBase
from .dialects import claim_returning, delete_returning, update_returning
from .schema import (
    ThreadRow,
    _maced,
    _thread_ref,
    pairs_in,
    policies,
    tenant_keys,
    thread_keys,
    thread_namespaces,
    thread_subjects,
    threads,
)


def _by_token(rows: Sequence[ThreadRow]) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for r in rows:
        if r.claim_token is not None:
            out.setdefault(r.claim_token, []).append((r.tenant, r.thread_id))
    return out



def unleased(now: float) -> Any:
    """No write holds a lease on the thread's key at ``now``: its last activity (every lease
    moves it) is more than ``LEASE_FENCE`` before (docs/key-lifecycle.md). Part of every
    statement of the sweep that marks or deletes a thread; the sweep's ``now`` is taken when it
    starts (earlier than the statement: stricter), or given by a test or backfill."""
    return threads.c.last_activity < now - LEASE_FENCE

class RegistryClaims(RegistryBase):
    """Claims, batches and fenced deletes of expired thread rows."""

    if TYPE_CHECKING:  # provided by Registry (declared for the type checker only)
        def _insert_receipt(self, conn: Connection, receipt: dict[str, Any]) -> None: ...

        def verified_expiry(self, row: ThreadRow) -> float | None: ...

    # pruner claims ----------------------------------------------------------------------------
    def claim_expired(self, *, now: float, owner: str, lease: float, limit: int,
                      tenant: str | None = None) -> list[ThreadRow]:
        """Atomically claim up to ``limit`` expired threads not claimed by a live pruner."""
        return self._claim((threads.c.expires_at <= now,), threads.c.expires_at,
                           owner=owner, lease=lease, limit=limit, tenant=tenant)

    def claim_emptied(self, *, cutoff: float, owner: str, lease: float, limit: int,
                      tenant: str | None = None) -> list[ThreadRow]:
        """Atomically claim up to ``limit`` threads ``delete_for_runs`` left empty
        (state ``emptied``), last active at or before ``cutoff``, not held and not claimed
        by a live pruner. The claim decides nothing: see :meth:`delete_emptied_claimed`."""
        return self._claim((threads.c.state == "emptied", threads.c.last_activity <= cutoff,
                            threads.c.legal_hold.is_(False)),
                           threads.c.last_activity, owner=owner, lease=lease, limit=limit,
                           tenant=tenant)

    def _claim(self, conditions: tuple[Any, ...], order: Any, *, owner: str, lease: float,
               limit: int, tenant: str | None) -> list[ThreadRow]:
        """Claim up to ``limit`` threads matching ``conditions`` (ordered by ``order``) that no
        live pruner holds (the candidates locked with SKIP LOCKED, so concurrent pruners take
        disjoint sets; SQLite has one writer at a time)."""
        wall = time.time()
        where = [*conditions,
                 sa.or_(threads.c.claim_expires.is_(None), threads.c.claim_expires < wall)]
        if tenant is not None:
            where.append(threads.c.tenant == tenant)
        values = {"claim_owner": owner, "claim_token": uuid.uuid4().hex,
                  "claim_expires": wall + lease}
        with self.begin() as conn:
            return [ThreadRow(**r) for r in claim_returning(conn, threads, where, order, limit,
                                                             values)]

    def delete_emptied_claimed(self, conn: Connection, row: ThreadRow, cutoff: float) -> bool:
        """Inside the caller's transaction: drop the registry row of a claimed emptied
        thread if it is still ours (claim token), still ``emptied`` (a write's touch sets
        it back to active), not held and still last active at or before ``cutoff``: the
        re-check is the statement that deletes (and, on SQLite, takes the write lock before
        the caller re-counts the checkpoints). The deleted row's MACs must verify, else
        TamperedDataError rolls the caller's transaction back."""
        found = delete_returning(conn, threads, [
            threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
            threads.c.claim_token == row.claim_token, threads.c.state == "emptied",
            threads.c.legal_hold.is_(False), threads.c.last_activity <= cutoff,
        ], list(threads.c))
        if not found:
            return False
        gone = found[0]
        # the filter read last_activity and legal_hold as stored; their MACs cover both
        self.verified_expiry(ThreadRow(**gone))  # raises on a row that does not verify
        return True

    def unmark_emptied(self, row: ThreadRow) -> None:
        """A claimed emptied thread that holds checkpoints again: back to active, released."""
        with self.begin() as conn:
            conn.execute(threads.update().where(
                threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                threads.c.claim_token == row.claim_token,
            ).values(state=sa.case((threads.c.state == "emptied", "active"),
                                   else_=threads.c.state),
                     claim_owner=None, claim_token=None, claim_expires=None))

    def release_claim(self, row: ThreadRow) -> None:
        with self.begin() as conn:
            conn.execute(threads.update().where(
                threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                threads.c.claim_token == row.claim_token,
            ).values(claim_owner=None, claim_token=None, claim_expires=None))

    def extend_claim(self, row: ThreadRow, seconds: float) -> None:
        with self.begin() as conn:
            conn.execute(threads.update().where(
                threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                threads.c.claim_token == row.claim_token,
            ).values(claim_expires=time.time() + seconds))

    def mark_state(self, row: ThreadRow, state: str, now: float | None = None) -> bool:
        """Set ``state`` on the row while claimed; ``deleting`` only while no write holds a
        lease on the thread's key at ``now`` (:func:`unleased`). False when not set."""
        where = [threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                 threads.c.claim_token == row.claim_token]
        if state == "deleting":
            where.append(unleased(time.time() if now is None else now))
        with self.begin() as conn:
            return bool(conn.execute(threads.update().where(*where).values(state=state)).rowcount)

    # batches of claimed threads (one claim token per claim_expired call) ----------------------
    def _batch_where(self, token: str, pairs: Sequence[tuple[str, str]]) -> list[Any]:
        return [threads.c.claim_token == token,
                pairs_in(self.dialect, threads.c.tenant, threads.c.thread_id, pairs)]

    def claimed(self, token: str, pairs: Sequence[tuple[str, str]]) -> list[ThreadRow]:
        """Re-read the rows of a batch that still carry the claim token (one query)."""
        if not pairs:
            return []
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(
                sa.select(threads).where(*self._batch_where(token, pairs))).mappings()]

    def release_claims(self, rows: Sequence[ThreadRow]) -> None:
        self._update_claims(rows, claim_owner=None, claim_token=None, claim_expires=None)

    def extend_claims(self, rows: Sequence[ThreadRow], seconds: float) -> None:
        self._update_claims(rows, claim_expires=time.time() + seconds)

    def mark_batch_state(self, rows: Sequence[ThreadRow], state: str,
                         now: float | None = None) -> set[tuple[str, str]]:
        """Set ``state`` on the rows still claimed by their token; returns those rows. Given
        ``now``, only rows still due (see :meth:`delete_claimed`) are marked, and each marked
        row must verify (else TamperedDataError and nothing is marked)."""
        done: set[tuple[str, str]] = set()
        with self.begin() as conn:
            for token, pairs in _by_token(rows).items():
                where = self._batch_where(token, pairs)
                if now is not None:
                    where.append(self._still_due(now))
                for r in update_returning(conn, threads, where, {"state": state},
                                          list(threads.c)):
                    if now is not None:
                        self._refuse_undue(r, now)
                    done.add((r["tenant"], r["thread_id"]))
        return done

    @staticmethod
    def _still_due(now: float) -> Any:
        """The stored columns say the row is due (or a crashed pruner's batch): a cheap SQL
        filter; the decision is made on the MACed fields (``_refuse_undue``)."""
        return sa.and_(unleased(now), sa.or_(threads.c.state == "deleting", sa.and_(
            threads.c.expires_at <= now, threads.c.legal_hold.is_(False))))

    def _refuse_undue(self, r: Any, now: float,
                      known: dict[tuple[str, str], ThreadRow] | None = None) -> None:
        """Raise TamperedDataError unless the row's MACs verify, it is not held and its
        verified TTLs have expired by ``now``: the caller's transaction is rolled back, so a
        forged expiry, a removed hold or a forged ``deleting`` state is never obeyed.
        ``known``: rows the caller verified already; a row identical to its verified copy in
        every MACed field and MAC is not MACed again (an equality test, not two HMACs)."""
        row = r if isinstance(r, ThreadRow) else ThreadRow(**r)
        seen = known.get((row.tenant, row.thread_id)) if known else None
        if seen is not None and _maced(seen) == _maced(row):
            expiry = mac.expiry_of(row.__dict__)
        else:
            expiry = self.verified_expiry(row)
        if row.legal_hold or expiry is None or expiry > now:
            raise TamperedDataError(
                f"securesaver_threads row {_thread_ref(row.tenant, row.thread_id)}: its stored "
                "expiry, hold or state says 'due' but its verified fields do not (forged); "
                "the batch was rolled back and the thread kept")

    def _update_claims(self, rows: Sequence[ThreadRow], **values: Any) -> None:
        if not rows:
            return
        with self.begin() as conn:
            for token, pairs in _by_token(rows).items():
                conn.execute(threads.update().where(*self._batch_where(token, pairs)
                                                    ).values(**values))

    def delete_claimed(self, conn: Connection, token: str, pairs: Sequence[tuple[str, str]],
                       now: float | None = None,
                       known: dict[tuple[str, str], ThreadRow] | None = None
                       ) -> list[tuple[str, str]]:
        """Inside the caller's transaction: drop the registry rows of a batch still fenced by
        ``token`` and, given ``now``, still due (expired and not held, or already being
        deleted): the re-check happens in the statement that deletes. Returns the
        (tenant, thread) pairs dropped (only those get receipts)."""
        if not pairs:
            return []
        where = self._batch_where(token, pairs)
        if now is None:
            return [(r["tenant"], r["thread_id"]) for r in delete_returning(
                conn, threads, where, [threads.c.tenant, threads.c.thread_id])]
        # the re-check under the claim: the SQL filter on the stored columns, then the MACs of
        # exactly the rows this statement deleted (as they were under its locks); one that
        # does not verify raises, rolling the caller's whole transaction back
        where.append(self._still_due(now))
        gone = []
        for r in delete_returning(conn, threads, where, list(threads.c)):
            self._refuse_undue(r, now, known)
            gone.append((r["tenant"], r["thread_id"]))
        return gone

    def finish_pruned(self, row: ThreadRow, receipt: dict[str, Any]) -> bool:
        """keep_latest done: clear expiry until the next write, release, write the receipt."""
        self._keyed()
        with self.begin() as conn:
            done = conn.execute(threads.update().where(
                threads.c.tenant == row.tenant, threads.c.thread_id == row.thread_id,
                threads.c.claim_token == row.claim_token,
            ).values(state=sa.case((threads.c.state == "emptied", "emptied"),
                                   else_="pruned"), expires_at=None, claim_owner=None,
                     claim_token=None, claim_expires=None)).rowcount
            if done:
                self._insert_receipt(conn, receipt)
        return bool(done)

    def finish_deleted(self, tenant: str, thread_id: str, receipt: dict[str, Any],
                       claim_token: str | None = None) -> bool:
        """Drop the registry row and write the receipt in one transaction (fenced by the claim
        token when a pruner holds one): a thread is receipted exactly once."""
        self._keyed()
        with self.begin() as conn:
            where = [threads.c.tenant == tenant, threads.c.thread_id == thread_id]
            if claim_token is not None:
                where.append(threads.c.claim_token == claim_token)
            done = conn.execute(threads.delete().where(*where)).rowcount
            if done or claim_token is None:
                conn.execute(thread_subjects.delete().where(   # the subject goes with it
                    thread_subjects.c.tenant == tenant,
                    thread_subjects.c.thread_id == thread_id))
                conn.execute(thread_namespaces.delete().where(
                    thread_namespaces.c.tenant == tenant,
                    thread_namespaces.c.thread_id == thread_id))
                self._insert_receipt(conn, receipt)
        return bool(done) or claim_token is None

    def expired_but_held(self, now: float, tenant: str | None = None) -> list[ThreadRow]:
        over = sa.or_(threads.c.last_activity + threads.c.idle_ttl <= now,
                      threads.c.created_at + threads.c.max_age <= now)
        q = sa.select(threads).where(threads.c.legal_hold.is_(True), over)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(q).mappings()]

    def list_expired(self, now: float, tenant: str | None = None,
                     limit: int | None = None) -> list[ThreadRow]:
        q = sa.select(threads).where(threads.c.expires_at <= now).order_by(threads.c.expires_at)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        if limit is not None:
            q = q.limit(limit)
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(q).mappings()]

    def list_emptied(self, cutoff: float, tenant: str | None = None) -> list[ThreadRow]:
        """Emptied threads last active at or before ``cutoff``, not held (dry runs)."""
        q = sa.select(threads).where(
            threads.c.state == "emptied", threads.c.last_activity <= cutoff,
            threads.c.legal_hold.is_(False)).order_by(threads.c.last_activity)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        with self.begin() as conn:
            return [ThreadRow(**r) for r in conn.execute(q).mappings()]

    def forget_tenant(self, tenant: str) -> None:
        with self.begin() as conn:
            conn.execute(threads.delete().where(threads.c.tenant == tenant))
            conn.execute(tenant_keys.delete().where(tenant_keys.c.tenant == tenant))
            conn.execute(thread_keys.delete().where(thread_keys.c.tenant == tenant))
            conn.execute(thread_subjects.delete().where(thread_subjects.c.tenant == tenant))
            conn.execute(policies.delete().where(policies.c.tenant == tenant))

    def count_expired(self, now: float, tenant: str | None = None) -> int:
        q = sa.select(sa.func.count()).select_from(threads).where(threads.c.expires_at <= now)
        if tenant is not None:
            q = q.where(threads.c.tenant == tenant)
        with self.begin() as conn:
            return int(conn.execute(q).scalar() or 0)
