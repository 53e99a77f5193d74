"""Bringing in threads a raw LangGraph saver wrote before SecureSaver wrapped it.

Those rows sit in clear under the caller's own thread ids, outside encryption, retention and
deletion (reads through SecureSaver raise :class:`~..errors.UnsealedDataError` for them).
:func:`adopt_threads` seals each one in place under a tenant: every checkpoint (every
namespace the raw saver lists) and its pending writes are written again through SecureSaver
(sealed, bound to the tenant's thread), then the raw rows are deleted with the raw saver's own
``delete_thread``, then a receipt (action ``adopted``) is written. Rerunning after a crash
finishes the job: a thread whose raw rows are still there is sealed again (the same checkpoint
ids, written over) and deleted; one already done is not listed any more.

The raw rows are decoded by ``raw`` -- a saver on the same storage with LangGraph's default
serializer, exactly as the application read them before wrapping: adopt trusts the existing
rows as much as the raw saver did. What stays behind (dead rows, WAL, backups) is
docs/guides/adopt.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from ..inner_access import raw_thread_ids
from ..tenancy import tenant_scope, validate_tenant
from .copying import _copy_plan

__all__ = ["AdoptReport", "adopt_threads"]


@dataclass
class AdoptReport:
    """What one run adopted: thread id -> checkpoints sealed."""

    tenant: str
    adopted: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "adopted": [
            {"thread_id": t, "checkpoints": n} for t, n in self.adopted.items()]}


def adopt_threads(saver: Any, raw: BaseCheckpointSaver, tenant: str,
                  thread_ids: Iterable[str] | None = None, *,
                  requested_by: str | None = None,
                  progress: Callable[[int, int], None] | None = None) -> AdoptReport:
    """Seal the raw threads (all of them, or ``thread_ids``) under ``tenant`` in place."""
    tenant = validate_tenant(tenant)
    ids = sorted(set(thread_ids)) if thread_ids is not None else raw_thread_ids(raw)
    report = AdoptReport(tenant)
    for done, thread in enumerate(ids):
        tuples = list(raw.list({"configurable": {"thread_id": thread}}))
        if not tuples:
            continue
        dst = {"configurable": {"thread_id": thread, "tenant_id": tenant}}
        with tenant_scope(tenant):
            for tup in sorted(tuples, key=_oldest_first):
                for cfg, ckpt, md, versions, writes in _copy_plan(tup, dst):  # type: ignore[arg-type]
                    saved = saver.put(cfg, ckpt, md, versions)
                    for task_id, task_writes in writes.items():
                        saver.put_writes(saved, task_writes, task_id)
        raw.delete_thread(thread)
        saver.registry.add_receipt(
            tenant=tenant, thread_id=thread, action="adopted", reason="adopt",
            requested_by=requested_by or tenant, detail={"checkpoints": len(tuples)})
        report.adopted[thread] = len(tuples)
        if progress is not None:
            progress(done + 1, len(ids))
    return report


def _oldest_first(tup: Any) -> tuple[int, str, str]:
    conf = tup.config["configurable"]
    ns = str(conf.get("checkpoint_ns", "") or "")
    return (ns.count("|") + (1 if ns else 0), ns, str(conf["checkpoint_id"]))
