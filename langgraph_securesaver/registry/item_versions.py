"""Store items bound to their version: what stops an older copy of a live item from opening.

Each SecureStore item has, per store holding it and per key row, a row of
``securesaver_store_versions`` naming the version the item is at: a number and the random tag
of the put that wrote it. A put reads it with the item's key (:func:`read_key`: one statement,
as the key read was), seals the value bound to the next number and a fresh tag (``"n:tag"``,
in the associated data and beside the token in the envelope), writes it to the inner store,
then confirms it (:func:`confirm`: one statement) -- only if the item's key row is still the
one it sealed under and the row names an earlier number (or already this very version: a read
confirmed it first). Otherwise another put confirmed the same or a later number meanwhile,
and its write may have landed after this one: the put seals and writes again, so what a
returned put wrote is the item's confirmed version until a later put or a delete replaces it.

A read checks each item it met against its row (:func:`read`, after the inner read): a lower
number, or the same number with another tag, is an older copy put back (or a killed put's,
overwritten since) and is refused; a higher number is a put that landed but was not confirmed
(in flight, or its process killed between its inner write and its confirmation), which the
read confirms: once served, a version is never rolled back, and a writer killed at any point
never leaves the item unreadable. Tags tell apart the copies of puts that took the same
number (concurrent puts, or a killed put and the next one).

One case stays open: two puts of one item racing from different processes, the one whose
write lands last killed before it writes again -- the item is then refused until it is written
or deleted again. A new key row (the item deleted and written again) starts afresh.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from .core import Registry
from .dialects import MYSQL, insert_if_absent
from .schema import pairs_in, store_keys, store_versions

#: (number, tag): the version a put sealed under, or an item's row names ((0, ""): none)
Version = tuple[int, str]

#: a confirmation: the row set to (number, tag) while the key row is the one sealed under and
#: the row names an earlier number, another key row's, or this version already
_CONFIRM = sa.text("""INSERT INTO securesaver_store_versions
    (tenant, item, store, key_born, version, tag)
SELECT :tenant, :item, :store, created_at, :version, :tag FROM securesaver_store_keys
    WHERE tenant = :key_tenant AND item = :key_item AND created_at = :born
ON CONFLICT (tenant, item, store) DO UPDATE SET
    key_born = excluded.key_born, version = excluded.version, tag = excluded.tag
WHERE securesaver_store_versions.key_born <> excluded.key_born
    OR securesaver_store_versions.version < excluded.version
    OR (securesaver_store_versions.version = excluded.version
        AND securesaver_store_versions.tag = excluded.tag)
RETURNING 1""")
#: how many items one read names (bound parameters per statement stay modest)
_CHUNK = 500
#: a put's read (the item's key row and version) and a read's (which key row each item has, and
#: its version), in the driver's parameter style (``{p}``), through the registry's direct
#: connections (no pool checkout, no transaction: the hot path of a get and a put)
_ONE = ("SELECT {cols}, v.key_born, v.version, v.tag FROM securesaver_store_keys k "
        "LEFT JOIN securesaver_store_versions v ON v.tenant = k.tenant AND v.item = k.item "
        "AND v.store = {p} WHERE k.tenant = {p} AND k.item {items}")
_KEY_COLS = "k.master_version, k.wrapped, k.created_at"


def _direct(registry: Registry) -> Any:
    """The registry's direct reads, once its tables exist."""
    if not registry._is_setup:
        registry.setup()
    return registry.direct


def store_id(location: str) -> str:
    """The name of a store in ``securesaver_store_versions`` (a digest of where it keeps its
    items)."""
    return hashlib.sha256(location.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def text(version: Version) -> str:
    """A version as the envelope and the associated data hold it (``""``: none)."""
    return f"{version[0]}:{version[1]}" if version[0] else ""


def parse(stored: str) -> Version:
    """:func:`text` read back; ValueError when it is not one."""
    if not stored:
        return 0, ""
    number, _sep, tag = stored.partition(":")
    if not (number.isdigit() and number[0] != "0" and 0 < len(tag) <= 32 and tag.isalnum()):
        raise ValueError("not a store item version")
    return int(number), tag


def _at(born: float, counted: Any, number: Any, tag: Any) -> Version:
    """The version a row names for the key row ``born`` ((0, ""): none, or another key's)."""
    if counted is None or float(counted) != born:
        return 0, ""
    return int(number), str(tag)


def read_key(registry: Registry, tenant: str, item: str, store: str
             ) -> tuple[tuple[str, bytes, float], Version] | None:
    """For a put: the item's key row (master version, wrapped key, created_at) and the
    version the item is at in ``store``; None when the item has no key row. One statement."""
    direct = _direct(registry)
    p = direct.placeholder
    rows = direct.rows(_ONE.format(cols=_KEY_COLS, p=p, items=f"= {p}"),
                       (store, tenant, item), one=True)
    if not rows:
        return None
    row = rows[0]
    born = float(row[2])
    # text a database writer put there reads as bytes that fail to unwrap
    wrapped = row[1].encode("utf-8", "surrogatepass") if isinstance(row[1], str) \
        else bytes(row[1])
    return (str(row[0]), wrapped, born), _at(born, row[3], row[4], row[5])


def next_version(current: Version) -> Version:
    """The version a put seals under after ``current``: the next number, a fresh tag."""
    return current[0] + 1, secrets.token_hex(8)


def confirm(registry: Registry, tenant: str, store: str,
            written: dict[str, tuple[float, Version]]) -> list[str]:
    """After SecureStore puts landed in the inner store (``written``: item -> (key row
    ``created_at``, version sealed under)): each item's row set to its put's version, in one
    transaction (one statement for one item). Returns the items where that was refused:
    deleted by another process meanwhile (or deleted and written again), or at the same or a
    later number by another put, which may have landed after this one. The caller seals
    those puts again (the next number), so a put that returned opens, as the item's current
    version, in every process. Also what a read confirms a version it served with."""
    return confirm_many(registry, [(tenant, store, written)])[0]


def confirm_many(registry: Registry,
                 requests: Sequence[tuple[str, str, dict[str, tuple[float, Version]]]]
                 ) -> list[list[str]]:
    """:func:`confirm` for several batches (tenant, store, written); the refused items of
    each, in order. On SQLite in one transaction (one write lock, not one per put); on
    PostgreSQL each statement commits by itself on one connection: a transaction locking
    several version rows would deadlock with a deletion locking them in another order."""
    out: list[list[str]] = []
    single = registry.dialect == "postgresql" or (
        len(requests) == 1 and len(requests[0][2]) == 1)
    with (registry.single() if single else registry.begin()) as conn:
        for tenant, store, written in requests:
            refused: list[str] = []
            for name, (born, (number, tag)) in written.items():
                if not _confirm(conn, tenant, name, store, born, (number, tag)):
                    refused.append(name)
            out.append(refused)
    return out


def _confirm(conn: Any, tenant: str, item: str, store: str, born: float,
             version: Version) -> bool:
    """One confirmation (see ``_CONFIRM``); False when refused."""
    if conn.dialect.name not in MYSQL:
        return conn.execute(_CONFIRM, {
            "tenant": tenant, "item": item, "store": store, "key_tenant": tenant,
            "key_item": item, "born": born, "version": version[0], "tag": version[1],
        }).first() is not None
    # MySQL has no conditional ON CONFLICT: the key row is read with a shared lock (a delete
    # waits), the version row locked, and the same rule decided here, in the caller's
    # transaction; a row another confirmation inserted meanwhile refuses (sealed again)
    if conn.execute(sa.select(store_keys.c.created_at).where(
            store_keys.c.tenant == tenant, store_keys.c.item == item,
            store_keys.c.created_at == born).with_for_update(read=True)).first() is None:
        return False
    key = (store_versions.c.tenant == tenant, store_versions.c.item == item,
           store_versions.c.store == store)
    row = conn.execute(sa.select(store_versions.c.key_born, store_versions.c.version,
                                 store_versions.c.tag).where(*key).with_for_update()).first()
    values = {"key_born": born, "version": version[0], "tag": version[1]}
    if row is None:
        return insert_if_absent(conn, store_versions.insert().values(
            tenant=tenant, item=item, store=store, **values), {})
    if not (float(row.key_born) != born or int(row.version) < version[0]
            or (int(row.version) == version[0] and row.tag == version[1])):
        return False
    conn.execute(store_versions.update().where(*key).values(**values))
    return True


def read(registry: Registry, tenant: str, store: str, items: Sequence[str]
         ) -> dict[str, tuple[float, Version]]:
    """Item -> (its key row's ``created_at``, the version it is at in ``store``), for the items
    of ``items`` that have a key row. One registry read (per 500 items)."""
    wanted = list(dict.fromkeys(items))
    out: dict[str, tuple[float, Version]] = {}
    direct = _direct(registry)
    p = direct.placeholder
    for i in range(0, len(wanted), _CHUNK):
        chunk = wanted[i:i + _CHUNK]
        sql = _ONE.format(cols="k.item, k.created_at", p=p,
                          items=f"= {p}" if len(chunk) == 1
                          else "IN (" + ", ".join([p] * len(chunk)) + ")")
        for name, born, counted, number, tag in direct.rows(sql, (store, tenant, *chunk)):
            out[str(name)] = (float(born), _at(float(born), counted, number, tag))
    return out


def forget_in(conn: Any, pairs: Sequence[tuple[str, str]]) -> None:
    """In the transaction destroying these (tenant, item) keys: their version rows too."""
    if pairs:
        conn.execute(store_versions.delete().where(pairs_in(
            conn.dialect.name, store_versions.c.tenant, store_versions.c.item, list(pairs))))
