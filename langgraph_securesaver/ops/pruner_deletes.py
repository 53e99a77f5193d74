"""How the retention sweep deletes a batch it decided on (a base class of :class:`.pruner.Sweep`).

When the registry and the inner saver share a database, a batch's checkpoints, blobs, writes,
companion records (PII vault, subjects, thread keys, idempotency records) and registry rows
are deleted and its receipts written in ONE transaction, each registry-row delete fenced by
the claim token and re-checking expiry and hold. Otherwise the batch is marked ``deleting``,
its storage deleted, then its companions, registry rows and receipts finished in one registry
transaction. A batch that fails for a reason other than a transient conflict is redone thread
by thread (the sweep's per-thread path, with its own re-checks). Every part of the sweep logs
as ``langgraph_securesaver.ops.pruner``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..audit import summaries
from ..keys.lifecycle import LEASE_FENCE
from ..registry.core import Registry
from ..registry.dialects import delete_returning
from ..registry.schema import ThreadRow, pairs_in
from ..retention import PruneReport
from ..services import SaverServices
from ..storage.ops import delete_threads_in
from ..tenancy import inner_thread_id
from . import threads

logger = logging.getLogger("langgraph_securesaver.ops.pruner")

TRANSIENT_RETRIES = 3


def is_transient(exc: BaseException) -> bool:
    """Deadlocks, serialization failures and busy databases: worth retrying, never surfaced."""
    names = {type(e).__name__ for e in (exc, exc.__cause__, getattr(exc, "orig", None)) if e}
    text = str(exc).lower()
    codes = {getattr(e, "args", (None,))[0] for e in (exc, getattr(exc, "orig", None)) if e}
    return bool(names & {"DeadlockDetected", "SerializationFailure", "LockNotAvailable"}) or (
        "database is locked" in text or "deadlock detected" in text) or bool(
        codes & {1213, 1205})   # MySQL: deadlock, lock wait timeout


def deletion_reason(row: ThreadRow, now: float) -> str:
    """The retention rule that expired ``row`` (a receipt's ``reason``)."""
    if row.idle_ttl is not None and row.last_activity + row.idle_ttl <= now:
        return "retention:idle_ttl"
    return "retention:max_age"


class BatchDeletion:
    """Deleting a re-checked batch completely, with its companions and one receipt a thread."""

    services: SaverServices
    registry: Registry
    now: float
    owner: str
    report: PruneReport
    _shared: bool

    if TYPE_CHECKING:  # provided by Sweep (declared for the type checker only)
        def _process_safely(self, row: ThreadRow) -> None: ...

    def _delete_safely(self, rows: list[ThreadRow]) -> None:
        for attempt in range(1, TRANSIENT_RETRIES + 1):
            try:
                gone = self._delete_batch(rows)
                break
            except Exception as exc:  # noqa: BLE001 - isolate the bad thread below
                if attempt < TRANSIENT_RETRIES and is_transient(exc):
                    logger.info("retrying a batch of %d threads after %s", len(rows),
                                type(exc).__name__)
                    time.sleep(0.05 * attempt)
                    continue
                logger.warning("a batch of %d threads failed (%s: %s); deleting them one by "
                               "one", len(rows), type(exc).__name__, exc)
                for row in rows:
                    self._process_safely(row)
                return
        for tenant, thread_id in gone:
            self.services.forget_thread(tenant, thread_id)
            self.report.deleted.append((tenant, thread_id))

    def _receipt(self, row: ThreadRow, counts: dict[str, int]) -> dict[str, Any]:
        return {"tenant": row.tenant, "thread_id": row.thread_id, "action": "deleted",
                "reason": deletion_reason(row, self.now), "requested_by": f"pruner:{self.owner}",
                "detail": {**counts, "policy_source": row.policy_source,
                           "expired_at": row.expires_at,
                           "erased_under": threads.erased_under(self.services)}}

    def _delete_batch(self, rows: list[ThreadRow]) -> list[tuple[str, str]]:
        """Delete a batch completely; returns the threads deleted (and receipted) here."""
        by_key = {(r.tenant, r.thread_id): r for r in rows}
        gone: list[tuple[str, str]] = []
        if self._shared:
            with self.registry.begin() as conn:
                for token, group in _group_by_token(rows).items():
                    gone += self.registry.delete_claimed(
                        conn, token, [(r.tenant, r.thread_id) for r in group], self.now,
                        known=by_key)  # verified by _batch: unchanged rows are not re-MACed
                inner = {inner_thread_id(t, th): (t, th) for t, th in gone}
                if inner:
                    checkpoints = delete_threads_in(conn, self.registry.dialect, list(inner))
                    companions = self._purge_companions(conn, gone)
                    self.registry.insert_receipts(conn, [self._receipt(by_key[key], {
                        "checkpoints": checkpoints.get(inner_id, 0),
                        **{name: per[key] for name, per in companions.items()}})
                        for inner_id, key in inner.items()])
            self._release_rest(rows, gone)  # after the commit (SQLite: one writer at a time)
            return gone
        # the registry is elsewhere: mark, delete storage, then finish in one registry
        # transaction (a kill in between leaves `deleting` rows the next sweep finishes)
        ours = self.registry.mark_batch_state(rows, "deleting", now=self.now)
        mine = [r for r in rows if (r.tenant, r.thread_id) in ours]
        if not mine:
            return []
        inner = {inner_thread_id(r.tenant, r.thread_id): (r.tenant, r.thread_id) for r in mine}
        checkpoints = self.services.storage.count_checkpoints_many(list(inner))
        self.services.storage.delete_threads(list(inner))
        with self.registry.begin() as conn:
            for token, group in _group_by_token(mine).items():
                gone += self.registry.delete_claimed(
                    conn, token, [(r.tenant, r.thread_id) for r in group])  # storage is gone
            companions = self._purge_companions(conn, gone)
            self.registry.insert_receipts(conn, [self._receipt(by_key[key], {
                "checkpoints": checkpoints.get(inner_thread_id(*key), 0),
                **{name: per[key] for name, per in companions.items()}}) for key in gone])
        return gone

    def _release_rest(self, rows: list[ThreadRow], gone: list[tuple[str, str]]) -> None:
        """Threads of the batch the final re-check kept (written, held, re-timed since the
        claim, or a write holds a lease on the key): their claims run out after the lease
        fence (fenced by the token, so a takeover is not undone), so this sweep does not
        claim them again and the first sweep after decides."""
        done = set(gone)
        rest = [r for r in rows if (r.tenant, r.thread_id) not in done]
        if rest:
            self.registry.extend_claims(rest, LEASE_FENCE)
            self.report.survived.extend((r.tenant, r.thread_id) for r in rest)

    def _purge_companions(self, conn: Any, pairs: list[tuple[str, str]]
                          ) -> dict[str, dict[tuple[str, str], int]]:
        """Companion records of a batch (PII vault, idempotency), in the caller's transaction;
        the same counts per thread that ``_purge_thread_storage`` puts in a receipt."""
        out = {"pii_values": self.services.vault.delete_threads_in(conn, pairs)}
        summaries.drop_pairs(conn, self.registry.dialect, pairs)
        self.services.subjects.delete_in(conn, pairs)
        keys = threads.thread_key_store(self.services)
        if keys is not None:   # the keys go with the data (crypto-erasure)
            out["thread_keys"] = keys.delete_in(conn, pairs)
        try:
            from ..idempotency import schema
        except ImportError:  # the idempotency component is not installed: no such records
            schema = None  # type: ignore[assignment]
        if schema is not None:
            counts = {p: 0 for p in pairs}
            dialect = self.registry.dialect
            idem = schema.idempotency_records   # tenant-wide records the threads claimed
            targets: list[tuple[sa.Table, list[Any], list[Any]]] = [
                (table, [pairs_in(dialect, table.c.tenant, table.c.thread_id, pairs)],
                 [table.c.tenant, table.c.thread_id]) for table in schema.TABLES]
            targets.append((idem, [idem.c.thread_id == "", pairs_in(
                dialect, idem.c.tenant, idem.c.origin, pairs)],
                [idem.c.tenant, idem.c.origin.label("thread_id")]))
            if dialect == "postgresql":  # one round trip: the deletes as CTEs
                ctes = [table.delete().where(*where).returning(*cols).cte(f"gone_{i}")
                        for i, (table, where, cols) in enumerate(targets)]
                gone = [(t, th) for t, th in conn.execute(sa.union_all(
                    *[sa.select(c.c.tenant, c.c.thread_id) for c in ctes]))]
            else:
                gone = [(r["tenant"], r["thread_id"]) for table, where, cols in targets
                        for r in delete_returning(conn, table, where, cols)]
            for tenant, thread_id in gone:
                counts[(tenant, thread_id)] += 1
            out["idempotency_records"] = counts
        return out


def _group_by_token(rows: list[ThreadRow]) -> dict[str, list[ThreadRow]]:
    """Claimed rows by claim token (a row without one is not ours to touch)."""
    out: dict[str, list[ThreadRow]] = {}
    for r in rows:
        if r.claim_token is not None:
            out.setdefault(r.claim_token, []).append(r)
    return out
