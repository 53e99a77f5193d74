"""The audit trail: security events and deletion receipts, filtered (``securesaver events``).

Reads the registry only; imports neither the inventory statements nor the cipher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .db import AuditDatabase
from .report import TrailEntry

if TYPE_CHECKING:
    from .sql import _Source


def _admin_tenant(saver: _Source, operation: str, tenant: Any) -> str | None:
    """The scope rule of whatever the trail reads (a saver's tenant gate, or the operator-only
    rule of an AuditDatabase)."""
    if isinstance(saver, AuditDatabase):
        return saver.admin_tenant(operation, tenant)
    return saver.services.gate.admin_tenant(operation, tenant)


def _kind_matches(kind: str, wanted: str | None) -> bool:
    return wanted is None or kind == wanted or kind.split(":", 1)[0] == wanted


def events(saver: _Source, *, tenant: str | None = None, thread_id: str | None = None,
           kind: str | None = None, since: float | None = None, until: float | None = None,
           limit: int | None = None) -> list[TrailEntry]:
    """Audit events and deletion receipts, oldest first. ``kind`` matches an event kind
    (``access_denied``), ``receipt`` (every receipt) or ``receipt:deleted`` (one action).
    Inside a tenant scope: that tenant's entries only."""
    tenant = _admin_tenant(saver, "events", tenant)
    registry = saver.registry
    out: list[TrailEntry] = []
    if kind is None or not kind.startswith("receipt"):
        for e in registry.list_events(kind=kind, tenant=tenant, thread_id=thread_id,
                                      since=since, until=until):
            out.append(TrailEntry(e.at, e.kind, e.tenant, e.thread_id, e.actor, e.detail,
                                  "event", str(e.id)))
    if kind is None or kind.startswith("receipt"):
        for r in registry.list_receipts(tenant=tenant, thread_id=thread_id, since=since,
                                        until=until):
            entry_kind = f"receipt:{r.action}"
            if not _kind_matches(entry_kind, kind):
                continue
            detail = {"reason": r.reason, **r.detail}
            out.append(TrailEntry(r.deleted_at, entry_kind, r.tenant, r.thread_id,
                                  r.requested_by, detail, "receipt", r.receipt_id))
    out.sort(key=lambda e: (e.at, e.source, e.ref))
    if limit is not None:
        out = out[-limit:]
    return out
