"""SecureStore items in ``securesaver audit`` and ``securesaver scan``.

A SecureStore on one database with its saver (``secure_pair``, ``SecureStore.from_url``)
keeps LangGraph's ``store`` table next to the registry. This module reads that table's raw
rows through the registry's engine -- no keyring, no LangGraph store object, nothing
decrypted -- and answers:

* the audit: per tenant, items, namespaces, stored bytes and their ages, items with a TTL
  and items past it (the inner store's TTL sweep is not running), and the kinds of personal
  data whose originals the PII vault keeps for store items; problems: rows of no known
  tenant, rows that hold no SecureStore envelope, expired rows still stored;
* the scan: each row's parts (tenant, caller's namespace, key, sealed token, blind-index
  entries) and the associated data it was sealed with, so :mod:`.scan` checks the clear
  columns for personal data, the envelope's shape, the data-key version and, with
  ``verify``, authenticates every sealed value against its place.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from ..errors import TamperedDataError
from ..keys.tokens import TEXT_PREFIX, from_text, is_token
from ..registry.pii_vault import pii_refs, pii_vault
from ..storage.store_format import BLIND_PREFIX, SEALED_KEY, VAULT_PREFIX, VERSION_KEY, vault_id
from ..storage.stored_json import lenient_json_loads
from ..tenancy import tenant_tag
from .report import age_bucket, iso

logger = logging.getLogger(__name__)

STORE_TABLE = "store"
_BLIND_KEY_RE = re.compile(r"^ssbi_[0-9a-f]{16}$")
_BLIND_VALUE_RE = re.compile(r"^[0-9a-f]{32}$")
_PAGE = 500
# (constant SQL: the table and columns are LangGraph's; every value is a bound parameter)
_SELECT = {False: "SELECT prefix, key, value, updated_at, expires_at FROM store ",
           True: "SELECT prefix, key, value::text, updated_at, expires_at FROM store "}
_PAGE_SQL = {pg: (sa.text(_SELECT[pg] + "ORDER BY prefix, key LIMIT :n"),
                  sa.text(_SELECT[pg] + "WHERE prefix > :p OR (prefix = :p AND key > :k) "
                          "ORDER BY prefix, key LIMIT :n"))
             for pg in (False, True)}


@dataclass
class StoreRow:
    """One raw row of the store table, split into what SecureStore wrote."""

    tenant: str | None                # None: the prefix names no known tenant
    namespace: tuple[str, ...]        # the caller's (tenant label removed when known)
    key: str
    size: int                         # bytes of the stored value
    updated_at: float | None
    expires_at: float | None
    token: bytes | None = None        # the sealed value, when the envelope is well formed
    blind: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None        # why the row is not a SecureStore envelope
    malformed_blind: bool = False
    version: str = ""                 # the item version the value says it was sealed at


def has_store_table(engine: sa.Engine) -> bool:
    try:
        return sa.inspect(engine).has_table(STORE_TABLE)
    except sa.exc.SQLAlchemyError:  # pragma: no cover - an unreadable catalog: no store
        return False


def count_store_rows(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT COUNT(*) FROM store")).scalar() or 0)


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value).replace(" ", "T", 1))
        except ValueError:
            return None
    if moment.tzinfo is None:  # SQLite's CURRENT_TIMESTAMP: UTC without an offset
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _envelope(row: StoreRow, text: str | bytes) -> None:
    """Fill ``row.token``/``row.blind`` from the stored JSON, or say why it is no envelope."""
    try:
        value = lenient_json_loads(text)
    except (ValueError, UnicodeDecodeError):
        row.problem = "the stored value is not JSON"
        return
    if not isinstance(value, dict) or not isinstance(value.get(SEALED_KEY), str):
        row.problem = "the stored value holds no SecureStore ciphertext"
        return
    sealed = value[SEALED_KEY]
    if not sealed.startswith(TEXT_PREFIX):
        row.problem = "the sealed field holds no ciphertext"
        return
    try:
        token = from_text(sealed)
    except TamperedDataError:
        row.problem = "the sealed field is not valid base64"
        return
    if not is_token(token):
        row.problem = "the sealed field holds no ciphertext"
        return
    row.token = token
    version = value.get(VERSION_KEY, "")
    if not isinstance(version, str) or len(version) > 64 or (
            not version and VERSION_KEY in value):
        row.problem = "the stored value's version field is malformed"
    else:
        row.version = version
    for name, digest in value.items():
        if name == SEALED_KEY or name == VERSION_KEY:
            continue
        if not isinstance(name, str) or not name.startswith(BLIND_PREFIX):
            row.problem = "the stored value holds fields SecureStore never writes"
            continue
        if not (_BLIND_KEY_RE.match(name) and isinstance(digest, str)
                and _BLIND_VALUE_RE.match(digest)):
            row.malformed_blind = True
        row.blind[name] = digest


def iter_store_rows(engine: sa.Engine, tenants: Sequence[str], *, page: int = _PAGE
                    ) -> Iterator[list[StoreRow]]:
    """Every row of the store table, a page at a time (keyset order on its primary key)."""
    by_tag = {tenant_tag(t): t for t in tenants}
    first_sql, next_sql = _PAGE_SQL[engine.dialect.name == "postgresql"]
    last = ("", "")
    first = True
    while True:
        with engine.connect() as conn:
            if first:
                rows = conn.execute(first_sql, {"n": page}).all()
            else:
                rows = conn.execute(next_sql, {"p": last[0], "k": last[1], "n": page}).all()
        first = False
        if not rows:
            return
        out = []
        for prefix, key, value, updated, expires in rows:
            labels = tuple(str(prefix).split("."))
            tenant = by_tag.get(labels[0])
            text = value if isinstance(value, (str, bytes)) else json.dumps(value)
            row = StoreRow(tenant, labels[1:] if tenant is not None else labels, str(key),
                           len(text), _epoch(updated), _epoch(expires))
            _envelope(row, text)
            out.append(row)
        yield out
        last = (str(rows[-1][0]), str(rows[-1][1]))
        if len(rows) < page:
            return


# --- the audit ---------------------------------------------------------------------------
@dataclass
class StoreTenantAudit:
    tenant: str
    items: int = 0
    namespaces: int = 0
    stored_bytes: int = 0
    first_updated: float | None = None
    last_updated: float | None = None
    with_ttl: int = 0
    expired: int = 0                   # past their TTL, still stored
    pii: dict[str, int] = field(default_factory=dict)   # distinct originals in the vault
    stored_bytes_by_age: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["first_updated"] = iso(self.first_updated)
        out["last_updated"] = iso(self.last_updated)
        return out


@dataclass
class StoreAudit:
    tenants: list[StoreTenantAudit]
    orphans: int = 0                   # rows whose prefix names no known tenant
    unsealed: int = 0                  # rows holding no SecureStore envelope
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"tenants": [t.as_dict() for t in self.tenants], "orphans": self.orphans,
                "unsealed": self.unsealed, "problems": self.problems}


def store_pii_kinds(engine: sa.Engine, tenant: str | None = None
                    ) -> dict[str, dict[str, int]]:
    """tenant -> kind -> distinct originals the vault keeps for store items."""
    joined = pii_refs.join(pii_vault, sa.and_(pii_refs.c.tenant == pii_vault.c.tenant,
                                              pii_refs.c.token == pii_vault.c.token))
    q = (sa.select(pii_refs.c.tenant, pii_refs.c.kind,
                   sa.func.count(sa.distinct(pii_refs.c.token)))
         .select_from(joined)
         .where(pii_refs.c.thread_id.like(VAULT_PREFIX + "%"))
         .group_by(pii_refs.c.tenant, pii_refs.c.kind))
    if tenant is not None:
        q = q.where(pii_refs.c.tenant == tenant)
    out: dict[str, dict[str, int]] = {}
    try:
        with engine.connect() as conn:
            for t, kind, n in conn.execute(q):
                out.setdefault(t, {})[kind] = int(n)
    except sa.exc.SQLAlchemyError:  # no vault tables yet: nothing kept
        return {}
    return out


def audit_store(engine: sa.Engine, tenants: Sequence[str], tenant: str | None, now: float
                ) -> StoreAudit | None:
    """The store part of the audit (None when the database has no store table)."""
    if not has_store_table(engine):
        return None
    per: dict[str, StoreTenantAudit] = {
        t: StoreTenantAudit(t) for t in ([tenant] if tenant is not None else tenants)}
    namespaces: dict[str, set[tuple[str, ...]]] = {}
    report = StoreAudit([])
    expired = 0
    for rows in iter_store_rows(engine, tenants):
        for row in rows:
            if row.tenant is None:
                if tenant is None:
                    report.orphans += 1
                continue
            if tenant is not None and row.tenant != tenant:
                continue
            if row.problem is not None:
                report.unsealed += 1
            t = per.setdefault(row.tenant, StoreTenantAudit(row.tenant))
            t.items += 1
            t.stored_bytes += row.size
            namespaces.setdefault(row.tenant, set()).add(row.namespace)
            if row.updated_at is not None:
                t.first_updated = row.updated_at if t.first_updated is None else min(
                    t.first_updated, row.updated_at)
                t.last_updated = row.updated_at if t.last_updated is None else max(
                    t.last_updated, row.updated_at)
            bucket = age_bucket(None if row.updated_at is None
                                else max(0.0, now - row.updated_at))
            t.stored_bytes_by_age[bucket] = t.stored_bytes_by_age.get(bucket, 0) + row.size
            if row.expires_at is not None:
                t.with_ttl += 1
                if row.expires_at <= now:
                    t.expired += 1
                    expired += 1
    kinds = store_pii_kinds(engine, tenant)
    for name, t in per.items():
        t.namespaces = len(namespaces.get(name, ()))
        t.pii = kinds.get(name, {})
    report.tenants = sorted(per.values(), key=lambda t: t.tenant)
    if expired:
        report.problems.append(
            f"{expired} store item(s) past their TTL are still stored: the store's TTL sweep "
            "is not running (store.start_ttl_sweeper() or sweep_ttl())")
    if report.orphans:
        report.problems.append(f"{report.orphans} store item(s) belong to no known tenant")
    if report.unsealed:
        report.problems.append(
            f"{report.unsealed} store item(s) hold data SecureStore never writes (no sealed "
            "envelope): tampered or written past SecureStore; run `securesaver scan --verify`")
    return report


# --- erasure ----------------------------------------------------------------------------
def purge_store_tenant(engine: sa.Engine, tenant: str) -> int:
    """Delete every store row of ``tenant`` (its tag is the namespace's first label) from the
    store table on this database, without opening any: what ``shred_tenant`` runs after the
    tenant's keys are destroyed (namespaces and keys are clear text). Returns rows deleted."""
    if not has_store_table(engine):
        return 0
    tag = tenant_tag(tenant)
    deleted = 0
    with engine.begin() as conn:
        for table in ("store_vectors", "store"):
            if table == "store_vectors" and not sa.inspect(conn).has_table(table):
                continue
            result = conn.execute(_PURGE_SQL[table], {"tag": tag, "under": tag + ".%"})
            if table == "store":
                deleted = int(result.rowcount or 0)
    return deleted


# (constant SQL; the tag is a bound parameter: "t" and 24 hex digits, no LIKE wildcard)
_PURGE_SQL = {
    "store": sa.text("DELETE FROM store WHERE prefix = :tag OR prefix LIKE :under"),
    "store_vectors": sa.text(
        "DELETE FROM store_vectors WHERE prefix = :tag OR prefix LIKE :under"),
}


def purge_store_namespace(engine: sa.Engine, tenant: str, namespace: Sequence[str],
                          before_delete: Callable[[Any, list[str]], object] | None = None
                          ) -> list[str]:
    """Delete the store rows of ``tenant`` whose namespace (the caller's, without the tenant
    label) is ``namespace`` or starts with it, e.g. ``(user_id,)`` for LangGraph's common
    ``(user_id, "memories")`` layout; what ``forget_subject`` runs for a subject's items.
    Returns the PII-vault owner ids of the deleted items (their originals go next). Nothing
    is opened: namespaces and keys are clear text. A label holding a period matches nothing
    (LangGraph refuses such labels). ``before_delete(conn, owners)`` runs in the transaction
    before the rows go (the items' keys are destroyed there)."""
    labels = [str(label) for label in namespace]
    if not labels or any(not label or "." in label for label in labels) \
            or not has_store_table(engine):
        return []
    prefix = ".".join([tenant_tag(tenant), *labels])
    under = (prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
             + ".%")
    owners: list[str] = []
    with engine.begin() as conn:
        rows = conn.execute(_SUBJECT_SQL["select"], {"p": prefix, "under": under}).all()
        owners = [vault_id(str(p).split(".")[1:], str(k)) for p, k in rows]
        if before_delete is not None and owners:
            before_delete(conn, owners)
        for table in ("store_vectors", "store"):
            if table == "store_vectors" and not sa.inspect(conn).has_table(table):
                continue
            conn.execute(_SUBJECT_SQL[table], {"p": prefix, "under": under})
    return owners


# (constant SQL; the prefix is a bound parameter, LIKE wildcards in it escaped)
_SUBJECT_SQL = {
    "select": sa.text(
        "SELECT prefix, key FROM store WHERE prefix = :p OR prefix LIKE :under ESCAPE '\\'"),
    "store": sa.text(
        "DELETE FROM store WHERE prefix = :p OR prefix LIKE :under ESCAPE '\\'"),
    "store_vectors": sa.text(
        "DELETE FROM store_vectors WHERE prefix = :p OR prefix LIKE :under ESCAPE '\\'"),
}
