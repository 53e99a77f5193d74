"""The subject of a thread: the end user its conversation belongs to, recorded as a keyed
digest so that ``forget_subject`` finds every thread of one person.

A write that names a subject (``subject_scope``, ``configurable["subject_id"]``, the LangGraph
Server user) records ``HMAC(tenant index key, subject)`` for its thread in
``securesaver_thread_subjects`` -- never the subject itself -- unless the thread already has
one. The first write naming a subject fixes it: a later write naming another subject is
refused (the caller raises AccessDenied). Writes that name none leave the thread as it is.
The row is deleted with the thread (every deletion path), so a deleted thread id can be
used again by anyone.

Each process remembers the digests it recorded or read (:class:`SubjectLabels`), so a thread
costs one registry round trip per process, not one per write. A remembered row is read again
when the thread's key is (re)loaded -- after another process deleted the thread, the next
write creates a new key and records the subject again -- and at the latest after ``ttl``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ..keys.crypto import TenantKeys
from ..keys.tokens import THREAD
from .core import Registry
from .schema import pairs_in, thread_subjects

#: the blind-index domain of subject digests (crypto.TenantKeys.blind)
DIGEST_DOMAIN = "subject-id"


def subject_digest(keys: TenantKeys, subject: str) -> str:
    """The keyed digest a subject is recorded under in ``keys``' tenant (32 hex digits)."""
    return keys.blind(DIGEST_DOMAIN, subject)


class SubjectLabels:
    """Records, checks and deletes the subjects of threads for one registry (thread-safe)."""

    def __init__(self, registry: Registry, *, ttl: float = 300.0,
                 cache_size: int = 100_000) -> None:
        self.registry = registry
        self.ttl = ttl
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SubjectLabels(cached={len(self._cache)})"

    # the write path ---------------------------------------------------------------------------
    def bind(self, keys: TenantKeys, thread_id: str, subject: str) -> bool:
        """Record ``subject`` for the thread unless it has one; False when it has another
        (the write must be refused)."""
        tenant = keys.tenant
        digest = subject_digest(keys, subject)
        k = (tenant, thread_id)
        hit = self._cache.get(k)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return hit[1] == digest
        with self.registry.begin() as conn:
            self.registry._insert_ignore(conn, thread_subjects, [{
                "tenant": tenant, "thread_id": thread_id, "subject": digest,
                "created_at": time.time()}])
            stored = conn.execute(sa.select(thread_subjects.c.subject).where(
                thread_subjects.c.tenant == tenant,
                thread_subjects.c.thread_id == thread_id)).scalar()
        stored = digest if stored is None else str(stored)
        self._remember(k, stored)
        return stored == digest

    def copy(self, tenant: str, source: str, target: str) -> bool:
        """Give ``target`` the subject of ``source`` (copy_thread): a copy of a person's
        conversation is theirs too. False when the target has another subject."""
        with self.registry.begin() as conn:
            digest = conn.execute(sa.select(thread_subjects.c.subject).where(
                thread_subjects.c.tenant == tenant,
                thread_subjects.c.thread_id == source)).scalar()
            if digest is None:
                return True
            self.registry._insert_ignore(conn, thread_subjects, [{
                "tenant": tenant, "thread_id": target, "subject": digest,
                "created_at": time.time()}])
            stored = conn.execute(sa.select(thread_subjects.c.subject).where(
                thread_subjects.c.tenant == tenant,
                thread_subjects.c.thread_id == target)).scalar()
        self.forget_cached(tenant, target)
        return stored == digest

    def _remember(self, k: tuple[str, str], digest: str) -> None:
        with self._lock:
            self._cache[k] = (time.monotonic(), digest)
            self._cache.move_to_end(k)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def forget_cached(self, tenant: str, thread_id: str) -> None:
        """Read the thread's row again at its next write (its key was reloaded or it was
        deleted)."""
        with self._lock:
            self._cache.pop((tenant, thread_id), None)

    def key_loaded(self, scope: str, tenant: str, name: str) -> None:
        """Hook of the thread-key store: a thread's key was read from the registry."""
        if scope == THREAD:
            self.forget_cached(tenant, name)

    # forget_subject ---------------------------------------------------------------------------
    def threads_of(self, keys: TenantKeys, subject: str) -> list[str]:
        """The thread ids recorded for ``subject`` in ``keys``' tenant."""
        digest = subject_digest(keys, subject)
        with self.registry.begin() as conn:
            return sorted(str(t) for t in conn.execute(
                sa.select(thread_subjects.c.thread_id).where(
                    thread_subjects.c.tenant == keys.tenant,
                    thread_subjects.c.subject == digest)).scalars())

    def subject_of(self, tenant: str, thread_id: str) -> str | None:
        """The digest recorded for a thread, if any."""
        with self.registry.begin() as conn:
            found = conn.execute(sa.select(thread_subjects.c.subject).where(
                thread_subjects.c.tenant == tenant,
                thread_subjects.c.thread_id == thread_id)).scalar()
        return None if found is None else str(found)

    # deletion (every thread deletion path; the registry's finish_deleted / forget_thread /
    # forget_tenant delete the row in the transaction that deletes the thread's row) ------------
    def delete_in(self, conn: Any, pairs: Sequence[tuple[str, str]]) -> None:
        """Delete the rows of (tenant, thread) ``pairs`` in the caller's transaction."""
        if pairs:
            conn.execute(thread_subjects.delete().where(pairs_in(
                conn.dialect.name, thread_subjects.c.tenant, thread_subjects.c.thread_id,
                list(pairs))))
            for tenant, thread_id in pairs:
                self.forget_cached(tenant, thread_id)

    def forget_tenant(self, tenant: str) -> None:
        with self._lock:
            for k in [k for k in self._cache if k[0] == tenant]:
                del self._cache[k]
