"""The keys PII-vault lookups are derived under, and their replacement at each erasure epoch.

A vault row keeps the *lookup* of its value (``redaction.make_token``: a keyed HMAC of the
normalized value) so that one value keeps one entry. Anything keyed by a key that outlives an
erasure confirms the erased value from a copy of the row (a PostgreSQL dead tuple, a backup).
So the lookup key is a random key per tenant **and master version** (a ``lookup`` row of
``securesaver_tenant_keys``, wrapped by the key provider), like the tenant KEK: the erasure
epoch (``rotate_keys(retire_old=True)``) creates the new version's lookup key, recomputes the
lookup of every live row under it (the value is opened with the entry's own key), deletes the
older lookup rows no vault row names any more, and retires the master version that wrapped
them. From then on no copy of an erased row confirms its value with the live keyring.

Each vault row names the master version its lookup was computed under (``lookup_key``):
erasure by value computes the lookups under every lookup key the tenant still holds, and an
older row is re-keyed at the next epoch. A value written again under another lookup key (a
process whose keyring did not yet know the new master version) gets a second entry; the
re-keying keeps both, the second under an *alias* lookup (``<lookup>~<its token's hex>``),
which erasure by value matches too.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..errors import TamperedDataError
from ..keys.material import SecretBytes
from ..keys.tokens import LOOKUP, associated_data, row_context, wrap_context
from .core import Registry, metadata

if TYPE_CHECKING:   # the audit's tables import this module without any key code
    from ..keys.crypto import KeyManager, KeyRow, TenantKeys

logger = logging.getLogger(__name__)

#: the lookup key of data written without per-thread keys (``thread_keys=False``): derived
#: from the tenant index key, which no epoch replaces
INDEX_DERIVED = ""
ALIAS_SEP = "~"
_BATCH = 500


def index_derived_key(keys: TenantKeys) -> SecretBytes:
    return SecretBytes(bytes.fromhex(keys.blind("pii-token-key")))


class LookupKeys:
    """A tenant's lookup keys, one per master version, unwrapped once per ``ttl``."""

    def __init__(self, keys: KeyManager, registry: Registry, *, ttl: float = 300.0) -> None:
        self.keys = keys
        self.registry = registry
        self.ttl = ttl
        self._cache: dict[tuple[str, str], tuple[float, SecretBytes]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never key material
        return f"LookupKeys(cached={len(self._cache)})"

    def current(self, tenant: str) -> tuple[str, SecretBytes]:
        """(master version, key) the tenant's new lookups are computed under."""
        version = self.keys.provider.current_version
        key = self.key(tenant, version, create=True)
        if key is None:  # pragma: no cover - create=True returns a key or raises
            raise TamperedDataError(f"tenant {tenant!r} has no PII lookup key")
        return version, key

    def live(self, tenant: str) -> list[tuple[str, SecretBytes]]:
        """Every lookup key the tenant holds (erasure by value computes under each)."""
        versions = sorted({r.master_version for r in self.registry.load_key_rows(tenant)
                           if r.purpose == LOOKUP})
        out = []
        for version in versions:
            key = self.key(tenant, version, create=False)
            if key is not None:
                out.append((version, key))
        return out

    def key(self, tenant: str, version: str, *, create: bool) -> SecretBytes | None:
        k = (tenant, version)
        hit = self._cache.get(k)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        with self._lock:
            row = self.registry.kek_row(tenant, version, LOOKUP)
            if row is None:
                if not create:
                    self._cache.pop(k, None)
                    return None
                row = self._create(tenant, version)
            from ..keys.provider import WrappedKey
            key = SecretBytes(self.keys.unwrap_fresh(
                tenant, WrappedKey(row.master_version, row.wrapped),
                row_context(self.registry, tenant, LOOKUP, row.version)))
            self._cache[k] = (time.monotonic(), key)
            return key

    def _create(self, tenant: str, version: str) -> KeyRow:
        from ..keys.crypto import KeyRow
        rows = [r for r in self.registry.load_key_rows(tenant) if r.purpose == LOOKUP]
        number = max((r.version for r in rows), default=0) + 1
        wrapped = self.keys.provider.wrap(tenant, secrets.token_bytes(32), wrap_context(
            tenant, LOOKUP, number, self.registry.database_id()))
        self.registry.insert_key_rows([KeyRow(
            tenant, LOOKUP, number, wrapped.master_version, wrapped.blob, time.time())])
        row = self.registry.kek_row(tenant, version, LOOKUP)  # another process may have won
        if row is None:
            raise TamperedDataError(
                f"tenant {tenant!r}: the key provider wrapped a new PII lookup key under "
                f"master version {wrapped.master_version!r}, not {version!r} (rotated while "
                "it was being created); retry")
        return row

    def forget(self) -> None:
        with self._lock:
            self._cache.clear()


def public_token_for(lookup: str) -> str:
    """A new random public token of the kind of ``lookup`` (same ``<KIND:32 hex>`` shape)."""
    label = lookup[1:lookup.index(":")] if lookup.startswith("<") and ":" in lookup else "PII"
    return f"<{label}:{secrets.token_hex(16)}>"


def alias(lookup: str, token: str) -> str:
    """The lookup of a second entry of one value (its token's hex keeps it unique)."""
    return f"{lookup}{ALIAS_SEP}{token.rsplit(':', 1)[-1].rstrip('>')}"


def matching(column: Any, lookups: Sequence[str]) -> Any:
    """WHERE ``column`` is one of ``lookups`` or an alias of one."""
    return sa.or_(column.in_(list(lookups)), *(
        column.startswith(f"{lookup}{ALIAS_SEP}", autoescape=True) for lookup in lookups))


def rekey(services: Any, lookups: LookupKeys, *,
          make: Callable[[SecretBytes, str, str], str]) -> int:
    """The epoch's re-keying: every live vault row whose lookup is not under the current
    master version's lookup key gets it recomputed (``make(key, kind, value)``); then the
    older lookup rows no row names are deleted. Returns the rows re-keyed."""
    from .schema import tenant_keys
    vault = _vault_table()
    registry: Registry = services.registry
    done = 0
    for tenant in services.vault.tenants():
        keys = services.keys.keys_for(tenant, create=False)
        if keys is None:
            continue
        version, key = lookups.current(tenant)
        stale = sa.and_(vault.c.tenant == tenant, vault.c.lookup.is_not(None), sa.or_(
            vault.c.lookup_key.is_(None), vault.c.lookup_key != version))
        while True:
            with registry.begin() as conn:
                rows = conn.execute(sa.select(
                    vault.c.token, vault.c.kind, vault.c.lookup, vault.c.sealed).where(
                    stale).order_by(vault.c.token).limit(_BATCH)).all()
            if not rows:
                break
            fresh = {}
            for token, kind, _old, sealed in rows:
                value = keys.open(bytes(sealed), associated_data("pii", tenant, str(token)))
                fresh[str(token)] = make(key, str(kind), value.decode("utf-8", "surrogatepass"))
            done += _apply(registry, tenant, version, rows, fresh)
        services.vault.drop_tenant_cache(tenant)   # lookup -> token mappings of the old key
    with registry.begin() as conn:   # older lookup keys nobody's lookup is under any more
        used = {(str(t), str(v)) for t, v in conn.execute(
            sa.select(vault.c.tenant, vault.c.lookup_key).distinct())}
        stale_rows = conn.execute(sa.select(
            tenant_keys.c.tenant, tenant_keys.c.version, tenant_keys.c.master_version).where(
            tenant_keys.c.purpose == LOOKUP,
            tenant_keys.c.master_version != services.keyring.current_version)).all()
        for tenant, number, master in stale_rows:
            if (str(tenant), str(master)) not in used:
                conn.execute(tenant_keys.delete().where(
                    tenant_keys.c.tenant == tenant, tenant_keys.c.purpose == LOOKUP,
                    tenant_keys.c.version == number))
    lookups.forget()
    if done:
        logger.info("re-keyed %d PII-vault lookups", done)
    return done


def _apply(registry: Registry, tenant: str, version: str, rows: Sequence[Any],
           fresh: dict[str, str]) -> int:
    """One batch's updates, in one transaction; a lookup another row already holds (a second
    entry of the value) becomes an alias."""
    vault = _vault_table()
    with registry.begin() as conn:
        taken = {str(lookup): str(token) for lookup, token in conn.execute(
            sa.select(vault.c.lookup, vault.c.token).where(
                vault.c.tenant == tenant, vault.c.lookup.in_(list(set(fresh.values())))))}
        updates = []
        for token, _kind, old, _sealed in rows:
            new = fresh[str(token)]
            if taken.get(new, str(token)) != str(token):
                new = alias(new, str(token))
            taken.setdefault(new, str(token))
            updates.append({"b_t": tenant, "b_tok": str(token), "b_old": old, "b_new": new,
                            "b_v": version})
        conn.execute(vault.update().where(
            vault.c.tenant == sa.bindparam("b_t"), vault.c.token == sa.bindparam("b_tok"),
            vault.c.lookup == sa.bindparam("b_old")).values(
            lookup=sa.bindparam("b_new"), lookup_key=sa.bindparam("b_v")), updates)
    return len(updates)


def _vault_table() -> sa.Table:
    """``securesaver_pii_vault`` (defined by :mod:`.pii_vault`, which imports this module)."""
    return metadata.tables["securesaver_pii_vault"]
