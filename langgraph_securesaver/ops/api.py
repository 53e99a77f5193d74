"""The operator-facing methods of :class:`~langgraph_securesaver.SecureSaver`, one line each.

:class:`SaverOperations` is a base class of SecureSaver: every retention, shredding, PII,
audit, scan, rotation and key method named in the README is defined here as a delegation to
its operation module, called with ``self.services`` (the narrow interface), and its async twin
runs the same body in a worker thread. Nothing here knows the checkpointer contract.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..offthread import to_thread
from ..registry.schema import Receipt, ThreadRow
from ..retention import PruneReport, RetentionPolicy
from ..services import SaverServices
from . import keys, pii, retention, shredding, subjects
from .retention import UNSET
from .subjects import SUBJECT_NAMESPACE, SubjectErasure

if TYPE_CHECKING:
    from ..services import SaverLike


class SaverOperations:
    """Retention, shredding, PII, audit, scan and key operations of a saver."""

    services: SaverServices

    # retention ----------------------------------------------------------------------------
    def set_default_retention(self, policy: RetentionPolicy | None) -> None:
        """The policy for tenants without their own (stored in the registry for the pruner).
        Operator only (refused inside a tenant scope)."""
        retention.set_default_retention(self.services, policy)

    @property
    def retention(self) -> RetentionPolicy | None:
        """The default retention policy of this saver (see :meth:`set_default_retention`)."""
        return self.services.retention

    def set_tenant_retention(self, tenant: str, policy: RetentionPolicy | None) -> None:
        """A tenant's own policy (``legal_hold=True`` holds the whole tenant); None removes it."""
        retention.set_tenant_retention(self.services, tenant, policy)

    async def aset_default_retention(self, policy: RetentionPolicy | None) -> None:
        """Async twin of :meth:`set_default_retention`, run in a worker thread."""
        await to_thread(self.set_default_retention, policy)

    async def aset_tenant_retention(self, tenant: str, policy: RetentionPolicy | None) -> None:
        """Async twin of :meth:`set_tenant_retention`, run in a worker thread."""
        await to_thread(self.set_tenant_retention, tenant, policy)

    def set_retention(self, thread_id: str, *, idle_ttl: Any = UNSET, max_age: Any = UNSET,
                      legal_hold: Any = UNSET, strategy: Any = UNSET) -> ThreadRow:
        """Override retention for one thread of the current tenant (scope or default)."""
        return retention.set_retention(self.services, thread_id, idle_ttl=idle_ttl,
                                       max_age=max_age, legal_hold=legal_hold,
                                       strategy=strategy)

    async def aset_retention(self, thread_id: str, **changes: Any) -> ThreadRow:
        """Async twin of :meth:`set_retention`, run in a worker thread."""
        from ..tenancy import tenant_scope
        gate = self.services.gate
        tenant = await gate.ascoped(lambda: gate.tenant("set_retention",
                                                        thread_id=str(thread_id)))

        def run() -> ThreadRow:
            with tenant_scope(tenant):
                return self.set_retention(thread_id, **changes)
        return await to_thread(run)

    def prune_expired(self, now: Any = None, *, limit: int | None = None,
                      dry_run: bool = False, tenant: str | None = None, **options: Any
                      ) -> PruneReport:
        """Execute retention: delete (or prune to latest) every expired, unheld thread.

        Safe to run on several machines at once. ``now`` (epoch seconds or an aware
        datetime) is for tests and backfills. Inside a tenant scope only that tenant's threads
        are swept. ``options``: ``batch``, ``lease``, ``active_grace``, ``owner``,
        ``progress``, ``should_stop`` (see :class:`~langgraph_securesaver.ops.pruner.Sweep`).
        """
        return retention.prune_expired(self.services, now, limit=limit, dry_run=dry_run,
                                       tenant=tenant, **options)

    async def aprune_expired(self, now: Any = None, *, limit: int | None = None,
                             dry_run: bool = False, tenant: str | None = None, **options: Any
                             ) -> PruneReport:
        """Async twin of :meth:`prune_expired`, run in a worker thread."""
        return await to_thread(self.prune_expired, now, limit=limit, dry_run=dry_run,
                                       tenant=tenant, **options)

    def receipts(self, *, tenant: str | None = None, thread_id: str | None = None,
                 since: Any = None, until: Any = None) -> builtins.list[Receipt]:
        """Deletion receipts (content-free: who, what, when, why, how many); ``since`` and
        ``until`` are epoch seconds or aware datetimes. Inside a scope: that tenant's only."""
        return retention.receipts(self.services, tenant=tenant, thread_id=thread_id,
                                  since=since, until=until)

    async def areceipts(self, **filters: Any) -> builtins.list[Receipt]:
        """Async twin of :meth:`receipts`, run in a worker thread."""
        return await to_thread(lambda: self.receipts(**filters))

    # shredding and PII ----------------------------------------------------------------------
    def shred_tenant(self, tenant: str, *, requested_by: str | None = None) -> int:
        """Crypto-shred a tenant: destroy what unwraps its keys at the key provider, so every
        copy of its data (database backups included) is unreadable, then delete its rows.

        Needs a keyring loaded from a file (it is rewritten) or a provider with
        ``destroy_tenant``, and refuses when the keyring also serves another database (see
        :meth:`Keyring.databases`): puncturing keeps per-tenant material only for the tenants
        of this registry. Returns the number of threads deleted.
        """
        return shredding.shred_tenant(self.services, tenant, requested_by=requested_by)

    async def ashred_tenant(self, tenant: str, *, requested_by: str | None = None) -> int:
        """Async twin of :meth:`shred_tenant`, run in a worker thread."""
        return await to_thread(self.shred_tenant, tenant, requested_by=requested_by)

    def pii_inventory(self, tenant: str | None = None, thread_id: str | None = None
                      ) -> dict[tuple[str, str], dict[str, int]]:
        """{(tenant, thread): {PII kind: distinct values}} for threads holding tokenized PII
        (inside a scope: that tenant's threads only)."""
        return pii.pii_inventory(self.services, tenant, thread_id)

    async def apii_inventory(self, tenant: str | None = None, thread_id: str | None = None
                             ) -> dict[tuple[str, str], dict[str, int]]:
        """Async twin of :meth:`pii_inventory`, run in a worker thread."""
        return await to_thread(self.pii_inventory, tenant, thread_id)

    def forget_pii(self, tenant: str, value: str | None = None, *, kind: str | None = None,
                   requested_by: str | None = None) -> int:
        """Erase stored PII without deleting conversations: the token stays, the value goes.

        ``value`` erases that value wherever the tenant's threads hold it; ``kind`` (e.g.
        ``"EMAIL_ADDRESS"``) erases every value of that kind. Returns the values erased.
        """
        return pii.forget_pii(self.services, tenant, value, kind=kind,
                              requested_by=requested_by)

    async def aforget_pii(self, tenant: str, value: str | None = None, *,
                          kind: str | None = None, requested_by: str | None = None) -> int:
        """Async twin of :meth:`forget_pii`, run in a worker thread."""
        return await to_thread(lambda: self.forget_pii(
            tenant, value, kind=kind, requested_by=requested_by))

    def forget_subject(self, subject: str | None = None, *, tenants: Any = None,
                       identifiers: Any = (), store_namespace: Any = SUBJECT_NAMESPACE,
                       stores: Any = (), requested_by: str | None = None) -> SubjectErasure:
        """Forget one person (the *subject*: the end user threads were written for, given by
        ``subject_scope``, ``configurable["subject_id"]`` or the LangGraph Server user) in
        ``tenants`` (None: every tenant; inside a scope, that tenant only).

        Deletes every thread recorded for the subject -- checkpoints, pending writes, the PII
        values only those threads used, idempotency and recovery records -- through the
        thread deletion path (each thread's key is destroyed: crypto-erasure), and the
        SecureStore items whose namespace starts with the subject id (``store_namespace``:
        another prefix tuple, or None for no store items): in the store table of the
        registry's database, and in each SecureStore of ``stores`` (through its own API;
        counted per store in ``SubjectErasure.stores``). A SecureStore of this registry that
        wrote items anywhere else (another file or database, process memory) must be named:
        otherwise :class:`~..errors.StoreNotReachedError` is raised before anything is
        deleted. ``identifiers`` (the person's e-mails, phones, names) also erase those
        values wherever else the tenant holds them; with ``subject=None`` only that is
        done. One receipt, counts only.
        """
        return subjects.forget_subject(self.services, subject, tenants=tenants,
                                       identifiers=identifiers,
                                       store_namespace=store_namespace, stores=stores,
                                       requested_by=requested_by)

    async def aforget_subject(self, subject: str | None = None, *, tenants: Any = None,
                              identifiers: Any = (), store_namespace: Any = SUBJECT_NAMESPACE,
                              stores: Any = (), requested_by: str | None = None
                              ) -> SubjectErasure:
        """Async twin of :meth:`forget_subject`, run in a worker thread (async stores are
        reached on their own event loop from there)."""
        return await to_thread(lambda: self.forget_subject(
            subject, tenants=tenants, identifiers=identifiers,
            store_namespace=store_namespace, stores=stores, requested_by=requested_by))

    # audit, events, scan, rotation (audit/inventory.py, audit/scan.py, ops/rotation.py) -----------
    def audit(self, *, tenant: str | None = None, now: Any = None) -> Any:
        """Inventory: tenants, threads, ages, expiry, sizes, key versions, PII kinds (inside a
        scope: that tenant only). ``now``: epoch seconds or an aware datetime."""
        from ..audit.inventory import audit
        from ..timeargs import to_epoch
        return audit(cast("SaverLike", self), tenant=tenant, now=to_epoch(now, "now"))

    async def aaudit(self, *, tenant: str | None = None, now: Any = None) -> Any:
        """Async twin of :meth:`audit`, run in a worker thread."""
        return await to_thread(lambda: self.audit(tenant=tenant, now=now))

    def events(self, **filters: Any) -> Any:
        """Audit events and deletion receipts (tenant, thread_id, kind, since, until, limit;
        times are epoch seconds or aware datetimes). Inside a scope: that tenant's only."""
        from ..audit.trail import events
        from ..gate import thread_id_of
        from ..timeargs import to_epoch
        for name in ("since", "until"):
            if name in filters:
                filters[name] = to_epoch(filters[name], name)
        if filters.get("thread_id") is not None:
            filters["thread_id"] = thread_id_of(filters["thread_id"])
        return events(cast("SaverLike", self), **filters)

    async def aevents(self, **filters: Any) -> Any:
        """Async twin of :meth:`events`, run in a worker thread."""
        return await to_thread(lambda: self.events(**filters))

    def scan(self, **options: Any) -> Any:
        """Check the at-rest guarantees on the raw tables (see scan.scan for options).
        Operator only: it reads every tenant's rows."""
        from ..audit.scan import scan
        return scan(cast("SaverLike", self), **options)

    async def ascan(self, **options: Any) -> Any:
        """Async twin of :meth:`scan`, run in a worker thread."""
        return await to_thread(lambda: self.scan(**options))

    def rotate_keys(self, **options: Any) -> Any:
        """New master version + rewrap; ``reencrypt=True`` also re-encrypts stored data.
        Operator only."""
        from .rotation import rotate_keys
        return rotate_keys(cast("SaverLike", self), **options)

    async def arotate_keys(self, **options: Any) -> Any:
        """Async twin of :meth:`rotate_keys`, run in a worker thread."""
        return await to_thread(lambda: self.rotate_keys(**options))

    def reencrypt(self, **options: Any) -> Any:
        """Rewrite every ciphertext not under its tenant's newest data key (resumable).
        ``tenants=`` narrows it; inside a scope it covers that tenant only."""
        from .rotation import reencrypt
        return reencrypt(cast("SaverLike", self), **options)

    async def areencrypt(self, **options: Any) -> Any:
        """Async twin of :meth:`reencrypt`, run in a worker thread."""
        return await to_thread(lambda: self.reencrypt(**options))

    # keys and databases ---------------------------------------------------------------------
    def database_id(self) -> str:
        """A random id for the database behind this saver's registry, created on first use and
        kept in ``securesaver_meta``; keyrings record the ids of the databases they serve."""
        return self.services.database_id()

    def require_sole_database(self, operation: str) -> None:
        """Refuse ``operation`` (shredding, retiring master versions) when the keyring also
        serves another database: its tenants' key rows may still be wrapped under the master
        versions this would destroy, and this registry cannot know those tenants."""
        keys.require_sole_database(self.services, operation)

    def rewrap_keys(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Re-seal every tenant's data keys under the keyring's current master version.

        Fast (no checkpoint is rewritten) and online. Afterwards older master versions are only
        needed for database backups taken before. Returns the number of key rows rewrapped.
        Operator only.
        """
        return keys.rewrap_keys(self.services, progress=progress)

    async def arewrap_keys(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Async twin of :meth:`rewrap_keys`, run in a worker thread."""
        return await to_thread(self.rewrap_keys, progress=progress)

    def rotate_data_key(self, tenant: str) -> int:
        """Start a new data-key version for ``tenant``; new writes use it, old data still reads."""
        return keys.rotate_data_key(self.services, tenant)

    async def arotate_data_key(self, tenant: str) -> int:
        """Async twin of :meth:`rotate_data_key`, run in a worker thread."""
        return await to_thread(self.rotate_data_key, tenant)

    def erasure_epoch(self) -> dict[str, Any]:
        """How many erasures still open from remnants and backups (made under a master version
        the keyring holds) until the next ``rotate_keys(retire_old=True)``."""
        self.services.gate.admin_tenant("erasure_epoch", operator_only=True)
        return keys.erasure_epoch(self.services)

    async def aerasure_epoch(self) -> dict[str, Any]:
        """Async twin of :meth:`erasure_epoch`, run in a worker thread."""
        return await to_thread(self.erasure_epoch)

    def destroy_master_key(self, version: str) -> None:
        """Destroy a provider's master key (KMS: schedule its deletion; PKCS#11: destroy the
        key object), named explicitly: retiring only stops using it. Operator only."""
        keys.destroy_master_key(self.services, version)

    async def adestroy_master_key(self, version: str) -> None:
        """Async twin of :meth:`destroy_master_key`, run in a worker thread."""
        await to_thread(self.destroy_master_key, version)

    def master_versions_in_use(self) -> dict[str, int]:
        """How many key rows each master version still wraps (retire a version at zero).
        Operator only."""
        return keys.master_versions_in_use(self.services)

    async def amaster_versions_in_use(self) -> dict[str, int]:
        """Async twin of :meth:`master_versions_in_use`, run in a worker thread."""
        return await to_thread(self.master_versions_in_use)
