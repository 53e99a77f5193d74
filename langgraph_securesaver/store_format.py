"""The stored form of a SecureStore item, as far as code that never opens it needs to know:
the envelope's field names, what a sealed value is bound to, and the PII vault's owner ids
for store items. Shared by the store (which seals and opens) and the audit and scan (which
read raw rows without the store)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .crypto import associated_data

#: the inner store's value holds ``{SEALED_KEY: "ss1.<token>", "ssbi_<k>": "<d>", ...}``
SEALED_KEY = "__securesaver"
BLIND_PREFIX = "ssbi_"
#: the PII vault keeps a store item's originals under a pseudo thread id of this prefix
VAULT_PREFIX = "securestore:"


def item_aad(database_id: str, tenant: str, namespace: Sequence[str], key: str) -> bytes:
    """What a store item is bound to (length-prefixed, so labels never run together)."""
    return associated_data("store-item", database_id, tenant, str(len(namespace)),
                           *namespace, key)


def sealed_aad(aad: bytes, blind: Mapping[str, Any]) -> bytes:
    """The item's associated data plus its blind-index entries (so they cannot be altered,
    added, removed or copied without the value failing to open)."""
    if not blind:
        return aad
    return aad + associated_data("store-blind", *(
        part for k in sorted(blind) for part in (str(k), str(blind[k]))))


def vault_id(namespace: Sequence[str], key: str) -> str:
    """The pseudo thread id an item's PII originals are recorded under (``namespace``: the
    caller's, without the tenant label)."""
    raw = json.dumps([list(namespace), key], ensure_ascii=False).encode("utf-8", "surrogatepass")
    return VAULT_PREFIX + hashlib.sha256(raw).hexdigest()[:40]
