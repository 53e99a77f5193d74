"""Key operations on the registry's key rows: rewrapping under the current master version,
new data-key versions, which master versions are still in use, and the rule that
destructive key operations need a keyring serving only this database.

Knows the services of a saver (keyring, key manager, registry, gate); not the saver.
(Re-encrypting stored data is :mod:`langgraph_securesaver.ops.rotation`.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError
from ..keys.tokens import KEK, LOOKUP
from ..registry.pii_lookups import rekey
from ..registry.thread_keys import ThreadKeyStore, mark_retiring
from ..registry.wrapped_keys import erasure_epoch_of
from ..services import SaverServices
from ..tenancy import validate_tenant

logger = logging.getLogger("langgraph_securesaver.saver")


def require_sole_database(services: SaverServices, operation: str) -> None:
    """Refuse ``operation`` (shredding, retiring master versions) when the keyring also
    serves another database: its tenants' key rows may still be wrapped under the master
    versions this would destroy, and this registry cannot know those tenants."""
    services.bind_keyring()
    others_of = getattr(services.keyring, "other_databases", None)
    if not callable(others_of):
        return
    others = others_of(services.database_id())
    if others:
        raise ConfigurationError(
            f"{operation} refused: keyring {getattr(services.keyring, 'path', '')} also serves "
            f"{len(others)} other database(s) ({', '.join(sorted(others.values()))}); "
            "destroying master versions here would make their tenants unreadable. Use a "
            "keyring that serves only this database, or, if those databases are gone, "
            "remove them with Keyring.forget_database(id) "
            f"(ids: {', '.join(sorted(others))})")


def rewrap_keys(services: SaverServices, *,
                progress: Callable[[int, int], None] | None = None) -> int:
    services.gate.admin_tenant("rewrap_keys", operator_only=True)
    registry = services.registry
    current = services.keyring.current_version
    # first: no process wraps a new key under another version from here on (the
    # rewrap below then sees every key row that will ever name one)
    mark_retiring(registry, current, list(services.keyring.versions()))
    tenants = registry.tenants_with_keys()
    done = 0
    for i, tenant in enumerate(tenants):
        # KEKs are replaced, never rewrapped (the erasure epoch): see thread_keys
        stale = [r for r in registry.load_key_rows(tenant)
                 if r.master_version != current and r.purpose not in (KEK, LOOKUP)]
        if stale:
            registry.replace_key_rows(services.keys.rewrap(tenant, stale))
            done += len(stale)
        if progress:
            progress(i + 1, len(tenants))
    threads = services.keys.threads
    if isinstance(threads, ThreadKeyStore):   # the erasure epoch: live thread keys only
        done += threads.rewrap(current)
        dropped = threads.drop_stale_keks(current)
        if dropped:
            logger.info("deleted %d key-encryption keys of older master versions", dropped)
        # PII-vault lookups under the new version's lookup key; the older ones go
        rekey(services, threads.lookups, make=services.pii.make_lookup)
        threads.forget()
    services.keys.forget()
    if done:
        registry.record_event("keys_rewrapped", master_version=current, rows=done,
                              tenants=len(tenants))
    logger.info("rewrapped %d key rows under master version %s", done, current)
    return done


def rotate_data_key(services: SaverServices, tenant: str) -> int:
    tenant = services.gate.admin_tenant("rotate_data_key", validate_tenant(tenant)) or tenant
    version = services.keys.new_data_key(tenant)
    services.registry.record_event("data_key_rotated", tenant=tenant, version=version)
    return version


def master_versions_in_use(services: SaverServices) -> dict[str, int]:
    services.gate.admin_tenant("master_versions_in_use", operator_only=True)
    counts: dict[str, int] = {}
    for tenant in services.registry.tenants_with_keys():
        for row in services.registry.load_key_rows(tenant):
            counts[row.master_version] = counts.get(row.master_version, 0) + 1
    threads = services.keys.threads
    if isinstance(threads, ThreadKeyStore):
        for version, n in threads.versions_in_use().items():
            counts[version] = counts.get(version, 0) + n
    return counts


def destroy_master_key(services: SaverServices, version: str) -> None:
    """Destroy the provider key ``version`` (a KMS key, an HSM key object): the explicit step
    that retiring never takes for a provider key, since a restored copy of a database shares
    its id and its keys. Refused for the current version, while a key row here is wrapped
    under it, and while the provider records another database."""
    services.gate.admin_tenant("destroy_master_key", operator_only=True)
    ring: Any = services.keyring
    destroy = getattr(ring, "destroy_version", None)
    if not callable(destroy):
        raise ConfigurationError(
            f"{type(ring).__name__} holds no provider keys to destroy (a keyring file's "
            "versions are removed by rotate_keys(retire_old=True))")
    if version == ring.current_version:
        raise ConfigurationError(f"master version {version} is current: rotate first")
    in_use = master_versions_in_use(services).get(version, 0)
    if in_use:
        raise ConfigurationError(
            f"master version {version} still wraps {in_use} key row(s) of this database")
    require_sole_database(services, "destroying a master key")
    destroy(version)
    services.registry.record_event("master_key_destroyed", version=version)
    logger.warning("master key %s destroyed at the key provider", version)


def erasure_epoch(services: SaverServices) -> dict[str, Any]:
    return erasure_epoch_of(services.registry, services.keyring)
