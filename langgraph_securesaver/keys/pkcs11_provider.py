"""A key provider whose master keys are AES keys in a PKCS#11 token (an HSM): they never leave it.

Each master version is one AES-256 secret-key object in the token, found by its label: the
configured label is version 1, rotation adds ``<label>.v2``, ``<label>.v3`` and so on, and the
current version is the highest one this provider made (re-read every ``label_ttl`` seconds, so
processes follow a rotation done elsewhere). A key is adopted only if the token generated it
(``CKA_LOCAL``: an imported key, whose value someone knows, never is) and carries in ``CKA_ID``
the key check value recorded when this provider made it (AES-GCM of a fixed block under the
key, bound to its label): a key another tool generated, or a relabelled one, is ignored and
logged. A rotation's new key is the highest version there is (versions are parsed without a
digit limit), so it always becomes current.

A data key is wrapped by ``C_Encrypt`` with ``CKM_AES_GCM`` *inside the token*, the tenant and
the key row's associated data as GCM's additional data, so a wrapped key copied to another
tenant, purpose or version does not decrypt. Unwrapping is ``C_Decrypt``, cached by SecureSaver
(``KeyManager.ttl``): the token is used once per tenant key and cache lifetime, never per turn.
Keys this provider creates are ``CKA_SENSITIVE``, not ``CKA_EXTRACTABLE``; others are refused.

Retiring a version only stops using its key object here: a restored copy of a database shares
its database id and its token, so nothing a copy does on its own may destroy a key its
original still uses. Destroying a version is a separate, explicit step naming it
(:meth:`Pkcs11KeyProvider.destroy_version`, ``securesaver destroy-master-key``), as is
shredding a tenant: ``C_DestroyObject``, immediate and final, in the HSM's own audit log. The
databases using the keys are recorded in the token as data objects; shredding is refused while
another database uses them.

PKCS#11 login belongs to the process, not to a session: every provider of a process shares one
pool of sessions (and one login) per module and token. A module that fails (token removed, a
device error) is finalized and initialized again on the next use; until then, and while it
keeps failing, a cold tenant gets :class:`KeyProviderUnavailable`, never a tamper error.

python-pkcs11 is imported only when this provider is built
(``pip install 'langgraph-securesaver[pkcs11]'``). The PIN comes from an environment variable or
a file (never from the URL) and is held as :class:`~.material.SecretText`.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import ConfigurationError, KeyProviderUnavailable, TamperedDataError
from .keyring import WrappedKey
from .material import SecretBytes
from .pkcs11_custody import check_value, generated_here, made_here
from .pkcs11_errors import MissingKeyObject, error_kind, fresh_error
from .pkcs11_pool import PinSource, SessionEntry, error_name, load_pkcs11, module_pool
from .pkcs11_url import DEFAULT_SESSIONS, parse_pkcs11_url

logger = logging.getLogger(__name__)

#: a wrapped key: this format byte, a 12-byte IV, then AES-GCM ciphertext and 16-byte tag
_FORMAT = b"\x01"
_IV_BYTES = 12
_AAD_PREFIX = b"securesaver/pkcs11/v1\x00"
_GENERATION = re.compile(r"\.v([1-9][0-9]*)")
#: data objects recording the databases a label family serves
_APPLICATION = "langgraph-securesaver"
_DB_PREFIX = "securesaver-db:"


# --- the provider -----------------------------------------------------------------------------
class Pkcs11KeyProvider:
    """Master keys in a PKCS#11 token (see the module docstring)."""

    #: rotation and shredding need no keyring file: the state lives in the token
    persists_itself = True
    path = None

    def __init__(self, token_label: str, key_label: str, *, module: str,
                 pin_env: str | None = None, pin_file: str | None = None,
                 max_sessions: int = DEFAULT_SESSIONS, label_ttl: float = 60.0) -> None:
        self._configure(token_label, key_label, module, PinSource(pin_env, pin_file),
                        max_sessions, label_ttl)
        self._resolve()

    def _configure(self, token_label: str, key_label: str, module: str, pins: PinSource,
                   max_sessions: int, label_ttl: float) -> None:
        if not token_label or not key_label:
            raise ConfigurationError("Pkcs11KeyProvider needs a token label and a key label")
        if re.search(r"\.v[0-9]+$", key_label):
            raise ConfigurationError(
                f"key label {key_label!r} ends like a version label (.vN); name the first "
                "version's label (rotation adds .v2, .v3, ...)")
        if not module:
            raise ConfigurationError("Pkcs11KeyProvider needs the PKCS#11 module path")
        if max_sessions < 1:
            raise ConfigurationError("max_sessions must be at least 1")
        self.token_label = token_label
        self.key_label = key_label
        self.module = module
        self.pins = pins
        self.pins.read()                      # a missing PIN source is a configuration error
        self.max_sessions = max_sessions
        self.label_ttl = label_ttl
        #: token operations this provider made, by name ("Decrypt" is one C_DecryptInit and
        #: its C_Decrypt): what the HSM's audit log would count
        self.calls: Counter[str] = Counter()
        self._calls_lock = threading.Lock()
        self._module = module_pool(os.path.abspath(module))
        self._token = self._module.token(token_label)
        self._lock = threading.RLock()
        self._versions: list[str] = []
        self._highest = 0                   # the highest generation of any family label
        self._retired: set[str] = set()     # versions this process stopped using
        self._current = ""
        self._resolved_at = -float("inf")

    @classmethod
    def from_url(cls, url: str) -> Pkcs11KeyProvider:
        """``pkcs11://<token label>/<key label>?module=/path/lib.so&pin-env=VAR`` (or
        ``pin-file=PATH``; optional ``max-sessions=N``). Labels are percent-decoded; a PIN
        in the URL is refused."""
        token, key, options = parse_pkcs11_url(url)
        return cls(token, key, **options)

    @classmethod
    def create_from_url(cls, url: str) -> Pkcs11KeyProvider:
        """:meth:`create` for the key a URL names (``securesaver keygen --keyring URL``)."""
        token, key, options = parse_pkcs11_url(url)
        return cls.create(token, key, **options)

    # sessions and calls ---------------------------------------------------------------------
    @contextmanager
    def _session(self) -> Iterator[SessionEntry]:
        """A pooled session, used by one thread at a time and under the module's lock (see
        ``ModulePool.serial``); sessions of a failed module generation are dropped."""
        self._module.enter(self._count)
        entry: SessionEntry | None = None
        try:
            with self._module.serial:
                entry = self._token.take(self.pins, self.max_sessions, self._count)
                yield entry
        finally:
            if entry is not None:
                self._token.give_back(entry)
            self._module.leave()

    def _count(self, operation: str) -> None:
        with self._calls_lock:
            self.calls[operation] += 1

    def _run(self, operation: str, work: Callable[[SessionEntry], Any], *,
             tenant: str | None = None, version: str = "") -> Any:
        """``work(session)``, classified: a device failure re-initializes the module and is
        tried once more, then raised as :class:`KeyProviderUnavailable`; a refusal of the data
        (a wrong tag, a destroyed key) is :class:`TamperedDataError` only while the token is
        demonstrably present. Errors are raised after the library's frames are gone."""
        pkcs11 = load_pkcs11()
        error: Exception | None = None
        for attempt in (1, 2):
            generation = -1
            try:
                with self._session() as entry:
                    generation = entry.generation
                    return work(entry)
            except (KeyProviderUnavailable, ConfigurationError, TamperedDataError) as exc:
                error = fresh_error(exc)
            except MissingKeyObject as missing:
                error = self._missing(missing.label, tenant)
            except pkcs11.exceptions.PKCS11Error as exc:
                kind = error_kind(exc, pkcs11)
                if kind == "maybe-data" and attempt == 1:
                    continue                  # a wrong tag fails again; a glitch need not
                if kind == "data" or (kind == "maybe-data" and self._token_healthy()):
                    error = self._refused(operation, exc, tenant, version)
                elif kind == "config":
                    error = ConfigurationError(
                        f"PKCS#11 {operation} on token {self.token_label!r}: "
                        f"{error_name(exc)} (the token or key does not support AES-GCM "
                        "encrypt/decrypt)")
                else:
                    self._module.fail(generation)
                    error = KeyProviderUnavailable(
                        f"PKCS#11 {operation} on token {self.token_label!r} failed: "
                        f"{error_name(exc)} (token removed, module or device failure); cached keys "
                        "keep working for their lifetime")
                    if attempt == 1:
                        continue
            break
        assert error is not None
        raise error

    def _token_healthy(self) -> bool:
        """Whether the token is present and answers (a fresh slot and token lookup)."""
        pkcs11 = load_pkcs11()
        try:
            self._module.enter(self._count)
        except KeyProviderUnavailable:
            return False
        try:
            with self._module.serial:
                self._count("GetToken")
                self._module.lib.get_token(token_label=self.token_label)
            return True
        except pkcs11.exceptions.PKCS11Error:
            return False
        finally:
            self._module.leave()

    def _missing(self, label: str, tenant: str | None) -> Exception:
        if not self._token_healthy():
            self._module.fail(self._module.generation)
            return KeyProviderUnavailable(
                f"PKCS#11 token {self.token_label!r} does not answer (removed, or a module "
                "failure); cached keys keep working for their lifetime")
        whose = f" of tenant {tenant!r}" if tenant is not None else ""
        return TamperedDataError(
            f"a data key{whose} names master version {label!r}, which token "
            f"{self.token_label!r} does not hold: destroyed by retirement or a shred, another "
            "token, or an altered row")

    def _refused(self, operation: str, exc: BaseException, tenant: str | None,
                 version: str) -> Exception:
        if operation != "Decrypt":
            return KeyProviderUnavailable(
                f"PKCS#11 {operation} on token {self.token_label!r} failed: {error_name(exc)}")
        whose = f" of tenant {tenant!r}" if tenant is not None else ""
        return TamperedDataError(
            f"a data key{whose} does not decrypt under PKCS#11 key {version!r} on token "
            f"{self.token_label!r} ({error_name(exc)}): wrong key, tenant or context, or an "
            "altered row")

    def _key(self, entry: SessionEntry, label: str) -> Any:
        """The secret-key object labelled ``label`` (cached per session); only a key the token
        generated (``CKA_LOCAL``) is used."""
        found = entry.keys.get(label)
        if found is not None:
            return found
        pkcs11 = load_pkcs11()
        self._count("FindObjects")
        keys = list(entry.session.get_objects({
            pkcs11.Attribute.CLASS: pkcs11.ObjectClass.SECRET_KEY,
            pkcs11.Attribute.LABEL: label}))
        if not keys:
            raise MissingKeyObject(label)
        if len(keys) > 1:
            raise ConfigurationError(
                f"token {self.token_label!r} holds {len(keys)} secret keys labelled {label!r}; "
                "labels must be unique")
        if not keys[0][pkcs11.Attribute.LOCAL]:
            raise MissingKeyObject(label)   # imported: as if absent (see _local)
        entry.keys[label] = keys[0]
        return keys[0]

    # versions ---------------------------------------------------------------------------------
    def _family(self, label: str) -> int | None:
        """The generation ``label`` is in this provider's family of labels, else None."""
        if label == self.key_label:
            return 1
        if label.startswith(self.key_label):
            match = _GENERATION.fullmatch(label[len(self.key_label):])
            if match:
                return int(match.group(1))
        return None

    def _label(self, generation: int) -> str:
        return self.key_label if generation == 1 else f"{self.key_label}.v{generation}"

    def _scan(self) -> list[str]:
        """The labels of this family's adopted key objects in the token, oldest first (see
        the module docstring); checks the current one is a usable, non-extractable AES key
        made by this provider. Keys not adopted are logged and never used; a key in the family
        that could leave the token is refused."""
        pkcs11 = load_pkcs11()
        attr = pkcs11.Attribute

        def work(entry: SessionEntry) -> list[str]:
            self._count("FindObjects")
            found: dict[str, list[Any]] = {}
            for obj in entry.session.get_objects({attr.CLASS: pkcs11.ObjectClass.SECRET_KEY}):
                if self._family(obj.label) is not None:
                    found.setdefault(obj.label, []).append(obj)
            twice = sorted(label for label, objs in found.items() if len(objs) > 1)
            if twice:
                raise ConfigurationError(
                    f"token {self.token_label!r} holds several secret keys labelled "
                    f"{', '.join(map(repr, twice))}; labels must be unique")
            labels = sorted(found, key=lambda lb: self._family(lb) or 0)
            self._highest = (self._family(labels[-1]) or 0) if labels else 0
            adopted = []
            for label in labels:
                key = found[label][0]
                if generated_here(key, label, self.token_label):
                    self._check_key(key, label)
                    if made_here(key, label, self.token_label, self._count):
                        adopted.append(label)
            return adopted

        labels: list[str] = self._run("FindObjects", work)
        return labels

    def _check_key(self, key: Any, label: str) -> None:
        pkcs11 = load_pkcs11()
        attr = pkcs11.Attribute
        self._count("GetAttributeValue")
        if key.key_type != pkcs11.KeyType.AES:
            raise ConfigurationError(f"PKCS#11 key {label!r} is not an AES key")
        if key[attr.EXTRACTABLE] or not key[attr.SENSITIVE]:
            raise ConfigurationError(
                f"PKCS#11 key {label!r} is extractable or not sensitive: its value could "
                "leave the HSM. Use a key with CKA_EXTRACTABLE=false and CKA_SENSITIVE=true")
        if not key[attr.ENCRYPT] or not key[attr.DECRYPT]:
            raise ConfigurationError(
                f"PKCS#11 key {label!r} needs CKA_ENCRYPT and CKA_DECRYPT (AES-GCM inside the "
                "token)")

    def _resolve(self) -> str:
        labels = self._scan()
        if not labels:
            raise ConfigurationError(
                f"token {self.token_label!r} holds no AES key labelled {self.key_label!r} (or "
                f"{self.key_label}.vN) made by this provider: create it with `securesaver "
                "keygen --keyring URL`")
        with self._lock:
            if self._current and self._current != labels[-1]:
                logger.info("PKCS#11 key %s: current version is now %s", self.key_label,
                            labels[-1])
            self._versions = [lb for lb in labels if lb not in self._retired or lb == labels[-1]]
            self._current = labels[-1]
            self._resolved_at = _now()
        return self._current

    @property
    def current_version(self) -> str:
        if _now() - self._resolved_at > self.label_ttl:
            try:
                self._resolve()
            except KeyProviderUnavailable as exc:   # keep the last known key during an outage
                logger.warning("PKCS#11 key %s could not be re-read: %s", self.key_label, exc)
                self._resolved_at = _now()
        return self._current

    def versions(self) -> list[str]:
        with self._lock:
            return list(self._versions)

    def shredded_from(self, version: str) -> bool:
        return False

    def reload(self) -> bool:
        before = (self._current, tuple(self._versions))
        self._resolve()
        return (self._current, tuple(self._versions)) != before

    # wrapping ---------------------------------------------------------------------------------
    @staticmethod
    def _aad(tenant: str, context: bytes) -> bytes:
        name = tenant.encode("utf-8", "surrogatepass")
        return _AAD_PREFIX + len(name).to_bytes(4, "big") + name + context

    def wrap(self, tenant: str, key: bytes | SecretBytes, context: bytes) -> WrappedKey:
        held = key if isinstance(key, SecretBytes) else SecretBytes(key)
        del key                           # the raw key: not in a frame that can raise
        version = self.current_version
        iv = secrets.token_bytes(_IV_BYTES)
        params = _gcm(iv, self._aad(tenant, context))

        def work(entry: SessionEntry) -> bytes:
            mechanism = load_pkcs11().Mechanism.AES_GCM
            self._count("Encrypt")
            return bytes(self._key(entry, version).encrypt(
                held.reveal(), mechanism=mechanism, mechanism_param=params))

        sealed = self._run("Encrypt", work, tenant=tenant, version=version)
        return WrappedKey(version, _FORMAT + iv + sealed)

    def unwrap(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes:
        version, blob = wrapped.master_version, wrapped.blob
        if self._family(version) is None:
            raise TamperedDataError(
                f"a data key of tenant {tenant!r} names master version {version!r}, which is "
                f"not a version of PKCS#11 key {self.key_label!r}: another provider's row, or "
                "an altered one")
        if not self._adopted(version):
            raise TamperedDataError(
                f"a data key of tenant {tenant!r} names PKCS#11 key {version!r}, which is not "
                "a key this provider made and holds (destroyed, imported, another tool's, or "
                "relabelled)")
        if len(blob) < 1 + _IV_BYTES + 16 or blob[:1] != _FORMAT:
            raise TamperedDataError(
                f"a data key of tenant {tenant!r} is not a PKCS#11-wrapped key (altered row)")
        params = _gcm(blob[1:1 + _IV_BYTES], self._aad(tenant, context))

        def work(entry: SessionEntry) -> bytes:
            mechanism = load_pkcs11().Mechanism.AES_GCM
            self._count("Decrypt")
            return bytes(self._key(entry, version).decrypt(
                blob[1 + _IV_BYTES:], mechanism=mechanism, mechanism_param=params))

        out: bytes = self._run("Decrypt", work, tenant=tenant, version=version)
        return out

    def _adopted(self, version: str) -> bool:
        """Is ``version`` a key this provider adopted (re-read once when it is not known)?"""
        with self._lock:
            if version in self._versions or version in self._retired:
                return True
        self._resolve()
        with self._lock:
            return version in self._versions

    # rotation and shredding -------------------------------------------------------------------
    def add_version(self) -> str:
        """Generate a new AES-256 key in the token (``<label>.vN``, non-extractable) and make
        it current."""
        self._resolve()
        label = self._label(self._highest + 1)   # above every label of the family
        self._generate(label)
        if self._resolve() != label:
            raise ConfigurationError(
                f"PKCS#11 key {label} was generated but did not become current")
        logger.info("PKCS#11 key %s generated on token %s", label, self.token_label)
        return label

    def _generate(self, label: str) -> None:
        pkcs11 = load_pkcs11()
        attr = pkcs11.Attribute

        def work(entry: SessionEntry) -> None:
            self._count("GenerateKey")
            key = entry.session.generate_key(
                pkcs11.KeyType.AES, 256, label=label, store=True,
                capabilities=pkcs11.MechanismFlag.ENCRYPT | pkcs11.MechanismFlag.DECRYPT,
                template={attr.TOKEN: True, attr.PRIVATE: True, attr.SENSITIVE: True,
                          attr.EXTRACTABLE: False, attr.WRAP: False, attr.UNWRAP: False,
                          attr.SIGN: False, attr.VERIFY: False, attr.DERIVE: False})
            key[attr.ID] = check_value(key, label, self._count)   # recorded as it is made

        self._run("GenerateKey", work)

    @classmethod
    def create(cls, token_label: str, key_label: str, *, module: str,
               pin_env: str | None = None, pin_file: str | None = None,
               max_sessions: int = DEFAULT_SESSIONS, label_ttl: float = 60.0,
               ) -> Pkcs11KeyProvider:
        """Generate the first key of ``key_label`` in the token (refused when one exists) and
        return its provider; what ``securesaver keygen --keyring pkcs11://...`` runs."""
        self = cls.__new__(cls)
        self._configure(token_label, key_label, module, PinSource(pin_env, pin_file),
                        max_sessions, label_ttl)
        if self._scan():
            raise ConfigurationError(
                f"token {token_label!r} already holds key {key_label!r}; rotate with "
                "`securesaver rotate-keys` instead")
        self._generate(key_label)
        self._resolve()
        return self

    def persist(self) -> None:
        """Nothing to save: the token holds the state."""

    def retire_version(self, version: str) -> None:
        """Stop using ``version`` here (no key row of this database is wrapped under it). The
        key object stays in the token: another database, or the original this one was
        restored from, may still use it. Destroying it is :meth:`destroy_version`."""
        if version == self.current_version:
            raise ConfigurationError(
                "cannot retire the current PKCS#11 key; add a new version first")
        if self._family(version) is None:
            raise ConfigurationError(f"{version!r} is not a version of {self.key_label!r}")
        with self._lock:
            self._retired.add(version)
            self._versions = [v for v in self._versions if v != version]
        logger.warning("PKCS#11 key %s is no longer used by this database; it is NOT "
                       "destroyed (once no other database uses it: securesaver "
                       "destroy-master-key --key %s)", version, version)

    def destroy_version(self, version: str) -> None:
        """Destroy the key object of ``version`` (``C_DestroyObject``: immediate and final;
        every data key still wrapped under it becomes unreadable). Never the current key."""
        if version == self.current_version:
            raise ConfigurationError("cannot destroy the current PKCS#11 key")
        if self._family(version) is None:
            raise ConfigurationError(f"{version!r} is not a version of {self.key_label!r}")

        def work(entry: SessionEntry) -> None:
            key = self._key(entry, version)
            self._count("DestroyObject")
            key.destroy()
            entry.keys.pop(version, None)

        self._run("DestroyObject", work)
        with self._lock:
            self._retired.discard(version)
            self._versions = [v for v in self._versions if v != version]
        logger.warning("PKCS#11 key %s destroyed on token %s", version, self.token_label)

    def destroy_tenant(self, tenant: str, keep_tenants: list[str]) -> None:
        """Crypto-shred ``tenant``: destroy every key object of this family but the current
        one. Call only after every kept tenant's rows are rewrapped under the current key
        (``shred_tenant`` does); backups taken before are then unreadable for every tenant
        unless restored with the live registry's key rows."""
        current = self.current_version
        for version in self._scan():   # retired versions too: backups may use them
            if version != current:
                self.destroy_version(version)

    # the databases this family serves (data objects in the token) -----------------------------
    def _db_label(self, database_id: str) -> str:
        return f"{_DB_PREFIX}{self.key_label}:{database_id}"

    def _db_objects(self, entry: SessionEntry) -> list[tuple[str, Any]]:
        pkcs11 = load_pkcs11()
        self._count("FindObjects")
        prefix = f"{_DB_PREFIX}{self.key_label}:"
        found = []
        for obj in entry.session.get_objects({
                pkcs11.Attribute.CLASS: pkcs11.ObjectClass.DATA,
                pkcs11.Attribute.APPLICATION: _APPLICATION}):
            label = str(obj[pkcs11.Attribute.LABEL])
            if label.startswith(prefix):
                found.append((label, obj))
        return found

    def record_database(self, database_id: str, label: str) -> None:
        """Record in the token that ``database_id`` uses this key family (a private data
        object), so destructive operations elsewhere see it; a failure is logged."""
        pkcs11 = load_pkcs11()
        attr = pkcs11.Attribute
        name = self._db_label(database_id)

        def work(entry: SessionEntry) -> None:
            if any(label == name for label, _ in self._db_objects(entry)):
                return
            self._count("CreateObject")
            entry.session.create_object({
                attr.CLASS: pkcs11.ObjectClass.DATA, attr.TOKEN: True, attr.PRIVATE: True,
                attr.APPLICATION: _APPLICATION, attr.LABEL: name,
                attr.VALUE: label.encode("utf-8")[:1024]})

        try:
            self._run("CreateObject", work)
        except (KeyProviderUnavailable, ConfigurationError) as exc:
            logger.warning("could not record database %s on PKCS#11 token %s: %s",
                           database_id, self.token_label, exc)

    def other_databases(self, database_id: str) -> dict[str, str]:
        """Databases other than ``database_id`` recorded for this key family in the token:
        shredding or retiring here is refused while there are any."""
        pkcs11 = load_pkcs11()
        prefix = f"{_DB_PREFIX}{self.key_label}:"

        def work(entry: SessionEntry) -> dict[str, str]:
            out = {}
            for name, obj in self._db_objects(entry):
                db = name[len(prefix):]
                if db != database_id:
                    out[db] = bytes(obj[pkcs11.Attribute.VALUE]).decode("utf-8", "replace")
            return out

        found: dict[str, str] = self._run("FindObjects", work)
        return found

    def forget_database(self, database_id: str) -> None:
        """Remove the record of ``database_id`` (it was decommissioned)."""
        name = self._db_label(database_id)

        def work(entry: SessionEntry) -> None:
            for label, obj in self._db_objects(entry):
                if label == name:
                    self._count("DestroyObject")
                    obj.destroy()

        self._run("DestroyObject", work)

    def __repr__(self) -> str:
        return (f"Pkcs11KeyProvider(token={getattr(self, 'token_label', '')!r}, "
                f"key={getattr(self, 'key_label', '')!r}, "
                f"current={getattr(self, '_current', '')!r})")

    __str__ = __repr__


def _gcm(iv: bytes, aad: bytes) -> Any:
    from pkcs11.mechanisms import GCMParams
    return GCMParams(iv, aad, 128)


def _now() -> float:
    import time
    return time.monotonic()
