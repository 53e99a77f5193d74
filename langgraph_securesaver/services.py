"""The narrow internal interface between a SecureSaver and its operations.

:class:`SaverServices` is what an operation (retention, shredding, PII erasure, key rotation,
audit, scan, the pruner, the idempotency store) gets instead of the saver's private members:
the inner saver, the registry, the storage ops, the key manager and tenant keys, the tenant
gate, the PII layer, and the small per-process caches (thread activity, policies). A saver
builds one in its constructor and exposes it as ``saver.services``.

This module sits below the saver and the operations: it imports only the bottom layer
(crypto, keyring, registry, storage ops, tenancy, PII vault) and never the saver, the
operations or the CLI. Not a public API: names here may change between releases.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from .caches import TokenCache
from .errors import ConfigurationError, KeyGoneError, TamperedDataError
from .gate import TenantGate
from .keys.crypto import KeyManager, TenantKeys
from .keys.lifecycle import WRITE_LEASE
from .keys.provider import KeyProvider
from .offthread import to_thread
from .pii_layer import PiiLayer
from .registry.core import Registry
from .registry.pii_vault import PiiVault
from .registry.subjects import SubjectLabels
from .registry.thread_keys import ThreadKeyStore
from .retention import DEFAULT_POLICY_KEY, RetentionPolicy
from .storage.ops import StorageOps
from .tenancy import ThreadRef

if TYPE_CHECKING:
    from .seal import SealedCodec


class SaverServices:
    """The parts of one saver its operations may use (see the module docstring)."""

    def __init__(self, *, inner: BaseCheckpointSaver, registry: Registry, keyring: KeyProvider,
                 keys: KeyManager, vault: PiiVault, storage: StorageOps, gate: TenantGate,
                 pii: PiiLayer, retention: RetentionPolicy | None, activity_resolution: float,
                 async_only: bool) -> None:
        self.inner = inner
        self.registry = registry
        self.keyring = keyring
        self.keys = keys
        self.vault = vault
        self.storage = storage
        self.gate = gate
        self.pii = pii
        self.retention = retention
        self.activity_resolution = activity_resolution
        self.async_only = async_only
        self.tokens = TokenCache()
        self.companions: dict[Any, Any] = {}  # stores built on this saver (idempotency)
        #: where SecureStores of this saver wrote items in this process (durable locations are
        #: also recorded in the registry): what forget_subject must reach
        self.store_locations: set[str] = set()
        #: the subject digests of threads (forget_subject finds a person's threads by them)
        self.subjects = SubjectLabels(registry)
        if isinstance(keys.threads, ThreadKeyStore):
            keys.threads.on_load.append(self.subjects.key_loaded)
        self._touched: dict[tuple[str, str], float] = {}
        self._policies: dict[str, tuple[float, RetentionPolicy]] = {}
        #: the saver's own authenticated read of a thread's latest checkpoint (installed by
        #: the saver: its read path and sealed codec sit above this layer)
        self.read_latest: Callable[[ThreadRef], CheckpointTuple | None] | None = None
        self._default_policy_saved = False
        self._keyring_bound = False

    # authenticated reads --------------------------------------------------------------------
    def authenticated_latest(self, ref: ThreadRef) -> CheckpointTuple | None:
        """The thread's latest checkpoint in ``ref``'s namespace, read, authenticated and
        opened as the saver's ``get_tuple`` does (PII tokens left in): a row that does not
        parse or authenticate is the TamperedDataError naming it. Fails closed when no saver
        installed its read path."""
        if self.read_latest is None:
            raise ConfigurationError(
                "these saver services have no authenticated read path (a SecureSaver installs "
                "one); a stored checkpoint cannot be believed without it")
        return self.read_latest(ref)

    # keys -----------------------------------------------------------------------------------
    def tenant_keys(self, tenant: str) -> TenantKeys:
        """The tenant's keys, created on first use (binds the keyring to this database)."""
        if not self._keyring_bound:
            self.bind_keyring()
        keys = self.keys.keys_for(tenant, create=True)
        if keys is None:  # create=True always returns keys; kept for the type checker
            raise TamperedDataError(f"no keys for tenant {tenant!r}")
        return keys

    async def atenant_keys(self, tenant: str) -> TenantKeys:
        cached = self.keys.cached(tenant)
        return cached if cached is not None else await to_thread(
            self.tenant_keys, tenant)

    async def aexisting_keys(self, tenant: str) -> TenantKeys | None:
        return self.keys.cached(tenant) or await to_thread(
            self.keys.keys_for, tenant, create=False)

    async def arequire_keys(self, tenant: str) -> TenantKeys:
        """:meth:`.keys.crypto.KeyManager.require` off the event loop: the keys of a tenant whose
        stored rows are being read, or the TamperedDataError that says they are gone."""
        cached = self.keys.cached(tenant)
        return cached if cached is not None else await to_thread(
            self.keys.require, tenant)

    async def awarm_thread_key(self, tenant: str, thread_id: str) -> None:
        """Load a thread's key into the cache off the event loop (a cold thread's first read
        reads its key row), so opening its ciphertexts on the loop never waits on the
        registry."""
        store = self.keys.threads
        cached = getattr(store, "cached", None)
        if store is not None and callable(cached) and not cached(tenant, thread_id):
            await to_thread(store.key, tenant, "thread", thread_id, False)

    def database_id(self) -> str:
        """A random id for the database behind the registry, created on first use and kept
        in ``securesaver_meta``; keyrings record the ids of the databases they serve."""
        return self.registry.database_id()

    def database_label(self) -> str:
        try:
            return self.registry.engine.url.render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001  # pragma: no cover - any engine has a URL
            return "(unknown)"

    def bind_keyring(self) -> None:
        """Record in the keyring (once per process) that it serves this database."""
        if self._keyring_bound:
            return
        self._keyring_bound = True
        record = getattr(self.keyring, "record_database", None)
        if callable(record):
            record(self.database_id(), self.database_label())

    # thread activity ------------------------------------------------------------------------
    def touch_due(self, ref: ThreadRef) -> bool:
        """Whether the thread's registry row is due an update before a write: the activity
        resolution passed, or this process's write lease on the thread's key has less than
        half of :data:`WRITE_LEASE` left (only :meth:`touch`, after the update succeeded,
        marks it done: a failed touch is retried)."""
        return self.touched_before(ref, min(self.activity_resolution, WRITE_LEASE / 2))

    def check_lease(self, ref: ThreadRef) -> None:
        """Right before a sealed write goes to the inner saver: its lease must have at least
        half of :data:`WRITE_LEASE` left, so it is stored before any destroyer of the key
        stops waiting; a lease that ran short is confirmed again, and a key that changed
        meanwhile means the write was sealed under a key that is going away: KeyGoneError,
        nothing stored (docs/key-lifecycle.md)."""
        if self.touch_due(ref) and not self.touch(ref):
            raise KeyGoneError(
                f"thread {ref.thread_id!r} of tenant {ref.tenant!r} was deleted while this write "
                "was being sealed; nothing was stored: retry (it starts the thread afresh)")

    def touched_before(self, ref: ThreadRef, seconds: float) -> bool:
        """Whether this process last touched the thread's registry row more than ``seconds``
        ago (or never)."""
        last = self._touched.get((ref.tenant, ref.thread_id))
        return last is None or time.monotonic() - last > seconds

    def touch(self, ref: ThreadRef) -> bool:
        """Move the thread's last activity and take a write lease on its key: in the same
        transaction, refused (KeyGoneError) while a deletion fences the thread off, and the
        cached key dropped unless it is still the thread's. False when it was dropped (what
        was sealed under it must not be stored)."""
        started = time.monotonic()   # the lease runs from before the registry saw it
        same = [True]

        def lease(conn: Any, state: str, _last: float) -> None:
            if state == "deleting":
                raise KeyGoneError(
                    f"thread {ref.thread_id!r} of tenant {ref.tenant!r} is being deleted; "
                    "nothing was stored: retry once the deletion is done (the thread then "
                    "starts afresh under a new key)")
            threads = self.keys.threads
            if isinstance(threads, ThreadKeyStore):
                same[0] = threads.confirm(conn, ref.tenant, ref.thread_id)

        self.registry.touch_thread(ref.tenant, ref.thread_id, policy=self.policy_for(ref.tenant),
                                   within=lease)
        if len(self._touched) > 100_000:
            self._touched.clear()
        if same[0]:   # no lease on a key this process does not hold yet: touched again
            self._touched[(ref.tenant, ref.thread_id)] = started
        return same[0]

    def flush_deleted(self) -> None:
        """End of a deletion batch: the storage and the registry drop what they still hold
        of the deleted rows outside their live pages (SQLite: the WAL; see docs/erasure.md)."""
        self.storage.flush_deleted()
        self.registry.flush_deleted()

    async def aflush_deleted(self) -> None:
        if self.async_only:
            await self.storage.aflush_deleted()
        else:
            await to_thread(self.storage.flush_deleted)
        await to_thread(self.registry.flush_deleted)

    def note_namespace(self, ref: ThreadRef) -> None:
        """Record a subgraph namespace the first time this process writes it (copy_thread
        reads them: :mod:`.registry.namespaces`)."""
        if not ref.checkpoint_ns:
            return
        seen = self.__dict__.setdefault("_namespaces", {})
        if ref.checkpoint_ns in seen.get((ref.tenant, ref.thread_id), ()):
            return
        self.registry.note_namespaces(ref.tenant, ref.thread_id, [ref.checkpoint_ns])
        if len(seen) > 100_000:
            seen.clear()
        seen.setdefault((ref.tenant, ref.thread_id), set()).add(ref.checkpoint_ns)

    def forget_thread(self, tenant: str, thread_id: str) -> None:
        """Drop what this process caches about a deleted thread."""
        self.__dict__.get("_namespaces", {}).pop((tenant, thread_id), None)
        self._touched.pop((tenant, thread_id), None)
        self.tokens.forget_thread(tenant, thread_id)
        self.subjects.forget_cached(tenant, thread_id)

    # retention policies ---------------------------------------------------------------------
    def save_default_policy(self) -> None:
        if self.retention is not None and not self._default_policy_saved:
            self.registry.set_policy(DEFAULT_POLICY_KEY, self.retention)
        self._default_policy_saved = True

    def set_default_policy(self, policy: RetentionPolicy | None) -> None:
        self.registry.set_policy(DEFAULT_POLICY_KEY, policy)
        self.retention, self._default_policy_saved = policy, True
        self._policies.clear()

    def policy_for(self, tenant: str) -> RetentionPolicy:
        self.save_default_policy()
        hit = self._policies.get(tenant)
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.activity_resolution:
            return hit[1]
        policy, _source = self.registry.effective_policy(tenant)
        self._policies[tenant] = (now, policy)
        return policy

    def forget_policy(self, tenant: str) -> None:
        self._policies.pop(tenant, None)


class SaverLike(Protocol):
    """What operations read of the saver a user hands them (``audit(saver)``, ``scan(saver)``,
    ``IdempotencyStore.for_saver(saver)``): its public attributes and ``services``."""

    @property
    def services(self) -> SaverServices: ...
    @property
    def inner(self) -> BaseCheckpointSaver: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def keyring(self) -> KeyProvider: ...
    @property
    def keys(self) -> KeyManager: ...
    @property
    def vault(self) -> PiiVault: ...
    @property
    def serde(self) -> SerializerProtocol: ...
    @property
    def codec(self) -> SealedCodec: ...
    @property
    def metadata_allowlist(self) -> frozenset[str]: ...
    @property
    def redactor(self) -> Any: ...
    def require_sole_database(self, operation: str) -> None: ...
    def rewrap_keys(self, *, progress: Callable[[int, int], None] | None = None) -> int: ...
    def rotate_data_key(self, tenant: str) -> int: ...
    def master_versions_in_use(self) -> dict[str, int]: ...
    def pii_inventory(self, tenant: str | None = None, thread_id: str | None = None
                      ) -> dict[tuple[str, str], dict[str, int]]: ...


def services_of(saver: Any) -> SaverServices | None:
    """``saver.services`` when ``saver`` is a SecureSaver (duck-typed: this layer may not
    import the saver), else None."""
    services = getattr(saver, "services", None)
    return services if isinstance(services, SaverServices) else None
