"""The retention sweep's part for threads ``delete_for_runs`` left empty (state ``emptied``).

``delete_for_runs`` deletes no thread: a run of the same thread may be writing (LangGraph
Server's rollback). It marks each thread it left without a checkpoint ``emptied``; the sweep
(:class:`.pruner.Sweep`, which mixes this class in) claims such a thread once it has been last
active before ``now - emptied_grace()`` and is not held, and deletes it -- storage, companion
records, key, one receipt with reason ``delete_for_runs`` -- in one fenced transaction that
re-counts its checkpoints: one written again is kept and its mark cleared. docs/erasure.md
says when such a thread's key goes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..registry.core import Registry
from ..registry.schema import ThreadRow
from ..retention import PruneReport
from ..services import SaverServices
from ..storage.ops import delete_threads_in
from ..tenancy import inner_thread_id
from . import threads


class _WrittenAgain(Exception):
    """An emptied thread holds a checkpoint again: its deletion is rolled back."""


class EmptiedSweep:
    """Claiming, re-checking and deleting emptied threads (a base class of the sweep)."""

    services: SaverServices
    registry: Registry
    now: float
    limit: int | None
    tenant: str | None
    batch: int
    lease: float
    active_grace: float
    owner: str
    report: PruneReport
    _shared: bool
    should_stop: Callable[[], bool]

    if TYPE_CHECKING:  # provided by Sweep (declared for the type checker only)
        def _verified(self, row: ThreadRow) -> tuple[bool, float | None]: ...

        def _purge_companions(self, conn: Any, pairs: list[tuple[str, str]]
                              ) -> dict[str, dict[tuple[str, str], int]]: ...

        def _safely(self, row: ThreadRow, action: Callable[[], None]) -> None: ...

    def emptied_grace(self) -> float:
        """How long a thread ``delete_for_runs`` left empty must stay empty and unwritten
        (its registry ``last_activity``, moved by the mark and by every write's touch) before
        the sweep deletes it: ``active_grace``, and at least the thread-key cache lifetime
        plus the activity resolution, so no process still holds its key from a write (a
        write touches the row at least once per resolution, before it fetches the key)."""
        store = threads.thread_key_store(self.services)
        ttl = store.ttl if store is not None else 0.0
        return max(self.active_grace, ttl + float(self.services.activity_resolution))

    def _sweep_emptied(self, done: int) -> None:
        """Claim emptied threads due (state ``emptied``, last active before the grace, not
        held) and delete each one still empty (:meth:`_emptied`)."""
        cutoff = self.now - self.emptied_grace()
        while not self.should_stop() and (self.limit is None or done < self.limit):
            want = self.batch if self.limit is None else min(self.batch, self.limit - done)
            rows = self.registry.claim_emptied(cutoff=cutoff, owner=self.owner,
                                               lease=self.lease, limit=want,
                                               tenant=self.tenant)
            if not rows:
                return
            for row in rows:
                self._safely(row, functools.partial(self._emptied, row, cutoff))
                done += 1

    def _dry_emptied(self) -> None:
        """What :meth:`_sweep_emptied` would decide, changing nothing."""
        cutoff = self.now - self.emptied_grace()
        wall = time.time()
        for row in self.registry.list_emptied(cutoff, self.tenant):
            if row.claim_expires is not None and row.claim_expires >= wall:
                continue
            key = (row.tenant, row.thread_id)
            if not self._verified(row)[0]:
                continue
            inner = inner_thread_id(row.tenant, row.thread_id)
            if self.services.storage.count_checkpoints(inner):
                self.report.survived.append(key)
            else:
                self.report.would_delete.append(key)

    def _emptied(self, row: ThreadRow, cutoff: float) -> None:
        """Delete a claimed emptied thread if it is still empty and unwritten.

        With the registry in the inner saver's database (``from_url``) one transaction
        deletes the registry row (fenced: still ours, still ``emptied``, not held, last
        active before ``cutoff``; on SQLite this statement takes the write lock), counts and
        deletes the thread's checkpoints -- any found roll everything back and the thread
        lives on -- then its companion records and key, and writes the receipt. Otherwise
        the count, the storage delete and the registry transaction are three steps."""
        key = (row.tenant, row.thread_id)
        self.registry.verified_expiry(row)   # a row that does not verify: reported, kept
        inner = inner_thread_id(row.tenant, row.thread_id)
        gone = False
        if self._shared:
            try:
                with self.registry.begin() as conn:
                    if self.registry.delete_emptied_claimed(conn, row, cutoff):
                        checkpoints = delete_threads_in(conn, self.registry.dialect, [inner])
                        if checkpoints.get(inner, 0):
                            raise _WrittenAgain
                        self._finish_emptied(conn, row, 0)
                        gone = True
            except _WrittenAgain:
                self.registry.unmark_emptied(row)
                self.report.survived.append(key)
                return
        else:
            if self.services.storage.count_checkpoints(inner):
                self.registry.unmark_emptied(row)
                self.report.survived.append(key)
                return
            self.services.storage.delete_threads([inner])   # writes and blobs left behind
            with self.registry.begin() as conn:
                if self.registry.delete_emptied_claimed(conn, row, cutoff):
                    self._finish_emptied(conn, row, 0)
                    gone = True
        if not gone:   # written (touched) or held since the claim
            self.registry.release_claim(row)
            self.report.survived.append(key)
            return
        self.services.forget_thread(row.tenant, row.thread_id)
        self.report.deleted.append(key)

    def _finish_emptied(self, conn: Any, row: ThreadRow, checkpoints: int) -> None:
        """Companion records, key and receipt of an emptied thread, in ``conn``."""
        pair = (row.tenant, row.thread_id)
        companions = self._purge_companions(conn, [pair])
        self.registry.insert_receipts(conn, [{
            "tenant": row.tenant, "thread_id": row.thread_id, "action": "deleted",
            "reason": "delete_for_runs", "requested_by": f"pruner:{self.owner}",
            "detail": {"checkpoints": checkpoints,
                       **{name: per[pair] for name, per in companions.items()},
                       "emptied_at": row.last_activity,
                       "erased_under": threads.erased_under(self.services)}}])
