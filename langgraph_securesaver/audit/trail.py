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


#: Every event kind the library records (``securesaver events --kind`` accepts these, the
#: receipt forms below, and any kind found in the database). tests/test_cli_newcomer.py checks
#: that every kind written in the source is listed.
EVENT_KINDS = frozenset({
    "access_denied", "data_key_rotated", "key_rotation_finished", "key_rotation_started",
    "keys_rewrapped", "master_key_destroyed", "master_keys_retired", "pii_forgotten",
    "retention_changed", "retention_sweep", "runs_deleted", "subject_forgotten", "tenant_shredded",
    "thread_copied"})
#: the actions of deletion receipts (``--kind receipt:ACTION``)
RECEIPT_ACTIONS = frozenset({"deleted", "forgotten", "pruned", "rollback", "shredded"})


def known_kind(kind: str) -> bool:
    """Whether ``--kind`` names something the trail can hold (not whether any is recorded)."""
    if kind == "receipt" or kind.startswith("receipt:"):
        return kind == "receipt" or kind.split(":", 1)[1] in RECEIPT_ACTIONS
    return kind in EVENT_KINDS


def recorded(saver: SaverLike | AuditDatabase, *, kind: str | None = None,
             tenant: str | None = None) -> bool:
    """Whether the database holds any event or receipt of ``kind`` / about ``tenant``
    (what tells an unknown name from a period without entries)."""
    registry = saver.registry
    if kind is None or not kind.startswith("receipt"):
        if registry.count_events(kind=kind, tenant=tenant):
            return True
    if kind is None or kind.startswith("receipt"):
        return bool(registry.count_receipts(tenant=tenant))
    return False


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
