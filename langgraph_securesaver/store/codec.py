"""The stored form of a SecureStore item: one sealed envelope per value, bound to its place.

An inner store's value column holds ``{"__securesaver": "ss1.<token>", "ssbi_<k>": "<d>", ...}``
and nothing else. The token is AES-GCM under the item's own key (:mod:`..registry.thread_keys`,
deleted with the item) over the redacted value and its embedding vectors, with associated data
naming (tenant, item, database id, namespace, key), the item's version (``__securesaver_v``,
:mod:`..registry.item_versions`) and its blind-index entries: a value copied to another item,
namespace, tenant or database, with its ``ssbi_`` entries or version altered, or put back
after the item was deleted, does not open (an older version put back opens, and is refused by
the version check of the read). ``ssbi_`` entries are keyed digests of
top-level scalar fields after redaction (equality filters run in the inner store).

Only bytes-in/bytes-out logic here: no tenancy rules, no redaction, no inner store API.
"""

from __future__ import annotations

import base64
import json
import math
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import ConfigurationError, TamperedDataError
from ..keys.crypto import TenantKeys
from ..keys.tokens import from_text, to_text
from ..storage.store_format import BLIND_PREFIX, SEALED_KEY, VERSION_KEY, item_aad, sealed_aad

__all__ = ["BLIND_PREFIX", "SEALED_KEY", "VERSION_KEY", "item_aad", "open_item",
           "open_item_scanned", "seal_item"]

ENVELOPE_VERSION = 1
#: the largest serialized value a put accepts (before sealing), as the saver bounds its input
MAX_VALUE_BYTES = 8 * 1024 * 1024
#: deepest nesting a value may have (the redaction policy's default bound)
MAX_VALUE_DEPTH = 100
_BLIND_TYPES = (str, int, float, bool)
_VERSION = bytes([ENVELOPE_VERSION])
_NO_VECTORS = _VERSION + bytes(4)
_loads = json.JSONDecoder().decode


def _depth_ok(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(node, Mapping):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
    return True


def dump_json(value: Any) -> bytes:
    """A value as the JSON an inner store would keep; bounded in depth and size
    (ConfigurationError otherwise)."""
    try:
        raw = _DUMPS(value).encode("utf-8", "surrogatepass")
    except RecursionError:
        raise ConfigurationError(
            f"store values may nest at most {MAX_VALUE_DEPTH} levels deep") from None
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"store values must be JSON-serializable: {exc}") from None
    # a value with fewer brackets than the bound cannot nest deeper (counted in C); only
    # bracket-rich values (or brackets inside strings) take the walk
    if raw.count(b"[") + raw.count(b"{") > MAX_VALUE_DEPTH \
            and not _depth_ok(value, MAX_VALUE_DEPTH):
        raise ConfigurationError(
            f"store values may nest at most {MAX_VALUE_DEPTH} levels deep")
    if len(raw) > MAX_VALUE_BYTES:
        raise ConfigurationError(
            f"a store value is {len(raw)} bytes serialized; at most {MAX_VALUE_BYTES} "
            "are accepted")
    return raw


_DUMPS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode


def blind_name(keys: TenantKeys, field: str) -> str:
    return BLIND_PREFIX + keys.blind("store-bi-key", field)[:16]


def _canonical(value: Any) -> str:
    """One text per equal JSON scalar (1 and 1.0 are one number, true is not 1)."""
    if isinstance(value, bool):
        return "b:" + ("1" if value else "0")
    if isinstance(value, (int, float)):
        number = float(value)
        if math.isnan(number):
            return "n:nan"
        return "n:" + repr(number)
    return "s:" + str(value)


def blind_value(keys: TenantKeys, field: str, value: Any) -> str:
    return keys.blind("store-bi-value", field, _canonical(value))


def blind_entries(keys: TenantKeys, value: Mapping[str, Any]) -> dict[str, str]:
    """Keyed digests of the value's top-level scalar fields (what equality filters use)."""
    return {blind_name(keys, k): blind_value(keys, k, v) for k, v in value.items()
            if isinstance(k, str) and isinstance(v, _BLIND_TYPES)
            and not (isinstance(v, float) and math.isnan(v))}


def pushdown_filter(keys: TenantKeys, filter: Mapping[str, Any] | None
                    ) -> tuple[dict[str, Any], bool]:
    """(inner filter over blind entries, whether every condition was pushed down). Only
    equality on a top-level scalar goes to the inner store; the rest is checked after the
    value is authenticated and opened (the caller always re-checks the whole filter)."""
    inner: dict[str, Any] = {}
    complete = True
    for field, wanted in (filter or {}).items():
        if isinstance(wanted, Mapping) and set(wanted) == {"$eq"}:
            wanted = wanted["$eq"]
        if (isinstance(field, str) and "." not in field
                and isinstance(wanted, _BLIND_TYPES)
                and not (isinstance(wanted, float) and math.isnan(wanted))):
            inner[blind_name(keys, field)] = blind_value(keys, field, wanted)
        else:
            complete = False
    return inner, complete


def pack_vector(vector: Sequence[float]) -> str:
    return base64.b64encode(array("d", [float(x) for x in vector]).tobytes()).decode("ascii")


def unpack_vector(text: Any) -> list[float]:
    if not isinstance(text, str):
        raise TamperedDataError("a sealed embedding is malformed")
    vec = array("d")
    vec.frombytes(base64.b64decode(text.encode("ascii")))
    return vec.tolist()


def seal_item(keys: TenantKeys, aad: bytes, value_json: bytes,
              vectors: Mapping[str, Sequence[float]] | None,
              blind: Mapping[str, str], key: AESGCM | None = None, version: str = ""
              ) -> dict[str, Any]:
    """The inner store's value for one item: format version, vectors (JSON, usually empty),
    value; sealed under ``key`` (the item's key) or, without one, the tenant's data key, and
    bound to the item's ``version`` (stored beside the token when there is one)."""
    if vectors:
        head = json.dumps({p: pack_vector(vec) for p, vec in vectors.items()},
                          separators=(",", ":")).encode("ascii")
        plain = _VERSION + len(head).to_bytes(4, "big") + head + value_json
    else:
        plain = _NO_VECTORS + value_json
    sealed = to_text(keys.seal(plain, sealed_aad(aad, blind, version), key=key))
    if version:
        return {SEALED_KEY: sealed, VERSION_KEY: version, **blind}
    return {SEALED_KEY: sealed, **blind}


def open_item(keys: TenantKeys, aad: bytes, stored: Any
              ) -> tuple[Any, dict[str, list[float]]]:
    """Authenticate an inner store's value, then parse it: (value, vectors by field path).
    Anything but an envelope SecureStore sealed for exactly this place is TamperedDataError."""
    value, vectors, _tokens, _version = open_item_scanned(keys, aad, stored)
    return value, vectors


def stored_version(stored: Mapping[str, Any]) -> str:
    """The version an envelope says it was sealed at (``""``: none; whether that is true is
    what opening it decides)."""
    version = stored.get(VERSION_KEY, "")
    if not isinstance(version, str) or len(version) > 64 or (
            not version and VERSION_KEY in stored):
        raise TamperedDataError("a store item's version field is malformed")
    return version


def open_item_scanned(keys: TenantKeys, aad: bytes, stored: Any
                      ) -> tuple[Any, dict[str, list[float]], bool, str]:
    """:func:`open_item`, plus whether the value may hold PII tokens (see
    :func:`may_hold_tokens`) and the version it was sealed at (authenticated)."""
    sealed = stored.get(SEALED_KEY) if type(stored) is dict or isinstance(stored, Mapping) \
        else None
    if not isinstance(sealed, str):
        raise TamperedDataError(
            "a store item holds a plain value where a SecureStore ciphertext was expected "
            "(written without encryption, or injected)")
    version = stored_version(stored)
    blind = {k: v for k, v in stored.items() if k != SEALED_KEY and k != VERSION_KEY}
    for k in blind:
        if not (isinstance(k, str) and k.startswith(BLIND_PREFIX)):
            raise TamperedDataError("a store item holds fields SecureStore did not write")
    plain = keys.open(from_text(sealed), sealed_aad(aad, blind, version))
    if plain[:1] != _VERSION:
        raise TamperedDataError("a store item was sealed in an unknown format")
    try:
        size = int.from_bytes(plain[1:5], "big")
        head = json.loads(plain[5:5 + size]) if size else {}
        body = plain[5 + size:]
        value = _loads(body.decode("utf-8", "surrogatepass"))
    except (ValueError, UnicodeDecodeError):  # pragma: no cover - authenticated: ours
        raise TamperedDataError("a sealed store value does not parse") from None
    return value, {p: unpack_vector(t) for p, t in head.items()}, may_hold_tokens(body), version


def is_envelope(stored: Any) -> bool:
    """Whether ``stored`` has the shape of a sealed item (whether it opens is another
    matter)."""
    return isinstance(stored, Mapping) and isinstance(stored.get(SEALED_KEY), str)


def may_hold_tokens(value_json: bytes) -> bool:
    """False only when no string of the JSON text can hold a PII token (``<KIND:...>``):
    no ``<``, written or escaped, in it."""
    return b"<" in value_json or b"\\u" in value_json
