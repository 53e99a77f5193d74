"""Subject access (GDPR Art. 15 and 20, PIPL Art. 45): everything the library holds about one
person, as one JSON document, written while it is read.

The subject's threads are found exactly as ``forget_subject`` finds them, in the same tenants
under the same scope rule (:func:`..ops.subjects.subject_tenants` and
:func:`..ops.subjects.subject_threads`); their store items are those whose namespace starts
with the subject id, as ``forget_subject`` deletes them. Each checkpoint is read through the
saver's own authenticated read path and written out before the next is read, so memory stays
flat however long the history. Personal data is restored: the document is the subject's own.

Document ``securesaver-subject-export/1``::

    {"format", "subject", "exported_at", "database_id",
     "tenants": [{"tenant", "retention_policy": {...}, "threads": [
         {"thread_id", "retention": {...}, "checkpoints": [...], "pending_interrupts": [...],
          "idempotency_records": [...], "receipts": [...]}],
       "store_items": [{"namespace", "key", "value", "updated_at", "expires_at"}]}],
     "counts": {"tenants", "threads", "checkpoints", "store_items"}}
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from collections.abc import Callable, Generator, Iterator
from datetime import date, datetime, timezone
from typing import IO, Any

import sqlalchemy as sa

from ..audit.store_items import has_store_table
from ..keys.crypto import TenantKeys
from ..ops.subjects import subject_tenants, subject_threads
from ..pii_layer import PiiLayer
from ..services import SaverLike
from ..storage.store_format import item_aad
from ..storage.stored_json import lenient_json_loads
from ..tenancy import tenant_tag, validate_subject
from ..timeargs import iso
from .chains import receipts_of_threads

EXPORT_FORMAT = "securesaver-subject-export/1"
INTERRUPT = "__interrupt__"
#: checkpoints read at once: memory stays at this many (a long conversation's checkpoints
#: each hold all its messages), however long the history
PAGE = 10
_THREAD_FIELDS = ("created_at", "last_activity", "expires_at")
_STORE_SQL = {pg: sa.text(
    "SELECT prefix, key, " + ("value::text" if pg else "value") + ", updated_at, expires_at "
    "FROM store WHERE prefix = :p OR prefix LIKE :under ESCAPE '\\' ORDER BY prefix, key")
    for pg in (False, True)}


def export_subject(saver: SaverLike, subject: str, *, tenants: Any = None,
                   out: IO[str] | None = None,
                   read: Callable[..., Iterator[Any]] | None = None) -> dict[str, Any]:
    """See :meth:`.api.EvidenceOperations.export_subject`. ``read``: how a thread's
    checkpoints are listed, ``read(config, before=..., limit=...)`` (default: the saver's
    ``list``)."""
    subject = validate_subject(subject, "the subject")
    names = subject_tenants(saver.services, tenants, "export_subject")
    job = _Export(saver, subject, read or saver.list)  # type: ignore[attr-defined]
    if out is not None:
        return job.write(names, out)
    buffer = io.StringIO()
    job.write(names, buffer)
    document: dict[str, Any] = json.loads(buffer.getvalue())
    return document


class _Export:
    def __init__(self, saver: SaverLike, subject: str,
                 read: Callable[..., Iterator[Any]]) -> None:
        self.read = read
        self.services = saver.services
        self.subject = subject
        # a saver built with redaction=None still reads tokens a redacting saver stored: they
        # are restored here all the same (restoring needs the vault, not the analyzer)
        pii = self.services.pii
        self.restorer = None
        if pii.redactor is None:
            from ..redaction import Redactor
            self.restorer = PiiLayer(Redactor(), pii.vault)
        self.counts = {"tenants": 0, "threads": 0, "checkpoints": 0, "store_items": 0}

    def write(self, tenants: list[str], out: IO[str]) -> dict[str, Any]:
        head = {"format": EXPORT_FORMAT, "subject": self.subject,
                "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "database_id": self.services.database_id()}
        out.write(_dump(head)[:-1] + ',\n"tenants": [')
        first = True
        for tenant in tenants:
            keys = self.services.keys.keys_for(tenant, create=False)
            if keys is None:
                continue
            threads = subject_threads(self.services, tenant, self.subject)
            if not threads:   # a tenant where the subject has nothing is not named
                peek = self._store_rows(tenant)
                found = next(peek, None) is not None
                peek.close()
                if not found:
                    continue
            out.write(("" if first else ",") + "\n")
            first = False
            self.counts["tenants"] += 1
            self._tenant(out, keys, threads)
        out.write('],\n"counts": ' + _dump(self.counts) + "}\n")
        return dict(self.counts)

    def _tenant(self, out: IO[str], keys: TenantKeys, threads: list[str]) -> None:
        tenant = keys.tenant
        policy, source = self.services.registry.effective_policy(tenant)
        out.write('{"tenant": ' + _dump(tenant) + ', "retention_policy": '
                  + _dump({**_plain(policy), "source": source}) + ',\n"threads": [')
        for i, thread_id in enumerate(threads):
            out.write(("," if i else "") + "\n")
            self._thread(out, keys, thread_id)
        out.write('],\n"store_items": [')
        n = 0
        for row in self._store_rows(keys.tenant):
            out.write(("," if n else "") + "\n" + _dump(self._store_item(keys, row)))
            n += 1
        self.counts["store_items"] += n
        out.write("]}")

    def _thread(self, out: IO[str], keys: TenantKeys, thread_id: str) -> None:
        tenant = keys.tenant
        row = self.services.registry.get_thread(tenant, thread_id)
        retention = None if row is None else {
            k: v for k, v in dataclasses.asdict(row).items()
            if k not in ("tenant", "thread_id", "policy_mac", "activity_mac", "claim_owner",
                         "claim_token", "claim_expires")}
        if retention is not None:
            for name in _THREAD_FIELDS:
                retention[name] = iso(retention[name]) if retention[name] else None
        out.write('{"thread_id": ' + _dump(thread_id) + ', "retention": ' + _dump(retention)
                  + ',\n"checkpoints": [')
        interrupts: list[dict[str, Any]] = []
        newest: set[str] = set()
        n = 0
        for tup in self._history(tenant, thread_id):
            if self.restorer is not None:
                tup = self.restorer.restore(keys, tup)
            conf = tup.config.get("configurable") or {}
            ns = str(conf.get("checkpoint_ns", "") or "")
            writes = [{"task_id": t, "channel": c, "value": v}
                      for t, c, v in tup.pending_writes or []]
            if ns not in newest:  # newest first: the first of a namespace is its latest
                newest.add(ns)
                interrupts.extend({"checkpoint_ns": ns, "checkpoint_id": conf.get(
                    "checkpoint_id"), **w} for w in writes if w["channel"] == INTERRUPT)
            parent = (tup.parent_config or {}).get("configurable") or {}
            out.write(("," if n else "") + "\n" + _dump({
                "checkpoint_ns": ns, "checkpoint_id": conf.get("checkpoint_id"),
                "parent_checkpoint_id": parent.get("checkpoint_id"),
                "ts": tup.checkpoint.get("ts"), "metadata": tup.metadata,
                "channel_values": tup.checkpoint.get("channel_values"),
                "pending_writes": writes}))
            n += 1
        self.counts["threads"] += 1
        self.counts["checkpoints"] += n
        out.write('],\n"pending_interrupts": ' + _dump(interrupts)
                  + ',\n"idempotency_records": ' + _dump(self._idempotency(keys, thread_id))
                  + ',\n"receipts": ' + _dump(receipts_of_threads(
                      self.services.registry, tenant, [thread_id])) + "}")

    def _history(self, tenant: str, thread_id: str) -> Iterator[Any]:
        """The thread's checkpoints, newest first, read a page at a time (an inner saver may
        fetch a whole listing at once: PostgreSQL's client-side cursor does)."""
        conf = {"thread_id": thread_id, "tenant_id": tenant}
        before = None
        while True:
            page = list(self.read({"configurable": conf}, before=before, limit=PAGE))
            yield from page
            if len(page) < PAGE:
                return
            last = page[-1].config.get("configurable") or {}
            before = {"configurable": {**conf, "checkpoint_id": last.get("checkpoint_id")}}

    def _idempotency(self, keys: TenantKeys, thread_id: str) -> list[dict[str, Any]]:
        engine = self.services.registry.engine
        if not sa.inspect(engine).has_table("securesaver_idempotency"):
            return []
        from ..idempotency.store import IdempotencyStore
        store = IdempotencyStore.for_services(self.services)
        out = []
        for r in store.list_records(keys.tenant, thread_id):
            record = {"key": r.key, "kind": r.kind, "name": r.name, "state": r.state,
                      "attempts": r.attempts, "created_at": iso(r.created_at),
                      "updated_at": iso(r.updated_at), "error": self._restored(keys, r.error)}
            if r.has_result:
                record["result"] = self._restored(keys, store.result(
                    keys.tenant, thread_id, r.key))
            out.append(record)
        return out

    def _restored(self, keys: TenantKeys, value: Any) -> Any:
        return value if self.restorer is None else self.restorer.restore_for_store(keys, value)

    # store items: the namespaces forget_subject deletes (those starting with the subject id)
    def _store_rows(self, tenant: str) -> Generator[Any, None, None]:
        engine = self.services.registry.engine
        if "." in self.subject or not has_store_table(engine):
            return   # LangGraph refuses labels holding a period: no item can match
        prefix = tenant_tag(tenant) + "." + self.subject
        under = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ".%"
        sql = _STORE_SQL[engine.dialect.name == "postgresql"]
        with engine.connect() as conn:   # a server-side cursor on PostgreSQL
            yield from conn.execution_options(stream_results=True).execute(
                sql, {"p": prefix, "under": under})

    def _store_item(self, keys: TenantKeys, row: Any) -> dict[str, Any]:
        from ..store.codec import open_item  # the store package imports the saver: not at load
        prefix, key, text, updated, expires = row
        namespace = str(prefix).split(".")[1:]
        stored = lenient_json_loads(text) if isinstance(text, (str, bytes)) else text
        value, _vectors = open_item(keys, item_aad(self.services.database_id(), keys.tenant,
                                                   namespace, str(key)), stored)
        value = (self.restorer or self.services.pii).restore_for_store(keys, value)
        return {"namespace": namespace, "key": str(key), "value": value,
                "updated_at": str(updated) if updated is not None else None,
                "expires_at": str(expires) if expires is not None else None}


def _plain(policy: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
        return dataclasses.asdict(policy)
    return {k: v for k, v in vars(policy).items() if not k.startswith("_")}


def _dump(value: Any) -> str:
    """ASCII JSON with no control character raw (DEL too): safe on a terminal."""
    text = json.dumps(value, default=_jsonable, ensure_ascii=True)
    return text.replace("\x7f", "\\u007f") if "\x7f" in text else text


def _jsonable(value: Any) -> Any:
    """What a checkpoint holds that JSON does not: messages as LangChain's own dicts, models
    and dataclasses as their fields, bytes as base64, anything else by type and text."""
    from langchain_core.messages import BaseMessage, message_to_dict
    if isinstance(value, BaseMessage):
        return message_to_dict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return {"type": type(value).__name__, "text": str(value)}
