"""Field-level encryption: sealing and opening tokens under per-tenant data keys
(``TenantKeys``), and unwrapping and caching those keys (``KeyManager``).

The token format, associated data and key rows are :mod:`.tokens` (no ``cryptography``
import); every name of it is importable from here as before. The tenant is not written in the
token: it is part of the associated data, together with the thread, the checkpoint namespace
and the record the value belongs to. A token moved to any other place fails authentication.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import KeyGoneError, TamperedDataError
from .material import SecretBytes
from .provider import KeyProvider, WrappedKey
from .tokens import (
    DATA,
    INDEX,
    MAGIC,
    NONCE_BYTES,
    THREAD_KEY_VERSION,
    TOKEN_HEADER,
    KeyRow,
    KeyStore,
    aad_scope,
    is_token,
    row_context,
    wrap_context,
)

logger = logging.getLogger(__name__)

class ScopedKeySource(Protocol):
    """Where per-thread and per-vault-entry data keys come from
    (:class:`..registry.thread_keys.ThreadKeyStore`); ``scope`` is THREAD or ENTRY. ``sealing``: new
    values are sealed under these keys (False: under the tenant's data key; existing values
    under scoped keys still open)."""

    sealing: bool

    def key(self, tenant: str, scope: str, name: str, create: bool) -> AESGCM | None: ...

    def refreshed(self, tenant: str, scope: str, name: str) -> AESGCM | None: ...


class _NoncePool:
    """Random 96-bit GCM nonces from the OS CSPRNG, drawn 4 KiB at a time.

    Same randomness as one ``os.urandom(12)`` per seal, but one system call per 341 nonces:
    each call releases the GIL, and a thread that hands the GIL over while another thread is
    busy waits up to the interpreter's switch interval to get it back (a turn seals ~10
    values while LangGraph runs its put and put_writes threads side by side). Each buffered
    byte is handed out once (under a lock); the buffer is discarded in a forked child, so
    parent and child never share a nonce."""

    _CHUNK = 341 * NONCE_BYTES  # 4092 bytes

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf = b""
        self._pos = 0
        self._pid = os.getpid()

    def take(self) -> bytes:
        with self._lock:
            if self._pid != os.getpid():  # forked without the at-fork hook having run
                self._buf, self._pos, self._pid = b"", 0, os.getpid()
            if self._pos + NONCE_BYTES > len(self._buf):
                self._buf, self._pos = os.urandom(self._CHUNK), 0
            nonce = self._buf[self._pos:self._pos + NONCE_BYTES]
            self._pos += NONCE_BYTES
            return nonce

    def discard(self) -> None:
        self._buf, self._pos, self._pid = b"", 0, os.getpid()
        self._lock = threading.Lock()


_NONCES = _NoncePool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_NONCES.discard)


def _nonce() -> bytes:
    return _NONCES.take()


def _seal_under(aes: AESGCM, plaintext: bytes, aad: bytes) -> bytes:
    """A ciphertext under a thread or vault-entry key (the header names no data-key version)."""
    nonce = _nonce()
    return TOKEN_HEADER.pack(MAGIC, THREAD_KEY_VERSION) + nonce + aes.encrypt(nonce, plaintext, aad)


@dataclass
class TenantKeys:
    """The unwrapped keys of one tenant: versioned data keys (AESGCM objects, which do not
    print their key) and one stable index (HMAC) key, held as :class:`SecretBytes`."""

    tenant: str
    current_version: int
    data: dict[int, AESGCM] = field(repr=False)
    index_key: SecretBytes = field(repr=False)
    _hmac_cache: dict[str, str] = field(default_factory=dict, repr=False)
    # asks the key store again when a token names a version this process has not seen yet
    # (another process rotated the tenant's data key)
    reload: Callable[[], TenantKeys | None] | None = field(default=None, repr=False)
    loaded_at: float = field(default_factory=time.monotonic, repr=False)
    _reload_lock: threading.Lock = field(default_factory=threading.Lock, repr=False,
                                         compare=False)
    #: per-thread / per-entry data keys; None: everything under the tenant's data key
    threads: ScopedKeySource | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:  # never key material, in repr, str, logs or tracebacks
        return (f"TenantKeys(tenant={self.tenant!r}, current_version={self.current_version}, "
                f"data_versions={sorted(self.data)})")

    __str__ = __repr__

    def seal(self, plaintext: bytes, aad: bytes, *, key: AESGCM | None = None) -> bytes:
        """Seal under the thread's own key when ``aad`` belongs to a thread (and a thread-key
        source is attached), else under the tenant's current data key. ``key``: the thread or
        vault-entry key of ``aad``, held by the caller (a key just created, whose row commits
        in the transaction that stores the ciphertext)."""
        if key is not None:
            scoped = aad_scope(aad)
            if scoped is None or scoped[1] != self.tenant:
                raise TamperedDataError(
                    "a thread or vault-entry key given for data of no thread or entry of the "
                    "tenant")
            return _seal_under(key, plaintext, aad)
        if self.threads is not None and self.threads.sealing:
            scoped = aad_scope(aad)
            if scoped is not None and scoped[1] == self.tenant:
                aes = self.threads.key(self.tenant, scoped[0], scoped[2], True)
                if aes is None:
                    raise TamperedDataError(
                        f"the {scoped[0]}'s data key was deleted while it was being written")
                return _seal_under(aes, plaintext, aad)
        nonce = _nonce()
        header = TOKEN_HEADER.pack(MAGIC, self.current_version) + nonce
        return header + self.data[self.current_version].encrypt(nonce, plaintext, aad)

    def _thread_key(self, aad: bytes) -> AESGCM:
        scoped = aad_scope(aad) if self.threads is not None else None
        if self.threads is None or scoped is None or scoped[1] != self.tenant:
            raise TamperedDataError(
                "a ciphertext sealed under a thread or vault-entry key was found elsewhere")
        aes = self.threads.key(self.tenant, scoped[0], scoped[2], False)
        if aes is None:
            raise TamperedDataError(
                f"ciphertext of a {scoped[0]} whose data key is gone (deleted or erased: its "
                "data is crypto-erased), or a ciphertext copied from another database")
        return aes

    def open(self, token: object, aad: bytes) -> bytes:
        if not isinstance(token, bytes) or not is_token(token):
            raise TamperedDataError(
                "a plain value was found where a SecureSaver ciphertext was expected; refusing "
                "to load it (it was written without encryption, or injected)"
            )
        version = int(TOKEN_HEADER.unpack_from(token)[1])
        aes = self._thread_key(aad) if version == THREAD_KEY_VERSION else self.data.get(version)
        if aes is None and self.reload is not None:
            with self._reload_lock:        # one reload for every thread that meets it
                aes = self.data.get(version)
                if aes is None:
                    fresh = self.reload()
                    if fresh is not None:
                        self.data.update(fresh.data)
                        self.current_version = max(self.current_version,
                                                   fresh.current_version)
                        aes = self.data.get(version)
        if aes is None:
            raise TamperedDataError(
                f"ciphertext names data key v{version} of tenant {self.tenant!r}, which is unknown "
                "(shredded tenant, wrong database, or forged token)"
            )
        start = TOKEN_HEADER.size
        nonce = token[start:start + NONCE_BYTES]
        try:
            return aes.decrypt(nonce, token[start + NONCE_BYTES:], aad)
        except InvalidTag:
            pass
        # a cached thread key another process replaced (deleted the thread, wrote it again):
        # the key row read once more, the ciphertext tried under it
        scoped = aad_scope(aad) if version == THREAD_KEY_VERSION else None
        renewed = None if scoped is None or self.threads is None else self.threads.refreshed(
            self.tenant, scoped[0], scoped[2])
        try:
            if renewed is None:
                raise InvalidTag
            return renewed.decrypt(nonce, token[start + NONCE_BYTES:], aad)
        except InvalidTag:
            raise TamperedDataError(
                "ciphertext failed authentication: it was altered, or moved from another tenant, "
                "thread, namespace or checkpoint"
            ) from None

    def blind(self, *parts: str) -> str:
        """A keyed, deterministic digest (blind index / stable token); never reversible."""
        key = "\x00".join(parts)
        hit = self._hmac_cache.get(key)
        if hit is None:
            raw = key.encode("utf-8", "surrogatepass")
            hit = hmac.digest(self.index_key.reveal(), raw, "sha256").hex()[:32]
            if len(self._hmac_cache) < 4096:
                self._hmac_cache[key] = hit
        return hit


def kek_wrap(kek: AESGCM, key: bytes, context: bytes) -> bytes:
    """A thread or vault-entry key sealed under its tenant's KEK (nonce + AES-GCM), locally:
    no key-provider call on the per-turn path."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + kek.encrypt(nonce, key, context)


def kek_unwrap(kek: AESGCM, blob: bytes, context: bytes) -> AESGCM:
    """The AESGCM of a key sealed by :func:`kek_wrap`; :class:`TamperedDataError` when the blob
    was altered, moved to another thread/tenant/database, or sealed under another KEK. The
    raw key never becomes a local (reporters print the locals of raising frames)."""
    try:
        return AESGCM(kek.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], context))
    except (InvalidTag, ValueError):
        raise TamperedDataError(
            "a thread or vault-entry key does not unwrap under its tenant's key-encryption "
            "key: altered, copied from another thread, tenant or database, or its KEK is gone"
        ) from None


class KeyManager:
    """Unwraps and caches tenant keys; creates them on a tenant's first write.

    Thread-safe. The cache holds unwrapped keys in process memory only.
    """

    def __init__(self, provider: KeyProvider, store: KeyStore, *, ttl: float = 300.0,
                 reload_interval: float = 0.5) -> None:
        self.provider = provider
        self.store = store
        self.ttl = ttl  # how long a process trusts its cached keys before re-reading them
        # at most one reload of the key source (and one re-read of a tenant's key rows) per
        # this many seconds when a version is unknown: rotation by another process is picked
        # up at once, forged versions cannot turn every read into a reload
        self.reload_interval = reload_interval
        self._cache: dict[str, TenantKeys] = {}
        #: per-thread data keys (set by the saver); None: tenant data keys only
        self.threads: ScopedKeySource | None = None
        self._lock = threading.Lock()
        self._provider_lock = threading.Lock()
        self._provider_generation = 0
        self._provider_reloaded = -float("inf")
        self._rows_reloaded: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"KeyManager(provider={self.provider!r}, tenants_cached={len(self._cache)})"

    def cached(self, tenant: str) -> TenantKeys | None:
        hit = self._cache.get(tenant)
        if hit is not None and time.monotonic() - hit.loaded_at > self.ttl:
            return None  # stale: re-read so rotations by other processes are picked up
        return hit

    def forget(self, tenant: str | None = None) -> None:
        with self._lock:
            if tenant is None:
                self._cache.clear()
            else:
                self._cache.pop(tenant, None)

    def keys_for(self, tenant: str, *, create: bool = True) -> TenantKeys | None:
        hit = self.cached(tenant)
        if hit is not None:
            return hit
        with self._lock:
            hit = self.cached(tenant)
            if hit is not None:
                return hit
            rows = self.store.load_key_rows(tenant)
            if not rows:
                if not create:
                    return None
                generation = self._provider_generation
                try:
                    self.store.insert_key_rows(self._new_rows(tenant, [(DATA, 1), (INDEX, 1)]))
                except KeyGoneError:   # wrapped under a version being retired: reload, retry
                    if not self._reload_provider(generation):
                        raise
                    self.store.insert_key_rows(self._new_rows(tenant, [(DATA, 1), (INDEX, 1)]))
                rows = self.store.load_key_rows(tenant)  # another process may have won the race
            keys = self._unwrap(tenant, rows)
            self._cache[tenant] = keys
            return keys

    def require(self, tenant: str) -> TenantKeys:
        keys = self.keys_for(tenant, create=False)
        if keys is None:
            raise TamperedDataError(
                f"tenant {tenant!r} has stored ciphertext but no data keys in the registry "
                "(shredded tenant, or a registry that does not belong to this database)"
            )
        return keys

    def new_data_key(self, tenant: str) -> int:
        """Add a data-key version for a tenant (data-key rotation); new writes use it."""
        with self._lock:
            rows = self.store.load_key_rows(tenant)
            version = max((r.version for r in rows if r.purpose == DATA), default=0) + 1
            self.store.insert_key_rows(self._new_rows(tenant, [(DATA, version)]))
            self._cache.pop(tenant, None)
        return version

    def _new_rows(self, tenant: str, specs: Iterable[tuple[str, int]]) -> list[KeyRow]:
        now = time.time()
        rows = []
        for purpose, version in specs:
            wrapped = self.provider.wrap(
                tenant, secrets.token_bytes(32),
                wrap_context(tenant, purpose, version, self.store.database_id()))
            rows.append(KeyRow(tenant, purpose, version, wrapped.master_version, wrapped.blob, now))
        return rows

    def _unwrap(self, tenant: str, rows: Sequence[KeyRow]) -> TenantKeys:
        """Unwrap a tenant's key rows; a row under a master version the provider does not
        hold (rotated by another process) makes the provider reload its source once."""
        generation = self._provider_generation
        try:
            return self._unwrap_once(tenant, rows)
        except TamperedDataError:
            if not self._reload_provider(generation):
                raise
            return self._unwrap_once(tenant, rows)

    def unwrap_fresh(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes:
        """``provider.unwrap``, reloading the provider's source once when the row names a
        master version it does not hold yet (rotated by another process)."""
        generation = self._provider_generation
        try:
            return self.provider.unwrap(tenant, wrapped, context)
        except TamperedDataError:
            if not self._reload_provider(generation):
                raise
            return self.provider.unwrap(tenant, wrapped, context)

    def _reload_provider(self, seen: int) -> bool:
        """Reload the provider's key source (coalesced across threads, rate-bounded); True
        when the failed unwrap is worth retrying."""
        reload = getattr(self.provider, "reload", None)
        if not callable(reload):
            return False
        with self._provider_lock:
            if self._provider_generation != seen:
                return True            # another thread reloaded since this one failed
            now = time.monotonic()
            if now - self._provider_reloaded < self.reload_interval:
                return False
            self._provider_reloaded = now
            try:
                changed = reload()
            except Exception as exc:  # noqa: BLE001 - a broken source must not hide the error
                logger.warning("key provider reload failed: %s", type(exc).__name__)
                return False
            if changed is False:
                return False
            self._provider_generation += 1
            return True

    def _unwrap_once(self, tenant: str, rows: Sequence[KeyRow]) -> TenantKeys:
        # the raw keys the provider returns never become locals here: a later row that does
        # not unwrap raises through this frame, and reporters print its locals
        data: dict[int, AESGCM] = {}
        index_key: SecretBytes | None = None
        for row in rows:
            if row.purpose == DATA:
                data[row.version] = AESGCM(self._unwrap_row(tenant, row).reveal())
            elif row.purpose == INDEX:
                index_key = self._unwrap_row(tenant, row)
        if not data or index_key is None:
            raise TamperedDataError(f"the key rows of tenant {tenant!r} are incomplete")
        return TenantKeys(tenant, max(data), data, index_key,
                          reload=lambda: self._reload(tenant), threads=self.threads)

    def _unwrap_row(self, tenant: str, row: KeyRow) -> SecretBytes:
        return SecretBytes(self.provider.unwrap(
            tenant, WrappedKey(row.master_version, row.wrapped),
            row_context(self.store, tenant, row.purpose, row.version)))

    def _reload(self, tenant: str) -> TenantKeys | None:
        now = time.monotonic()
        if now - self._rows_reloaded.get(tenant, -float("inf")) < self.reload_interval:
            return None  # re-read a moment ago: the version is not in the registry
        if len(self._rows_reloaded) > 100_000:
            self._rows_reloaded.clear()
        self._rows_reloaded[tenant] = now
        rows = self.store.load_key_rows(tenant)
        if not rows:
            return None
        keys = self._unwrap(tenant, rows)
        with self._lock:
            self._cache[tenant] = keys
        return keys

    def rewrap(self, tenant: str, rows: Sequence[KeyRow]) -> list[KeyRow]:
        """Rows re-sealed under the provider's current master version (no data rewrite)."""
        out = []
        bound_to = self.store.database_id()
        for row in rows:
            wrapped = self.provider.wrap(
                tenant, self._unwrap_row(tenant, row).reveal(),
                wrap_context(tenant, row.purpose, row.version, bound_to))
            out.append(KeyRow(tenant, row.purpose, row.version, wrapped.master_version,
                              wrapped.blob, row.created_at))
        return out

