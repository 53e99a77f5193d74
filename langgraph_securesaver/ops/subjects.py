"""Forgetting one person: every thread of a subject (found by its keyed digest, see
:mod:`..registry.subjects`), with its pending writes, PII-vault values, idempotency and recovery
records and keys, through the one thread deletion path (crypto-erasure); the subject's store items
(in the registry's database, and in every SecureStore named by ``stores=``; refused before
anything is deleted when a store the registry knows of is not named); optionally the values of
their identifiers wherever else the tenant holds them; one receipt.

Knows the services of a saver (gate, keys, subject labels, vault, registry); not the saver.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..audit import summaries
from ..errors import ConfigurationError, StoreNotReachedError
from ..gate import Denial
from ..keys.tokens import ITEM
from ..registry.subjects import subject_digest
from ..services import SaverServices
from ..tenancy import ThreadRef, validate_actor, validate_subject, validate_tenant
from .pii import erase_identifiers, identifier_list
from .threads import erased_under, purge_thread_storage, thread_key_store

#: ``store_namespace`` default: the namespaces that start with the subject id
SUBJECT_NAMESPACE = object()
#: per-thread counts of the purge path summed into the receipt
_COUNTED = ("checkpoints", "pii_values", "idempotency_records", "thread_keys")


@dataclass(frozen=True)
class SubjectErasure:
    """What :meth:`SecureSaver.forget_subject` erased, per tenant (counts, never values)."""

    tenants: builtins.list[str]
    #: threads of the subject deleted (their keys destroyed)
    threads: dict[str, int] = field(default_factory=dict)
    #: PII-vault values erased: those only the subject's threads used, and (with
    #: ``identifiers``) the identifiers' values wherever the tenant held them
    pii_values: dict[str, int] = field(default_factory=dict)
    #: SecureStore items deleted (namespaces starting with the subject id, by default)
    store_items: dict[str, int] = field(default_factory=dict)
    #: of those, per tenant, the items deleted in each store named by ``stores=``
    #: (by location: ``sqlite:<file>``, ``postgresql://host:port/db``, ``memory:...``)
    stores: dict[str, dict[str, int]] = field(default_factory=dict)
    #: every count of the receipt, per tenant
    detail: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the id of the one receipt written (``securesaver forget-subject --signing-key`` signs it)
    receipt_id: str = ""

    @property
    def total_threads(self) -> int:
        return sum(self.threads.values())


def forget_subject(services: SaverServices, subject: str | None = None, *,
                   tenants: Iterable[str] | None = None, identifiers: Iterable[str] = (),
                   store_namespace: Any = SUBJECT_NAMESPACE, stores: Iterable[Any] = (),
                   requested_by: str | None = None) -> SubjectErasure:
    """See :meth:`..ops.api.SaverOperations.forget_subject`."""
    requested_by = validate_actor(requested_by)
    if subject is not None and not isinstance(subject, str) and isinstance(
            subject, (builtins.list, tuple, set, frozenset)):
        raise ConfigurationError(
            "forget_subject(subject, ...) takes one subject id; pass a person's e-mails, "
            "phone numbers or names as identifiers=[...]")
    subject = None if subject is None else validate_subject(subject, "the subject")
    values = identifier_list(identifiers, allow_empty=subject is not None)
    namespace = _namespace(store_namespace, subject)
    names = subject_tenants(services, tenants)
    named = reached_stores(services, stores, namespace is not None)
    per: dict[str, dict[str, int]] = {}
    by_store: dict[str, dict[str, int]] = {}
    for tenant in names:
        per[tenant] = _forget_in_tenant(services, tenant, subject, values, namespace)
        if namespace is not None:
            by_store[tenant] = _purge_named(services, tenant, namespace, named, per[tenant])
    services.flush_deleted()
    when = erased_under(services)
    receipt_id = uuid.uuid4().hex
    services.registry.add_receipt(
        receipt_id=receipt_id,
        tenant=names[0] if len(names) == 1 else "", thread_id=None, action="forgotten",
        reason="forget_subject", requested_by=requested_by,
        detail={"by_subject": subject is not None, "identifiers": len(values),
                "tenants": len(names), "counts": per, "stores": by_store,
                "erased_under": when})
    for tenant in names:
        counts: dict[str, Any] = dict(per[tenant])
        services.registry.record_event(
            "subject_forgotten", tenant=tenant, actor=requested_by, erased_under=when,
            **counts)
    return SubjectErasure(
        tenants=names, threads={t: c["threads"] for t, c in per.items()},
        pii_values={t: c["pii_values"] + c["values_erased"] for t, c in per.items()},
        store_items={t: c["store_items"] for t, c in per.items()}, stores=by_store,
        detail=per, receipt_id=receipt_id)


def reached_stores(services: SaverServices, stores: Iterable[Any], erasing: bool
                   ) -> dict[str, Any]:
    """The named SecureStores by location, after checking that together with the registry's
    own database they reach every store a SecureStore of this registry wrote to (recorded in
    the registry, or in this process for stores in memory). Raises
    :class:`StoreNotReachedError` otherwise: nothing is deleted yet."""
    from ..registry.namespaces import registry_location

    def is_store(s: Any) -> bool:   # a SecureStore (this layer does not import the store's)
        return callable(getattr(s, "reached_location", None))

    single = isinstance(stores, (str, bytes)) or is_store(stores)
    listed: builtins.list[Any] = [] if single else builtins.list(stores)
    if single or not all(is_store(s) for s in listed):
        raise ConfigurationError("forget_subject(stores=...) takes a list of SecureStores")
    named = {s.reached_location(): s for s in listed}
    if not erasing:
        return named
    reached = {registry_location(services.registry.engine), *named}
    missing = sorted((set(services.registry.store_locations()) | services.store_locations)
                     - reached)
    if missing:
        raise StoreNotReachedError(
            f"SecureStores of this registry wrote items to {len(missing)} store(s) this call "
            f"does not reach ({', '.join(missing[:3])}): the subject's items there would "
            "survive. Pass them as forget_subject(stores=[secure_store, ...]) "
            "(securesaver forget-subject --store-url URL), or store_namespace=None to leave "
            "store items alone; nothing was deleted")
    return named


def _purge_named(services: SaverServices, tenant: str, namespace: tuple[str, ...],
                 named: dict[str, Any], counts: dict[str, int]) -> dict[str, int]:
    """The subject's items in each named store, through that store's API, and the PII
    originals only they used (added to ``counts``). Returns items per store location."""
    out: dict[str, int] = {}
    if services.keys.keys_for(tenant, create=False) is None:
        return out
    for location, store in named.items():
        owners = store.purge_subject_items(tenant, namespace)   # keys first, then the items
        out[location] = len(owners)
        counts["store_items"] += len(owners)
        if owners:
            with services.registry.begin() as conn:
                counts["pii_values"] += sum(services.vault.delete_threads_in(
                    conn, [(tenant, o) for o in owners]).values())
    return out


def _forget_in_tenant(services: SaverServices, tenant: str, subject: str | None,
                      values: Sequence[str], namespace: tuple[str, ...] | None
                      ) -> dict[str, int]:
    counts = dict.fromkeys(("threads", *_COUNTED, "store_items", "values_erased",
                            "value_threads"), 0)
    keys = services.keys.keys_for(tenant, create=False)
    if keys is None:
        return counts
    if subject is not None:
        thread_ids = subject_threads(services, tenant, subject)
        for thread_id in thread_ids:       # the one deletion path: keys go with the data
            purged = purge_thread_storage(services, ThreadRef(tenant, thread_id))
            services.registry.forget_thread(tenant, thread_id)
            services.forget_thread(tenant, thread_id)
            for name in _COUNTED:
                counts[name] += int(purged.get(name, 0))
        counts["threads"] = len(thread_ids)
    if namespace is not None:
        counts["store_items"], store_values = _purge_store(services, tenant, namespace)
        counts["pii_values"] += store_values
    if values:
        counts["values_erased"], counts["value_threads"] = erase_identifiers(
            services, keys, values)
    summaries.mark_changed(services.registry, tenant)
    return counts


def _purge_store(services: SaverServices, tenant: str, namespace: tuple[str, ...]
                 ) -> tuple[int, int]:
    """The subject's SecureStore items on this database, and the PII originals only they
    (or the subject's deleted threads) used, their vault-entry keys destroyed. Returns (items,
    originals erased). The items' own keys are destroyed in the transaction that deletes them
    (crypto-erased, docs/erasure.md)."""
    from ..audit.store_items import purge_store_namespace
    owners = purge_store_namespace(services.registry.engine, tenant, namespace,
                                   item_key_destroyer(services, tenant, namespace))
    erased = 0
    if owners:
        with services.registry.begin() as conn:
            erased = sum(services.vault.delete_threads_in(
                conn, [(tenant, o) for o in owners]).values())
    return len(owners), erased


def item_key_destroyer(services: SaverServices, tenant: str, namespace: tuple[str, ...]
                       ) -> Callable[[Any, Sequence[str]], int]:
    """What destroys, in a caller's transaction, the keys of a subject's store items: those
    listed (``owners``), and for a one-label namespace (the subject id) every item key
    recorded under it, so the remnants of items the store already expired no longer open
    either. The subject's digest is computed here, before any transaction is open."""
    threads = thread_key_store(services)
    keys = services.keys.keys_for(tenant, create=False)
    owner = subject_digest(keys, namespace[0]) \
        if len(namespace) == 1 and keys is not None else None

    def destroy(conn: Any, owners: Sequence[str]) -> int:
        if threads is None:
            return 0
        n = sum(threads.delete_in(conn, [(tenant, o) for o in owners], ITEM).values())
        if owner is not None:
            n += threads.delete_owned_items(conn, tenant, owner)
        return n
    return destroy


def _namespace(store_namespace: Any, subject: str | None) -> tuple[str, ...] | None:
    if store_namespace is SUBJECT_NAMESPACE:
        return None if subject is None else (subject,)
    if store_namespace is None:
        return None
    if isinstance(store_namespace, (str, bytes)) or not all(
            isinstance(label, str) and label for label in store_namespace):
        raise ConfigurationError(
            "forget_subject(store_namespace=...) takes a tuple of namespace labels, or None")
    labels = tuple(store_namespace)
    return labels or None


def subject_tenants(services: SaverServices, tenants: Iterable[str] | None,
                    operation: str = "forget_subject") -> builtins.list[str]:
    """The tenants a subject operation (forgetting, exporting) acts for (the admin scope
    rule: the operator names tenants or gets every tenant; a tenant scope acts for itself
    only)."""
    gate = services.gate
    if tenants is None:
        scoped = gate.admin_tenant(operation, None)
        return [scoped] if scoped is not None else services.registry.tenants()
    if isinstance(tenants, (str, bytes)):
        raise ConfigurationError(f"{operation}(tenants=...) takes a list of tenant ids")
    return sorted({gate.admin_tenant(operation, validate_tenant(t)) or t for t in tenants})


def subject_threads(services: SaverServices, tenant: str, subject: str) -> builtins.list[str]:
    """The thread ids recorded for ``subject`` in ``tenant`` (none when the tenant has no
    keys here): what forgetting deletes and exporting reads."""
    keys = services.keys.keys_for(tenant, create=False)
    return [] if keys is None else services.subjects.threads_of(keys, subject)


def copy_subject(services: SaverServices, tenant: str, source: str, target: str) -> None:
    """copy_thread: the target thread belongs to the source's subject (a copy of a person's
    conversation is theirs); refused when the target already belongs to another subject."""
    if not services.subjects.copy(tenant, source, target):
        raise services.gate.record_denial(Denial(
            tenant, tenant, "copy_thread: the target thread belongs to another subject",
            target))
