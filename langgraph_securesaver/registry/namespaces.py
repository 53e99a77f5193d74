"""The checkpoint namespaces each thread was written in (its subgraphs).

The BaseCheckpointSaver API has no way to ask which namespaces a thread holds, and some savers
list a thread's root namespace only unless told another (LMDB, objectstorage). SecureSaver
notes each namespace the first time it writes one (once per process), so ``copy_thread``
copies every namespace on any saver; the rows go with the thread.

It also records where SecureStores of this registry wrote items outside its own database (a
SQLite file, another PostgreSQL database: ``securesaver_meta`` rows ``store:<digest>``), so
``forget_subject`` in any process knows every store a subject's items may live in.

A base class of :class:`~.core.Registry`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import sqlalchemy as sa

from .base import RegistryBase
from .schema import meta_table, thread_namespaces

_STORE_KEY = "store:"


def _ns_key(tenant: str, thread_id: str, ns: str) -> str:
    return hashlib.sha256("\0".join((tenant, thread_id, ns)).encode()).hexdigest()


class RegistryNamespaces(RegistryBase):
    """Which checkpoint namespaces a thread was written in."""

    def note_namespaces(self, tenant: str, thread_id: str, namespaces: Iterable[str]) -> None:
        rows = [{"ns_key": _ns_key(tenant, thread_id, ns), "tenant": tenant,
                 "thread_id": thread_id, "checkpoint_ns": ns} for ns in namespaces]
        with self.begin() as conn:
            self._insert_ignore(conn, thread_namespaces, rows)

    def namespaces(self, tenant: str, thread_id: str) -> list[str]:
        with self.begin() as conn:
            return sorted(conn.execute(sa.select(thread_namespaces.c.checkpoint_ns).where(
                thread_namespaces.c.tenant == tenant,
                thread_namespaces.c.thread_id == thread_id)).scalars())


    def note_store(self, location: str) -> None:
        """Record that a SecureStore of this registry writes items at ``location``."""
        key = _STORE_KEY + hashlib.sha256(location.encode()).hexdigest()[:40]
        with self.begin() as conn:
            self._insert_ignore(conn, meta_table, [{"key": key, "value": location}])

    def store_locations(self) -> list[str]:
        """Every location :meth:`note_store` recorded."""
        with self.begin() as conn:
            return sorted(conn.execute(sa.select(meta_table.c.value).where(
                meta_table.c.key.like(_STORE_KEY + "%"))).scalars())
