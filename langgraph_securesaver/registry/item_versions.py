"""Store items bound to their version: what stops an older copy of a live item from opening.

Each SecureStore item's key row (``securesaver_store_keys``) counts its versions:
``reserved``, the last version a put took, and ``version``, the version the item is at --
the least a read accepts. A put takes ``reserved + 1`` (one statement, with its key,
:meth:`.thread_keys.ThreadKeyStore.reserve_item`), seals the value bound to that number (it is
in the associated data, and beside the token in the envelope), writes it to the inner store,
then confirms it (:func:`commit`): ``version`` becomes the put's, if the key row is still the
one it sealed under and no put reserved a later number since -- else the put seals and writes
again, so the item's last write is always its confirmed version. A read checks each item it
met against its row (:func:`read`, after the inner read): an earlier version is an older copy
put back and is refused; a later one is a put that landed but was not confirmed (in flight, or
its process killed between its inner write and the confirmation), which the read confirms
(:func:`roll_forward`): once served, a version is never rolled back, and a writer killed at any
point never leaves the item unreadable.

Numbers are never reused (a put killed after reserving leaves a gap), so the copy a killed put
wrote and a later put's are told apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from .core import Registry
from .schema import store_keys

#: which key row each of a tenant's store items has, and the version it is at
_VERSIONS = sa.select(store_keys.c.item, store_keys.c.created_at, store_keys.c.version).where(
    store_keys.c.tenant == sa.bindparam("tenant"),
    store_keys.c.item.in_(sa.bindparam("items", expanding=True)))
#: how many items one read names (bound parameters per statement stay modest)
_CHUNK = 500


def commit(registry: Registry, tenant: str, used: dict[str, tuple[float, int]]) -> list[str]:
    """After SecureStore puts landed in the inner store: each item's version raised to the one
    its put sealed under (``used``: item -> (key row ``created_at``, version) from
    ``reserve_item``), in one transaction -- only where the row is still that key row and no
    put reserved a later version since. Returns the items where that failed: deleted by
    another process meanwhile (or deleted and written again), or written again by a put that
    may land before this one. The caller seals those puts again (a new version), so a put that
    returned opens, as the item's current version, in every process."""
    stale: list[str] = []
    with registry.begin() as conn:
        for name, (born, version) in used.items():
            done = conn.execute(store_keys.update().where(
                store_keys.c.tenant == tenant, store_keys.c.item == name,
                store_keys.c.created_at == born, store_keys.c.reserved == version).values(
                version=version)).rowcount
            if not done:
                stale.append(name)
    return stale


def read(registry: Registry, tenant: str, items: Sequence[str]) -> dict[str, tuple[float, int]]:
    """Item -> (its key row's ``created_at``, the version it is at), for the items of
    ``items`` that have a key row. One registry read (per 500 items)."""
    wanted = list(dict.fromkeys(items))
    out: dict[str, tuple[float, int]] = {}
    with registry.read() as conn:
        for i in range(0, len(wanted), _CHUNK):
            for name, born, version in conn.execute(_VERSIONS, {
                    "tenant": tenant, "items": wanted[i:i + _CHUNK]}):
                out[str(name)] = (float(born), int(version))
    return out


def roll_forward(registry: Registry, tenant: str, seen: dict[str, tuple[float, int]]) -> None:
    """A read met items at a later version than their rows are at (``seen``: item -> (key
    row, version)): puts that landed and are not confirmed yet, or never will be (their
    process was killed). Their rows are at that version from now on, so the earlier one never
    opens again: what a read served is never rolled back."""
    with registry.begin() as conn:
        for name, (born, version) in seen.items():
            conn.execute(store_keys.update().where(
                store_keys.c.tenant == tenant, store_keys.c.item == name,
                store_keys.c.created_at == born, store_keys.c.version < version,
                store_keys.c.reserved >= version).values(version=version))
