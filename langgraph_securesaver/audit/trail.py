"""The audit trail: security events and deletion receipts, filtered (``securesaver events``).

Reads the registry only; imports neither the inventory statements, the report types nor the
cipher.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..timeargs import iso
from .db import AuditDatabase

if TYPE_CHECKING:
    from ..services import SaverLike


@dataclass(frozen=True)
class TrailEntry:
    """An event (``kind`` as recorded) or a deletion receipt (``kind`` = ``receipt:<action>``)."""

    at: float
    kind: str
    tenant: str | None
    thread_id: str | None
    actor: str | None
    detail: dict[str, Any]
    source: str            # "event" | "receipt"
    ref: str               # event id or receipt id

    def as_dict(self) -> dict[str, Any]:
        return {"at": iso(self.at), "kind": self.kind, "tenant": self.tenant,
                "thread_id": self.thread_id, "actor": self.actor, "detail": self.detail,
                "source": self.source, "id": self.ref}


def _admin_tenant(saver: SaverLike | AuditDatabase, operation: str, tenant: Any) -> str | None:
    """The scope rule of whatever the trail reads (a saver's tenant gate, or the operator-only
    rule of an AuditDatabase)."""
    if isinstance(saver, AuditDatabase):
        return saver.admin_tenant(operation, tenant)
    return saver.services.gate.admin_tenant(operation, tenant)


def _kind_matches(kind: str, wanted: str | None) -> bool:
    return wanted is None or kind == wanted or kind.split(":", 1)[0] == wanted


def events(saver: SaverLike | AuditDatabase, *, tenant: str | None = None,
           thread_id: str | None = None, kind: str | None = None, since: float | None = None,
           until: float | None = None, limit: int | None = None) -> list[TrailEntry]:
    """Audit events and deletion receipts, oldest first. ``kind`` matches an event kind
    (``access_denied``), ``receipt`` (every receipt) or ``receipt:deleted`` (one action).
    Inside a tenant scope: that tenant's entries only."""
    tenant = _admin_tenant(saver, "events", tenant)
    registry = saver.registry
    out: list[TrailEntry] = []
    if kind is None or not kind.startswith("receipt"):
        out.extend(map(_from_event, registry.list_events(
            kind=kind, tenant=tenant, thread_id=thread_id, since=since, until=until)))
    if kind is None or kind.startswith("receipt"):
        for r in registry.list_receipts(tenant=tenant, thread_id=thread_id, since=since,
                                        until=until):
            if _kind_matches(f"receipt:{r.action}", kind):
                out.append(_from_receipt(r))
    out.sort(key=lambda e: (e.at, e.source, e.ref))
    if limit is not None:
        out = out[-limit:]
    return out


def latest(saver: SaverLike | AuditDatabase, *, receipts: bool, tenant: str | None = None,
           since: float | None = None, until: float | None = None, n: int
           ) -> tuple[int, list[TrailEntry]]:
    """(how many, the latest ``n`` oldest first) of the period's deletion receipts
    (``receipts``) or refused reads (``access_denied`` events): what a report shows of a
    trail that may hold millions of entries, without reading them all."""
    tenant = _admin_tenant(saver, "events", tenant)
    registry = saver.registry
    if receipts:
        total = registry.count_receipts(tenant=tenant, since=since, until=until)
        rows = registry.list_receipts(tenant=tenant, since=since, until=until, newest=n)
        return total, [_from_receipt(r) for r in rows]
    total = registry.count_events(kind="access_denied", tenant=tenant, since=since, until=until)
    entries = list(map(_from_event, registry.list_events(
        kind="access_denied", tenant=tenant, since=since, until=until, newest=n)))
    entries.sort(key=lambda e: (e.at, e.source, e.ref))
    return total, entries


def _from_event(e: Any) -> TrailEntry:
    return TrailEntry(e.at, e.kind, e.tenant, e.thread_id, e.actor, e.detail, "event", str(e.id))


def _from_receipt(r: Any) -> TrailEntry:
    return TrailEntry(r.deleted_at, f"receipt:{r.action}", r.tenant, r.thread_id,
                      r.requested_by, {"reason": r.reason, **r.detail}, "receipt", r.receipt_id)
