"""Stalled-run recovery: resume opted-in threads whose run died, one worker per thread,
never a live one.

A thread opts in with :func:`mark_recoverable` (inside a node, or :func:`recoverable_run`
around ``invoke``); the process running it then holds the thread's recovery lease
(:mod:`.recovery_lease`: holder liveness, heartbeats on the database clock).
:func:`recover_stalled` claims each armed thread whose lease is free, expired or held by a dead
process, checks the latest checkpoint (pending tasks, no pending interrupt, the ``older_than``
floor from the last recorded activity), resumes it with ``graph.invoke(None, config)``, caps
the attempts, and records the threads that keep failing as dead letters. The side effects of
a resumed run are protected by the idempotency keys of its tools.

The user's turn wins over a recoverer: a new opt-in takes the lease whoever holds it, and the
resumed run's checkpoint writes carry its lease's fencing token, which the saver checks
(:func:`.recovery_lease.check_fence`): the recoverer's next write is refused, it stops and
reports the thread as ``yielded``. In the other order (a new turn on a stalled thread, whose
remaining tasks LangGraph then drops) the opt-in records a dead letter and logs a warning.
"""

from __future__ import annotations

import importlib
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from langchain_core.runnables import RunnableConfig

from ..errors import ConfigurationError, TamperedDataError
from ..keys.tokens import associated_data
from ..offthread import to_thread
from .context import CONFIG_KEY_CHECKPOINTER
from .errors import NoIdempotencyContext, RecoveryLeaseLost
from .recovery_lease import (
    ARMED,
    DEAD,
    DEFAULT_LEASE,
    DONE,
    FENCE,
    Lease,
    claim,
    fence_of,
    held_by_this_process,
    held_here,
    hold,
    opt_in,
    rearm,
)
from .schema import dead_letters, recoverable_threads
from .store import IdempotencyStore, default_owner

if TYPE_CHECKING:
    from ..services import SaverLike

logger = logging.getLogger(__name__)

_R = recoverable_threads
_D = dead_letters
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
    #: the lease changed hands mid-resume (the user's next turn took it): stopped writing
    yielded: list[tuple[str, str]] = field(default_factory=list)
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


def _saver_of(saver: SaverLike | None, config: RunnableConfig | None) -> SaverLike:
    from ..services import services_of
    if saver is None and config is not None:
        saver = (config.get("configurable") or {}).get(CONFIG_KEY_CHECKPOINTER)
    if saver is None or services_of(saver) is None:
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


def _run_loop(config: RunnableConfig) -> Any:
    """The LangGraph loop of the run ``config`` belongs to (a node's config), or None."""
    call = (config.get("configurable") or {}).get("__pregel_call")
    schedule = getattr(call, "keywords", {}).get("schedule_task") if call is not None else None
    loop = getattr(schedule, "__self__", None)
    stack = getattr(loop, "stack", None)
    return loop if callable(getattr(stack, "callback", None)) else None


def mark_recoverable(config: RunnableConfig | None = None, *,
                     saver: SaverLike | None = None, lease: float = DEFAULT_LEASE) -> None:
    """Opt a thread in to stalled-run recovery; this process holds its recovery lease.

    ``config`` is the run config (default: the current run's, inside a node). Its scalar
    ``configurable`` values (model names, user ids...) are stored sealed and given back to the
    resumed run. A new opt-in re-arms the thread with a fresh attempt budget and takes its
    lease for this process (heartbeated on the database clock, tied to this process's
    liveness): no recoverer resumes the thread while it runs here. Called inside a node, the
    lease is given back when the run ends (finished, failed or interrupted); called before
    ``invoke``, when :func:`release_recoverable` is called (or :func:`recoverable_run` exits)
    or the process ends. Inside a run that holds the lease (the recoverer's resume itself, or a
    run opted in before ``invoke``) it changes nothing: attempts, state and fencing token stay.
    """
    if config is None:
        try:
            from langgraph.config import get_config
            config = get_config()
        except RuntimeError:
            raise NoIdempotencyContext("mark_recoverable() outside a run needs a config") from None
    sv = _saver_of(saver, config)
    ref = sv.services.gate.resolve_ref(config, "mark_recoverable")
    store = IdempotencyStore.for_saver(sv)
    loop = _run_loop(config)
    if not _runs_here(store, ref.tenant, ref.thread_id, config):
        keys = store.tenant_keys(ref.tenant)
        extras = sv.services.pii.redact_for_store(
            keys, ref.thread_id, _scalar_configurable(config.get("configurable") or {}),
            RECOVERY_CHANNEL)
        import json
        sealed = keys.seal(json.dumps(extras, sort_keys=True).encode("utf-8"),
                           _conf_aad(ref.tenant, ref.thread_id))
        held = opt_in(store, ref.tenant, ref.thread_id, sealed,
                      f"{default_owner()}:{uuid.uuid4().hex[:6]}", lease)
        if held.superseded:
            _report_superseded(store, held)
        if loop is not None:  # released when this run's loop exits, however it ends
            _on_exit(loop.stack, held)
        elif "__pregel_call" in (config.get("configurable") or {}):
            logger.warning("mark_recoverable: the run's end cannot be observed in this "
                           "LangGraph version; thread %r stays leased until "
                           "release_recoverable() or the process ends", ref.thread_id)


def _runs_here(store: IdempotencyStore, tenant: str, thread_id: str,
               config: RunnableConfig) -> bool:
    """Does this run hold the thread's lease already (its own opt-in, or the resume it is)? A
    recoverer's lease held in this process counts only for that resume: a user's turn served
    by the same process takes the lease over like one from any other process."""
    held = held_here(store, tenant, thread_id)
    if held is not None and held.kind == "recovery":
        return fence_of(config) == held.token
    return held_by_this_process(store, tenant, thread_id)


#: the error type of the dead letter a new turn on a stalled thread records
SUPERSEDED = "StalledRunSuperseded"


def _report_superseded(store: IdempotencyStore, held: Lease) -> None:
    """A new turn opted in while the thread's previous run had stalled: LangGraph will drop
    that run's remaining tasks when this turn's input arrives, and no recoverer will resume
    them. Never silent: a warning, and a dead letter ``securesaver recover --dead-letters``
    lists."""
    logger.warning("thread %s/%s: a new turn started while its previous run had stalled; "
                   "that run's remaining tasks will not be run (dead letter %s)",
                   held.tenant, held.thread_id, SUPERSEDED)
    text = ("a new turn started while the thread's previous run had not ended (its process "
            "gone without giving the lease back, or its last resume failed); LangGraph drops "
            "that run's remaining tasks when the new input arrives: recovery will not run them")
    _dead_letter(store, held, SUPERSEDED, text, 0)


def _dead_letter(store: IdempotencyStore, held: Lease, error_type: str, text: str,
                 attempts: int) -> None:
    keys = store.tenant_keys(held.tenant)
    letter = uuid.uuid4().hex
    with store._begin("recording a dead letter") as conn:
        conn.execute(_D.insert().values(
            letter_id=letter, tenant=held.tenant, thread_id=held.thread_id, at=store._now,
            attempts=attempts, worker=held.owner, error_type=error_type[:255],
            error=keys.seal(text.encode("utf-8", "replace"),
                            _error_aad(held.tenant, held.thread_id, letter))))


def _on_exit(stack: Any, held: Lease) -> None:
    push_async = getattr(stack, "push_async_callback", None)
    if push_async is None:
        stack.callback(_release_quietly, held)
        return

    async def release() -> None:  # an async run: the database work off the event loop
        await to_thread(_release_quietly, held)

    push_async(release)


def _release_quietly(held: Lease) -> None:
    try:
        held.release()
    except Exception:  # the lease then lapses with this process or its expiry
        logger.warning("could not release the recovery lease of %s/%s", held.tenant,
                       held.thread_id, exc_info=True)


async def amark_recoverable(config: RunnableConfig | None = None, *,
                            saver: SaverLike | None = None, lease: float = DEFAULT_LEASE) -> None:
    if config is None:
        from langgraph.config import get_config
        config = get_config()
    await to_thread(mark_recoverable, config, saver=saver, lease=lease)


def release_recoverable(config: RunnableConfig, *, saver: SaverLike | None = None) -> bool:
    """Give back the recovery lease this process took with :func:`mark_recoverable` outside
    a run (the thread stays armed: if its run stopped with tasks left, recovery resumes it).
    False if this process holds no run lease on the thread."""
    sv = _saver_of(saver, config)
    ref = sv.services.gate.resolve_ref(config, "release_recoverable")
    held = held_here(IdempotencyStore.for_saver(sv), ref.tenant, ref.thread_id)
    if held is None or held.kind != "run":
        return False
    return held.release()


@contextmanager
def recoverable_run(config: RunnableConfig, *, saver: SaverLike | None = None,
                    lease: float = DEFAULT_LEASE) -> Iterator[None]:
    """``with recoverable_run(config, saver=saver): graph.invoke(inputs, config)``: opt in and
    hold the thread's recovery lease exactly while the block runs."""
    mark_recoverable(config, saver=saver, lease=lease)
    try:
        yield
    finally:
        _release_run(config, saver)


def _release_run(config: RunnableConfig, saver: SaverLike | None) -> None:
    try:
        release_recoverable(config, saver=saver)
    except Exception:  # the lease then lapses with this process or its expiry
        logger.warning("could not release the recovery lease of %r",
                       (config.get("configurable") or {}).get("thread_id"), exc_info=True)


@asynccontextmanager
async def arecoverable_run(config: RunnableConfig, *, saver: SaverLike | None = None,
                           lease: float = DEFAULT_LEASE) -> AsyncIterator[None]:
    await amark_recoverable(config, saver=saver, lease=lease)
    try:
        yield
    finally:
        await to_thread(_release_run, config, saver)


def unmark_recoverable(saver: SaverLike, tenant: str, thread_id: str) -> bool:
    store = IdempotencyStore.for_saver(saver)
    with store._begin("unmarking a thread") as conn:
        return bool(conn.execute(_R.delete().where(
            _R.c.tenant == tenant, _R.c.thread_id == thread_id)).rowcount)


def rearm_dead_letter(saver: SaverLike, tenant: str, thread_id: str) -> bool:
    """Re-arm a dead-lettered thread explicitly (fresh attempt budget); False if it is not
    dead-lettered. Its dead letters stay as the record of what failed."""
    return rearm(IdempotencyStore.for_saver(saver), tenant, thread_id)


# --------------------------------------------------------------------------------------------
def _claim(store: IdempotencyStore, tenant: str, thread_id: str, owner: str,
           lease: float) -> Lease | None:
    got = claim(store, tenant, thread_id, owner, lease)
    if isinstance(got, str):
        return None
    hold(got)  # renewed on the database clock until released
    return got


def recover_stalled(graph: Any, saver: SaverLike | None = None, *, older_than: float = 0.0,
                    tenant: str | None = None, max_attempts: int = 3,
                    worker_id: str | None = None, lease: float = DEFAULT_LEASE,
                    limit: int | None = None, durability: str = "sync") -> RecoveryReport:
    """Resume every armed thread nobody runs (its lease free, expired on the database clock,
    or its holder's process gone) whose latest checkpoint still has tasks to run. Safe to run
    from several workers at once.

    Args:
        graph: the compiled graph (its checkpointer must be ``saver``).
        saver: the SecureSaver (default: ``graph.checkpointer``).
        older_than: a floor on top of the lease: seconds on the database clock since the
            thread's last recorded activity (opt-in, heartbeat of its holder, end of a run)
            before it is resumed. 0 resumes at the first sweep after the holder is gone.
        tenant: only this tenant's threads.
        max_attempts: resume attempts before the thread is dead-lettered.
        worker_id: recorded as lease owner and on dead letters (default ``host:pid:rand``).
        lease: seconds a lease lasts without renewal (renewed while resuming); decides only
            when the holder's liveness cannot be checked (another host on SQLite).
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
    q = sa.select(_R.c.tenant, _R.c.thread_id).where(_R.c.state == ARMED)
    if tenant is not None:
        q = q.where(_R.c.tenant == tenant)
    q = q.order_by(_R.c.updated_at)
    if limit is not None:
        q = q.limit(limit)
    with store._begin("listing recoverable threads") as conn:
        candidates = [(r.tenant, r.thread_id) for r in conn.execute(q)]
    secrets.SystemRandom().shuffle(candidates)  # spread concurrent workers over the list
    return candidates


def _resume_config(store: IdempotencyStore, claimed: Lease) -> RunnableConfig:
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
    if store.services is not None:  # tokenized PII back for the owning tenant
        extras = store.services.pii.restore_for_store(keys, extras)
    # FENCE: the saver refuses this run's writes once the lease changes hands
    return {"configurable": {**extras, "thread_id": thread_id, "tenant_id": ten,
                             FENCE: claimed.token}}


class _ForgedOptIn(TamperedDataError):
    """A recovery opt-in row that does not authenticate."""


def _refuse(claimed: Lease, report: RecoveryReport, exc: _ForgedOptIn) -> None:
    logger.error("recovery of tenant %r thread %r: %s", claimed.tenant, claimed.thread_id, exc)
    report.failed.append((claimed.tenant, claimed.thread_id))
    claimed.release()


def _precheck(store: IdempotencyStore, claimed: Lease, snap: Any, report: RecoveryReport,
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
    # the floor: database clock against the last activity recorded on the database clock
    # (never a checkpoint's ts, which is the writer's clock)
    if (older_than > 0 and claimed.active_at is not None and claimed.now is not None
            and claimed.now - claimed.active_at < older_than):
        claimed.release()
        report.skipped_recent += 1
        return None
    row = claimed.update("counting a resume attempt", attempts=_R.c.attempts + 1)
    if row is None:  # lost the lease meanwhile
        claimed.abandon()
        report.skipped_busy += 1
        return None
    attempts = int(row.attempts)
    logger.info("resuming stalled thread %s/%s (attempt %s)", *ident, attempts)
    return attempts


def _recover_one(graph: Any, store: IdempotencyStore, claimed: Lease, config: RunnableConfig,
                 report: RecoveryReport, *, older_than: float, max_attempts: int,
                 durability: str) -> None:
    ident = (claimed.tenant, claimed.thread_id)
    attempts = _precheck(store, claimed, graph.get_state(config), report, older_than)
    if attempts is None:
        return
    try:
        graph.invoke(None, config, durability=durability)
    except RecoveryLeaseLost:
        _yield(claimed, report)
        return
    except Exception as exc:  # noqa: BLE001 - any failure of the run counts as an attempt
        _record_failure(store, claimed, exc, attempts, max_attempts, report)
        return
    after = graph.get_state(config)
    claimed.release(DONE if not after.next else ARMED, last_error=None)
    report.resumed.append(ident)


def _yield(claimed: Lease, report: RecoveryReport) -> None:
    """The lease changed hands mid-resume and the saver refused this run's next write: stop,
    leave the row to its new holder (not even an attempt is recorded), and report it."""
    claimed.abandon()
    report.yielded.append((claimed.tenant, claimed.thread_id))
    logger.warning("recovery of %s/%s stopped: its lease was taken by another run (the "
                   "thread's next turn); that run's checkpoints are the thread's latest",
                   claimed.tenant, claimed.thread_id)


def _record_failure(store: IdempotencyStore, claimed: Lease, exc: Exception, attempts: int,
                    max_attempts: int, report: RecoveryReport) -> None:
    ident = (claimed.tenant, claimed.thread_id)
    logger.error("resuming %s/%s failed (attempt %s)", *ident, attempts, exc_info=exc)
    keys = store.tenant_keys(claimed.tenant)
    text = f"{type(exc).__name__}: {exc}"
    if store.services is not None:  # the error text through the saver's redactor
        text = store.services.pii.redact_for_store(keys, claimed.thread_id, text, RECOVERY_CHANNEL)
    sealed = keys.seal(text.encode("utf-8", "replace"),
                       _error_aad(claimed.tenant, claimed.thread_id, "last"))
    if attempts >= max_attempts:
        _dead_letter(store, claimed, type(exc).__name__, text, attempts)
        claimed.release(DEAD, last_error=sealed)
        report.dead_lettered.append(ident)
        logger.error("thread %s/%s dead-lettered after %s attempts: %s", *ident, attempts,
                     type(exc).__name__)
    else:
        claimed.release(last_error=sealed)
        report.failed.append(ident)


async def arecover_stalled(graph: Any, saver: SaverLike | None = None, *,
                           older_than: float = 0.0, tenant: str | None = None,
                           max_attempts: int = 3, worker_id: str | None = None,
                           lease: float = DEFAULT_LEASE,
                           limit: int | None = None, durability: str = "sync") -> RecoveryReport:
    """Async :func:`recover_stalled`, for graphs on async savers (``AsyncPostgresSaver``,
    ``AsyncSqliteSaver``, LangGraph Server): reads state with ``aget_state``, resumes with
    ``ainvoke``; the database work of the leases runs in worker threads, never on the loop."""
    sv = _saver_of(saver if saver is not None else getattr(graph, "checkpointer", None), None)
    store = IdempotencyStore.for_saver(sv)
    owner = worker_id or f"{default_owner()}:{uuid.uuid4().hex[:6]}"
    report = RecoveryReport(owner)
    for ten, thread_id in await to_thread(_candidates, store, tenant, limit):
        report.examined += 1
        claimed = await to_thread(_claim, store, ten, thread_id, owner, lease)
        if claimed is None:
            report.skipped_busy += 1
            continue
        try:
            try:
                config = await to_thread(_resume_config, store, claimed)
            except _ForgedOptIn as exc:
                await to_thread(_refuse, claimed, report, exc)
                continue
            await _arecover_one(graph, store, claimed, config, report, older_than=older_than,
                                max_attempts=max_attempts, durability=durability)
        except Exception:
            logger.exception("recovery of %s/%s failed outside the run", ten, thread_id)
            await to_thread(claimed.release)
    return report


async def _arecover_one(graph: Any, store: IdempotencyStore, claimed: Lease,
                        config: RunnableConfig, report: RecoveryReport, *, older_than: float,
                        max_attempts: int, durability: str) -> None:
    ident = (claimed.tenant, claimed.thread_id)
    snap = await graph.aget_state(config)
    attempts = await to_thread(_precheck, store, claimed, snap, report, older_than)
    if attempts is None:
        return
    try:  # the lease is renewed by this process's lease thread, off the event loop
        await graph.ainvoke(None, config, durability=durability)
    except RecoveryLeaseLost:
        _yield(claimed, report)
        return
    except Exception as exc:  # noqa: BLE001 - any failure of the run counts as an attempt
        await to_thread(_record_failure, store, claimed, exc, attempts, max_attempts,
                                report)
        return
    after = await graph.aget_state(config)
    await to_thread(claimed.release, DONE if not after.next else ARMED,
                            last_error=None)
    report.resumed.append(ident)


def dead_letters_of(saver: SaverLike, *, tenant: str | None = None) -> list[DeadLetter]:
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


def recovery_state(saver: SaverLike, tenant: str, thread_id: str) -> dict[str, Any] | None:
    """The recovery row of a thread (state, attempts, owner, fencing token), or None."""
    store = IdempotencyStore.for_saver(saver)
    with store._begin("reading a recovery row") as conn:
        r = conn.execute(sa.select(_R.c.state, _R.c.attempts, _R.c.owner, _R.c.fencing_token)
                         .where(_R.c.tenant == tenant, _R.c.thread_id == thread_id)).first()
    return dict(r._mapping) if r is not None else None


# --------------------------------------------------------------------------------------------
def load_graph(graph_ref: str, saver: SaverLike) -> Any:
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
