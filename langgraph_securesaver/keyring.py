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
import logging
import os
import secrets
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import ENV_VAR, ConfigurationError, KeyringRequired, TamperedDataError

logger = logging.getLogger(__name__)

FILE_FORMAT = "securesaver-keyring/1"
_KEY_BYTES = 32
_NONCE_BYTES = 12
_KEK_INFO = b"securesaver/tenant-kek/v1\x00"


@dataclass(frozen=True)
class WrappedKey:
    """A data key sealed by the provider: which master version sealed it, and the bytes."""

    master_version: str
    blob: bytes = field(repr=False)


@runtime_checkable
class KeyProvider(Protocol):
    """What SecureSaver needs from wherever master keys live (file, env, KMS, Vault).

    ``context`` is associated data the provider must bind into the wrap (tenant, key purpose and
    version), so a wrapped key copied to another tenant fails to unwrap. ``unwrap`` raises
    :class:`TamperedDataError` for every failure, including an unknown master version.

    Optional: ``reload() -> bool`` re-reads the provider's source; SecureSaver calls it (at
    most every ``KeyManager.reload_interval`` seconds) when a key row names a master version
    the provider does not hold, so processes follow a rotation done elsewhere. Optional too:
    ``record_database(id, label)`` / ``other_databases(id)`` (see :class:`Keyring`).
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
        # the databases this keyring serves (database id -> label, password hidden)
        self._databases: dict[str, str] = {}
        self.path: Path | None = None
        self._env_var: str | None = None
        self._source_stamp: object = None
        self._lock = threading.RLock()

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
            ring = cls._from_json(value, source=var)
        else:
            masters: dict[str, bytes] = {}
            for i, part in enumerate(p.strip() for p in value.split(",") if p.strip()):
                version, sep, key = part.partition(":")
                if not sep:
                    version, key = str(i + 1), part
                version = version.strip()
                if not version or len(version) > 64:
                    raise ConfigurationError(f"{var}: a master version is empty or too long")
                if version in masters:
                    raise ConfigurationError(f"{var}: master version {version} appears twice")
                masters[version] = _unb64(key.strip(), f"{var} (version {version})")
            ring = cls(masters)
        ring._env_var = var
        ring._source_stamp = _digest(value)
        return ring

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        p = Path(path)
        try:
            stamp = _file_stamp(p)
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise KeyringRequired(f"keyring file {p} does not exist") from None
        except IsADirectoryError:
            raise ConfigurationError(f"keyring {p} is a directory, not a keyring file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(
                f"keyring file {p} cannot be read: {type(exc).__name__}") from None
        ring = cls._from_json(text, source=str(p))
        ring.path = p
        ring._source_stamp = stamp
        return ring

    @classmethod
    def _from_json(cls, text: str, *, source: str) -> Keyring:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"keyring {source} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
            raise ConfigurationError(f"keyring {source} is not a {FILE_FORMAT} document")
        masters_doc = data.get("masters")
        if not isinstance(masters_doc, dict) or not masters_doc:
            raise ConfigurationError(
                f"keyring {source} has no \"masters\" object of version -> base64 key")
        masters = {}
        for v, k in masters_doc.items():
            if not isinstance(k, str) or not v or len(v) > 64:
                raise ConfigurationError(
                    f"keyring {source}: master key {v!r} must be a base64 string under a "
                    "version of at most 64 characters")
            masters[v] = _unb64(k, f"{source} master key {v}")
        current = data.get("current")
        if current is not None and not isinstance(current, (str, int)):
            raise ConfigurationError(f"keyring {source}: \"current\" must be a version string")
        ring = cls(masters, str(current) if current is not None else None)
        punctured = data.get("punctured", {})
        if not isinstance(punctured, dict) or not all(
                isinstance(keks, dict) for keks in punctured.values()):
            raise ConfigurationError(
                f"keyring {source}: \"punctured\" must map versions to {{tenant: base64 key}}")
        for version, keks in punctured.items():
            if any(not isinstance(t, str) or not isinstance(k, str) for t, k in keks.items()):
                raise ConfigurationError(
                    f"keyring {source}: punctured keys of version {version!r} must be "
                    "tenant -> base64 strings")
            ring._punctured[str(version)] = {
                t: _unb64(k, f"{source} punctured key {version}/{t}") for t, k in keks.items()}
        databases = data.get("databases", {})
        if not isinstance(databases, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in databases.items()):
            raise ConfigurationError(
                f"keyring {source}: \"databases\" must map database ids to labels")
        ring._databases = dict(databases)
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
                "databases": dict(sorted(self._databases.items())),
            },
            indent=2,
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically with mode 0600 (the file is as sensitive as every conversation)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(target):
            self._merge_databases_from(target)
            self._write(target)
        self.path = target
        return target

    def _merge_databases_from(self, target: Path) -> None:
        """Databases recorded in the file by other processes are kept (the list only grows,
        except through :meth:`forget_database`)."""
        if self.path is None or Path(self.path) != target:
            return
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        found = data.get("databases") if isinstance(data, dict) else None
        if isinstance(found, dict):
            for db, label in found.items():
                if isinstance(db, str) and isinstance(label, str) and db not in self._forgotten:
                    self._databases.setdefault(db, label)

    @property
    def _forgotten(self) -> set[str]:
        return self.__dict__.setdefault("_forgotten_dbs", set())

    def _write(self, target: Path) -> None:
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
        self._source_stamp = _file_stamp(target)

    # following the key source (rotation by another process) ---------------------------------
    def reload(self) -> bool:
        """Re-read the source this keyring came from (its file, or its environment variable)
        and adopt it: a process started before a rotation learns the new master version, and
        forgets retired ones. Cheap when nothing changed (a ``stat``). Returns whether the
        keys changed. A source that became unreadable or invalid is ignored (logged)."""
        with self._lock:
            try:
                if self.path is not None:
                    if _file_stamp(self.path) == self._source_stamp:
                        return False
                    fresh = Keyring.from_file(self.path)
                elif self._env_var is not None:
                    if _digest(os.environ.get(self._env_var, "").strip()) == self._source_stamp:
                        return False
                    fresh = Keyring.from_env(self._env_var)
                else:
                    return False
            except (ConfigurationError, OSError) as exc:
                logger.warning("keyring source could not be reloaded: %s", exc)
                return False
            changed = (fresh._masters != self._masters or fresh._current != self._current
                       or fresh._punctured != self._punctured)
            if changed:
                self._masters, self._current = fresh._masters, fresh._current
                self._punctured = fresh._punctured
                self._keks = {}
                logger.info("keyring reloaded: master versions %s, current %s",
                            self.versions(), self._current)
            self._databases.update(fresh._databases)
            self._source_stamp = fresh._source_stamp
            return changed

    # the databases this keyring serves --------------------------------------------------------
    def databases(self) -> dict[str, str]:
        """Database id -> label of every database this keyring was used with (recorded when a
        SecureSaver opens a database with it; saved in the keyring file)."""
        return dict(self._databases)

    def record_database(self, database_id: str, label: str) -> None:
        """Note that this keyring serves ``database_id`` (persisted when it has a file; a file
        that cannot be written, e.g. a read-only secret mount, is left alone and logged)."""
        with self._lock:
            if database_id in self._databases:
                return
            self._databases[database_id] = label
            if self.path is None:
                return
            try:
                with _file_lock(self.path):
                    on_disk = Keyring.from_file(self.path)
                    if database_id in on_disk._databases:
                        return
                    on_disk._databases[database_id] = label
                    on_disk._write(self.path)   # only the database list changes on disk
                    self._databases.update(on_disk._databases)
            except (OSError, ConfigurationError) as exc:
                logger.warning("could not record database %s in keyring file %s: %s",
                               database_id, self.path, exc)

    def other_databases(self, database_id: str) -> dict[str, str]:
        """The databases other than ``database_id`` this keyring serves (re-read from its
        file, so a database recorded by another process counts)."""
        with self._lock:
            if self.path is not None:
                self._merge_databases_from(Path(self.path))
            return {d: label for d, label in self._databases.items() if d != database_id}

    def forget_database(self, database_id: str) -> None:
        """Stop counting ``database_id`` as served (it was decommissioned); persist after."""
        with self._lock:
            self._databases.pop(database_id, None)
            self._forgotten.add(database_id)

    def persist(self) -> None:
        """Save back to the file this keyring came from (shredding and rotation need it).
        Databases other processes recorded in the file meanwhile are kept."""
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

    __str__ = __repr__


class NoKeys:
    """A provider with no keys, for read-only jobs that never decrypt (audit, scan listings).

    It cannot unwrap the registry MAC key either, so such a job cannot verify or write
    registry rows: the retention pruner refuses to run with it.

    Any attempt to wrap or unwrap fails closed with :class:`KeyringRequired`.
    """

    current_version = "none"

    def versions(self) -> list[str]:
        return []

    def wrap(self, tenant: str, key: bytes, context: bytes) -> WrappedKey:
        raise KeyringRequired("this job runs without keys and cannot create tenant keys")

    def unwrap(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes:
        raise KeyringRequired("this job runs without keys and cannot decrypt")


def _file_stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _digest(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@contextmanager
def _file_lock(target: Path) -> Iterator[None]:
    """An exclusive advisory lock beside the keyring file, so processes that update it
    (rotation, shredding, recording a database) do not lose each other's changes."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock_path = target.with_name(target.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (1 << 62, version)
