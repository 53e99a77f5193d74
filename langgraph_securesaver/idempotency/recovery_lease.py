"""The recovery lease of a thread: which process runs it now, and whether that process lives.

One row of ``securesaver_recoverable`` per opted-in thread holds at most one lease. The process
running the thread holds it: the worker from its opt-in (``mark_recoverable``) until its run
ends, a recoverer while it resumes the thread. A holder records the same identity as an
idempotency claim (host id, pid and start time, random id, PostgreSQL session lock, see
``liveness.py``) and a heartbeat renews the lease on the DATABASE clock while the run goes on.
A recoverer takes a lease only when it is free, expired on the database clock, or its holder is
dead; a live holder keeps it, whatever any clock says. Taking a lease always raises the fencing
token, so a stale holder's later writes match no row, and a recoverer's checkpoint writes
carry the token of its lease (:data:`FENCE`): the saver refuses them once the lease has
changed hands (:func:`check_fence`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa

from ..registry.dialects import absent_insert, changed_row, insert_if_absent
from .errors import RecoveryLeaseLost
from .liveness import (
    Liveness,
    is_running_here,
    local_liveness,
    register_running,
    unregister_running,
)
from .schema import HOLDER_COLUMNS, recoverable_threads
from .store import IdempotencyStore

if TYPE_CHECKING:
    from ..services import SaverLike

logger = logging.getLogger("langgraph_securesaver.idempotency.recovery")

_R = recoverable_threads
ARMED, DONE, DEAD = "armed", "done", "dead"
#: the key part of the liveness identity of a recovery lease (idempotency keys are hex)
LEASE_KEY = "__recovery__"
#: seconds a lease lasts without renewal (renewed every third of it while its holder runs)
DEFAULT_LEASE = 300.0
#: the configurable key of a recoverer's run: the fencing token of its lease. LangGraph hands
#: the run's configurable to every ``put`` / ``put_writes``; keys starting with ``__`` are
#: never copied into checkpoint metadata nor into the sealed opt-in configurable.
FENCE = "__securesaver_recovery_fence__"


def _ident(tenant: str, thread_id: str, token: int) -> tuple[str, str, str, int]:
    return (tenant, thread_id, LEASE_KEY, token)


def holder_values(store: IdempotencyStore) -> dict[str, Any]:
    """The holder columns this process writes on a lease it takes."""
    me = store.holder()
    session = store.pg_session
    return {"holder_host": me.host_id, "holder_pid": me.pid, "holder_start": me.start,
            "holder_nonce": me.nonce,
            "holder_lock": session.key() if session is not None else None}


_NO_HOLDER = {name: None for name in HOLDER_COLUMNS}


@dataclass
class Lease:
    """A recovery lease this process holds (``kind``: ``run`` for a worker's own run,
    ``recovery`` for a recoverer's resume)."""

    store: IdempotencyStore
    tenant: str
    thread_id: str
    token: int
    owner: str
    lease: float
    kind: str
    sealed_conf: bytes | None = None
    active_at: float | None = None  # last activity before this lease was taken
    now: float | None = None        # the database clock when it was taken
    ended: bool = field(default=False)
    superseded: bool = False        # (an opt-in) the previous run had stalled, see opt_in

    def where(self) -> list[sa.ColumnElement[bool]]:
        return [_R.c.tenant == self.tenant, _R.c.thread_id == self.thread_id,
                _R.c.fencing_token == self.token]

    def update(self, what: str, **values: Any) -> Any:
        with self.store._begin(what) as conn:
            return changed_row(conn, _R.update().where(*self.where()).values(
                updated_at=self.store._now, **values), None, (_R.c.attempts,), self.where())

    def renew(self) -> bool:
        now = self.store._now
        # the application's own run records activity; a recoverer's attempts do not (they
        # are bounded by max_attempts, not by older_than)
        extra = {"active_at": now} if self.kind == "run" else {}
        return self.update("renewing a recovery lease", lease_expires_at=now + self.lease,
                           **extra) is not None

    def release(self, state: str = ARMED, **values: Any) -> bool:
        """Give the lease back (once); the end of the application's run is activity."""
        if self.ended:
            return False
        self.ended = True
        _holds.forget(self)
        extra = {"active_at": self.store._now} if self.kind == "run" else {}
        try:
            return self.update("releasing a recovery lease", state=state, owner=None,
                               lease_expires_at=None, **_NO_HOLDER, **extra,
                               **values) is not None
        finally:
            unregister_running(_ident(self.tenant, self.thread_id, self.token))


    def abandon(self) -> None:
        """Stop renewing a lease found lost (another process took it over)."""
        self.ended = True
        _holds.forget(self)
        unregister_running(_ident(self.tenant, self.thread_id, self.token))


class _Holds:
    """The leases this process holds, and the daemon thread renewing them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[tuple[int, str, str], tuple[Lease, float]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._leases[(id(lease.store), lease.tenant, lease.thread_id)] = (
                lease, time.monotonic() + lease.lease / 3)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="securesaver-recovery-lease")
                self._thread.start()
        self._wake.set()

    def forget(self, lease: Lease) -> None:
        with self._lock:
            key = (id(lease.store), lease.tenant, lease.thread_id)
            got = self._leases.get(key)
            if got is not None and got[0] is lease:
                del self._leases[key]

    def get(self, store: IdempotencyStore, tenant: str, thread_id: str) -> Lease | None:
        with self._lock:
            got = self._leases.get((id(store), tenant, thread_id))
        return got[0] if got is not None else None

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._leases:
                    self._thread = None
                    return
                now = time.monotonic()
                due = [lease for lease, at in self._leases.values() if at <= now]
                wait = min(at for _lease, at in self._leases.values()) - now
            for lease in due:
                try:
                    ok = lease.renew()
                except Exception:  # the store may be down for a moment
                    logger.warning("could not renew the recovery lease of %s/%s",
                                   lease.tenant, lease.thread_id, exc_info=True)
                    ok = True  # try again next round; the lease may still be valid
                with self._lock:
                    key = (id(lease.store), lease.tenant, lease.thread_id)
                    if not ok:
                        logger.warning("recovery lease of %s/%s was taken over",
                                       lease.tenant, lease.thread_id)
                        if key in self._leases and self._leases[key][0] is lease:
                            del self._leases[key]
                    elif key in self._leases:
                        self._leases[key] = (lease, time.monotonic() + lease.lease / 3)
            self._wake.wait(timeout=max(0.01, wait) if not due else 0.01)
            self._wake.clear()


_holds = _Holds()


def held_here(store: IdempotencyStore, tenant: str, thread_id: str) -> Lease | None:
    """The lease this process holds on the thread (its own run or a resume), or None."""
    return _holds.get(store, tenant, thread_id)


def held_by_this_process(store: IdempotencyStore, tenant: str, thread_id: str) -> bool:
    """True if the row's lease is held by this very process and still running here (also
    through another saver object on the same database)."""
    if held_here(store, tenant, thread_id) is not None:
        return True
    row = _select(store, tenant, thread_id)
    if row is None or row.owner is None:
        return False
    me = store.holder()
    return (row.holder_pid == me.pid and row.holder_nonce == me.nonce
            and is_running_here(_ident(tenant, thread_id, int(row.fencing_token))))


def hold(lease: Lease) -> None:
    """Keep ``lease`` renewed until it is released."""
    _holds.add(lease)


def fence_of(config: Any) -> int | None:
    """The fencing token a recoverer's run config carries, or None (any other run)."""
    token = ((config or {}).get("configurable") or {}).get(FENCE)
    return token if isinstance(token, int) and not isinstance(token, bool) else None


def check_fence(saver: SaverLike, tenant: str, thread_id: str, token: int) -> None:
    """Refuse a recoverer's write once its lease changed hands (:class:`RecoveryLeaseLost`).

    Checked just before the write reaches the inner saver (any saver, so not in its
    transaction): a write that passed the check before the lease moved still lands, but its
    checkpoint id was made before the new holder's run began, so the new run's checkpoints
    are the thread's latest."""
    store = IdempotencyStore.for_saver(saver)
    with store._begin("checking a recovery lease") as conn:
        current = conn.execute(sa.select(_R.c.fencing_token).where(
            _R.c.tenant == tenant, _R.c.thread_id == thread_id)).scalar()
    if current is None or int(current) != token:
        raise RecoveryLeaseLost(
            f"the recovery lease of thread {thread_id!r} changed hands (fencing token "
            f"{token} is stale): this recoverer's write was refused and it stops")


# --------------------------------------------------------------------------------------------
def _select(store: IdempotencyStore, tenant: str, thread_id: str) -> Any:
    with store._begin("reading a recovery row") as conn:
        return conn.execute(sa.select(
            _R.c.state, _R.c.owner, _R.c.fencing_token, _R.c.lease_expires_at, _R.c.last_error,
            _R.c.active_at, _R.c.updated_at, _R.c.created_at, store._now.label("now"),
            *(_R.c[name] for name in HOLDER_COLUMNS)).where(
                _R.c.tenant == tenant, _R.c.thread_id == thread_id)).first()


def holder_liveness(store: IdempotencyStore, tenant: str, thread_id: str, row: Any) -> Liveness:
    """Is the process holding the lease of ``row`` alive, dead, or unknown (the lease decides)?"""
    ident = _ident(tenant, thread_id, int(row.fencing_token))
    verdict = local_liveness(store.holder(), ident, row.holder_host, row.holder_pid,
                             row.holder_start, row.holder_nonce)
    if verdict != "unknown":
        return verdict
    lock, session = row.holder_lock, store.pg_session
    if (session is not None and isinstance(lock, int) and not isinstance(lock, bool)
            and 0 < lock < (1 << 63)):
        with store._begin("checking the holder's session") as conn:
            return "dead" if session.holder_gone(conn, lock) else "alive"
    return "unknown"


Verdict = Literal["busy", "gone"]


def claim(store: IdempotencyStore, tenant: str, thread_id: str, owner: str,
          lease: float) -> Lease | Verdict:
    """Take the thread's lease for a resume: only an armed row whose lease is free, expired on
    the database clock, or held by a dead process. ``"busy"``: a live (or unknown, unexpired)
    holder keeps it; ``"gone"``: the row is not armed any more."""
    row = _select(store, tenant, thread_id)
    if row is None or row.state != ARMED:
        return "gone"
    expired = row.lease_expires_at is None or float(row.lease_expires_at) < float(row.now)
    dead = False
    if not expired:
        if holder_liveness(store, tenant, thread_id, row) != "dead":
            return "busy"
        dead = True
        logger.info("recovery lease of %s/%s: its holder (pid %s) is gone", tenant, thread_id,
                    row.holder_pid)
    seen = int(row.fencing_token)
    ident = _ident(tenant, thread_id, seen + 1)
    register_running(ident)  # before the row changes hands: this process is alive for it
    now = store._now
    free = sa.or_(_R.c.lease_expires_at.is_(None), _R.c.lease_expires_at < now)
    stmt = (_R.update().where(
        _R.c.tenant == tenant, _R.c.thread_id == thread_id, _R.c.state == ARMED,
        _R.c.fencing_token == seen, *(() if dead else (free,)))
        .values(owner=owner, lease_expires_at=now + lease, fencing_token=seen + 1,
                updated_at=now, **holder_values(store)))
    try:
        with store._begin("claiming a thread") as conn:
            r = changed_row(conn, stmt, None, (_R.c.fencing_token, _R.c.configurable),
                            (_R.c.tenant == tenant, _R.c.thread_id == thread_id))
    except BaseException:
        unregister_running(ident)
        raise
    if r is None:
        unregister_running(ident)
        return "busy"
    active = row.active_at if row.active_at is not None else row.updated_at
    got = Lease(store, tenant, thread_id, int(r.fencing_token), owner, lease, "recovery",
                bytes(r.configurable) if r.configurable is not None else None,
                float(active) if active is not None else None, float(row.now))
    return got


def _upsert_values(store: IdempotencyStore, sealed: bytes, owner: str,
                   lease: float) -> dict[str, Any]:
    now = store._now
    return {"state": ARMED, "owner": owner, "attempts": 0, "lease_expires_at": now + lease,
            "updated_at": now, "active_at": now, "configurable": sealed, "last_error": None,
            **holder_values(store)}


def stalled(store: IdempotencyStore, row: Any, tenant: str, thread_id: str) -> bool:
    """Did the thread's previous run stop without ending, its remaining tasks waiting for a
    recoverer? Its holder went away with the lease (expired, or its process is gone), or a
    recoverer's failed attempt left it armed for the next one."""
    if row is None or row.state != ARMED:
        return False
    if row.owner is None:
        return row.last_error is not None
    expired = row.lease_expires_at is not None and float(row.lease_expires_at) < float(row.now)
    return expired or holder_liveness(store, tenant, thread_id, row) == "dead"


def opt_in(store: IdempotencyStore, tenant: str, thread_id: str, sealed: bytes, owner: str,
           lease: float = DEFAULT_LEASE) -> Lease:
    """A new opt-in by the process about to run the thread: armed, attempts reset, and the
    lease taken for this process (fencing token + 1, whoever held it: a recoverer still
    resuming the thread has its next checkpoint write refused). ``superseded`` on the lease
    says the thread's previous run had stalled (:func:`stalled`): LangGraph drops its
    remaining tasks when the new turn's input arrives, so the caller reports it."""
    for _ in range(20):
        row = _select(store, tenant, thread_id)
        seen = None if row is None else int(row.fencing_token)
        token = 1 if seen is None else seen + 1
        ident = _ident(tenant, thread_id, token)
        register_running(ident)
        values = _upsert_values(store, sealed, owner, lease)
        try:
            with store._begin("marking a thread recoverable") as conn:
                if seen is None:
                    done = _insert(store, conn, tenant, thread_id, values)
                else:
                    done = conn.execute(_R.update().where(
                        _R.c.tenant == tenant, _R.c.thread_id == thread_id,
                        _R.c.fencing_token == int(seen)).values(
                            fencing_token=token, **values)).rowcount == 1
        except BaseException:
            unregister_running(ident)
            raise
        if done:
            got = Lease(store, tenant, thread_id, token, owner, lease, "run",
                        superseded=stalled(store, row, tenant, thread_id))
            hold(got)
            return got
        unregister_running(ident)
    raise RuntimeError(f"could not opt thread {thread_id!r} in: its row keeps changing")


def _insert(store: IdempotencyStore, conn: Any, tenant: str, thread_id: str,
            values: dict[str, Any]) -> bool:
    return insert_if_absent(conn, absent_insert(store.dialect, _R, {
        "tenant": tenant, "thread_id": thread_id, "fencing_token": 1, "created_at": store._now,
        **values}), {})


def rearm(store: IdempotencyStore, tenant: str, thread_id: str) -> bool:
    """Re-arm a dead-lettered thread (a fresh attempt budget; nobody holds it)."""
    now = store._now
    with store._begin("re-arming a thread") as conn:
        return conn.execute(_R.update().where(
            _R.c.tenant == tenant, _R.c.thread_id == thread_id, _R.c.state == DEAD).values(
                state=ARMED, attempts=0, owner=None, lease_expires_at=None, last_error=None,
                updated_at=now, active_at=now, fencing_token=_R.c.fencing_token + 1,
                **_NO_HOLDER)).rowcount == 1
