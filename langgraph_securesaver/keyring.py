"""Master keys and the key-provider protocol.

The key hierarchy has three levels:

* **master keys** (versioned) live only with the key provider (this keyring file, an env var,
  or a KMS/Vault adapter implementing :class:`KeyProvider`);
* a **tenant key-encryption key** is derived from a master key and the tenant id, so the
  provider can wrap and unwrap per tenant without storing anything per tenant;
* **data keys** (per tenant, versioned) are random, wrapped by the tenant KEK and stored in the
  registry table. Rotating a master key rewraps data keys; data is not rewritten.

A database backup therefore holds only wrapped data keys. Shredding a tenant means the provider
can no longer produce that tenant's KEK for any master version the backup used (see the
retention docs); the protocol reserves :meth:`KeyProvider.destroy_tenant` for it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import ConfigurationError, KeyringRequired, TamperedDataError

ENV_VAR = "SECURESAVER_MASTER_KEY"
FILE_FORMAT = "securesaver-keyring/1"
_KEY_BYTES = 32
_NONCE_BYTES = 12
_KEK_INFO = b"securesaver/tenant-kek/v1\x00"


@dataclass(frozen=True)
class WrappedKey:
    """A data key sealed by the provider: which master version sealed it, and the bytes."""

    master_version: str
    blob: bytes


@runtime_checkable
class KeyProvider(Protocol):
    """What SecureSaver needs from wherever master keys live (file, env, KMS, Vault).

    ``context`` is associated data the provider must bind into the wrap (tenant, key purpose and
    version), so a wrapped key copied to another tenant fails to unwrap. ``unwrap`` raises
    :class:`TamperedDataError` for every failure, including an unknown master version.
    """

    @property
    def current_version(self) -> str: ...

    def versions(self) -> list[str]: ...

    def wrap(self, tenant: str, key: bytes, context: bytes) -> WrappedKey: ...

    def unwrap(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes: ...


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise ConfigurationError(f"{what} is not valid base64: {exc}") from None
    if len(raw) != _KEY_BYTES:
        raise ConfigurationError(f"{what} must decode to {_KEY_BYTES} bytes, got {len(raw)}")
    return raw


class Keyring:
    """The built-in key provider: versioned 256-bit master keys held by the application.

    Load it with :meth:`from_file` (a JSON file, mode 0600) or :meth:`from_env`
    (``SECURESAVER_MASTER_KEY``: one base64 key, or ``1:<b64>,2:<b64>`` for several versions;
    the highest version seals new keys).
    """

    def __init__(self, masters: Mapping[str, bytes], current: str | None = None) -> None:
        if not masters:
            raise KeyringRequired("the keyring holds no master key")
        for version, key in masters.items():
            if not version or not isinstance(key, bytes) or len(key) != _KEY_BYTES:
                raise ConfigurationError(f"master key {version!r} must be {_KEY_BYTES} bytes")
        self._masters = dict(masters)
        self._current = current if current is not None else max(self._masters, key=_version_key)
        if self._current not in self._masters:
            raise ConfigurationError(
                f"current master version {self._current!r} is not in the keyring")
        self._keks: dict[tuple[str, str], AESGCM] = {}
        # master versions destroyed by a tenant shred: the per-tenant KEKs that survive it
        self._punctured: dict[str, dict[str, bytes]] = {}
        self.path: Path | None = None

    # construction -------------------------------------------------------------------------
    @classmethod
    def generate(cls) -> Keyring:
        """A new keyring with one random master key (version "1")."""
        return cls({"1": secrets.token_bytes(_KEY_BYTES)})

    @classmethod
    def from_env(cls, var: str = ENV_VAR) -> Keyring:
        value = os.environ.get(var, "").strip()
        if not value:
            raise KeyringRequired(f"{var} is not set")
        if value.startswith("{"):
            return cls._from_json(value, source=var)
        masters: dict[str, bytes] = {}
        for i, part in enumerate(p.strip() for p in value.split(",") if p.strip()):
            version, sep, key = part.partition(":")
            if not sep:
                version, key = str(i + 1), part
            masters[version] = _unb64(key, f"{var} (version {version})")
        return cls(masters)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise KeyringRequired(f"keyring file {p} does not exist") from None
        ring = cls._from_json(text, source=str(p))
        ring.path = p
        return ring

    @classmethod
    def _from_json(cls, text: str, *, source: str) -> Keyring:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"keyring {source} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
            raise ConfigurationError(f"keyring {source} is not a {FILE_FORMAT} document")
        masters = {
            str(v): _unb64(k, f"{source} master key {v}") for v, k in dict(data["masters"]).items()
        }
        current = data.get("current")
        ring = cls(masters, str(current) if current is not None else None)
        for version, keks in dict(data.get("punctured", {})).items():
            ring._punctured[str(version)] = {
                t: _unb64(k, f"{source} punctured key {version}/{t}") for t, k in keks.items()}
        return ring

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Keyring:
        """The keyring at ``path`` if given, else from the environment; a clear error otherwise."""
        if path is not None:
            return cls.from_file(path)
        return cls.from_env()

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FILE_FORMAT,
                "current": self._current,
                "masters": {v: _b64(k) for v, k in sorted(self._masters.items())},
                "punctured": {v: {t: _b64(k) for t, k in sorted(keks.items())}
                              for v, keks in sorted(self._punctured.items())},
            },
            indent=2,
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically with mode 0600 (the file is as sensitive as every conversation)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".keyring-", dir=target.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.to_json())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.path = target
        return target

    def persist(self) -> None:
        """Save back to the file this keyring came from (shredding and rotation need it)."""
        if self.path is None:
            raise ConfigurationError(
                "this keyring has no file to save to (it came from the environment); load it "
                "with Keyring.from_file(path) to rotate or shred, then update your secret store")
        self.save(self.path)

    # versions -----------------------------------------------------------------------------
    @property
    def current_version(self) -> str:
        return self._current

    def versions(self) -> list[str]:
        return sorted(set(self._masters) | set(self._punctured), key=_version_key)

    def shredded_from(self, version: str) -> bool:
        return version in self._punctured

    def add_version(self) -> str:
        """Add a new random master key and make it current; older versions still unwrap."""
        new = str(max(int(v) for v in self._masters if v.isdigit()) + 1) if any(
            v.isdigit() for v in self._masters
        ) else "1"
        self._masters[new] = secrets.token_bytes(_KEY_BYTES)
        self._current = new
        return new

    def retire_version(self, version: str) -> None:
        """Forget a master key. Data keys still wrapped by it become unreadable."""
        if version == self._current:
            raise ConfigurationError(
                "cannot retire the current master version; add a new one first")
        self._masters.pop(version, None)
        self._keks = {k: v for k, v in self._keks.items() if k[0] != version}

    # wrapping -----------------------------------------------------------------------------
    @staticmethod
    def _derive(master: bytes, tenant: str) -> bytes:
        return HKDF(
            algorithm=hashes.SHA256(), length=_KEY_BYTES, salt=None,
            info=_KEK_INFO + tenant.encode("utf-8"),
        ).derive(master)

    def _kek(self, version: str, tenant: str) -> AESGCM:
        cached = self._keks.get((version, tenant))
        if cached is not None:
            return cached
        master = self._masters.get(version)
        if master is not None:
            kek = self._derive(master, tenant)
        elif tenant in self._punctured.get(version, {}):
            kek = self._punctured[version][tenant]
        elif version in self._punctured:
            raise TamperedDataError(
                f"tenant {tenant!r} was crypto-shredded (or unknown) for master version "
                f"{version}: its data can no longer be decrypted")
        else:
            raise TamperedDataError(
                f"master key version {version} is not in this keyring; load the keyring that "
                "holds it (or rewrap with `securesaver rotate-keys` before retiring it)"
            )
        aes = AESGCM(kek)
        self._keks[(version, tenant)] = aes
        return aes

    def wrap(self, tenant: str, key: bytes, context: bytes) -> WrappedKey:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        blob = nonce + self._kek(self._current, tenant).encrypt(nonce, key, context)
        return WrappedKey(self._current, blob)

    def unwrap(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes:
        aes = self._kek(wrapped.master_version, tenant)
        blob = wrapped.blob
        try:
            return aes.decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], context)
        except (InvalidTag, ValueError):
            raise TamperedDataError(
                f"a data key of tenant {tenant!r} does not unwrap under master version "
                f"{wrapped.master_version}: wrong keyring, or the key row was altered"
            ) from None

    def destroy_tenant(self, tenant: str, keep_tenants: list[str]) -> None:
        """Crypto-shred ``tenant``: every master version except the current one is replaced
        by the KEKs of ``keep_tenants`` only, then forgotten. Backups whose key rows were
        wrapped under those versions stay readable for the kept tenants and never again for
        ``tenant``. Call only after every kept tenant's rows are rewrapped under the current
        version, and persist the keyring afterwards."""
        for version in [v for v in self._masters if v != self._current]:
            master = self._masters.pop(version)
            self._punctured[version] = {
                t: self._derive(master, t) for t in keep_tenants if t != tenant}
        for keks in self._punctured.values():
            keks.pop(tenant, None)
        self._keks = {k: v for k, v in self._keks.items() if k[1] != tenant}

    def __repr__(self) -> str:  # never print key material
        return f"Keyring(versions={self.versions()}, current={self._current!r})"


class NoKeys:
    """A provider with no keys, for jobs that never decrypt (the retention pruner).

    Any attempt to wrap or unwrap fails closed with :class:`KeyringRequired`.
    """

    current_version = "none"

    def versions(self) -> list[str]:
        return []

    def wrap(self, tenant: str, key: bytes, context: bytes) -> WrappedKey:
        raise KeyringRequired("this job runs without keys and cannot create tenant keys")

    def unwrap(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes:
        raise KeyringRequired("this job runs without keys and cannot decrypt")


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (1 << 62, version)
