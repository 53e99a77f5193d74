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
import os
from collections.abc import Iterable
from typing import Any

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


# --- where a store keeps its items (shared by SecureStore and forget_subject) -----------------
#: the registry records durable store locations up to this length (its meta values)
_LOCATION_MAX = 256


def is_durable(location: str) -> bool:
    """A location another process can open (a file, a database), not process memory."""
    return location.startswith(("sqlite:", "postgresql://"))


def sqlite_location(file: str) -> str:
    if not file or file == ":memory:":
        return ""
    return ("sqlite:" + os.path.realpath(file))[:_LOCATION_MAX]


def postgres_location(host: Any, port: Any, dbname: Any, options: Any) -> str:
    """Host, port, database and server options (a ``search_path`` names another schema):
    never a user or password."""
    where = f"postgresql://{host or 'localhost'}:{port or 5432}/{dbname or ''}"
    return (where + (f"?options={options}" if options else ""))[:_LOCATION_MAX]


def registry_location(engine: Any) -> str:
    """Where the registry's database is, in :func:`store_location`'s terms ("" in memory).
    On PostgreSQL it is read off a live connection, as a store's is: a URL without a host
    (the Unix socket) or with defaults left out names the same database differently."""
    url = engine.url
    if url.get_backend_name() == "sqlite":
        return sqlite_location(url.database or "")
    with engine.connect() as conn:
        info = getattr(conn.connection.dbapi_connection, "info", None)
    if info is None:
        return postgres_location(url.host, url.port, url.database, url.query.get("options"))
    return postgres_location(info.host, info.port, info.dbname, info.options)
