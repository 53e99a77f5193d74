"""The registry's wrapped key rows: loading and storing them, and the database id they are
bound to.

A base class of :class:`~.core.Registry` (implements :class:`~..keys.crypto.KeyStore`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ..errors import KeyGoneError, TamperedDataError
from ..keys.lifecycle import RETIRING_MASTERS
from ..keys.provider import KeyProvider, WrappedKey
from ..keys.tokens import KeyRow
from .base import RegistryBase
from .schema import DATABASE_ID, meta_table, tenant_keys, thread_keys

logger = logging.getLogger("langgraph_securesaver.registry.core")



def retiring_versions(conn: Any) -> frozenset[str]:
    """The master versions a rotation is retiring (:func:`mark_retiring`), read in the caller's
    transaction; on PostgreSQL the row stays locked FOR SHARE until it commits."""
    value = conn.execute(sa.select(meta_table.c.value).where(
        meta_table.c.key == RETIRING_MASTERS).with_for_update(read=True)).scalar()
    return frozenset(v for v in str(value or "").split(",") if v)


class RegistryKeys(RegistryBase):
    """Key rows (the KeyStore protocol) and the database id they are bound to."""

    _database_id: str | None = None

    # the database id ----------------------------------------------------------------------------
    def database_id(self) -> str:
        """A random id for this database, created on first use and kept in
        ``securesaver_meta``: bound into every wrapped key (a row copied from another database
        does not unwrap here), and recorded by keyrings in the databases they serve."""
        if self._database_id is None:
            with self.begin() as conn:
                self._insert_ignore(conn, meta_table, [
                    {"key": DATABASE_ID, "value": secrets.token_hex(16)}])
                self._database_id = str(conn.execute(sa.select(meta_table.c.value).where(
                    meta_table.c.key == DATABASE_ID)).scalar_one())
        return self._database_id

    # rows ---------------------------------------------------------------------------------------
    @staticmethod
    def _key_row(r: Any) -> KeyRow:
        return KeyRow(r["tenant"], r["purpose"], r["version"], r["master_version"],
                      bytes(r["wrapped"]), r["created_at"])

    def load_key_rows(self, tenant: str) -> list[KeyRow]:
        # CAST: a row a database writer filled with text (SQLite keeps any type in any
        # column) reads as bytes that fail to unwrap (TamperedDataError), not as a driver error
        wrapped = sa.cast(tenant_keys.c.wrapped, sa.LargeBinary).label("wrapped")
        with self.begin() as conn:
            rows = conn.execute(
                sa.select(*[c for c in tenant_keys.c if c.name != "wrapped"], wrapped)
                .where(tenant_keys.c.tenant == tenant)
            ).mappings().all()
        return [self._key_row(r) for r in rows]

    def insert_key_rows(self, rows: Sequence[KeyRow]) -> None:
        """Insert key rows (a tenant's keys, a KEK) unless present -- refused with KeyGoneError,
        nothing inserted, when one is wrapped under a master version a rotation is retiring
        (checked after the insert, in its transaction: see thread_keys.mark_retiring)."""
        with self.begin() as conn:
            self._insert_ignore(conn, tenant_keys, [r.__dict__ for r in rows])
            stale = {r.master_version for r in rows} & retiring_versions(conn)
            if stale:
                raise KeyGoneError(
                    f"master version(s) {', '.join(sorted(stale))} are being retired by a key "
                    "rotation: no new key is wrapped under them; nothing was stored, retry "
                    "(the keyring is reloaded)")

    def replace_key_rows(self, rows: Sequence[KeyRow]) -> None:
        with self.begin() as conn:
            for r in rows:
                conn.execute(
                    tenant_keys.update()
                    .where(tenant_keys.c.tenant == r.tenant, tenant_keys.c.purpose == r.purpose,
                           tenant_keys.c.version == r.version)
                    .values(master_version=r.master_version, wrapped=r.wrapped)
                )

    def tenants_with_keys(self) -> list[str]:
        with self.begin() as conn:
            return list(conn.execute(sa.select(tenant_keys.c.tenant).distinct()).scalars())

    def delete_tenant_keys(self, tenant: str) -> int:
        with self.begin() as conn:
            return conn.execute(tenant_keys.delete().where(tenant_keys.c.tenant == tenant)).rowcount

    # verification -------------------------------------------------------------------------------
    def key_row_problems(self, provider: KeyProvider) -> tuple[int, list[tuple[str, str, str]]]:
        """(rows checked, problems): every key row must unwrap under its context bound to this
        database (``events --verify``). A row copied from another database, altered, or wrapped
        by a master version the keyring lacks is named by digests, never by values."""
        from ..keys.tokens import row_context
        from .integrity import row_tag
        with self.begin() as conn:
            rows = [self._key_row(r) for r in conn.execute(sa.select(tenant_keys)).mappings()]
        problems = []
        for row in rows:
            try:
                provider.unwrap(row.tenant, WrappedKey(row.master_version, row.wrapped),
                                row_context(self, row.tenant, row.purpose, row.version))
            except TamperedDataError as exc:
                problems.append((tenant_keys.name, f"tenant#{row_tag(row.tenant)} "
                                 f"{row.purpose} v{row.version}",
                                 "does not unwrap here (copied from another database, altered, "
                                 f"or its master version is gone): {type(exc).__name__}"))
        return len(rows), problems

    def kek_row(self, tenant: str, master_version: str, purpose: str | None = None
                ) -> KeyRow | None:
        """The tenant's KEK row (or ``purpose`` row: one per master version, like the PII
        lookup key) under ``master_version`` (the lowest number if a race between processes
        made two): thread and vault-entry key rows name their KEK this way."""
        from ..keys.tokens import KEK
        rows = [r for r in self.load_key_rows(tenant)
                if r.purpose == (purpose or KEK) and r.master_version == master_version]
        return min(rows, key=lambda r: r.version) if rows else None

    def thread_key_problems(self, provider: KeyProvider
                            ) -> tuple[int, list[tuple[str, str, str]]]:
        """(rows checked, problems): every thread key must unwrap here under its tenant's KEK,
        bound to this database, tenant and thread (one provider unwrap per KEK)."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        from ..keys.crypto import kek_unwrap, row_context
        from ..keys.tokens import KEK, thread_key_context
        from .integrity import row_tag
        database = self.database_id()
        with self.begin() as conn:
            rows = conn.execute(sa.select(thread_keys.c.tenant, thread_keys.c.thread_id,
                                          thread_keys.c.master_version,
                                          thread_keys.c.wrapped)).all()
        keks: dict[tuple[str, str], AESGCM | None] = {}

        def kek_of(tenant: str, version: str) -> AESGCM:
            if (tenant, version) not in keks:
                row = self.kek_row(tenant, version)
                keks[(tenant, version)] = None if row is None else AESGCM(provider.unwrap(
                    tenant, WrappedKey(row.master_version, row.wrapped),
                    row_context(self, tenant, KEK, row.version)))
            kek = keks[(tenant, version)]
            if kek is None:
                raise TamperedDataError("no key-encryption key for this thread key")
            return kek

        problems = []
        for tenant, thread_id, version, blob in rows:
            try:
                kek_unwrap(kek_of(str(tenant), str(version)), bytes(blob),
                           thread_key_context(database, tenant, thread_id))
            except TamperedDataError as exc:
                problems.append((thread_keys.name, f"tenant#{row_tag(tenant)} "
                                 f"thread#{row_tag(tenant, thread_id)}",
                                 "does not unwrap here (copied from another database, altered, "
                                 f"or its master version is gone): {type(exc).__name__}"))
        return len(rows), problems


def _retired_not_destroyed(conn: Any) -> list[str]:
    """A key provider's versions retired here (events) and not destroyed since, by
    ``destroy-master-key`` or a shred (which destroys every older version)."""
    import json

    from .schema import events
    kinds = ("master_keys_retired", "master_key_destroyed", "tenant_shredded")
    left: dict[str, None] = {}
    for kind, detail in conn.execute(sa.select(events.c.kind, events.c.detail).where(
            events.c.kind.in_(kinds)).order_by(events.c.id)):
        if kind == "tenant_shredded":
            left.clear()
        elif kind == "master_key_destroyed":
            left.pop(str(json.loads(detail).get("version")), None)
        else:
            left.update(dict.fromkeys(str(v) for v in json.loads(detail).get("versions", [])))
    return list(left)


def erasure_epoch_of(registry: Any, ring: Any) -> dict[str, Any]:
    """The pending erasure epoch: the master versions the keyring still holds, and how many
    erasures (deletion receipts, ``pii_forgotten`` events) were made under one of them -- the
    copies of their keys in remnants and backups open until ``rotate-keys --retire-old``."""
    from .schema import events, receipts
    held = [v for v in ring.versions()
            if not getattr(ring, "shredded_from", lambda _v: False)(v)]
    pending = 0
    with registry.begin() as conn:
        if getattr(ring, "persists_itself", False):   # a provider: retiring destroys nothing
            held += [v for v in _retired_not_destroyed(conn) if v not in held]
        for version in held:
            mark = f'%"erased_under": "{version}"%'
            pending += int(conn.execute(sa.select(sa.func.count()).select_from(receipts).where(
                receipts.c.detail.like(mark))).scalar() or 0)
            pending += int(conn.execute(sa.select(sa.func.count()).select_from(events).where(
                events.c.kind == "pii_forgotten", events.c.detail.like(mark))).scalar() or 0)
    return {"current_master": ring.current_version, "held_masters": held,
            "erasures_pending": pending}
