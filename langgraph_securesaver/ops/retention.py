"""Retention as an API: default and per-tenant policies, per-thread overrides, the expiry
sweep (:class:`~.pruner.Sweep` does the work) and the deletion receipts.

Knows the services of a saver (registry, gate, policy cache); not the saver, not the CLI.
"""

from __future__ import annotations

import builtins
from typing import Any

from ..errors import ConfigurationError
from ..gate import thread_id_of
from ..registry.schema import Receipt, ThreadRow
from ..retention import PruneReport, RetentionPolicy, parse_duration
from ..services import SaverServices
from ..tenancy import validate_tenant

UNSET: Any = object()


def set_default_retention(services: SaverServices, policy: RetentionPolicy | None) -> None:
    services.gate.admin_tenant("set_default_retention", operator_only=True)
    services.set_default_policy(policy)


def set_tenant_retention(services: SaverServices, tenant: str,
                         policy: RetentionPolicy | None) -> None:
    tenant = services.gate.admin_tenant("set_tenant_retention", validate_tenant(tenant)) or tenant
    services.registry.set_policy(tenant, policy)
    services.forget_policy(tenant)
    services.registry.record_event("retention_changed", tenant=tenant,
                                   policy=None if policy is None else policy.as_row())


def set_retention(services: SaverServices, thread_id: str, *, idle_ttl: Any = UNSET,
                  max_age: Any = UNSET, legal_hold: Any = UNSET, strategy: Any = UNSET
                  ) -> ThreadRow:
    thread_id = thread_id_of(thread_id)
    gate = services.gate
    tenant = gate.scoped(lambda: gate.tenant("set_retention", thread_id=str(thread_id)))
    changes: dict[str, Any] = {}
    if idle_ttl is not UNSET:
        changes["idle_ttl"] = parse_duration(idle_ttl, what="idle_ttl")
    if max_age is not UNSET:
        changes["max_age"] = parse_duration(max_age, what="max_age")
    if legal_hold is not UNSET:
        changes["legal_hold"] = bool(legal_hold)
    if strategy is not UNSET:
        RetentionPolicy(strategy=strategy)  # validates
        changes["strategy"] = strategy
    if not changes:
        raise ConfigurationError(
            "set_retention needs idle_ttl, max_age, legal_hold or strategy")
    row = services.registry.set_thread_retention(tenant, str(thread_id), **changes)
    services.registry.record_event("retention_changed", tenant=tenant, thread_id=str(thread_id),
                                   **{k: v for k, v in changes.items()})
    return row


def prune_expired(services: SaverServices, now: Any = None, *, limit: int | None = None,
                  dry_run: bool = False, tenant: str | None = None, **options: Any
                  ) -> PruneReport:
    from ..timeargs import to_epoch
    from .pruner import Sweep
    tenant = services.gate.admin_tenant("prune_expired", tenant)
    now = to_epoch(now, "now")
    # the sweep acts only on thread rows whose MACs verify: without the keyring it cannot
    # tell a forged expiry from a real one, so it refuses to run (KeyringRequired)
    services.registry.integrity.require()
    services.save_default_policy()
    report = Sweep(services, now=now, limit=limit, dry_run=dry_run, tenant=tenant,
                   **options).run()
    if not dry_run and (report.deleted or report.pruned_to_latest):
        services.registry.record_event("retention_sweep", tenant=tenant,
                                       deleted=len(report.deleted),
                                       pruned=len(report.pruned_to_latest),
                                       errors=len(report.errors))
    return report


def receipts(services: SaverServices, *, tenant: str | None = None,
             thread_id: str | None = None, since: Any = None, until: Any = None
             ) -> builtins.list[Receipt]:
    from ..timeargs import to_epoch
    tenant = services.gate.admin_tenant("receipts", tenant)
    if thread_id is not None:
        thread_id = thread_id_of(thread_id)
    return services.registry.list_receipts(tenant=tenant, thread_id=thread_id,
                                           since=to_epoch(since, "since"),
                                           until=to_epoch(until, "until"))
