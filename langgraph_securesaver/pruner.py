"""The retention sweep: claim expired threads, re-check them, delete or prune, leave receipts.

See :mod:`langgraph_securesaver.retention` for the guarantees. The sweep is synchronous; the
saver's ``aprune_expired`` runs it in a worker thread (async-only inner savers are reached on
their own event loop from there).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .registry import ThreadRow
from .retention import PruneReport
from .tenancy import ThreadRef

if TYPE_CHECKING:
    from .saver import SecureSaver

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 100
DEFAULT_LEASE = 300.0
DEFAULT_ACTIVE_GRACE = 120.0
TRANSIENT_RETRIES = 3


def _is_transient(exc: BaseException) -> bool:
    """Deadlocks, serialization failures and busy databases: worth retrying, never surfaced."""
    names = {type(e).__name__ for e in (exc, exc.__cause__, getattr(exc, "orig", None)) if e}
    text = str(exc).lower()
    return bool(names & {"DeadlockDetected", "SerializationFailure", "LockNotAvailable"}) or (
        "database is locked" in text or "deadlock detected" in text)


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _checkpoint_time(ts: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(ts)).timestamp()
    except (TypeError, ValueError):
        return None


def _reason(row: ThreadRow, now: float) -> str:
    if row.idle_ttl is not None and row.last_activity + row.idle_ttl <= now:
        return "retention:idle_ttl"
    return "retention:max_age"


class Sweep:
    """One run of the pruner over the registry."""

    def __init__(self, saver: SecureSaver, *, now: float | None, limit: int | None,
                 dry_run: bool, tenant: str | None, batch: int = DEFAULT_BATCH,
                 lease: float = DEFAULT_LEASE, active_grace: float = DEFAULT_ACTIVE_GRACE,
                 owner: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        self.saver = saver
        self.registry = saver.registry
        self.now = time.time() if now is None else float(now)
        self.limit = limit
        self.dry_run = dry_run
        self.tenant = tenant
        self.batch = batch
        self.lease = lease
        self.active_grace = active_grace
        self.owner = owner or default_owner()
        self.progress = progress
        self.should_stop = should_stop or (lambda: False)
        self.report = PruneReport(self.now, dry_run)

    def run(self) -> PruneReport:
        self.report.held = [(r.tenant, r.thread_id)
                            for r in self.registry.expired_but_held(self.now, self.tenant)]
        total = self.registry.count_expired(self.now, self.tenant)
        if self.limit is not None:
            total = min(total, self.limit)
        if self.dry_run:
            for row in self.registry.list_expired(self.now, self.tenant, self.limit):
                target = (self.report.would_delete if row.strategy == "delete"
                          else self.report.would_prune)
                target.append((row.tenant, row.thread_id))
            return self.report
        done = 0
        while not self.should_stop() and (self.limit is None or done < self.limit):
            want = self.batch if self.limit is None else min(self.batch, self.limit - done)
            rows = self.registry.claim_expired(now=self.now, owner=self.owner,
                                               lease=self.lease, limit=want, tenant=self.tenant)
            if not rows:
                break
            for row in rows:
                if self.should_stop():
                    self.registry.release_claim(row)
                    continue
                done += 1
                self._process_safely(row)
                if self.progress:
                    self.progress(done, max(total, done))
        logger.info("retention sweep: %d deleted, %d pruned, %d errors",
                    len(self.report.deleted), len(self.report.pruned_to_latest),
                    len(self.report.errors))
        return self.report

    def _process_safely(self, row: ThreadRow) -> None:
        for attempt in range(1, TRANSIENT_RETRIES + 1):
            try:
                self._process(row)
                return
            except Exception as exc:  # noqa: BLE001 - one bad thread must not stop the sweep
                if attempt < TRANSIENT_RETRIES and _is_transient(exc):
                    logger.info("retrying tenant %r thread %r after %s", row.tenant,
                                row.thread_id, type(exc).__name__)
                    time.sleep(0.05 * attempt)
                    continue
                self._record_error(row, exc)
                return

    def _record_error(self, row: ThreadRow, exc: Exception) -> None:
        # the claim is kept until its lease expires, so this sweep does not retry it
        logger.error("retention failed for tenant %r thread %r: %s", row.tenant,
                     row.thread_id, exc, exc_info=exc)
        self.report.errors.append((row.tenant, row.thread_id, f"{type(exc).__name__}: {exc}"))

    def _process(self, claimed: ThreadRow) -> None:
        key = (claimed.tenant, claimed.thread_id)
        row = self.registry.get_thread(claimed.tenant, claimed.thread_id)
        if row is None or row.claim_token != claimed.claim_token:
            return  # deleted or taken over meanwhile
        ref = ThreadRef(row.tenant, row.thread_id)
        if row.state != "deleting":
            if row.legal_hold:
                self.report.held.append(key)
                self.registry.release_claim(row)
                return
            if row.expires_at is None or row.expires_at > self.now:
                self.report.survived.append(key)
                self.registry.release_claim(row)
                return
            latest = self.saver._latest_checkpoint_time(ref)
            if latest is not None and row.idle_ttl is not None and (
                    latest + row.idle_ttl > self.now) and latest > row.last_activity:
                # written after the registry last heard of it: it is not idle after all
                self.registry.touch_thread(row.tenant, row.thread_id, now=latest)
                self.report.survived.append(key)
                self.registry.release_claim(row)
                return
            if latest is not None and self.now - latest < self.active_grace:
                # keep the claim for the grace period only: not retried by this sweep, free
                # for the first sweep after the run had time to finish
                self.registry.extend_claim(row, min(self.lease, self.active_grace))
                self.report.skipped_active.append(key)
                return
        reason = _reason(row, self.now)
        if row.strategy == "keep_latest" and row.state != "deleting":
            checkpoints_before = self.saver._ops.count_checkpoints(ref.inner_id)
            self.saver._ops.keep_latest([ref.inner_id])
            after = self.saver._ops.count_checkpoints(ref.inner_id)
            self.registry.finish_pruned(row, {
                "tenant": row.tenant, "thread_id": row.thread_id, "action": "pruned",
                "reason": reason, "requested_by": f"pruner:{self.owner}",
                "detail": {"checkpoints_deleted": checkpoints_before - after,
                           "checkpoints_kept": after, "policy_source": row.policy_source}})
            self.report.pruned_to_latest.append(key)
            return
        self.registry.mark_state(row, "deleting")
        counts = self.saver._purge_thread_storage(ref)
        if self.registry.finish_deleted(row.tenant, row.thread_id, {
                "tenant": row.tenant, "thread_id": row.thread_id, "action": "deleted",
                "reason": reason, "requested_by": f"pruner:{self.owner}",
                "detail": {**counts, "policy_source": row.policy_source,
                           "expired_at": row.expires_at}}, claim_token=row.claim_token):
            self.saver._forget_touch(row.tenant, row.thread_id)
            self.report.deleted.append(key)
