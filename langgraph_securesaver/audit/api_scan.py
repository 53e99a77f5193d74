"""``scan`` on a saver whose storage SecureSaver cannot read as tables (MySQL, Redis, LMDB,
object storage, your own): every checkpoint of every registered thread, in every namespace
it was written in, is read back through the saver's own API and authenticated as ``get_tuple``
would (a ciphertext edited in the backend is a ``refused`` violation naming the thread, never
a value), and threads the saver holds that SecureSaver did not write are ``unsealed``
violations (where the saver can list across threads). The master versions in use are those
wrapping the registry's key rows. What it cannot check there: clear columns of tables it does
not know. docs/savers.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..errors import SecureSaverError, TamperedDataError
from ..tenancy import tenant_scope
from .scan_report import ScanReport, Violation

__all__ = ["scan_through_api"]


def scan_through_api(saver: Any, progress: Callable[[int, int], None] | None = None
                     ) -> ScanReport:
    """Authenticate every stored checkpoint of ``saver`` through its API."""
    inner = saver.inner
    where = type(inner).__name__
    report = ScanReport(backend=where, started_at=time.time())
    registry = saver.registry
    tenants = registry.tenants()
    threads = [(t, row.thread_id) for t in tenants for row in registry.list_threads(t)]
    checked = 0
    for done, (tenant, thread) in enumerate(threads):
        with tenant_scope(tenant):
            for ns in ["", *registry.namespaces(tenant, thread)]:
                config = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
                try:
                    for _ in saver.list(config):
                        checked += 1
                except TamperedDataError as exc:
                    report.violations.append(Violation(
                        "refused", where, f"tenant {tenant!r} thread {thread!r} namespace "
                        f"{ns!r}", _reason(exc)))
        if progress is not None:
            progress(done + 1, len(threads))
    for thread in _unsealed(saver):
        report.violations.append(Violation(
            "unsealed", where, f"thread {thread!r}",
            "written without SecureSaver (in clear): securesaver adopt"))
    report.rows = {where: checked}
    report.verified = checked
    # what every stored ciphertext depends on: the master versions wrapping the key rows
    report.master_versions = saver.master_versions_in_use()
    report.duration = time.time() - report.started_at
    return report


def _reason(exc: SecureSaverError) -> str:
    text = str(exc)
    return text.rsplit("was refused: ", 1)[-1][:200]


def _unsealed(saver: Any) -> list[str]:
    from ..inner_access import raw_thread_ids
    if not saver.services.storage.lists_across_threads():
        return []
    try:
        return raw_thread_ids(saver.inner)
    except (TamperedDataError, TypeError, ValueError):
        return []
