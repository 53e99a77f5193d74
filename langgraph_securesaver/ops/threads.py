"""Deleting and pruning threads: the one purge path every deletion takes.

``delete_thread``, ``prune``, the retention sweep and ``shred_tenant`` all remove a thread
through :func:`purge_thread_storage` (checkpoints, writes, blobs, PII vault entries,
idempotency records) and leave a receipt. Knows the services of a saver; not the saver.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig

from ..audit import summaries
from ..errors import TamperedDataError
from ..keys.lifecycle import LEASE_FENCE
from ..listing import ARows, decoding, listing
from ..registry.thread_keys import ThreadKeyStore
from ..services import SaverServices
from ..storage.ops import checkpoint_epoch
from ..tenancy import ThreadRef, current_tenant_scope, outer_thread_id, thread_prefix


def delete_threads(services: SaverServices, tenant: str, thread_ids: Sequence[str],
                   how: str) -> None:
    """Delete threads completely and leave a receipt for each (runs in a worker thread
    on the async path; async-only inner savers are reached on their own loop)."""
    actor = current_tenant_scope() or tenant
    for thread_id in thread_ids:
        ref = ThreadRef(tenant, thread_id)
        counts: dict[str, Any] = dict(purge_thread_storage(services, ref))
        counts["erased_under"] = erased_under(services)
        services.registry.finish_deleted(tenant, thread_id, {
            "tenant": tenant, "thread_id": thread_id, "action": "deleted", "reason": how,
            "requested_by": actor, "detail": counts})
        services.forget_thread(tenant, thread_id)
    services.flush_deleted()


def mark_emptied(services: SaverServices, tenant: str, inner_ids: Iterable[str]
                 ) -> builtins.list[str]:
    """After ``delete_for_runs``: mark the threads of ``inner_ids`` left without a checkpoint
    ``emptied`` in the registry and return their thread ids. Nothing else is deleted here: a
    run of the same thread may be writing right now (LangGraph Server's rollback), and its
    checkpoint must neither be deleted nor sealed under a key that is then destroyed. The
    retention sweep deletes an emptied thread -- its storage, companion records and key, with
    one receipt (reason ``delete_for_runs``) -- once it has stayed empty and unwritten for
    :meth:`.pruner.Sweep.emptied_grace` (docs/erasure.md)."""
    ids = sorted(set(inner_ids or ()))
    if not ids:
        return []
    counts = services.storage.count_checkpoints_many(ids)
    emptied = [outer for tid in ids if not counts.get(tid, 0)
               for outer in [outer_thread_id(tenant, tid)] if outer is not None]
    if emptied:
        services.registry.mark_emptied(tenant, emptied, policy=services.policy_for(tenant))
    return emptied


def keep_latest(services: SaverServices, tenant: str, thread_ids: Sequence[str]) -> None:
    """Prune threads to their latest checkpoint, with a receipt for each one that shrank."""
    ops = services.storage
    refs = [ThreadRef(tenant, t) for t in thread_ids]
    before = {r.thread_id: ops.count_checkpoints(r.inner_id) for r in refs}
    ops.keep_latest([r.inner_id for r in refs])
    summaries.mark_changed(services.registry, tenant, list(thread_ids))
    for ref in refs:
        after = ops.count_checkpoints(ref.inner_id)
        if before[ref.thread_id] > after:
            services.registry.add_receipt(
                tenant=tenant, thread_id=ref.thread_id, action="pruned", reason="prune",
                requested_by=current_tenant_scope() or tenant,
                detail={"checkpoints_deleted": before[ref.thread_id] - after,
                        "checkpoints_kept": after})


def purge_thread_storage(services: SaverServices, ref: ThreadRef) -> dict[str, int]:
    """Remove a thread's checkpoints, writes and blobs, and every record SecureSaver or its
    companions keep for it. Idempotent: a crash half-way is finished by running it again.

    First the thread is fenced off (:func:`fence`): nothing is deleted while a write may still
    store under its key."""
    fence(services, ref)
    counts = {"checkpoints": services.storage.count_checkpoints(ref.inner_id)}
    services.storage.delete_threads([ref.inner_id])
    for name, purge in thread_purgers(services):
        counts[name] = purge(ref.tenant, ref.thread_id)
    summaries.drop(services.registry, ref.tenant, [ref.thread_id])
    return counts


def fence(services: SaverServices, ref: ThreadRef) -> None:
    """The destroyer's half of the key lifecycle (docs/key-lifecycle.md): mark the thread
    ``deleting`` -- no process is granted a write lease on its key from then on -- and wait
    until every lease granted before has run out (at most ``LEASE_FENCE`` after the thread's
    last activity; no wait for a thread nobody wrote lately). A write that took its lease in
    time is stored before the deletion starts, and deleted with the thread."""
    last = services.registry.fence_thread(ref.tenant, ref.thread_id)
    wait = last + LEASE_FENCE - time.time()
    if wait > 0:
        time.sleep(min(wait, LEASE_FENCE))


def thread_purgers(services: SaverServices
                   ) -> builtins.list[tuple[str, Callable[[str, str], int]]]:
    """Per-thread cleanups of companion stores (PII vault, idempotency records)."""
    purgers: builtins.list[tuple[str, Callable[[str, str], int]]] = [
        ("pii_values", services.vault.delete_thread)]
    store = idempotency_store(services)
    if store is not None:
        purgers.append(("idempotency_records", store.delete_thread))
    keys = thread_key_store(services)
    if keys is not None:   # last: the key goes with the data (crypto-erasure)
        purgers.append(("thread_keys", keys.delete_thread))
    return purgers


def erased_under(services: SaverServices) -> str:
    """The master version current at an erasure: copies of the destroyed keys (remnants,
    backups) stop opening once it is retired (the erasure epoch, docs/erasure.md)."""
    return str(services.keyring.current_version)


def thread_key_store(services: SaverServices) -> ThreadKeyStore | None:
    """The saver's per-thread data keys (None for a key manager without them)."""
    store = services.keys.threads
    return store if isinstance(store, ThreadKeyStore) else None


def idempotency_store(services: SaverServices) -> Any:
    """The idempotency store on this saver's database (None if that component is absent)."""
    try:
        from ..idempotency.store import IdempotencyStore
    except ImportError:
        return None
    return IdempotencyStore.for_services(services)


def latest_checkpoint_time(services: SaverServices, ref: ThreadRef) -> float | None:
    """When the thread was last written, from its latest root checkpoint, read exactly as the
    retention sweep's batches read it (:meth:`..storage.ops.StorageOps.latest_checkpoint_times`
    for this one thread: the checkpoint rows only, with SQL, on SQLite and PostgreSQL; the
    inner ``get_tuple`` on savers without native SQL), so a thread is decided the same way
    whether it is swept in a batch or on its own. A corrupt channel blob or pending write does
    not enter that decision.

    A checkpoint row that does not parse is the TamperedDataError naming it (the pruner
    reports it and keeps the thread), in the words ``get_tuple`` uses for the same row when
    ``get_tuple`` refuses it too."""
    try:
        return services.storage.latest_checkpoint_times([ref.inner_id]).get(ref.inner_id)
    except TamperedDataError as refused:
        named = _get_tuple_refusal(services, ref)
        raise (named or refused) from None


def _get_tuple_refusal(services: SaverServices, ref: ThreadRef) -> TamperedDataError | None:
    """The TamperedDataError ``get_tuple`` gives for the thread's latest root checkpoint (it
    names the table, row and column on sync SQL savers), or None when it reads the thread."""
    config: RunnableConfig = {"configurable": {"thread_id": ref.inner_id,
                                               "checkpoint_ns": ""}}
    try:
        if services.storage.async_mode():
            with decoding(ref, config):
                services.storage.bridge(services.inner.aget_tuple(config))
        else:
            with decoding(ref, config, services.inner if is_sql_saver(services) else None):
                services.inner.get_tuple(config)
    except TamperedDataError as exc:
        return exc
    return None


def authenticated_checkpoint_time(services: SaverServices, ref: ThreadRef) -> float | None:
    """:func:`latest_checkpoint_time`, authenticated: the latest root checkpoint read and
    opened as ``get_tuple`` does (its ts is covered by the seal), so a time the caller acts on
    is one SecureSaver wrote. A row that does not parse or authenticate is the
    TamperedDataError naming it."""
    tup = services.authenticated_latest(ref)
    return None if tup is None else checkpoint_epoch(tup.checkpoint.get("ts"))


def inner_thread_ids(services: SaverServices, tenant: str) -> builtins.list[str]:
    """Thread ids the inner saver holds for a tenant (finds rows the registry lost)."""
    prefix = thread_prefix(tenant)
    ids = services.storage.thread_ids(prefix)
    if ids is not None:
        return sorted({i[len(prefix):] for i in ids if i.startswith(prefix)})
    seen: set[str] = set()
    inner = services.inner
    if services.storage.async_mode():  # (a row that does not parse: TamperedDataError)
        async def collect() -> builtins.list[Any]:
            return [t async for t in ARows(inner.alist(None), tenant)]
        rows: Any = services.storage.bridge(collect())
    else:
        rows = listing(tenant, lambda: inner.list(None))
    for tup in rows:
        thread = outer_thread_id(tenant, str(tup.config["configurable"]["thread_id"]))
        if thread is not None:
            seen.add(thread)
    return sorted(seen)


def is_sql_saver(services: SaverServices) -> bool:
    """A sync SQLite or PostgreSQL inner saver, whose refused rows ``decoding`` can locate."""
    from ..inner_access import is_sync_only
    return not services.async_only and is_sync_only(services.inner)
