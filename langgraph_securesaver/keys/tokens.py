"""The token format, associated data and key rows: what reading a stored ciphertext's header
or a registry key row needs, without the cipher (nothing here imports ``cryptography``, so the
audit and the registry's readers start without it). :mod:`.crypto` seals and opens tokens
and re-exports every name of this module.

Token format (bytes)::

    b"SS" | format version (1 byte, 0x01) | data-key version (4 bytes, big endian)
          | nonce (12 bytes) | AES-256-GCM ciphertext with 16-byte tag

Text columns (JSON metadata) carry ``"ss1." + urlsafe base64``.
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import TamperedDataError

MAGIC = b"SS\x01"
TEXT_PREFIX = "ss1."
#: a token's header: magic and format version, data-key version
TOKEN_HEADER = struct.Struct(">3sI")
NONCE_BYTES = 12
TAG_BYTES = 16
MIN_TOKEN_BYTES = TOKEN_HEADER.size + NONCE_BYTES + TAG_BYTES

DATA = "data"
INDEX = "index"
#: a tenant's key-encryption key for thread and vault-entry keys, one per master version; it
#: is never rewrapped: an erasure epoch replaces it (see :mod:`..registry.thread_keys`)
KEK = "kek"
#: a tenant's PII lookup key (the HMAC key of vault lookups), one per master version; replaced,
#: never rewrapped, by the erasure epoch (see :mod:`..registry.pii_lookups`)
LOOKUP = "lookup"

#: the key-version field of a token sealed under its thread's own data key (tenant data-key
#: versions start at 1); see :mod:`..registry.thread_keys`
THREAD_KEY_VERSION = 0
#: associated-data kinds ``(kind, tenant, thread, ...)`` of what belongs to one thread:
#: checkpoint values, pending writes, sealed metadata, idempotency and recovery records.
#: With a scoped-key source, these are sealed under the thread's key.
THREAD_SCOPED = frozenset({b"cv", b"w", b"md", b"idem", b"idem-error", b"recover-conf",
                           b"recover-error"})
#: ``("pii", tenant, token)``: a PII-vault value, sealed under its entry's own key
ENTRY_SCOPED = frozenset({b"pii"})
#: ``("si", tenant, item, ...)``: a SecureStore item, sealed under the item's own key
ITEM_SCOPED = frozenset({b"si"})
THREAD, ENTRY, ITEM = "thread", "entry", "item"
_SCOPED_KINDS = THREAD_SCOPED | ENTRY_SCOPED | ITEM_SCOPED
_GROUPS = {**dict.fromkeys(THREAD_SCOPED, THREAD), **dict.fromkeys(ENTRY_SCOPED, ENTRY),
           **dict.fromkeys(ITEM_SCOPED, ITEM)}
_AAD_PREFIX = b"securesaver/aad/v1"
_LEN = struct.Struct(">I")


_AAD_HEAD = b"securesaver/aad/v1"
_LENGTH = struct.Struct(">I").pack


def associated_data(*parts: str) -> bytes:
    """Length-prefixed encoding, so ("a:b", "c") and ("a", "b:c") never collide."""
    return _AAD_HEAD + aad_parts(parts)


def aad_parts(parts: Iterable[str]) -> bytes:
    """The length-prefixed encoding of ``parts`` without the header (what follows a cached
    prefix of :func:`associated_data`: ``associated_data(*a, *b) ==
    associated_data(*a) + aad_parts(b)``)."""
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        out += _LENGTH(len(raw))
        out += raw
    return bytes(out)


def aad_scope(aad: bytes) -> tuple[str, str, str] | None:
    """(THREAD, ENTRY or ITEM; tenant; thread, token or store item) of associated data that
    belongs to one thread, vault entry or store item, else None."""
    if not aad.startswith(_AAD_PREFIX):
        return None
    pos = len(_AAD_PREFIX)
    if pos + 4 > len(aad):
        return None
    (n,) = _LEN.unpack_from(aad, pos)
    if aad[pos + 4:pos + 4 + n] not in _SCOPED_KINDS:  # the usual case, decided on the kind
        return None
    parts: list[bytes] = []
    while len(parts) < 3 and pos + 4 <= len(aad):
        (n,) = _LEN.unpack_from(aad, pos)
        parts.append(aad[pos + 4:pos + 4 + n])
        pos += 4 + n
    if len(parts) < 3:
        return None
    group = _GROUPS.get(parts[0])
    if group is None:
        return None
    return (group, parts[1].decode("utf-8", "surrogatepass"),
            parts[2].decode("utf-8", "surrogatepass"))


def is_token(value: object) -> bool:
    return isinstance(value, bytes) and len(value) >= MIN_TOKEN_BYTES and value[:3] == MAGIC


def token_key_version(token: bytes) -> int:
    """The data-key version a token names (for audits); raises TamperedDataError if malformed."""
    if not is_token(token):
        raise TamperedDataError("not a SecureSaver ciphertext (plain value where one was expected)")
    return int(TOKEN_HEADER.unpack_from(token)[1])


# base64.urlsafe_b64encode/-decode, without their per-call argument handling
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def to_text(token: bytes) -> str:
    return TEXT_PREFIX + binascii.b2a_base64(token, newline=False).translate(
        _TO_URLSAFE).decode("ascii")


def from_text(text: object) -> bytes:
    if not isinstance(text, str) or not text.startswith(TEXT_PREFIX):
        raise TamperedDataError(
            "expected a SecureSaver ciphertext in a text column, found a plain value")
    try:
        return binascii.a2b_base64(text[len(TEXT_PREFIX):].encode("ascii").translate(
            _FROM_URLSAFE))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise TamperedDataError("a text ciphertext is not valid base64") from None




@dataclass(frozen=True)
class KeyRow:
    """One wrapped key as stored in the registry."""

    tenant: str
    purpose: str
    version: int
    master_version: str
    wrapped: bytes = field(repr=False)
    created_at: float


class KeyStore(Protocol):
    """Where wrapped tenant keys are persisted (the registry implements it).

    ``database_id()`` names the database the rows belong to (bound into every wrap, so a row
    copied from another database never unwraps)."""

    def load_key_rows(self, tenant: str) -> list[KeyRow]: ...

    def insert_key_rows(self, rows: Sequence[KeyRow]) -> None: ...

    def database_id(self) -> str: ...


def wrap_context(tenant: str, purpose: str, version: int, database: str) -> bytes:
    """The associated data of a wrapped key, bound to its database, tenant, purpose and
    version."""
    return associated_data("key@db", database, tenant, purpose, str(version))


def thread_key_context(database: str, tenant: str, name: str, scope: str = THREAD) -> bytes:
    """The wrap context of a thread's (or vault entry's) data key: bound to its database,
    tenant and thread (or token)."""
    return associated_data(f"{scope}-key", database, tenant, name)


def row_context(store: KeyStore, tenant: str, purpose: str, version: int) -> bytes:
    """The wrap context a stored row of ``store``'s database must unwrap under."""
    return wrap_context(tenant, purpose, version, store.database_id())
