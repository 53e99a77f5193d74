"""Stalled-run recovery: resume opted-in threads whose run died, one worker per thread.

A thread opts in with :func:`mark_recoverable` (call it before ``invoke``, or from inside a
node). :func:`recover_stalled` then finds armed threads, claims each one under a lease in the
database (the same compare-and-set mechanics as idempotency keys: several workers never
resume the same thread at once), checks the latest checkpoint (pending tasks, no pending
interrupt, no activity for ``older_than`` seconds), resumes it with ``graph.invoke(None,
config)``, caps the attempts, and records the threads that keep failing as dead letters.
The side effects of a resumed run are protected by the idempotency keys of its tools.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import logging
import secrets
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from langchain_core.runnables import RunnableConfig

from ..crypto import associated_data
from ..errors import ConfigurationError, TamperedDataError
from .context import CONFIG_KEY_CHECKPOINTER
from .errors import NoIdempotencyContext
from .schema import dead_letters, recoverable_threads
from .store import IdempotencyStore, default_owner

if TYPE_CHECKING:
    from ..saver import SecureSaver

logger = logging.getLogger(__name__)

_R = recoverable_threads
_D = dead_letters
ARMED, DONE, DEAD = "armed", "done", "dead"
_RESERVED_CONFIGURABLE = frozenset({"thread_id", "tenant_id", "checkpoint_ns", "checkpoint_id",
                                    "checkpoint_map"})


@dataclass
class RecoveryReport:
    """What one :func:`recover_stalled` sweep did (thread ids as ``(tenant, thread_id)``)."""

    worker_id: str
    examined: int = 0
    resumed: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    dead_lettered: list[tuple[str, str]] = field(default_factory=list)
    finished: list[tuple[str, str]] = field(default_factory=list)  # nothing left to run
    skipped_busy: int = 0      # another worker holds the lease
    skipped_recent: int = 0    # activity newer than older_than
    skipped_waiting: int = 0   # waiting on an interrupt (human input)


@dataclass(frozen=True)
class DeadLetter:
    letter_id: str
    tenant: str
    thread_id: str
    at: float
    attempts: int
    worker: str | None
    error_type: str | None
    error: str | None


def _saver_of(saver: SecureSaver | None, config: RunnableConfig | None) -> SecureSaver:
    from ..saver import SecureSaver
    if saver is None and config is not None:
        saver = (config.get("configurable") or {}).get(CONFIG_KEY_CHECKPOINTER)
    if not isinstance(saver, SecureSaver):
        raise ConfigurationError("recovery needs a SecureSaver (pass saver=...)")
    return saver


def _scalar_configurable(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in conf.items()
            if not k.startswith("__") and k not in _RESERVED_CONFIGURABLE
            and isinstance(v, (str, int, float, bool, type(None)))}


RECOVERY_CHANNEL = "__recovery__"  # the channel name recovery records are redacted under


def _conf_aad(tenant: str, thread_id: str) -> bytes:
    return associated_data("recover-conf", tenant, thread_id)


def _error_aad(tenant: str, thread_id: str, what: str) -> bytes:
    return associated_data("recover-error", tenant, thread_id, what)


def _upsert(store: IdempotencyStore, row: dict[str, Any]) -> Any:
    stmt: Any
    if store.dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert
        stmt = pg_insert(_R)
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert
        stmt = sqlite_insert(_R)
    stmt = stmt.values(**row)
    return stmt.on_conflict_do_update(
        index_elements=[_R.c.tenant, _R.c.thread_id],
        set_={"state": ARMED, "attempts": 0, "configurable": stmt.excluded.configurable,
              "updated_at": stmt.excluded.updated_at, "last_error": None})


def mark_recoverable(config: RunnableConfig | None = None, *,
                     saver: SecureSaver | None = None) -> None:
    """Opt a thread in to stalled-run recovery (re-arms it and resets its attempt count).

    ``config`` is the run config (default: the current run's, inside a node). Its scalar
    ``configurable`` values (model names, user ids...) are stored sealed and given back to the
    resumed run.
    """
    if config is None:
        try:
            from langgraph.config import get_config
            config = get_config()
        except RuntimeError:
            raise NoIdempotencyContext("mark_recoverable() outside a run needs a config") from None
    sv = _saver_of(saver, config)
    ref = sv._scoped(lambda: sv._ref(config, "mark_recoverable"))
    store = IdempotencyStore.for_saver(sv)
    keys = store.tenant_keys(ref.tenant)
    extras = sv._redact_for_store(keys, ref.thread_id,
                                 _scalar_configurable(config.get("configurable") or {}),
                                 RECOVERY_CHANNEL)
    import json
    sealed = keys.seal(json.dumps(extras, sort_keys=True).encode("utf-8"),
                       _conf_aad(ref.tenant, ref.thread_id))
    now = store._now
    row = {"tenant": ref.tenant, "thread_id": ref.thread_id, "state": ARMED, "owner": None,
           "fencing_token": 0, "attempts": 0, "lease_expires_at": None, "created_at": now,
           "updated_at": now, "configurable": sealed}
    with store._begin("marking a thread recoverable") as conn:
        conn.execute(_upsert(store, row))


async def amark_recoverable(config: RunnableConfig | None = None, *,
                            saver: SecureSaver | None = None) -> None:
    import asyncio
    if config is None:
        from langgraph.config import get_config
        config = get_config()
    await asyncio.to_thread(mark_recoverable, config, saver=saver)


def unmark_recoverable(saver: SecureSaver, tenant: str, thread_id: str) -> bool:
    store = IdempotencyStore.for_saver(saver)
    with store._begin("unmarking a thread") as conn:
        return bool(conn.execute(_R.delete().where(
            _R.c.tenant == tenant, _R.c.thread_id == thread_id)).rowcount)


# --------------------------------------------------------------------------------------------
class _Lease:
    def __init__(self, store: IdempotencyStore, tenant: str, thread_id: str, token: int,
                 owner: str, lease: float, sealed_conf: bytes | None = None) -> None:
        self.store, self.tenant, self.thread_id = store, tenant, thread_id
        self.token, self.owner, self.lease = token, owner, lease
        self.sealed_conf = sealed_conf

    def where(self) -> list[sa.ColumnElement[bool]]:
        return [_R.c.tenant == self.tenant, _R.c.thread_id == self.thread_id,
                _R.c.fencing_token == self.token]

    def update(self, what: str, **values: Any) -> Any:
        with self.store._begin(what) as conn:
            return conn.execute(_R.update().where(*self.where()).values(
                updated_at=self.store._now, **values).returning(_R.c.attempts)).first()

    def renew(self) -> bool:
        return self.update("renewing a recovery lease",
                           lease_expires_at=self.store._now + self.lease) is not None

    def release(self, state: str = ARMED, **values: Any) -> None:
        self.update("releasing a recovery lease", state=state, owner=None,
                    lease_expires_at=None, **values)

    @contextmanager
    def heartbeat(self) -> Iterator[None]:
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.lease / 3):
                try:
                    if not self.renew():
                        logger.warning("recovery lease of %s/%s lost", self.tenant,
                                       self.thread_id)
                        return
                except Exception:
                    logger.exception("could not renew a recovery lease")

        thread = threading.Thread(target=loop, name="securesaver-recover-lease", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)


def _claim(store: IdempotencyStore, tenant: str, thread_id: str, owner: str,
           lease: float) -> _Lease | None:
    now = store._now
    stmt = (_R.update().where(
        _R.c.tenant == tenant, _R.c.thread_id == thread_id, _R.c.state == ARMED,
        sa.or_(_R.c.lease_expires_at.is_(None), _R.c.lease_expires_at < now))
        .values(owner=owner, lease_expires_at=now + lease,
                fencing_token=_R.c.fencing_token + 1, updated_at=now)
        .returning(_R.c.fencing_token, _R.c.configurable))
    with store._begin("claiming a thread") as conn:
        r = conn.execute(stmt).first()
    if r is None:
        return None
    return _Lease(store, tenant, thread_id, int(r.fencing_token), owner, lease,
                  bytes(r.configurable) if r.configurable is not None else None)


def _checkpoint_age(created_at: str | None, now: float) -> float:
    if not created_at:
        return float("inf")
    try:
        ts = _dt.datetime.fromisoformat(created_at)
    except ValueError:
        return float("inf")
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=_dt.timezone.utc)
    return now - ts.timestamp()


def recover_stalled(graph: Any, saver: SecureSaver | None = None, *, older_than: float,
                    tenant: str | None = None, max_attempts: int = 3,
                    worker_id: str | None = None, lease: float = 300.0,
                    limit: int | None = None, durability: str = "sync") -> RecoveryReport:
    """Resume every armed thread whose latest checkpoint still has tasks to run and has seen
    no activity for ``older_than`` seconds. Safe to run from several workers at once.

    Args:
        graph: the compiled graph (its checkpointer must be ``saver``).
        saver: the SecureSaver (default: ``graph.checkpointer``).
        older_than: seconds without a new checkpoint before a thread counts as stalled.
            Choose more than your longest step.
        tenant: only this tenant's threads.
        max_attempts: resume attempts before the thread is dead-lettered.
        worker_id: recorded as lease owner and on dead letters (default ``host:pid:rand``).
        lease: seconds a claim on a thread lasts without renewal (renewed while resuming).
        limit: examine at most this many threads.
        durability: durability of the resumed run.
    """
    sv = _saver_of(saver if saver is not None else getattr(graph, "checkpointer", None), None)
    store = IdempotencyStore.for_saver(sv)
    owner = worker_id or f"{default_owner()}:{uuid.uuid4().hex[:6]}"
    report = RecoveryReport(owner)
    for ten, thread_id in _candidates(store, tenant, limit):
        report.examined += 1
        claimed = _claim(store, ten, thread_id, owner, lease)
        if claimed is None:
            report.skipped_busy += 1
            continue
        try:
            config = _resume_config(store, claimed)
            _recover_one(graph, store, claimed, config, report, older_than=older_than,
                         max_attempts=max_attempts, durability=durability)
        except _ForgedOptIn as exc:
            _refuse(claimed, report, exc)
        except Exception:
            logger.exception("recovery of %s/%s failed outside the run", ten, thread_id)
            claimed.release()
    return report


def _candidates(store: IdempotencyStore, tenant: str | None,
                limit: int | None) -> list[tuple[str, str]]:
    q = sa.select(_R.c.tenant, _R.c.thread_id).where(
        _R.c.state == ARMED, sa.or_(_R.c.lease_expires_at.is_(None),
                                    _R.c.lease_expires_at < store._now))
    if tenant is not None:
        q = q.where(_R.c.tenant == tenant)
    q = q.order_by(_R.c.updated_at)
    if limit is not None:
        q = q.limit(limit)
    with store._begin("listing recoverable threads") as conn:
        candidates = [(r.tenant, r.thread_id) for r in conn.execute(q)]
    secrets.SystemRandom().shuffle(candidates)  # spread concurrent workers over the list
    return candidates


def _resume_config(store: IdempotencyStore, claimed: _Lease) -> RunnableConfig:
    """The run config of the resumed thread: its sealed configurable extras, opened.

    The sealed configurable is the proof of the opt-in (AES-GCM bound to tenant and thread):
    a row without one, or with one that does not open, was not written by mark_recoverable
    and raises :class:`_ForgedOptIn` (the thread is reported as failed, never resumed)."""
    import json
    ten, thread_id = claimed.tenant, claimed.thread_id
    try:
        if claimed.sealed_conf is None:
            raise TamperedDataError("the opt-in row has no sealed configurable")
        keys = store.tenant_keys(ten)
        extras: dict[str, Any] = json.loads(
            keys.open(claimed.sealed_conf, _conf_aad(ten, thread_id)))
    except (TamperedDataError, ValueError) as exc:
        raise _ForgedOptIn(f"securesaver_recoverable row refused: {exc}") from None
    if store.saver is not None:  # tokenized PII back for the owning tenant
        extras = store.saver._restore_for_store(keys, extras)
    return {"configurable": {**extras, "thread_id": thread_id, "tenant_id": ten}}


class _ForgedOptIn(TamperedDataError):
    """A recovery opt-in row that does not authenticate."""


def _refuse(claimed: _Lease, report: RecoveryReport, exc: _ForgedOptIn) -> None:
    logger.error("recovery of tenant %r thread %r: %s", claimed.tenant, claimed.thread_id, exc)
    report.failed.append((claimed.tenant, claimed.thread_id))
    claimed.release()


def _precheck(store: IdempotencyStore, claimed: _Lease, snap: Any, report: RecoveryReport,
              older_than: float) -> int | None:
    """Decide from the thread's state whether to resume it; the attempt number, or None."""
    ident = (claimed.tenant, claimed.thread_id)
    if not snap.next:
        claimed.release(DONE)
        report.finished.append(ident)
        return None
    if snap.interrupts:
        claimed.release()
        report.skipped_waiting += 1
        return None
    if _checkpoint_age(snap.created_at, store.db_time()) < older_than:
        claimed.release()
        report.skipped_recent += 1
        return None
    row = claimed.update("counting a resume attempt", attempts=_R.c.attempts + 1)
    if row is None:  # lost the lease meanwhile
        report.skipped_busy += 1
        return None
    attempts = int(row.attempts)
    logger.info("resuming stalled thread %s/%s (attempt %s)", *ident, attempts)
    return attempts


def _recover_one(graph: Any, store: IdempotencyStore, claimed: _Lease, config: RunnableConfig,
                 report: RecoveryReport, *, older_than: float, max_attempts: int,
                 durability: str) -> None:
    ident = (claimed.tenant, claimed.thread_id)
    attempts = _precheck(store, claimed, graph.get_state(config), report, older_than)
    if attempts is None:
        return
    try:
        with claimed.heartbeat():
            graph.invoke(None, config, durability=durability)
    except Exception as exc:  # noqa: BLE001 - any failure of the run counts as an attempt
        _record_failure(store, claimed, exc, attempts, max_attempts, report)
        return
    after = graph.get_state(config)
    claimed.release(DONE if not after.next else ARMED, last_error=None)
    report.resumed.append(ident)


def _record_failure(store: IdempotencyStore, claimed: _Lease, exc: Exception, attempts: int,
                    max_attempts: int, report: RecoveryReport) -> None:
    ident = (claimed.tenant, claimed.thread_id)
    logger.error("resuming %s/%s failed (attempt %s)", *ident, attempts, exc_info=exc)
    keys = store.tenant_keys(claimed.tenant)
    text = f"{type(exc).__name__}: {exc}"
    if store.saver is not None:  # the error text through the saver's redactor
        text = store.saver._redact_for_store(keys, claimed.thread_id, text, RECOVERY_CHANNEL)
    sealed = keys.seal(text.encode("utf-8", "replace"),
                       _error_aad(claimed.tenant, claimed.thread_id, "last"))
    if attempts >= max_attempts:
        letter = uuid.uuid4().hex
        with store._begin("recording a dead letter") as conn:
            conn.execute(_D.insert().values(
                letter_id=letter, tenant=claimed.tenant, thread_id=claimed.thread_id,
                at=store._now, attempts=attempts, worker=claimed.owner,
                error_type=type(exc).__name__[:255],
                error=keys.seal(text.encode("utf-8", "replace"),
                                _error_aad(claimed.tenant, claimed.thread_id, letter))))
        claimed.release(DEAD, last_error=sealed)
        report.dead_lettered.append(ident)
        logger.error("thread %s/%s dead-lettered after %s attempts: %s", *ident, attempts,
                     type(exc).__name__)
    else:
        claimed.release(last_error=sealed)
        report.failed.append(ident)


async def arecover_stalled(graph: Any, saver: SecureSaver | None = None, *,
                           older_than: float, tenant: str | None = None, max_attempts: int = 3,
                           worker_id: str | None = None, lease: float = 300.0,
                           limit: int | None = None, durability: str = "sync") -> RecoveryReport:
    """Async :func:`recover_stalled`, for graphs on async savers (``AsyncPostgresSaver``,
    ``AsyncSqliteSaver``, LangGraph Server): reads state with ``aget_state``, resumes with
    ``ainvoke``; the database work of the leases runs in worker threads, never on the loop."""
    import asyncio
    sv = _saver_of(saver if saver is not None else getattr(graph, "checkpointer", None), None)
    store = IdempotencyStore.for_saver(sv)
    owner = worker_id or f"{default_owner()}:{uuid.uuid4().hex[:6]}"
    report = RecoveryReport(owner)
    for ten, thread_id in await asyncio.to_thread(_candidates, store, tenant, limit):
        report.examined += 1
        claimed = await asyncio.to_thread(_claim, store, ten, thread_id, owner, lease)
        if claimed is None:
            report.skipped_busy += 1
            continue
        try:
            try:
                config = await asyncio.to_thread(_resume_config, store, claimed)
            except _ForgedOptIn as exc:
                await asyncio.to_thread(_refuse, claimed, report, exc)
                continue
            await _arecover_one(graph, store, claimed, config, report, older_than=older_than,
                                max_attempts=max_attempts, durability=durability)
        except Exception:
            logger.exception("recovery of %s/%s failed outside the run", ten, thread_id)
            await asyncio.to_thread(claimed.release)
    return report


async def _arecover_one(graph: Any, store: IdempotencyStore, claimed: _Lease,
                        config: RunnableConfig, report: RecoveryReport, *, older_than: float,
                        max_attempts: int, durability: str) -> None:
    import asyncio
    ident = (claimed.tenant, claimed.thread_id)
    snap = await graph.aget_state(config)
    attempts = await asyncio.to_thread(_precheck, store, claimed, snap, report, older_than)
    if attempts is None:
        return
    stop = asyncio.Event()

    async def beat() -> None:
        while True:
            try:
                await asyncio.wait_for(stop.wait(), timeout=claimed.lease / 3)
                return
            except asyncio.TimeoutError:
                pass
            try:
                if not await asyncio.to_thread(claimed.renew):
                    logger.warning("recovery lease of %s/%s lost", *ident)
                    return
            except Exception:
                logger.exception("could not renew a recovery lease")

    beating = asyncio.create_task(beat())
    try:
        await graph.ainvoke(None, config, durability=durability)
    except Exception as exc:  # noqa: BLE001 - any failure of the run counts as an attempt
        stop.set()
        await beating
        await asyncio.to_thread(_record_failure, store, claimed, exc, attempts, max_attempts,
                                report)
        return
    finally:
        stop.set()
        if not beating.done():
            await beating
    after = await graph.aget_state(config)
    await asyncio.to_thread(claimed.release, DONE if not after.next else ARMED,
                            last_error=None)
    report.resumed.append(ident)


def dead_letters_of(saver: SecureSaver, *, tenant: str | None = None) -> list[DeadLetter]:
    """The dead letters (errors decrypted), oldest first."""
    store = IdempotencyStore.for_saver(saver)
    q = sa.select(_D).order_by(_D.c.at)
    if tenant is not None:
        q = q.where(_D.c.tenant == tenant)
    with store._begin("listing dead letters") as conn:
        rows = conn.execute(q).mappings().all()
    out = []
    for r in rows:
        error = None
        if r["error"] is not None:
            error = store.tenant_keys(r["tenant"]).open(
                bytes(r["error"]), _error_aad(r["tenant"], r["thread_id"], r["letter_id"])
            ).decode("utf-8", "replace")
        out.append(DeadLetter(r["letter_id"], r["tenant"], r["thread_id"], r["at"],
                              r["attempts"], r["worker"], r["error_type"], error))
    return out


def recovery_state(saver: SecureSaver, tenant: str, thread_id: str) -> dict[str, Any] | None:
    """The recovery row of a thread (state, attempts, owner, fencing token), or None."""
    store = IdempotencyStore.for_saver(saver)
    with store._begin("reading a recovery row") as conn:
        r = conn.execute(sa.select(_R.c.state, _R.c.attempts, _R.c.owner, _R.c.fencing_token)
                         .where(_R.c.tenant == tenant, _R.c.thread_id == thread_id)).first()
    return dict(r._mapping) if r is not None else None


# --------------------------------------------------------------------------------------------
def load_graph(graph_ref: str, saver: SecureSaver) -> Any:
    """``"package.module:attr"`` -> a compiled graph using ``saver``.

    ``attr`` may be a compiled graph (re-bound to ``saver``), a ``StateGraph`` builder
    (compiled with ``saver``), or a callable ``factory(saver) -> compiled graph``.
    """
    module_name, sep, attr = graph_ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"graph reference must look like 'module:attr', got "
                                 f"{graph_ref!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if hasattr(obj, "get_state") and hasattr(obj, "copy"):
        return obj.copy(update={"checkpointer": saver})
    if hasattr(obj, "compile"):
        return obj.compile(checkpointer=saver)
    if callable(obj):
        return obj(saver)
    raise ConfigurationError(f"{graph_ref!r} is not a graph, a StateGraph or a factory")


_ASYNC_SCHEMES = {"sqlite+aiosqlite:": "sqlite:",
                  "postgresql+psycopg_async:": "postgresql:",
                  "postgres+psycopg_async:": "postgresql:"}


def async_url(url: str) -> str | None:
    """``sqlite+aiosqlite:///x.db`` / ``postgresql+psycopg_async://...`` (the SQLAlchemy names
    of the async drivers) -> the plain URL to open with ``SecureSaver.afrom_url``; None for a
    sync URL."""
    for prefix, plain in _ASYNC_SCHEMES.items():
        if url.startswith(prefix):
            return plain + url[len(prefix):]
    return None


def recover_main(url: str, graph_ref: str, *, keyring: str | None = None,
                 older_than: float = 300.0, tenant: str | None = None, max_attempts: int = 3,
                 worker_id: str | None = None, lease: float = 300.0, limit: int | None = None,
                 durability: str = "sync", use_async: bool | None = None,
                 **saver_options: Any) -> RecoveryReport:
    """Entry point for ``securesaver recover``: one sweep over the database at ``url``.

    ``keyring`` is a keyring file path (default: ``SECURESAVER_MASTER_KEY``);
    ``saver_options`` go to ``SecureSaver.from_url`` (e.g. ``redaction=None``). An async URL
    (``sqlite+aiosqlite:///...``, ``postgresql+psycopg_async://...``) or ``use_async=True``
    opens the saver with ``SecureSaver.afrom_url`` (an async inner saver, as LangGraph Server
    uses) and sweeps with :func:`arecover_stalled`.
    """
    from ..keyring import Keyring
    from ..saver import SecureSaver
    plain = async_url(url)
    if plain is not None or use_async:
        import asyncio
        return asyncio.run(_arecover_main(
            plain or url, graph_ref, keyring=keyring, older_than=older_than, tenant=tenant,
            max_attempts=max_attempts, worker_id=worker_id, lease=lease, limit=limit,
            durability=durability, **saver_options))
    ring = Keyring.load(keyring)
    with SecureSaver.from_url(url, keyring=ring, **saver_options) as saver:
        graph = load_graph(graph_ref, saver)
        report = recover_stalled(graph, saver, older_than=older_than, tenant=tenant,
                                 max_attempts=max_attempts, worker_id=worker_id, lease=lease,
                                 limit=limit, durability=durability)
    _log_sweep(report)
    return report


async def _arecover_main(url: str, graph_ref: str, *, keyring: str | None, older_than: float,
                         tenant: str | None, max_attempts: int, worker_id: str | None,
                         lease: float, limit: int | None, durability: str,
                         **saver_options: Any) -> RecoveryReport:
    import asyncio

    from ..keyring import Keyring
    from ..saver import SecureSaver
    ring = await asyncio.to_thread(Keyring.load, keyring)
    async with SecureSaver.afrom_url(url, keyring=ring, **saver_options) as saver:
        graph = load_graph(graph_ref, saver)
        report = await arecover_stalled(graph, saver, older_than=older_than, tenant=tenant,
                                        max_attempts=max_attempts, worker_id=worker_id,
                                        lease=lease, limit=limit, durability=durability)
    _log_sweep(report)
    return report


def _log_sweep(report: RecoveryReport) -> None:
    logger.info("recovery sweep by %s: examined %s, resumed %s, failed %s, dead-lettered %s",
                report.worker_id, report.examined, len(report.resumed), len(report.failed),
                len(report.dead_lettered))
