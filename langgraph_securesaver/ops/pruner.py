"""The retention sweep: claim expired threads, re-check them, delete or prune, leave receipts.

See :mod:`langgraph_securesaver.retention` for the guarantees. The sweep is synchronous; the
saver's ``aprune_expired`` runs it in a worker thread (async-only inner savers are reached on
their own event loop from there).

Threads are processed in batches (``batch``, default 500): one claim (``UPDATE`` with a
lease and one fencing token, returning the rows as they are under its locks), one query for
the latest checkpoint time of every thread of the batch, then set-based deletes whose
registry-row delete re-checks the claim token, expiry and hold in the same statement.

Registry integrity: the sweep acts on MACed fields only. Every claimed row's MACs are checked
before anything is decided (a forged row is reported in ``errors``, its claim kept, its thread
untouched), and the rows the fenced delete returns — as they are under its locks — are
checked again (compared with their verified copy, or MACed): one that does not verify or is
not due by its verified TTLs raises ``TamperedDataError`` inside the batch transaction, which
rolls back whole and is redone thread by thread. Receipts extend each tenant's hash chain
once per batch, as the transaction's last statement (``Registry.insert_receipts``).

Checkpoint times: the batch's latest-times query reads each thread's stored ``ts``
unauthenticated, as a filter. A time that would save an expired thread (written since the
registry last heard of it, or within ``active_grace``) is believed only after that thread's
latest checkpoint is read again and authenticated as ``get_tuple`` does
(:meth:`..services.SaverServices.authenticated_latest`; the ts is sealed): a forged one is
reported in ``errors`` and the thread kept, and the registry is never touched with it. A
future authenticated time is clamped to the sweep's ``now`` (see :meth:`Sweep._believed`).

What decides: the MACed registry row and the thread's checkpoint rows, nothing else. The
batch and the per-thread path (``_process``: ``keep_latest`` threads, and every thread of a
batch redone one by one) read the latest checkpoint time the same way,
``storage.latest_checkpoint_times`` (SQL over the checkpoint rows on SQLite and PostgreSQL,
sync and async; ``get_tuple`` only on savers without native SQL), so a thread's fate never
depends on its batch-mates. A latest checkpoint row that does not parse keeps the thread
(the decision cannot be made; reported). A corrupt channel blob or pending write does not
enter the decision: the expired thread is deleted with it, with one receipt. The pruner is
not an integrity checker (``securesaver scan --verify`` is): keeping such threads would let
a one-byte edit hold any thread past its retention, the inner ``get_tuple`` decode never
caught a changed ciphertext under its own type tag anyway, and catching it here would read
and decrypt each thread's latest state instead of one field per thread. The exception is a
stored ts that would keep the thread: believed only from a full authenticated read, where a
corrupt blob or write is reported and the thread kept -- not deleted either way.

When the registry and the inner saver share a database (``from_url``), a batch's
checkpoints, blobs, writes, companion records (PII vault, idempotency) and registry rows are
deleted and its receipts written in ONE transaction: a kill at any point leaves each thread
of the batch untouched or fully deleted with exactly one receipt. Otherwise (a registry
elsewhere, an in-memory or custom saver) the batch is marked ``deleting``, its storage
deleted, then its companions, registry rows and receipts finished in one registry
transaction; a kill in between leaves ``deleting`` rows the next sweep finishes when their
lease runs out. A batch that fails for a reason other than a transient conflict is retried
thread by thread, so one bad thread never stops the others.

Threads ``delete_for_runs`` left empty (state ``emptied``) are swept after the expired ones:
claimed once last active before ``now - emptied_grace()`` and not held, each is deleted in
one fenced transaction that re-counts its checkpoints (:mod:`.pruner_emptied`); one written
again is kept and its mark cleared. docs/erasure.md says when such a thread's key goes.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..audit import summaries
from ..errors import TamperedDataError
from ..keys.lifecycle import DEFAULT_ACTIVE_GRACE, LEASE_FENCE
from ..registry.schema import ThreadRow, _thread_ref
from ..retention import PruneReport
from ..services import SaverServices
from ..tenancy import ThreadRef, inner_thread_id
from . import threads
from .pruner_deletes import TRANSIENT_RETRIES, BatchDeletion, deletion_reason, is_transient
from .pruner_emptied import EmptiedSweep

if TYPE_CHECKING:
    from ..services import SaverLike

logger = logging.getLogger(__name__)

DEFAULT_BATCH = 500
DEFAULT_LEASE = 300.0
# how far ahead a writer's clock may run for its checkpoint time to count as a write (now)
CLOCK_SKEW = 300.0


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def shares_database(saver: SaverLike | SaverServices) -> bool:
    """True when the registry's connections see the inner saver's own tables, so one
    transaction can delete storage, companions and registry rows together (cached)."""
    services = saver if isinstance(saver, SaverServices) else saver.services
    return services.storage.shares_database(services.registry.engine)


def _ref(row: ThreadRow) -> str:
    return _thread_ref(row.tenant, row.thread_id)


#: audit summaries refreshed per sweep at most (audit/summaries.py)
SUMMARY_REFRESH_LIMIT = 50_000


class Sweep(BatchDeletion, EmptiedSweep):
    """One run of the pruner over the registry."""

    def __init__(self, saver: SaverLike | SaverServices, *, now: float | None, limit: int | None,
                 dry_run: bool, tenant: str | None, batch: int = DEFAULT_BATCH,
                 lease: float = DEFAULT_LEASE, active_grace: float = DEFAULT_ACTIVE_GRACE,
                 owner: str | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        # a saver (its services) or the services themselves (SecureSaver.prune_expired)
        self.services = saver if isinstance(saver, SaverServices) else saver.services
        self.registry = self.services.registry
        self.now = time.time() if now is None else float(now)
        self.limit = limit
        self.dry_run = dry_run
        self.tenant = tenant
        self.batch = max(1, int(batch))
        self.lease = lease
        self.active_grace = active_grace
        self.owner = owner or default_owner()
        self.progress = progress
        self.should_stop = should_stop or (lambda: False)
        self.report = PruneReport(self.now, dry_run)
        self._shared = False
        self.report_refreshed = 0

    def _verified(self, row: ThreadRow) -> tuple[bool, float | None]:
        """(verifies, verified expiry); a row that does not verify is reported as an error."""
        try:
            return True, self.registry.verified_expiry(row)
        except TamperedDataError as exc:
            self._record_error(row, exc)
            return False, None

    def run(self) -> PruneReport:
        self.report.held = [(r.tenant, r.thread_id)
                            for r in self.registry.expired_but_held(self.now, self.tenant)
                            if self._verified(r)[0]]
        total = self.registry.count_expired(self.now, self.tenant)
        if self.limit is not None:
            total = min(total, self.limit)
        if self.dry_run:
            wall = time.time()   # rows a live pruner holds are not claimable: not listed
            rows = [r for r in self.registry.list_expired(self.now, self.tenant)
                    if r.claim_expires is None or r.claim_expires < wall]
            rows = rows if self.limit is None else rows[:self.limit]
            for start in range(0, len(rows), self.batch):
                self._dry_batch(rows[start:start + self.batch])
            self._dry_emptied()
            return self.report
        self._shared = shares_database(self.services)
        done = 0
        while not self.should_stop() and (self.limit is None or done < self.limit):
            want = self.batch if self.limit is None else min(self.batch, self.limit - done)
            rows = self.registry.claim_expired(now=self.now, owner=self.owner,
                                               lease=self.lease, limit=want, tenant=self.tenant)
            if not rows:
                break
            if self.should_stop():
                self.registry.release_claims(rows)
                break
            try:
                self._batch(rows)
            except Exception as exc:  # noqa: BLE001 - never lose the sweep to one batch
                logger.warning("a batch of %d threads failed (%s: %s); processing them one by "
                               "one", len(rows), type(exc).__name__, exc)
                for row in rows:   # re-read each; what was already done is skipped
                    self._process_safely(row)
            for _ in rows:
                done += 1
                if self.progress:
                    self.progress(done, max(total, done))
        if not self.should_stop():
            self._sweep_emptied(done)
        if self.report.deleted or self.report.pruned_to_latest:
            self.services.flush_deleted()
        if self._shared and self.tenant is None and not self.should_stop():
            self._refresh_summaries()
        logger.info("retention sweep: %d deleted, %d pruned, %d errors",
                    len(self.report.deleted), len(self.report.pruned_to_latest),
                    len(self.report.errors))
        return self.report

    def _refresh_summaries(self) -> None:
        """The audit summaries that are due (audit/summaries.py), at most SUMMARY_REFRESH_LIMIT
        threads a sweep: what bounds how long a summary stays due (the audit recomputes a due
        one from the raw rows meanwhile, so only its speed depends on this)."""
        from ..audit.sql import AuditDatabase
        if not summaries.built(self.registry):
            return
        try:
            self.report_refreshed = summaries.refresh(AuditDatabase(self.registry),
                                                      limit=SUMMARY_REFRESH_LIMIT)
        except Exception as exc:  # noqa: BLE001 - summaries never fail a retention sweep
            logger.warning("audit summaries not refreshed (%s: %s)", type(exc).__name__, exc)

    # one claimed batch ---------------------------------------------------------------------
    def _batch(self, current: list[ThreadRow]) -> None:
        """Re-check a claimed batch, then delete what is still due. The rows are as the claim
        returned them (read under the claim's row locks); the final delete re-checks expiry,
        hold and the claim token in the statement that deletes."""
        release: list[ThreadRow] = []
        check: list[ThreadRow] = []
        doomed: list[ThreadRow] = []
        for row in current:
            key = (row.tenant, row.thread_id)
            # act on the MACed fields only: a row whose MACs do not verify, or whose stored
            # expires_at is earlier than its verified TTLs imply, is reported (errors) and
            # left alone with its claim kept, so this sweep does not pick it up again
            ok, expiry = self._verified(row)
            if not ok:
                continue
            if row.legal_hold:
                self.report.held.append(key)
                release.append(row)
            elif expiry is None or expiry > self.now:
                if row.expires_at is not None and row.expires_at <= self.now:
                    self._record_error(row, _forged_expiry(row))
                    continue
                self.report.survived.append(key)
                release.append(row)
            elif row.state == "deleting":
                doomed.append(row)       # a crashed pruner's batch: finish it
            elif row.strategy == "keep_latest":
                self._process_safely(row)  # rare: pruned one by one, with its own re-checks
            else:
                check.append(row)
        alone: list[ThreadRow] = []
        try:
            latest = self._latest_times(check)
        except TamperedDataError:
            # a row of one of them cannot be read: each is re-checked on its own, so the one
            # it belongs to is reported by name and the others go on (what this batch already
            # decided for the rest -- held, survived, errors -- is not decided twice)
            alone, check, latest = check, [], {}
        active: list[ThreadRow] = []
        for row in check:
            key = (row.tenant, row.thread_id)
            try:
                last = self._believed(row, latest.get(inner_thread_id(row.tenant,
                                                                      row.thread_id)))
            except TamperedDataError as exc:  # reported, claim kept, nothing deleted
                self._record_error(row, _kept(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - re-checked on its own, with retries
                logger.info("re-checking tenant %r thread %r on its own after %s", row.tenant,
                            row.thread_id, type(exc).__name__)
                alone.append(row)
                continue
            if self._alive(row, last):
                # written after the registry last heard of it: it is not idle after all
                self.registry.touch_thread(row.tenant, row.thread_id, now=last)
                self.report.survived.append(key)
                release.append(row)
            elif self._active(last) or self._leased(row):
                # keep the claim for the grace period only: not retried by this sweep, free
                # for the first sweep after the run had time to finish
                active.append(row)
                self.report.skipped_active.append(key)
            else:
                doomed.append(row)
        self.registry.release_claims(release)
        self.registry.extend_claims(active, self._grace_claim())
        for row in alone:
            self._process_safely(row)
        if doomed:
            self._delete_safely(doomed)

    def _dry_batch(self, rows: list[ThreadRow]) -> None:
        """What :meth:`_batch` would decide for these rows, with the same checks in the same
        order (verified TTLs, hold, the latest checkpoint time, ``active_grace``), changing
        nothing: no claim, no touch, no delete. Only a concurrent writer or pruner can make
        the real sweep that follows differ."""
        check: list[ThreadRow] = []
        for row in rows:
            key = (row.tenant, row.thread_id)
            ok, expiry = self._verified(row)
            if not ok:
                continue
            if row.legal_hold:
                if key not in self.report.held:
                    self.report.held.append(key)
            elif expiry is None or expiry > self.now:
                if row.expires_at is not None and row.expires_at <= self.now:
                    self._record_error(row, _forged_expiry(row))
                else:
                    self.report.survived.append(key)
            elif row.state == "deleting":
                self.report.would_delete.append(key)
            else:
                check.append(row)
        try:
            latest = self._latest_times(check)
        except TamperedDataError:
            latest = {}
            for row in check:  # one by one, as the real sweep re-checks them
                try:
                    latest.update(self._latest_times([row]))
                except TamperedDataError as exc:
                    self._record_error(row, _kept(exc))
            errors = {(t, th) for t, th, _ in self.report.errors}
            check = [r for r in check if (r.tenant, r.thread_id) not in errors]
        for row in check:
            key = (row.tenant, row.thread_id)
            try:
                last = self._believed(row, latest.get(inner_thread_id(row.tenant,
                                                                      row.thread_id)))
            except TamperedDataError as exc:
                self._record_error(row, _kept(exc))
                continue
            if self._alive(row, last):
                self.report.survived.append(key)
            elif self._active(last) or self._leased(row):
                self.report.skipped_active.append(key)
            elif row.strategy == "keep_latest":
                self.report.would_prune.append(key)
            else:
                self.report.would_delete.append(key)

    def _safely(self, row: ThreadRow, action: Callable[[], None]) -> None:
        """``action`` for one thread, retried on transient conflicts; any other failure is
        reported in ``errors`` (the claim is kept until its lease runs out)."""
        for attempt in range(1, TRANSIENT_RETRIES + 1):
            try:
                action()
                return
            except Exception as exc:  # noqa: BLE001 - one bad thread must not stop the sweep
                if attempt < TRANSIENT_RETRIES and is_transient(exc):
                    time.sleep(0.05 * attempt)
                    continue
                self._record_error(row, exc)
                return

    # what a thread's latest checkpoint time may decide -------------------------------------
    def _alive(self, row: ThreadRow, last: float | None) -> bool:
        """Written after the registry last heard of it, and not idle by that write."""
        return (last is not None and row.idle_ttl is not None
                and last + row.idle_ttl > self.now and last > row.last_activity)

    def _leased(self, row: ThreadRow) -> bool:
        """A write may hold a lease on the thread's key (its verified last activity is within
        ``LEASE_FENCE``): skipped whatever ``active_grace`` says (docs/key-lifecycle.md); the
        statement that deletes re-checks it."""
        return row.last_activity > self.now - LEASE_FENCE

    def _grace_claim(self) -> float:
        """How long an active thread stays claimed: not retried by this sweep, free for the
        first sweep after the grace (or the lease) ran out."""
        return min(self.lease, max(self.active_grace, LEASE_FENCE))

    def _active(self, last: float | None) -> bool:
        """Written within ``active_grace``: a run may be in flight."""
        return last is not None and self.now - last < self.active_grace

    def _believed(self, row: ThreadRow, last: float | None) -> float | None:
        """The latest checkpoint time the sweep acts on, from ``last`` (the cheap read: the
        inner saver's row, unauthenticated).

        A time that would not save the thread (the registry's verified verdict stands) is used
        as read: a forged older or missing ts cannot expire a thread earlier than its MACed row
        says. A time that would save it (alive, or active) is believed only from the latest
        checkpoint read again and authenticated as ``get_tuple`` does (its ts is sealed): a
        row that does not authenticate is the TamperedDataError naming it (the caller reports
        it). Rare -- only threads written since the registry last heard of them -- so the
        batch keeps its one query. An authenticated time up to ``CLOCK_SKEW`` in the future
        (another machine's clock) counts as written now: it never moves ``last_activity`` past
        ``now``, and the thread is kept that way at most until that time has passed. Farther
        ahead it is no evidence of activity (None: the registry's verdict stands)."""
        if not (self._alive(row, last) or self._active(last)):
            return last
        checked = threads.authenticated_checkpoint_time(
            self.services, ThreadRef(row.tenant, row.thread_id))
        if checked is not None and checked > self.now:
            ahead = checked - self.now
            if ahead > CLOCK_SKEW:
                # no clock is that far off: not evidence of a write (a caller's own ts). As
                # "written now" it would save the thread at every sweep until that date
                logger.warning("tenant %r thread %r: its latest checkpoint is dated %.0f s "
                               "after the sweep's now; not taken as activity", row.tenant,
                               row.thread_id, ahead)
                return None
            logger.warning("tenant %r thread %r: its latest checkpoint is dated %.0f s after "
                           "the sweep's now (a clock ahead?); counted as written now",
                           row.tenant, row.thread_id, ahead)
            checked = self.now
        return checked

    def _latest_times(self, rows: list[ThreadRow]) -> dict[str, float | None]:
        if not rows:
            return {}
        ids = [inner_thread_id(r.tenant, r.thread_id) for r in rows]
        for attempt in range(1, TRANSIENT_RETRIES + 1):
            try:
                return dict(self.services.storage.latest_checkpoint_times(ids))
            except Exception as exc:
                if attempt < TRANSIENT_RETRIES and is_transient(exc):
                    time.sleep(0.05 * attempt)
                    continue
                raise
        return {}  # pragma: no cover - the loop returns or raises

    def _process_safely(self, row: ThreadRow) -> None:
        for attempt in range(1, TRANSIENT_RETRIES + 1):
            try:
                self._process(row)
                return
            except Exception as exc:  # noqa: BLE001 - one bad thread must not stop the sweep
                if attempt < TRANSIENT_RETRIES and is_transient(exc):
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
        # act on the MACed fields only (TamperedDataError -> reported, claim kept): a forged
        # expires_at, TTL, created_at or last_activity never makes a thread expire early
        expiry = self.registry.verified_expiry(row)
        if row.legal_hold:
            self.report.held.append(key)
            self.registry.release_claim(row)
            return
        if expiry is None or expiry > self.now:
            if row.expires_at is not None and row.expires_at <= self.now:
                # reported; the claim is kept so this sweep does not pick the row up again
                raise _forged_expiry(row)
            self.report.survived.append(key)
            self.registry.release_claim(row)
            return
        if row.state != "deleting":
            try:
                latest = self._believed(row, threads.latest_checkpoint_time(self.services, ref))
            except TamperedDataError as exc:  # reported, claim kept, nothing deleted
                raise _kept(exc) from None
            if self._alive(row, latest):
                # written after the registry last heard of it: it is not idle after all
                self.registry.touch_thread(row.tenant, row.thread_id, now=latest)
                self.report.survived.append(key)
                self.registry.release_claim(row)
                return
            if self._active(latest) or self._leased(row):
                # keep the claim for the grace period only: not retried by this sweep, free
                # for the first sweep after the run had time to finish
                self.registry.extend_claim(row, self._grace_claim())
                self.report.skipped_active.append(key)
                return
        reason = deletion_reason(row, self.now)
        if row.strategy == "keep_latest" and row.state != "deleting":
            checkpoints_before = self.services.storage.count_checkpoints(ref.inner_id)
            self.services.storage.keep_latest([ref.inner_id])
            after = self.services.storage.count_checkpoints(ref.inner_id)
            summaries.mark_changed(self.registry, row.tenant, [row.thread_id])
            self.registry.finish_pruned(row, {
                "tenant": row.tenant, "thread_id": row.thread_id, "action": "pruned",
                "reason": reason, "requested_by": f"pruner:{self.owner}",
                "detail": {"checkpoints_deleted": checkpoints_before - after,
                           "checkpoints_kept": after, "policy_source": row.policy_source}})
            self.report.pruned_to_latest.append(key)
            return
        if row.state != "deleting" and not self.registry.mark_state(row, "deleting", self.now):
            # a write holds a lease on its key: the first sweep after it ran out decides
            self.registry.extend_claim(row, LEASE_FENCE)
            self.report.skipped_active.append(key)
            return
        counts = threads.purge_thread_storage(self.services, ref)
        if self.registry.finish_deleted(row.tenant, row.thread_id, {
                "tenant": row.tenant, "thread_id": row.thread_id, "action": "deleted",
                "reason": reason, "requested_by": f"pruner:{self.owner}",
                "detail": {**counts, "policy_source": row.policy_source,
                           "expired_at": row.expires_at,
                           "erased_under": threads.erased_under(self.services)}},
                claim_token=row.claim_token):
            self.services.forget_thread(row.tenant, row.thread_id)
            self.report.deleted.append(key)


def _kept(exc: TamperedDataError) -> TamperedDataError:
    """A thread whose latest checkpoint does not parse or authenticate: the refusal naming the
    row, and what the sweep did about it."""
    return TamperedDataError(f"{exc}; retention kept the expired thread for a person to look "
                             "at (securesaver scan --verify; delete_thread deletes it)")


def _forged_expiry(row: ThreadRow) -> TamperedDataError:
    return TamperedDataError(
        f"securesaver_threads row {_ref(row)}: expires_at is earlier than its verified TTLs "
        "imply (forged expiry); the thread was kept")
