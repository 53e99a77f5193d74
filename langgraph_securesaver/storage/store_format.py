"""The stored form of a SecureStore item, as far as code that never opens it needs to know:
the envelope's field names, what a sealed value is bound to, and the PII vault's owner ids
for store items. Shared by the store (which seals and opens) and the audit and scan (which
read raw rows without the store)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from ..keys.tokens import aad_parts, associated_data

#: the inner store's value holds ``{SEALED_KEY: "ss1.<token>", "ssbi_<k>": "<d>", ...}``
SEALED_KEY = "__securesaver"
BLIND_PREFIX = "ssbi_"
#: the item version the value was sealed at (``"<number>:<tag>"``, bound into the associated
#: data; absent: sealed before items had versions)
VERSION_KEY = "__securesaver_v"
#: the PII vault keeps a store item's originals under a pseudo thread id of this prefix
VAULT_PREFIX = "securestore:"


@lru_cache(maxsize=1024)
def _item_prefix(tenant: str) -> bytes:
    return associated_data("si", tenant)


_BLIND_HEAD = associated_data("store-blind")
_VERSION_HEAD = associated_data("store-version")
#: encoded (blind name, digest) pairs: the digests of frequent field values repeat (they are
#: stored in clear next to the ciphertext; nothing secret is cached here)
_BLIND_PAIRS: dict[tuple[str, str], bytes] = {}
_BLIND_PAIRS_MAX = 8192


def item_aad(database_id: str, tenant: str, namespace: Sequence[str], key: str) -> bytes:
    """What a store item is bound to (length-prefixed, so labels never run together):
    ``associated_data("si", tenant, vault_id(namespace, key), database_id,
    str(len(namespace)), *namespace, key)``. The kind and the item id make it a store item's
    (:func:`..keys.tokens.aad_scope`): it is sealed under the item's own key, named by the id
    (:mod:`..registry.thread_keys`)."""
    return _item_prefix(tenant) + aad_parts(
        (vault_id(namespace, key), database_id, str(len(namespace)), *namespace, key))


def sealed_aad(aad: bytes, blind: Mapping[str, Any], version: str = "") -> bytes:
    """The item's associated data plus its version and its blind-index entries (so none of
    them can be altered, added, removed or copied without the value failing to open):
    ``aad + associated_data("store-version", version) + associated_data("store-blind",
    k1, v1, k2, v2, ...)``, keys sorted; each part only when there is one."""
    if version:
        aad = aad + _VERSION_HEAD + aad_parts((version,))
    if not blind:
        return aad
    out = [aad, _BLIND_HEAD]
    for k in sorted(blind):
        v = blind[k]
        pair = (k, v) if type(k) is str and type(v) is str else None
        encoded = _BLIND_PAIRS.get(pair) if pair is not None else None
        if encoded is None:
            encoded = aad_parts((str(k), str(v)))
            if pair is not None and len(_BLIND_PAIRS) < _BLIND_PAIRS_MAX:
                _BLIND_PAIRS[pair] = encoded
        out.append(encoded)
    return b"".join(out)


def vault_id(namespace: Sequence[str], key: str) -> str:
    """The pseudo thread id an item's PII originals are recorded under, and the name of the
    item's own key (``namespace``: the caller's, without the tenant label)."""
    return _vault_id(tuple(namespace), key)


@lru_cache(maxsize=8192)
def _vault_id(namespace: tuple[str, ...], key: str) -> str:
    raw = aad_parts((str(len(namespace)), *namespace, key))
    return VAULT_PREFIX + hashlib.sha256(raw).hexdigest()[:40]
