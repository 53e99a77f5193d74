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
import re
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import ENV_VAR, ConfigurationError, KeyringRequired, TamperedDataError
from .keyring_file import (
    file_lock,
    file_stamp,
    insecure_allowed,
    read_keyring_text,
    refuse_symlink,
    write_keyring_text,
)
from .material import Refusal, SecretBytes, SecretText, refusing_outside
from .provider import WrappedKey

logger = logging.getLogger(__name__)

FILE_FORMAT = "securesaver-keyring/1"
_KEY_BYTES = 32
_NONCE_BYTES = 12
_KEK_INFO = b"securesaver/tenant-kek/v1\x00"
#: a master version: short, printable, and never mistaken for a key (base64 keys are longer
#: and padded with "=")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")


def _b64(key: SecretBytes) -> str:
    return base64.urlsafe_b64encode(key.reveal()).decode("ascii")


def _shown(version: object) -> str:
    """A version as an error message may print it: only when it looks like one (a malformed
    document can hold a key where a version belongs)."""
    if isinstance(version, str) and _VERSION.fullmatch(version) and len(version) <= 16:
        return repr(version)
    return "(not shown)"


def _unb64(text: str, what: str) -> SecretBytes:
    """A 32-byte key from base64; raises :class:`Refusal` (call it inside a parser run by
    :func:`refusing_outside`, whose frames hold the text)."""
    try:
        held = SecretBytes(base64.urlsafe_b64decode(text.encode("ascii")))
    except binascii.Error as exc:
        raise Refusal(f"{what} is not valid base64: {exc}") from None
    except (ValueError, UnicodeEncodeError):
        raise Refusal(f"{what} is not valid base64 (a character outside base64)") from None
    if len(held) != _KEY_BYTES:
        raise Refusal(f"{what} must decode to {_KEY_BYTES} bytes, got {len(held)}")
    return held


def _hold(masters: object) -> tuple[dict[str, SecretBytes], str | None]:
    """The masters as :class:`SecretBytes`, or the reason they are refused. Never raises:
    the caller raises after this frame, which holds the raw keys, is gone."""
    if not isinstance(masters, Mapping):
        return {}, "masters must map versions to 32-byte keys"
    held: dict[str, SecretBytes] = {}
    for version, key in masters.items():
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            return {}, (f"master version {_shown(version)} must be 1-32 letters, digits, '.', "
                        "'_' or '-', starting with a letter or digit")
        if not isinstance(key, (bytes, SecretBytes)) or len(key) != _KEY_BYTES:
            return {}, f"master key {version!r} must be {_KEY_BYTES} bytes"
        held[version] = key if isinstance(key, SecretBytes) else SecretBytes(key)
    return held, None


class Keyring:
    """The built-in key provider: versioned 256-bit master keys held by the application.

    Load it with :meth:`from_file` (a JSON file, mode 0600, owned by the process's user) or
    :meth:`from_env` (``SECURESAVER_MASTER_KEY``: one base64 key, or ``1:<b64>,2:<b64>`` for
    several versions; the highest version seals new keys). Keys are held as
    :class:`~langgraph_securesaver.keys.material.SecretBytes`: nothing here prints one.
    """

    def __init__(self, masters: Mapping[str, bytes | SecretBytes],
                 current: str | None = None) -> None:
        self._masters: dict[str, SecretBytes] = {}
        self._current = ""
        self._keks: dict[tuple[str, str], AESGCM] = {}
        # master versions destroyed by a tenant shred: the per-tenant KEKs that survive it
        self._punctured: dict[str, dict[str, SecretBytes]] = {}
        # the databases this keyring serves (database id -> label, password hidden)
        self._databases: dict[str, str] = {}
        self.path: Path | None = None
        self._env_var: str | None = None
        self._source_stamp: object = None
        self._allow_insecure = False
        self._lock = threading.RLock()
        held, problem = _hold(masters)
        del masters                      # the caller's raw keys: not in a frame that raises
        if problem is not None:
            raise ConfigurationError(problem)
        if not held:
            raise KeyringRequired("the keyring holds no master key")
        self._masters = held
        current = current if current is not None else max(held, key=_version_key)
        if current not in held:
            raise ConfigurationError(
                f"current master version {_shown(current)} is not in the keyring")
        self._current = current

    # construction -------------------------------------------------------------------------
    @classmethod
    def generate(cls) -> Keyring:
        """A new keyring with one random master key (version "1")."""
        return cls({"1": SecretBytes(secrets.token_bytes(_KEY_BYTES))})

    @classmethod
    def from_env(cls, var: str = ENV_VAR) -> Keyring:
        value = SecretText(os.environ.get(var, "").strip())
        if not value:
            raise KeyringRequired(f"{var} is not set")
        ring = refusing_outside(cls._parse_env, value, var)
        ring._env_var = var
        ring._source_stamp = _digest(value)
        return ring

    @classmethod
    def _parse_env(cls, value: SecretText, var: str) -> Keyring:
        if value.reveal().startswith("{"):
            return cls._parse_document(value, var)
        masters: dict[str, SecretBytes] = {}
        for i, part in enumerate(p.strip() for p in value.reveal().split(",") if p.strip()):
            version, sep, key = part.partition(":")
            if not sep:
                version, key = str(i + 1), part
            version = version.strip()
            if not _VERSION.fullmatch(version):
                raise Refusal(f"{var}: master version #{i + 1} {_shown(version)} must be "
                              "1-32 letters, digits, '.', '_' or '-'")
            if version in masters:
                raise Refusal(f"{var}: master version {version} appears twice")
            masters[version] = _unb64(key.strip(), f"{var} (version {version})")
        return cls(masters)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *,
                  allow_insecure_permissions: bool | None = None) -> Keyring:
        """Load a keyring file. It must be a regular file (a symlink to one is followed) that
        only its owner can read and write, and that owner must be this process's user;
        otherwise :class:`ConfigurationError` names the path and the mode.

        ``allow_insecure_permissions=True`` (or, when the argument is left ``None``,
        ``SECURESAVER_ALLOW_INSECURE_KEYRING=1``) skips that check: right only for a
        read-only secret mount whose mode you cannot set (a Kubernetes secret volume is
        root-owned 0644 unless ``defaultMode``/``fsGroup`` say otherwise)."""
        p = Path(path)
        allow = insecure_allowed(allow_insecure_permissions)
        text, stamp = read_keyring_text(p, allow)
        ring = refusing_outside(cls._parse_document, text, str(p))
        ring.path = p
        ring._source_stamp = stamp
        ring._allow_insecure = allow
        return ring

    @classmethod
    def _parse_document(cls, text: SecretText, source: str) -> Keyring:
        """A ``securesaver-keyring/1`` document; raises :class:`Refusal` or our own errors
        (run it with :func:`refusing_outside`: its frames hold the document)."""
        try:
            data = json.loads(text.reveal())
        except json.JSONDecodeError as exc:
            raise Refusal(f"keyring {source} is not valid JSON: {exc.msg} (line "
                          f"{exc.lineno}, column {exc.colno})") from None
        if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
            raise Refusal(f"keyring {source} is not a {FILE_FORMAT} document")
        masters_doc = data.get("masters")
        if not isinstance(masters_doc, dict) or not masters_doc:
            raise Refusal(
                f"keyring {source} has no \"masters\" object of version -> base64 key")
        masters = {}
        for i, (v, k) in enumerate(masters_doc.items()):
            if not isinstance(k, str) or not _VERSION.fullmatch(v):
                raise Refusal(
                    f"keyring {source}: master key #{i + 1} (version {_shown(v)}) must be a "
                    "base64 string under a version of 1-32 letters, digits, '.', '_' or '-'")
            masters[v] = _unb64(k, f"{source} master key {v}")
        current = data.get("current")
        if current is not None and (not isinstance(current, (str, int))
                                    or isinstance(current, bool)):
            raise Refusal(f"keyring {source}: \"current\" must be a version string")
        ring = cls(masters, str(current) if current is not None else None)
        punctured = data.get("punctured", {})
        if not isinstance(punctured, dict) or not all(
                isinstance(keks, dict) for keks in punctured.values()):
            raise Refusal(
                f"keyring {source}: \"punctured\" must map versions to {{tenant: base64 key}}")
        for version, keks in punctured.items():
            if not _VERSION.fullmatch(version) or any(
                    not isinstance(t, str) or not isinstance(k, str) for t, k in keks.items()):
                raise Refusal(
                    f"keyring {source}: punctured keys of version {_shown(version)} must be "
                    "tenant -> base64 strings")
            ring._punctured[version] = {
                t: _unb64(k, f"{source} punctured key of version {version}")
                for t, k in keks.items()}
        databases = data.get("databases", {})
        if not isinstance(databases, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in databases.items()):
            raise Refusal(f"keyring {source}: \"databases\" must map database ids to labels")
        ring._databases = dict(databases)
        return ring

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, *,
             allow_insecure_permissions: bool | None = None) -> Keyring:
        """The keyring at ``path`` if given, else from the environment; a clear error otherwise."""
        if path is not None:
            return cls.from_file(path, allow_insecure_permissions=allow_insecure_permissions)
        return cls.from_env()

    def _document(self) -> SecretText:
        return SecretText(json.dumps(
            {
                "format": FILE_FORMAT,
                "current": self._current,
                "masters": {v: _b64(k) for v, k in sorted(self._masters.items())},
                "punctured": {v: {t: _b64(k) for t, k in sorted(keks.items())}
                              for v, keks in sorted(self._punctured.items())},
                "databases": dict(sorted(self._databases.items())),
            },
            indent=2,
        ))

    def to_json(self) -> str:
        """The keyring file's text: every key in clear (handle it like the file)."""
        return self._document().reveal()

    def env_value(self) -> SecretText:
        """A value for ``SECURESAVER_MASTER_KEY`` holding this keyring: ``<b64>`` for a
        lone version "1", ``1:<b64>,2:<b64>`` for several, the JSON document when shredding
        left punctured keys or the current version is not the highest."""
        if self._punctured or self._current != max(self._masters, key=_version_key):
            return self._document()
        if list(self._masters) == ["1"]:
            return SecretText(_b64(self._masters["1"]))
        return SecretText(",".join(f"{v}:{_b64(k)}" for v, k in sorted(
            self._masters.items(), key=lambda item: _version_key(item[0]))))

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write atomically with mode 0600 (the file is as sensitive as every conversation).

        An existing file is replaced only with ``overwrite=True`` (:meth:`persist` saves a
        keyring back to its own file). The databases a replaced file records are kept when it
        holds a master key of this keyring (the same keyring, rotated or shredded); a file of
        other keys that serves databases is never replaced (their data would become
        unreadable): move it away yourself. A symlink at ``path`` is refused, not replaced."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(target):
            refuse_symlink(target)
            if os.path.lexists(target):
                if not overwrite:
                    raise ConfigurationError(
                        f"keyring file {target} exists; pass overwrite=True to replace it "
                        "(Keyring.persist() saves a keyring back to its own file)")
                self._keep_databases_of(target)
            self._source_stamp = write_keyring_text(target, self._document())
        self.path = target
        return target

    def _keep_databases_of(self, target: Path) -> None:
        """Before ``target`` is replaced: adopt the databases it records when it is this
        keyring (shares a master key), refuse when it is another keyring that serves some."""
        try:
            on_disk = Keyring.from_file(target, allow_insecure_permissions=True)
        except KeyringRequired:
            return                                      # vanished meanwhile
        except ConfigurationError:
            if target.is_file() and not os.access(target, os.R_OK):
                raise ConfigurationError(
                    f"keyring file {target} cannot be read, so the databases it serves are "
                    "unknown; refusing to replace it") from None
            return                                      # not a keyring: nothing to keep
        mine = list(self._masters.values())
        if any(key == other for key in on_disk._masters.values() for other in mine):
            for db, label in on_disk._databases.items():
                if db not in self._forgotten:
                    self._databases.setdefault(db, label)
            return
        if on_disk._databases:
            labels = ", ".join(sorted(on_disk._databases.values()))
            raise ConfigurationError(
                f"keyring file {target} holds other master keys and serves databases "
                f"({labels}); replacing it would make their data unreadable. Move it away "
                "yourself if those databases are gone")

    def _merge_databases_from(self, target: Path) -> None:
        """Databases recorded in the file by other processes are kept (the list only grows,
        except through :meth:`forget_database`)."""
        if self.path is None or Path(self.path) != target:
            return
        try:
            on_disk = Keyring.from_file(target, allow_insecure_permissions=self._allow_insecure)
        except ConfigurationError:
            return
        for db, label in on_disk._databases.items():
            if db not in self._forgotten:
                self._databases.setdefault(db, label)

    @property
    def _forgotten(self) -> set[str]:
        return self.__dict__.setdefault("_forgotten_dbs", set())

    def _write(self, target: Path) -> None:
        self._source_stamp = write_keyring_text(target, self._document())

    # following the key source (rotation by another process) ---------------------------------
    def reload(self) -> bool:
        """Re-read the source this keyring came from (its file, or its environment variable)
        and adopt it: a process started before a rotation learns the new master version, and
        forgets retired ones. Cheap when nothing changed (a ``stat``). Returns whether the
        keys changed. A source that became unreadable or invalid is ignored (logged)."""
        with self._lock:
            try:
                if self.path is not None:
                    if file_stamp(self.path) == self._source_stamp:
                        return False
                    fresh = Keyring.from_file(
                        self.path, allow_insecure_permissions=self._allow_insecure)
                elif self._env_var is not None:
                    value = SecretText(os.environ.get(self._env_var, "").strip())
                    if _digest(value) == self._source_stamp:
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
                with file_lock(self.path):
                    on_disk = Keyring.from_file(
                        self.path, allow_insecure_permissions=self._allow_insecure)
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
        self.save(self.path, overwrite=True)

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
        self._masters[new] = SecretBytes(secrets.token_bytes(_KEY_BYTES))
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
    def _derive(master: SecretBytes, tenant: str) -> SecretBytes:
        return SecretBytes(HKDF(
            algorithm=hashes.SHA256(), length=_KEY_BYTES, salt=None,
            info=_KEK_INFO + tenant.encode("utf-8"),
        ).derive(master.reveal()))

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
        aes = AESGCM(kek.reveal())
        self._keks[(version, tenant)] = aes
        return aes

    def wrap(self, tenant: str, key: bytes | SecretBytes, context: bytes) -> WrappedKey:
        aes = self._kek(self._current, tenant)
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = aes.encrypt(nonce, key.reveal() if isinstance(key, SecretBytes) else key,
                             context)
        return WrappedKey(self._current, nonce + sealed)

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

    def __repr__(self) -> str:
        """Versions only, never key material; safe on a keyring whose ``__init__`` refused
        (reporters call it on the ``self`` of the refusing frame)."""
        masters = getattr(self, "_masters", {})
        punctured = getattr(self, "_punctured", {})
        versions = sorted(set(masters) | set(punctured), key=_version_key)
        return f"Keyring(versions={versions}, current={getattr(self, '_current', '')!r})"

    __str__ = __repr__


def _digest(text: SecretText) -> str:
    import hashlib
    return hashlib.sha256(text.reveal().encode("utf-8")).hexdigest()


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (1 << 62, version)
