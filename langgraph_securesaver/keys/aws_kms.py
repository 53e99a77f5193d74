"""A key provider whose master keys are AWS KMS keys: they never leave KMS.

Each master version is one symmetric KMS key (its key id); the current version is the key an
alias points to (or a configured key id). A data key is wrapped by ``kms:Encrypt`` under the
current key with an *encryption context* naming the tenant and the key's purpose, so
CloudTrail records whose key was used and a wrapped key copied to another tenant does not
decrypt. Unwrapping is ``kms:Decrypt`` with the same context; SecureSaver caches the result
(``KeyManager.ttl``), so KMS is called once per tenant key and cache lifetime, never per turn.

Rotation points the alias at a new KMS key and rewraps the key rows; retiring a version only
stops using its KMS key here. Destroying it (``ScheduleKeyDeletion``) is a separate, explicit
step naming the key (:meth:`AwsKmsKeyProvider.destroy_version`, ``securesaver
destroy-master-key``): a restored copy of a database shares its database id and its KMS keys,
so nothing a copy does on its own may destroy a key its original still uses. KMS *automatic*
rotation is not used: it keeps every old backing key for as long as the KMS key exists, so
nothing a backup holds ever becomes unreadable. Shredding a tenant rewraps every other tenant
under a new KMS key and schedules the deletion of the old ones (one KMS key per database, not
per tenant: a KMS key costs about $1 a month).

Key material never reaches a log: botocore logs every request and response body at DEBUG
(``Encrypt``'s plaintext, ``Decrypt``'s result), so while this provider's client makes a call,
the DEBUG and INFO records of the AWS SDK's own loggers (botocore, boto3, urllib3) from that
thread are dropped (:class:`_QuietWire`); the application's other AWS calls log as configured.

boto3 is imported only when this provider is built (``pip install langgraph-securesaver[aws]``);
credentials, region defaults and the endpoint come from boto3's own configuration
(environment incl. ``AWS_ENDPOINT_URL``, profiles, instance roles), never from a URL.
"""

from __future__ import annotations

import base64
import logging
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigurationError, KeyProviderUnavailable, TamperedDataError
from .material import SecretBytes
from .provider import WrappedKey

logger = logging.getLogger(__name__)

SCHEME = "aws-kms"
#: error codes that say the ciphertext, its context or its key is wrong: the data is refused
_REFUSED = frozenset({"InvalidCiphertextException", "IncorrectKeyException",
                      "NotFoundException", "KMSInvalidStateException", "DisabledException",
                      "InvalidKeyUsageException", "ValidationException"})
_AAD_PREFIX = b"securesaver/aad/v1"
#: tag key prefix naming a database a KMS key serves (the tag value is its label)
_DB_TAG = "securesaver-db:"
_TAG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _.:/=+-@")
#: days KMS waits before deleting a retired key (its minimum; it can be cancelled meanwhile)
DEFAULT_DELETION_DAYS = 7


def _context_parts(context: bytes) -> list[str] | None:
    """The parts of a SecureSaver associated-data string (see ``tokens.associated_data``),
    or None when it is not one."""
    if not context.startswith(_AAD_PREFIX):
        return None
    parts, at = [], len(_AAD_PREFIX)
    while at < len(context):
        if at + 4 > len(context):
            return None
        (size,) = struct.unpack(">I", context[at:at + 4])
        at += 4
        parts.append(context[at:at + size].decode("utf-8", "replace"))
        at += size
    return parts


def encryption_context(tenant: str, context: bytes) -> dict[str, str]:
    """The KMS encryption context of a wrap: the tenant and the readable purpose (what
    CloudTrail shows) and the whole associated data, so every byte of it is bound."""
    out = {"securesaver:tenant": tenant,
           "securesaver:context": base64.b64encode(context).decode("ascii")}
    parts = _context_parts(context)   # [label, database, tenant, purpose...]
    if parts and len(parts) >= 4:
        out["securesaver:purpose"] = "/".join(parts[3:])
    return out


class AwsKmsKeyProvider:
    """Master keys in AWS KMS (see the module docstring)."""

    #: rotation and shredding need no keyring file: the state lives in KMS
    persists_itself = True
    path = None

    def __init__(self, key: str = "alias/securesaver", *, region: str | None = None,
                 client: Any = None, alias_ttl: float = 60.0,
                 deletion_days: int = DEFAULT_DELETION_DAYS) -> None:
        if not key:
            raise ConfigurationError("AwsKmsKeyProvider needs a KMS key id, ARN or alias")
        self.key = key
        self.region = region
        self.alias_ttl = alias_ttl
        self.deletion_days = deletion_days
        self._client = client if client is not None else _client(region)
        self._lock = threading.RLock()
        self._seen: set[str] = set()
        self._retired: set[str] = set()     # no longer used here
        self._destroyed: set[str] = set()   # scheduled for deletion by this process
        self._current = ""
        self._resolved_at = -float("inf")
        self._resolve()

    @classmethod
    def from_url(cls, url: str) -> AwsKmsKeyProvider:
        """``aws-kms://alias/name?region=us-east-1`` or ``aws-kms://<key id>``; credentials
        and endpoint are never read from the URL."""
        parts = urlsplit(url)
        if parts.scheme != SCHEME:
            raise ConfigurationError(f"not an {SCHEME}:// URL")
        if parts.username or parts.password:
            raise ConfigurationError(
                f"{SCHEME}:// URLs carry no credentials: boto3 reads them from its own "
                "configuration (environment, profile, instance role)")
        key = (parts.netloc + parts.path).strip("/")
        query = parse_qs(parts.query)
        unknown = set(query) - {"region"}
        if unknown:
            raise ConfigurationError(
                f"{SCHEME}:// URL: unknown option(s) {', '.join(sorted(unknown))} (only "
                "region; the endpoint comes from AWS_ENDPOINT_URL or the profile)")
        region = query.get("region", [None])[-1]
        return cls(key, region=region)

    # versions -----------------------------------------------------------------------------
    def _resolve(self) -> str:
        """The key id the configured key or alias names now (DescribeKey)."""
        described = self._call("DescribeKey", self._client.describe_key, KeyId=self.key)
        meta = described["KeyMetadata"]
        if meta.get("KeySpec", "SYMMETRIC_DEFAULT") != "SYMMETRIC_DEFAULT":
            raise ConfigurationError(
                f"KMS key {self.key} is {meta.get('KeySpec')}; a SYMMETRIC_DEFAULT key is needed")
        with self._lock:
            if self._current and self._current != meta["KeyId"]:
                logger.info("KMS key %s now names key %s", self.key, meta["KeyId"])
            self._current = meta["KeyId"]
            self._seen.add(self._current)
            self._resolved_at = time.monotonic()
        return self._current

    @property
    def current_version(self) -> str:
        if time.monotonic() - self._resolved_at > self.alias_ttl:
            try:
                self._resolve()
            except KeyProviderUnavailable as exc:   # keep the last known key during an outage
                logger.warning("KMS key %s could not be re-resolved: %s", self.key, exc)
                self._resolved_at = time.monotonic()
        return self._current

    def versions(self) -> list[str]:
        with self._lock:
            return sorted(self._seen - self._retired - self._destroyed)

    def shredded_from(self, version: str) -> bool:
        return False

    def reload(self) -> bool:
        before = self._current
        return self._resolve() != before

    # wrapping -----------------------------------------------------------------------------
    def wrap(self, tenant: str, key: bytes | SecretBytes, context: bytes) -> WrappedKey:
        held = key if isinstance(key, SecretBytes) else SecretBytes(key)
        del key                           # the raw key: not in a frame that can raise
        version = self.current_version
        blob = self._call("Encrypt", self._client.encrypt, KeyId=version,
                          Plaintext=held, EncryptionContext=encryption_context(tenant, context),
                          )["CiphertextBlob"]
        return WrappedKey(version, blob)

    def unwrap(self, tenant: str, wrapped: WrappedKey, context: bytes) -> bytes:
        with self._lock:
            self._seen.add(wrapped.master_version)
        return self._call("Decrypt", self._client.decrypt, KeyId=wrapped.master_version,
                          CiphertextBlob=wrapped.blob,
                          EncryptionContext=encryption_context(tenant, context),
                          tenant=tenant)["Plaintext"]

    # rotation and shredding ---------------------------------------------------------------
    def add_version(self) -> str:
        """A new KMS key becomes current: the alias is pointed at it (with a key id
        configured instead of an alias, rotate at KMS and reconfigure)."""
        if not self.key.startswith("alias/"):
            raise ConfigurationError(
                f"KMS key {self.key} is not an alias: create a new key, point your "
                "configuration at it, then run rewrap_keys()")
        created = self._call("CreateKey", self._client.create_key,
                             Description=f"langgraph-securesaver master key ({self.key})",
                             KeyUsage="ENCRYPT_DECRYPT", KeySpec="SYMMETRIC_DEFAULT")
        new = created["KeyMetadata"]["KeyId"]
        self._copy_database_tags(self.current_version, new)
        self._call("UpdateAlias", self._client.update_alias, AliasName=self.key,
                   TargetKeyId=new)
        with self._lock:
            self._current = new
            self._seen.add(new)
            self._resolved_at = time.monotonic()
        logger.info("KMS alias %s points at new key %s", self.key, new)
        return new

    def persist(self) -> None:
        """Nothing to save: KMS holds the state."""

    def retire_version(self, version: str) -> None:
        """Stop using a KMS key here (no key row of this database is wrapped under it). The
        key itself is left alone: another database, or the original this one was restored
        from, may still use it. Destroying it is :meth:`destroy_version`, named explicitly."""
        if version == self.current_version:
            raise ConfigurationError(
                "cannot retire the current KMS key; add a new version first")
        with self._lock:
            self._retired.add(version)
        logger.warning("KMS key %s is no longer used by this database; it is NOT scheduled "
                       "for deletion (once no other database uses it: securesaver "
                       "destroy-master-key --key %s)", version, version)

    def destroy_version(self, version: str) -> None:
        """Schedule the deletion of the KMS key ``version`` (after ``deletion_days``; until
        then KMS refuses to use it and the deletion can be cancelled). Never the current
        key."""
        if version == self.current_version:
            raise ConfigurationError("cannot destroy the current KMS key")
        self._call("ScheduleKeyDeletion", self._client.schedule_key_deletion, KeyId=version,
                   PendingWindowInDays=self.deletion_days)
        with self._lock:
            self._destroyed.add(version)
        logger.warning("KMS key %s scheduled for deletion in %d days", version,
                       self.deletion_days)

    def destroy_tenant(self, tenant: str, keep_tenants: list[str]) -> None:
        """Crypto-shred ``tenant``: every KMS key but the current one is scheduled for
        deletion. Call only after every kept tenant's rows are rewrapped under the current
        key (``shred_tenant`` does); backups taken before are then unreadable for every
        tenant unless restored with the live registry's key rows."""
        current = self.current_version
        with self._lock:   # retired versions too: backups may hold rows wrapped under them
            older = sorted(self._seen - self._destroyed - {current})
        for version in older:
            self.destroy_version(version)

    # the databases this provider serves (tags on its KMS keys) ------------------------------
    def record_database(self, database_id: str, label: str) -> None:
        """Tag the current KMS key with ``database_id`` so destructive operations elsewhere
        see that this database depends on it (needs ``kms:TagResource``; a failure is
        logged, and the database then counts as unknown to :meth:`other_databases`)."""
        key = self.current_version
        try:
            if _DB_TAG + database_id in self._tags(key):
                return
            self._call("TagResource", self._client.tag_resource, KeyId=key,
                       Tags=[{"TagKey": _DB_TAG + database_id, "TagValue": _tag_value(label)}])
        except (KeyProviderUnavailable, ConfigurationError) as exc:
            logger.warning("could not tag KMS key %s with database %s: %s", key, database_id,
                           exc)

    def other_databases(self, database_id: str) -> dict[str, str]:
        """Databases other than ``database_id`` whose id is tagged on any KMS key this
        provider knows (the current one included): shredding or retiring here is refused."""
        out: dict[str, str] = {}
        for version in self.versions():
            for tag, label in self._tags(version).items():
                if tag.startswith(_DB_TAG) and tag != _DB_TAG + database_id:
                    out[tag[len(_DB_TAG):]] = label
        return out

    def forget_database(self, database_id: str) -> None:
        """Remove ``database_id``'s tag from every known KMS key (it was decommissioned)."""
        for version in self.versions():
            if _DB_TAG + database_id in self._tags(version):
                self._call("UntagResource", self._client.untag_resource, KeyId=version,
                           TagKeys=[_DB_TAG + database_id])

    def _tags(self, key: str) -> dict[str, str]:
        listed = self._call("ListResourceTags", self._client.list_resource_tags, KeyId=key)
        return {t["TagKey"]: t["TagValue"] for t in listed.get("Tags", [])}

    def _copy_database_tags(self, old: str, new: str) -> None:
        tags = [{"TagKey": k, "TagValue": v} for k, v in self._tags(old).items()
                if k.startswith(_DB_TAG)]
        if tags:
            self._call("TagResource", self._client.tag_resource, KeyId=new, Tags=tags)

    # calling KMS --------------------------------------------------------------------------
    def _call(self, operation: str, method: Any, *, tenant: str | None = None,
              **params: Any) -> Any:
        """One KMS call; its failure is raised from here after the botocore frames (which
        hold the request, plaintext included) are gone, as a typed error naming no key."""
        plaintext = params.pop("Plaintext", None)
        error: Exception | None = None
        try:
            with _quiet_wire():
                if plaintext is not None:
                    return method(Plaintext=plaintext.reveal(), **params)
                return method(**params)
        except Exception as exc:  # noqa: BLE001 - classified below, frames discarded
            error = _classify(operation, exc, params.get("KeyId", ""), tenant)
        raise error

    def __repr__(self) -> str:
        return f"AwsKmsKeyProvider(key={self.key!r}, current={self._current!r})"

    __str__ = __repr__


#: the AWS SDK's loggers: botocore logs request and response bodies (key material) at DEBUG
_WIRE_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer")


class _QuietWire(logging.Filter):
    """Drops the SDK's DEBUG and INFO records emitted by a thread while it runs this module's
    KMS call (a logger's filter runs in the thread that logs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calling = threading.local()
        self.installed = 0     # the size of the logger registry when last installed

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not getattr(self.calling, "on", False)

    def install(self) -> None:
        """On every SDK logger that exists (a logger's filters do not cover its children);
        again whenever new loggers appeared (botocore creates some on first use)."""
        names = logging.Logger.manager.loggerDict
        if len(names) == self.installed:
            return
        for name in [*_WIRE_LOGGERS, *list(names)]:
            if name.split(".", 1)[0] in _WIRE_LOGGERS:
                found = logging.getLogger(name)
                if self not in found.filters:
                    found.addFilter(self)
        self.installed = len(names)


_QUIET = _QuietWire()


@contextmanager
def _quiet_wire() -> Iterator[None]:
    _QUIET.install()
    _QUIET.calling.on = True
    try:
        yield
    finally:
        _QUIET.calling.on = False
        _QUIET.install()      # loggers botocore created during the call


def _classify(operation: str, exc: Exception, key_id: str, tenant: str | None) -> Exception:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _REFUSED and operation == "Decrypt":
            whose = f" of tenant {tenant!r}" if tenant is not None else ""
            return TamperedDataError(
                f"a data key{whose} does not decrypt under KMS key {key_id} ({code}): wrong "
                "key or encryption context, a key scheduled for deletion, or an altered row")
        if code in ("NotFoundException",) and operation == "DescribeKey":
            return ConfigurationError(f"KMS key {key_id} does not exist ({code})")
        return KeyProviderUnavailable(
            f"KMS {operation} on {key_id or 'a key'} failed: {code or type(exc).__name__} "
            "(check credentials, permissions and the KMS endpoint)")
    return KeyProviderUnavailable(
        f"KMS {operation} could not reach AWS KMS: {type(exc).__name__} (check the network, "
        "AWS_ENDPOINT_URL and credentials); cached keys keep working for their lifetime")


def _client(region: str | None) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigurationError(
            "AwsKmsKeyProvider needs boto3: pip install 'langgraph-securesaver[aws]'") from None
    config = Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5,
                    read_timeout=15)
    try:
        client = boto3.session.Session().client("kms", region_name=region, config=config)
    except Exception as exc:  # noqa: BLE001 - e.g. NoRegionError
        problem = type(exc).__name__
    else:
        _QUIET.install()      # the loggers the client's modules just created
        return client
    raise ConfigurationError(
        f"cannot create a KMS client ({problem}): set ?region= or AWS_DEFAULT_REGION")


def _tag_value(label: str) -> str:
    """A database label as a KMS tag value (its allowed characters, at most 256)."""
    return "".join(c if c in _TAG_CHARS else "_" for c in label)[:256]
