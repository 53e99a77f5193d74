"""Inspection, operator actions and deletion of stored idempotency records: the part of
:class:`~.store.IdempotencyStore` that operators, recovery and the purge path use (a base
class of the store; it relies on the store's transactions and sealing).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..keys.crypto import TenantKeys
from ..offthread import to_thread
from . import schema
from . import statements as stmts
from .keys import KeyScope
from .records import IdempotencyRecord
from .schema import COMPLETED, FAILED, idempotency_records

_T = idempotency_records


class RecordAdmin:
    """``get``, ``list_records``, ``result``, ``resolve``, ``delete_thread``, ``delete_tenant``."""

    _now: Any

    def _begin(self, what: str) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def tenant_keys(self, tenant: str) -> TenantKeys:
        raise NotImplementedError

    def _seal_value(self, scope: KeyScope, value: Any) -> bytes:
        raise NotImplementedError

    def _open_value(self, scope: KeyScope, token: bytes) -> Any:
        raise NotImplementedError

    # inspection and operator actions --------------------------------------------------------
    def get(self, tenant: str, thread_id: str, key: str) -> IdempotencyRecord | None:
        with self._begin("reading a record") as conn:
            r = conn.execute(sa.select(_T).where(
                _T.c.tenant == tenant, _T.c.thread_id == thread_id, _T.c.key == key)
            ).mappings().first()
        return self._record(r) if r is not None else None

    def list_records(self, tenant: str, thread_id: str | None = None, *,
                     state: str | None = None) -> list[IdempotencyRecord]:
        q = sa.select(_T).where(_T.c.tenant == tenant).order_by(_T.c.created_at)
        if thread_id is not None:
            q = q.where(_T.c.thread_id == thread_id)
        if state is not None:
            q = q.where(_T.c.state == state)
        with self._begin("listing records") as conn:
            rows = conn.execute(q).mappings().all()
        return [self._record(r) for r in rows]

    def _record(self, r: Any) -> IdempotencyRecord:
        scope = KeyScope(r["tenant"], r["thread_id"], r["key"], r["kind"], r["name"])
        error = None
        if r["error"] is not None:
            error = self.tenant_keys(scope.tenant).open(bytes(r["error"]), scope.error_aad()
                                                        ).decode("utf-8", "replace")
        return IdempotencyRecord(
            r["tenant"], r["thread_id"], r["key"], r["kind"], r["name"], r["state"],
            r["fingerprint"], r["owner"], int(r["fencing_token"]), int(r["attempts"]),
            r["lease_expires_at"], r["created_at"], r["updated_at"], r["result"] is not None,
            error)

    def result(self, tenant: str, thread_id: str, key: str) -> Any:
        """The stored (decrypted) result of a completed key; LookupError if there is none."""
        with self._begin("reading a result") as conn:
            r = conn.execute(sa.select(_T.c.kind, _T.c.name, _T.c.result).where(
                _T.c.tenant == tenant, _T.c.thread_id == thread_id, _T.c.key == key)).first()
        if r is None or r.result is None:
            raise LookupError(f"no stored result for idempotency key {key}")
        return self._open_value(KeyScope(tenant, thread_id, key, r.kind, r.name),
                                bytes(r.result))

    def resolve(self, tenant: str, thread_id: str, key: str, *, result: Any = None,
                retry: bool = False) -> bool:
        """Settle an ``unknown`` (or stuck) key: record ``result`` as its completed outcome, or
        with ``retry=True`` make it claimable again (same key, attempts kept)."""
        now = self._now
        with self._begin("reading a record") as conn:
            r = conn.execute(sa.select(_T.c.kind, _T.c.name, _T.c.origin).where(
                _T.c.tenant == tenant, _T.c.thread_id == thread_id, _T.c.key == key)).first()
        if r is None:
            return False
        scope = KeyScope(tenant, thread_id, key, r.kind, r.name, r.origin or "")
        values: dict[str, Any] = ({"state": FAILED, "lease_expires_at": None} if retry else
                                  {"state": COMPLETED, "result": self._seal_value(scope, result),
                                   "lease_expires_at": None, "error": None})
        with self._begin("resolving a key") as conn:
            n = conn.execute(_T.update().where(stmts.pk(), _T.c.state != COMPLETED)
                             .values(updated_at=now, **values), stmts.pk_params(scope)).rowcount
        return bool(n)

    # deletion -------------------------------------------------------------------------------
    def delete_thread(self, tenant: str, thread_id: str) -> int:
        """Delete the thread's idempotency records (the tenant-wide records it claimed too:
        their values are the thread's, erased with it), recovery row and dead letters."""
        total = 0
        with self._begin("deleting a thread") as conn:
            for table in schema.TABLES:
                mine = table.c.thread_id == thread_id
                if table is _T and thread_id:
                    mine = sa.or_(mine, sa.and_(_T.c.thread_id == "", _T.c.origin == thread_id))
                total += conn.execute(table.delete().where(table.c.tenant == tenant, mine)
                                      ).rowcount
        return total

    def delete_tenant(self, tenant: str) -> int:
        """Delete every idempotency / recovery / dead-letter row of the tenant."""
        total = 0
        with self._begin("deleting a tenant") as conn:
            for table in schema.TABLES:
                total += conn.execute(table.delete().where(table.c.tenant == tenant)).rowcount
        return total

    async def adelete_thread(self, tenant: str, thread_id: str) -> int:
        return await to_thread(self.delete_thread, tenant, thread_id)

    async def adelete_tenant(self, tenant: str) -> int:
        return await to_thread(self.delete_tenant, tenant)
