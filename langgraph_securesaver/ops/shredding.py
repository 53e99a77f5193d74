"""Crypto-shredding a tenant: its key material is destroyed at the key provider (so every
copy of its data, backups included, is unreadable), then its rows are deleted.

Knows the services of a saver (keyring, key manager, registry, purge path); not the saver.
"""

from __future__ import annotations

import logging
from typing import Any

from ..audit import summaries
from ..errors import ConfigurationError
from ..keys.tokens import KEK, LOOKUP
from ..services import SaverServices
from ..tenancy import ThreadRef, validate_actor, validate_tenant
from .keys import require_sole_database
from .threads import (
    idempotency_store,
    inner_thread_ids,
    purge_thread_storage,
    thread_key_store,
)

logger = logging.getLogger("langgraph_securesaver.saver")


def shred_tenant(services: SaverServices, tenant: str, *,
                 requested_by: str | None = None) -> int:
    tenant = services.gate.admin_tenant("shred_tenant", validate_tenant(tenant)) or tenant
    requested_by = validate_actor(requested_by)
    registry = services.registry
    ring: Any = services.keyring
    if not hasattr(ring, "destroy_tenant") or not hasattr(ring, "add_version"):
        raise ConfigurationError(
            f"{type(ring).__name__} cannot destroy tenant keys; use a Keyring file or a "
            "KeyProvider with destroy_tenant()")
    if getattr(ring, "path", None) is None and not getattr(ring, "persists_itself", False):
        raise ConfigurationError(
            "shredding rewrites the keyring: load it with Keyring.from_file(path) (an "
            "environment keyring cannot be changed from here)")
    require_sole_database(services, "shred_tenant")
    reload = getattr(ring, "reload", None)
    if callable(reload):       # start from the file as it is now (another process may
        reload()               # have rotated since this one loaded it)
    others = [t for t in registry.tenants_with_keys() if t != tenant]
    ring.add_version()
    ring.persist()                         # 1. a fresh master version for everyone else
    for other in others:                   # 2. move the others' key rows onto it
        stale = [r for r in registry.load_key_rows(other)
                 if r.master_version != ring.current_version and r.purpose not in (KEK, LOOKUP)]
        if stale:
            registry.replace_key_rows(services.keys.rewrap(other, stale))
    keys = thread_key_store(services)
    if keys is not None:                   # their thread keys onto new KEKs (KEKs are replaced)
        keys.rewrap(ring.current_version, except_tenant=tenant)
        keys.drop_stale_keks(ring.current_version, except_tenant=tenant)
    ring.destroy_tenant(tenant, others)    # 3. older versions survive only for the others
    ring.persist()
    services.keys.forget()
    thread_ids = sorted({r.thread_id for r in registry.list_threads(tenant)}
                        | set(inner_thread_ids(services, tenant)))
    for thread_id in thread_ids:           # 4. delete the (now unreadable) rows
        counts = purge_thread_storage(services, ThreadRef(tenant, thread_id))
        registry.finish_deleted(tenant, thread_id, {
            "tenant": tenant, "thread_id": thread_id, "action": "shredded",
            "reason": "shred_tenant", "requested_by": requested_by, "detail": counts})
    services.vault.delete_tenant(tenant)
    # SecureStore items on this database: unreadable now, but their namespaces and keys are
    # clear text (store_audit)
    from ..audit.store_items import purge_store_tenant
    store_items = purge_store_tenant(registry.engine, tenant)
    if store_items:
        logger.info("shred_tenant: %d store item(s) of tenant %r deleted", store_items, tenant)
    summaries.drop(registry, tenant)
    store = idempotency_store(services)
    if store is not None:
        store.delete_tenant(tenant)
    registry.forget_tenant(tenant)
    services.subjects.forget_tenant(tenant)
    if keys is not None:
        keys.delete_tenant(tenant)
    services.forget_policy(tenant)
    services.flush_deleted()
    registry.record_event("tenant_shredded", tenant=tenant, actor=requested_by,
                          threads=len(thread_ids), master_version=ring.current_version)
    from ..registry.schema import scrub_wal
    scrub_wal(registry.engine)   # the deleted rows' old pages (clear ids, labels), on SQLite
    logger.warning("tenant %r crypto-shredded (%d threads)", tenant, len(thread_ids))
    return len(thread_ids)
