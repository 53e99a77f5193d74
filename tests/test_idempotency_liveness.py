"""Who holds a claim and whether it is alive: two hosts, slow live holders, reused pids, old and
forged holder columns, clock skew, racing takeovers, and the schema upgrade of older tables.

Every test runs on SQLite (a file) and on the real PostgreSQL. No timing assertions: orders of
events are checked on the database clock, and "did not wait for the lease" is shown with leases
far longer than the test could run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import (
    Claim,
    IdempotencyConflict,
    IdempotencyLeaseLost,
    IdempotencyPolicy,
    IdempotencyStore,
    KeyScope,
)
from langgraph_securesaver.idempotency.liveness import current_holder, process_start
from langgraph_securesaver.idempotency.schema import HOLDER_COLUMNS, idempotency_records

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SCRIPTS = Path(__file__).parent / "idem_scripts"
_T = idempotency_records
RAISE = IdempotencyPolicy(on_conflict="raise")


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def ring() -> Keyring:
    return Keyring.generate()


@pytest.fixture
def saver(url: str, ring: Keyring) -> Iterator[SecureSaver]:
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as s:
        yield s


def store_on(saver: SecureSaver, host_id: str | None = None) -> IdempotencyStore:
    st = IdempotencyStore(saver.registry.engine, saver.keys, saver.serde, saver=saver,
                          host_id=host_id)
    st.setup()
    return st


def new_scope() -> KeyScope:
    return KeyScope("acme", "t1", "k-" + uuid.uuid4().hex, "business", "op")


def until(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)


def row_of(store: IdempotencyStore, scope: KeyScope) -> dict[str, Any]:
    with store.engine.begin() as conn:
        r = conn.execute(sa.select(_T).where(_T.c.key == scope.key)).mappings().one()
    return dict(r)


def forge(store: IdempotencyStore, scope: KeyScope, **values: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(_T.update().where(_T.c.key == scope.key).values(**values))


def takes_over(store: IdempotencyStore, scope: KeyScope,
               policy: IdempotencyPolicy = RAISE) -> Claim | None:
    try:
        got = store.acquire(scope, policy=policy)
    except IdempotencyConflict:
        return None
    assert isinstance(got, Claim)
    return got


# --- the holder is recorded -----------------------------------------------------------------------
def test_claims_record_the_holder(saver: SecureSaver) -> None:
    store = store_on(saver)
    scope = new_scope()
    claim = store.acquire(scope)
    assert isinstance(claim, Claim)
    row = row_of(store, scope)
    me = current_holder()
    assert (row["holder_pid"], row["holder_start"], row["holder_nonce"]) == (
        os.getpid(), process_start(os.getpid()), me.nonce)
    assert row["holder_host"] == me.host_id and me.host_id is not None
    if store.dialect == "postgresql":
        assert isinstance(row["holder_lock"], int)  # the session advisory lock's key
    else:
        assert row["holder_lock"] is None
    store.complete(claim, "ok")


# --- two hosts -------------------------------------------------------------------------------------
def test_other_host_holder_is_taken_over_only_after_its_lease(saver: SecureSaver) -> None:
    """Host B cannot check host A's pid: a claim that stops being renewed is taken over once its
    lease has run out on the database clock, not before (A's session is still alive here, so
    on PostgreSQL too only the lease decides)."""
    host_a, host_b = store_on(saver, "host-a"), store_on(saver, "host-b")
    scope = new_scope()
    held = host_a.acquire(scope, policy=IdempotencyPolicy(lease=2.0))  # never renewed
    assert isinstance(held, Claim)
    expires = row_of(host_a, scope)["lease_expires_at"]
    assert takes_over(host_b, scope) is None  # A's lease is valid: B may not take over
    taken = until(lambda: takes_over(host_b, scope))
    assert (taken.token, taken.attempts) == (2, 2)
    row = row_of(host_b, scope)
    assert row["updated_at"] >= expires  # the takeover happened after the lease, DB clock
    assert row["holder_host"] == "host-b"
    with pytest.raises(IdempotencyLeaseLost):
        host_a.complete(held, "stale")  # fenced out
    host_b.complete(taken, "from b")
    assert host_a.execute(scope, lambda c: "again").value == "from b"


def test_same_host_dead_holder_is_taken_over_before_its_lease(saver: SecureSaver) -> None:
    """The same holder row, but the holder's host is ours and its process is gone."""
    store = store_on(saver)
    scope = new_scope()
    held = store.acquire(scope, policy=IdempotencyPolicy(lease=600))
    assert isinstance(held, Claim)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    forge(store, scope, holder_pid=gone.pid, holder_nonce="0" * 32)
    taken = takes_over(store, scope)  # at once: the lease has 10 minutes to go
    assert taken is not None and taken.token == 2


@pytest.mark.postgres
def test_postgres_other_host_holder_whose_session_died_is_taken_over(pg_url: str,
                                                                     ring: Keyring) -> None:
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None) as saver:
        host_a, host_b = store_on(saver, "host-a"), store_on(saver, "host-b")
        scope = new_scope()
        held = host_a.acquire(scope, policy=IdempotencyPolicy(lease=600))
        assert isinstance(held, Claim)
        assert takes_over(host_b, scope) is None  # A's session holds its lock: alive
        assert host_a._session is not None
        host_a._session.close()  # A's connection drops, as when its process dies
        taken = takes_over(host_b, scope)
        assert taken is not None and taken.token == 2


# --- a live holder that is slow ----------------------------------------------------------------------
def test_slow_live_holder_on_another_host_is_waited_for(saver: SecureSaver) -> None:
    """The effect runs longer than the lease itself; the heartbeat keeps the claim, so the
    duplicate on another host waits and then gets the stored result: one execution."""
    host_a, host_b = store_on(saver, "host-a"), store_on(saver, "host-b")
    scope = new_scope()
    policy = IdempotencyPolicy(lease=0.6, wait_timeout=60)  # heartbeat every 0.2 s
    executions: list[int] = []
    started = threading.Event()

    def slow(claim: Claim) -> str:
        started.set()
        executions.append(claim.token)
        time.sleep(2.0)  # > lease > heartbeat interval
        return "slow result"

    worker = threading.Thread(target=lambda: host_a.execute(scope, slow, policy=policy))
    worker.start()
    assert started.wait(30)
    out = host_b.execute(scope, lambda c: executions.append(-1) or "second", policy=policy)
    worker.join(60)
    assert executions == [1]  # never a second execution
    assert out.replayed and out.value == "slow result" and out.fencing_token == 1


def test_slow_live_holder_process_with_default_policy(url: str, ring: Keyring,
                                                      tmp_path: Path) -> None:
    """Another process on this host holds the key for longer than the default heartbeat
    interval; the duplicate here (default policy) waits and gets the stored result."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE slow_effects (pid INTEGER, token INTEGER)"))
    engine.dispose()
    ring.save(tmp_path / "keyring.json")
    key, marker = "slow-" + uuid.uuid4().hex, tmp_path / "started"
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        IdempotencyStore.for_saver(saver).setup()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    interval = IdempotencyPolicy().lease / 3
    holder = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "slow_holder.py"), url, str(tmp_path / "keyring.json"),
         key, str(marker), str(interval + 1.5)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        until(marker.exists, timeout=60)
        with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
            store = IdempotencyStore.for_saver(saver)
            out = store.execute(KeyScope("acme", "slow-thread", key, "business", "slow"),
                                lambda c: "second execution")
            with store.engine.begin() as conn:
                effects = conn.execute(sa.text("SELECT pid, token FROM slow_effects")).all()
    finally:
        stdout, stderr = holder.communicate(timeout=60)
    assert holder.returncode == 0, stderr
    assert json.loads(stdout.strip().splitlines()[-1]) == {"replayed": False, "token": 1}
    assert out.replayed and out.value == f"done by {holder.pid}"
    assert effects == [(holder.pid, 1)]


# --- reused pids, old and forged rows ------------------------------------------------------------------
@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    until(lambda: process_start(proc.pid) is not None)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_reused_pid_on_the_same_host_counts_as_dead(saver: SecureSaver,
                                                    sleeper: subprocess.Popen[bytes]) -> None:
    """The recorded pid belongs to a live process, but one that started at another time."""
    store = store_on(saver)
    scope = new_scope()
    assert isinstance(store.acquire(scope, policy=IdempotencyPolicy(lease=600)), Claim)
    start = process_start(sleeper.pid)
    assert start is not None
    forge(store, scope, holder_pid=sleeper.pid, holder_start=start, holder_nonce="1" * 32,
          holder_lock=None)
    assert takes_over(store, scope) is None  # that process is alive: wait
    forge(store, scope, holder_start=start - 1)  # same pid, another process
    taken = takes_over(store, scope)
    assert taken is not None and taken.token == 2


@pytest.mark.parametrize("columns", [
    {name: None for name in HOLDER_COLUMNS},                       # no holder recorded
    {"holder_pid": -1},                                             # never a process group
    {"holder_pid": 0},
    {"holder_pid": 1 << 30},
    {"holder_host": "another-host", "holder_pid": 999_999},
    {"holder_start": None},
    {"holder_nonce": "f" * 32},                                     # our pid, not our nonce
])
def test_missing_or_malformed_holder_columns_fall_back_to_the_lease(
        saver: SecureSaver, columns: dict[str, Any]) -> None:
    store = store_on(saver)
    scope = new_scope()
    assert isinstance(store.acquire(scope, policy=IdempotencyPolicy(lease=600)), Claim)
    forge(store, scope, **{"holder_lock": None, **columns})
    assert takes_over(store, scope) is None  # nothing known: the lease decides
    forge(store, scope, lease_expires_at=row_of(store, scope)["created_at"] - 1)
    taken = takes_over(store, scope)  # ...and once it ran out, the key is taken over
    assert taken is not None and taken.token == 2


@pytest.mark.postgres
def test_postgres_forged_lock_keys(pg_url: str, ring: Keyring) -> None:
    """A lock key nobody holds reads as a dead session (takeover, NEW fence); a key some live
    session holds reads as alive (the lease decides)."""
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None) as saver:
        a, b = store_on(saver, "host-a"), store_on(saver, "host-b")
        live = store_on(saver, "host-c")
        live_key = live._session.key() if live._session is not None else None
        assert live_key is not None
        scope = new_scope()
        assert isinstance(a.acquire(scope, policy=IdempotencyPolicy(lease=600)), Claim)
        forge(a, scope, holder_lock=live_key)
        assert takes_over(b, scope) is None
        forge(a, scope, holder_lock=-5)  # out of range: ignored, lease decides
        assert takes_over(b, scope) is None
        forge(a, scope, holder_lock=12345)
        taken = takes_over(b, scope)
        assert taken is not None and taken.token == 2


def test_dead_holder_takeover_races_yield_one_execution_per_fence(saver: SecureSaver) -> None:
    """Eight duplicates find the same dead holder at once: one takes over (fence 2) and
    executes; the others wait and replay its result. No fence ever executes twice."""
    stores = [store_on(saver) for _ in range(2)]
    scope = new_scope()
    assert isinstance(stores[0].acquire(scope, policy=IdempotencyPolicy(lease=600)), Claim)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    forge(stores[0], scope, holder_pid=gone.pid, holder_nonce="2" * 32, holder_lock=None)
    tokens: list[int] = []
    outcomes: list[Any] = []
    errors: list[BaseException] = []
    go = threading.Barrier(8)

    def effect(claim: Claim) -> str:
        tokens.append(claim.token)
        time.sleep(0.2)
        return f"fence {claim.token}"

    def run(store: IdempotencyStore) -> None:
        go.wait()
        try:
            outcomes.append(store.execute(scope, effect))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(stores[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert tokens == [2]
    assert sorted(o.replayed for o in outcomes) == [False] + [True] * 7
    assert {o.value for o in outcomes} == {"fence 2"}


def test_a_claim_this_process_dropped_is_taken_over(saver: SecureSaver) -> None:
    """A claim of this very process that no code here works on any more (its failure could
    not be recorded) is dead: the retry takes it over instead of waiting out the lease."""
    store = store_on(saver)
    scope = new_scope()
    held = store.acquire(scope, policy=IdempotencyPolicy(lease=600))
    assert isinstance(held, Claim)
    assert takes_over(store, scope) is None  # still running here
    from langgraph_securesaver.idempotency.liveness import unregister_running
    unregister_running((scope.tenant, scope.thread_id, scope.key, held.token))
    taken = takes_over(store, scope)
    assert taken is not None and taken.token == 2


# --- clocks ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("skew", [-86_400.0, 86_400.0])
def test_worker_clock_skew_changes_nothing(saver: SecureSaver, monkeypatch: pytest.MonkeyPatch,
                                           skew: float) -> None:
    """A worker whose wall clock is a day off neither takes over a live lease early nor keeps
    a dead holder's claim: leases use the database clock, process starts the kernel's ticks."""
    a, b = store_on(saver, "host-a"), store_on(saver, "host-b")
    scope = new_scope()
    assert isinstance(a.acquire(scope, policy=IdempotencyPolicy(lease=600)), Claim)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    assert takes_over(b, scope) is None
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    mine = store_on(saver)
    forge(a, scope, holder_host=mine.holder().host_id, holder_pid=gone.pid, holder_lock=None)
    taken = takes_over(mine, scope)
    assert taken is not None and taken.token == 2


@pytest.mark.postgres
def test_postgres_dropped_liveness_connection_is_reopened_with_its_key(
        pg_url: str, ring: Keyring, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server drops the holder's idle liveness connection (restart, idle timeout) while
    the process lives: the next claim notices, reconnects under the same lock key, and other
    hosts see its claims alive again instead of taking them over."""
    from langgraph_securesaver.idempotency import liveness
    monkeypatch.setattr(liveness, "_RECHECK", 0.0)  # check on every claim
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None) as saver:
        a, b = store_on(saver, "host-a"), store_on(saver, "host-b")
        first = a.acquire(new_scope(), policy=IdempotencyPolicy(lease=600))
        assert isinstance(first, Claim) and a._session is not None
        key = a._session.key()
        backend = a._session._conn.info.backend_pid
        with a.engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": backend})

        def gone() -> bool:
            with a.engine.connect() as conn:
                return not conn.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": backend}
                ).scalar()

        until(gone)
        scope = new_scope()
        second = a.acquire(scope, policy=IdempotencyPolicy(lease=600))
        assert isinstance(second, Claim)
        assert row_of(a, scope)["holder_lock"] == key  # the same key, held again
        assert a._session._conn.info.backend_pid != backend
        assert takes_over(b, scope) is None  # alive, not taken over
