"""IdempotencyStore on real databases (SQLite files and PostgreSQL): claims, replays, leases,
fencing, fingerprints, failures, sealing, deletion, failing closed."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import ToolMessage

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.idempotency import (
    Claim,
    Hit,
    IdempotencyAttemptsExhausted,
    IdempotencyConflict,
    IdempotencyKeyReused,
    IdempotencyLeaseLost,
    IdempotencyOutcomeUnknown,
    IdempotencyPolicy,
    IdempotencyStore,
    IdempotencyStoreUnavailable,
    KeyScope,
)
from langgraph_securesaver.idempotency.schema import idempotency_records

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SecureSaver]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as s:
        yield s


@pytest.fixture
def store(saver: SecureSaver) -> IdempotencyStore:
    st = IdempotencyStore.for_saver(saver)
    st.setup()
    return st


def new_scope(tenant: str = "acme", thread: str = "t1", name: str = "op") -> KeyScope:
    return KeyScope(tenant, thread, "k-" + uuid.uuid4().hex, "business", name)


class Counter:
    def __init__(self, value: Any = "done", delay: float = 0.0) -> None:
        self.calls = 0
        self.value = value
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, claim: Claim) -> Any:
        with self.lock:
            self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        return self.value


def fp(store: IdempotencyStore, args: Any, tenant: str = "acme") -> str:
    from langgraph_securesaver.idempotency.keys import fingerprint
    return fingerprint(store.tenant_keys(tenant), args)


def until(fn: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll fn until it returns a truthy value (bounded; never a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


# --- basic contract -------------------------------------------------------------------------
def test_first_call_executes_then_replays_stored_result(store: IdempotencyStore) -> None:
    scope = new_scope()
    value = ToolMessage(content="sent", tool_call_id="c1", name="send_email",
                        artifact={"id": 7})
    fn = Counter(value)
    first = store.execute(scope, fn)
    second = store.execute(scope, fn)
    assert fn.calls == 1
    assert (first.replayed, second.replayed) == (False, True)
    assert isinstance(second.value, ToolMessage)
    assert second.value.content == "sent" and second.value.artifact == {"id": 7}
    rec = store.get(scope.tenant, scope.thread_id, scope.key)
    assert rec is not None
    assert (rec.state, rec.attempts, rec.fencing_token, rec.has_result) == (
        "completed", 1, 1, True)


def test_results_are_sealed_and_bound_to_tenant_thread_and_key(store: IdempotencyStore) -> None:
    scope = new_scope()
    store.execute(scope, Counter({"card": "4111-SECRET-1111"}))
    with store.engine.begin() as conn:
        raw = conn.execute(sa.select(idempotency_records.c.result).where(
            idempotency_records.c.key == scope.key)).scalar_one()
    assert b"SECRET" not in bytes(raw)
    store.tenant_keys("other-tenant")
    # copy the row to another thread, another tenant and another key: none of them opens
    moved = [KeyScope("acme", "t2", scope.key, "business", "op"),
             KeyScope("other-tenant", "t1", scope.key, "business", "op"),
             KeyScope("acme", "t1", "k-forged", "business", "op")]
    cols = [c for c in idempotency_records.c if c.name not in ("tenant", "thread_id", "key")]
    with store.engine.begin() as conn:
        for m in moved:
            conn.execute(idempotency_records.insert().from_select(
                ["tenant", "thread_id", "key", *[c.name for c in cols]],
                sa.select(sa.literal(m.tenant), sa.literal(m.thread_id), sa.literal(m.key),
                          *cols).where(idempotency_records.c.key == scope.key,
                                       idempotency_records.c.tenant == "acme",
                                       idempotency_records.c.thread_id == "t1")))
    for m in moved:
        fn = Counter()
        with pytest.raises(TamperedDataError):
            store.execute(m, fn)
        assert fn.calls == 0


def test_fingerprint_mismatch_raises_key_reused(store: IdempotencyStore) -> None:
    scope = new_scope()
    fn = Counter()
    store.execute(scope, fn, fingerprint=fp(store, {"amount": 10}))
    with pytest.raises(IdempotencyKeyReused):
        store.execute(scope, fn, fingerprint=fp(store, {"amount": 11}))
    assert fn.calls == 1
    # same arguments in another key order: same canonical fingerprint, replayed
    out = store.execute(scope, fn, fingerprint=fp(store, {"amount": 10}))
    assert out.replayed and fn.calls == 1


def test_fingerprint_mismatch_refuses_takeover_of_a_failed_key(store: IdempotencyStore) -> None:
    scope = new_scope()

    def boom(claim: Claim) -> Any:
        raise RuntimeError("downstream 500")

    with pytest.raises(RuntimeError):
        store.execute(scope, boom, fingerprint=fp(store, {"a": 1}))
    fn = Counter()
    with pytest.raises(IdempotencyKeyReused):
        store.execute(scope, fn, fingerprint=fp(store, {"a": 2}))
    assert fn.calls == 0


# --- leases, takeover, fencing -------------------------------------------------------------------
def test_lease_expiry_takeover_bumps_fencing_token(store: IdempotencyStore) -> None:
    scope = new_scope()
    short = IdempotencyPolicy(lease=0.3, on_conflict="raise", heartbeat=False)
    first = store.acquire(scope, policy=short)
    assert isinstance(first, Claim) and first.token == 1

    def try_take() -> Claim | None:
        try:
            got = store.acquire(scope, policy=short)
        except IdempotencyConflict:
            return None
        assert isinstance(got, Claim)
        return got

    second = until(try_take)  # possible only once the lease expired on the database clock
    assert (second.token, second.attempts) == (2, 2)
    with pytest.raises(IdempotencyLeaseLost):
        store.complete(first, "stale worker result")
    assert store.renew(first) is False
    store.complete(second, "taker result")
    out = store.execute(scope, Counter())
    assert out.replayed and out.value == "taker result" and out.fencing_token == 2
    rec = store.get(scope.tenant, scope.thread_id, scope.key)
    assert rec is not None and (rec.state, rec.fencing_token, rec.attempts) == (
        "completed", 2, 2)


def test_lease_is_measured_on_the_database_clock(store: IdempotencyStore,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    scope = new_scope()
    policy = IdempotencyPolicy(lease=30, on_conflict="raise")
    assert isinstance(store.acquire(scope, policy=policy), Claim)
    db_before = store.db_time()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 10_000)  # a worker with a wild clock
    with pytest.raises(IdempotencyConflict):
        store.acquire(scope, policy=policy)
    rec = store.get(scope.tenant, scope.thread_id, scope.key)
    assert rec is not None and rec.lease_expires_at is not None
    assert db_before < rec.lease_expires_at <= store.db_time() + 30


def test_renew_and_heartbeat_extend_the_lease(store: IdempotencyStore) -> None:
    scope = new_scope()
    policy = IdempotencyPolicy(lease=0.9, heartbeat=True)
    seen: list[float] = []

    def slow(claim: Claim) -> str:
        first = store.get(scope.tenant, scope.thread_id, scope.key)
        assert first is not None and first.lease_expires_at is not None
        seen.append(first.lease_expires_at)

        def renewed() -> bool:
            rec = store.get(scope.tenant, scope.thread_id, scope.key)
            return bool(rec and rec.lease_expires_at and rec.lease_expires_at > seen[0])

        until(renewed)  # the heartbeat thread renewed the lease while we ran
        rec = store.get(scope.tenant, scope.thread_id, scope.key)
        assert rec is not None and rec.fencing_token == 1  # renewed, not taken over
        return "ok"

    assert store.execute(scope, slow, policy=policy).value == "ok"


def test_on_expired_unknown_then_resolve(store: IdempotencyStore) -> None:
    scope = new_scope()
    policy = IdempotencyPolicy(lease=0.2, on_expired="unknown", on_conflict="raise",
                               heartbeat=False)
    assert isinstance(store.acquire(scope, policy=policy), Claim)  # the worker then "dies"

    def unknown() -> bool:
        try:
            store.acquire(scope, policy=policy)
        except IdempotencyOutcomeUnknown:
            return True
        except IdempotencyConflict:
            return False
        raise AssertionError("an expired claim must not be re-executed under 'unknown'")

    until(unknown)
    fn = Counter()
    with pytest.raises(IdempotencyOutcomeUnknown):
        store.execute(scope, fn, policy=policy)
    rec = store.get(scope.tenant, scope.thread_id, scope.key)
    assert rec is not None and rec.state == "unknown"
    assert store.resolve(scope.tenant, scope.thread_id, scope.key, result="charged (checked)")
    out = store.execute(scope, fn, policy=policy)
    assert out.replayed and out.value == "charged (checked)" and fn.calls == 0


def test_failures_are_retried_with_the_same_key_until_max_attempts(
        store: IdempotencyStore) -> None:
    scope = new_scope()
    policy = IdempotencyPolicy(max_attempts=2)
    tokens: list[int] = []

    def boom(claim: Claim) -> Any:
        tokens.append(claim.token)
        raise ConnectionError("payment API timed out (secret detail)")

    for _ in range(2):
        with pytest.raises(ConnectionError):
            store.execute(scope, boom, policy=policy)
    assert tokens == [1, 2]
    rec = store.get(scope.tenant, scope.thread_id, scope.key)
    assert rec is not None and (rec.state, rec.attempts) == ("failed", 2)
    assert rec.error is not None and "secret detail" in rec.error  # sealed, readable by us
    with store.engine.begin() as conn:
        raw = conn.execute(sa.select(idempotency_records.c.error).where(
            idempotency_records.c.key == scope.key)).scalar_one()
    assert b"secret detail" not in bytes(raw)
    fn = Counter()
    with pytest.raises(IdempotencyAttemptsExhausted):
        store.execute(scope, fn, policy=policy)
    assert fn.calls == 0


def test_error_results_count_as_failures_not_cached(store: IdempotencyStore) -> None:
    scope = new_scope()
    err = ToolMessage(content="Error: boom", tool_call_id="c", status="error")
    first = store.execute(scope, Counter(err), is_failure=lambda v: v.status == "error")
    assert first.value.status == "error"
    second = store.execute(scope, Counter("fine"))
    assert not second.replayed and second.value == "fine" and second.attempts == 2


def test_interrupted_claim_is_released_without_counting(store: IdempotencyStore) -> None:
    from langgraph.errors import GraphInterrupt
    scope = new_scope()

    def ask(claim: Claim) -> Any:
        raise GraphInterrupt(())

    with pytest.raises(GraphInterrupt):
        store.execute(scope, ask)
    out = store.execute(scope, Counter("approved"))
    assert out.value == "approved" and out.attempts == 1


# --- concurrency --------------------------------------------------------------------------------
def test_conflict_raise_and_bounded_wait(store: IdempotencyStore) -> None:
    scope = new_scope()
    held = store.acquire(scope, policy=IdempotencyPolicy(lease=60))
    assert isinstance(held, Claim)
    fn = Counter()
    with pytest.raises(IdempotencyConflict):
        store.execute(scope, fn, policy=IdempotencyPolicy(on_conflict="raise"))
    with pytest.raises(IdempotencyConflict):
        store.execute(scope, fn, policy=IdempotencyPolicy(on_conflict="wait",
                                                          wait_timeout=0.3))
    assert fn.calls == 0
    results: list[Any] = []
    waiter = threading.Thread(target=lambda: results.append(
        store.execute(scope, fn, policy=IdempotencyPolicy(wait_timeout=30))))
    waiter.start()
    store.complete(held, "holder's result")
    waiter.join(60)
    assert results and results[0].replayed and results[0].value == "holder's result"
    assert fn.calls == 0


def test_eight_threads_racing_execute_once(store: IdempotencyStore) -> None:
    scope = new_scope()
    fn = Counter("once", delay=0.05)
    barrier = threading.Barrier(8)
    outcomes: list[Any] = []
    errors: list[BaseException] = []

    def worker() -> None:
        barrier.wait()
        try:
            outcomes.append(store.execute(scope, fn, fingerprint=fp(store, {"x": 1})))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert fn.calls == 1
    assert len(outcomes) == 8 and {o.value for o in outcomes} == {"once"}
    assert sorted(o.replayed for o in outcomes) == [False] + [True] * 7


def test_eight_threads_racing_to_retry_a_failed_key_execute_once(
        store: IdempotencyStore) -> None:
    """The takeover is a compare-and-set: all racers see 'failed', one wins the UPDATE."""
    scope = new_scope()

    def boom(claim: Claim) -> Any:
        raise RuntimeError("first attempt failed")

    with pytest.raises(RuntimeError):
        store.execute(scope, boom)
    for _ in range(3):  # repeat: the window between reading 'failed' and the UPDATE is small
        fn = Counter("retried", delay=0.05)
        barrier = threading.Barrier(8)
        outcomes: list[Any] = []

        def worker(fn: Counter = fn, barrier: threading.Barrier = barrier,
                   outcomes: list[Any] = outcomes) -> None:
            barrier.wait()
            outcomes.append(store.execute(scope, fn, policy=IdempotencyPolicy(max_attempts=50)))

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert fn.calls == 1 and len(outcomes) == 8
        assert sorted(o.replayed for o in outcomes) == [False] + [True] * 7
        with store.engine.begin() as conn:  # back to 'failed' for the next round
            conn.execute(idempotency_records.update().where(
                idempotency_records.c.key == scope.key).values(state="failed", result=None))


async def test_async_duplicates_execute_once(store: IdempotencyStore) -> None:
    scope = new_scope()
    calls = 0

    async def effect(claim: Claim) -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return "async-once"

    outs = await asyncio.gather(*[store.aexecute(scope, effect) for _ in range(5)])
    assert calls == 1
    assert sorted(o.replayed for o in outs) == [False, True, True, True, True]
    assert {o.value for o in outs} == {"async-once"}
    hit = await store.aacquire(scope)
    assert isinstance(hit, Hit) and hit.value == "async-once"


# --- failing closed -----------------------------------------------------------------------------
def test_store_unavailable_fails_closed_when_the_table_is_gone(store: IdempotencyStore) -> None:
    scope = new_scope()
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE securesaver_idempotency"))
    fn = Counter()
    with pytest.raises(IdempotencyStoreUnavailable):
        store.execute(scope, fn)
    assert fn.calls == 0


def test_store_unavailable_fails_closed_when_the_server_is_unreachable(
        saver: SecureSaver) -> None:
    dead = sa.create_engine("postgresql+psycopg://postgres@127.0.0.1:1/none",
                            connect_args={"connect_timeout": 2})
    store = IdempotencyStore(dead, saver.keys, saver.serde)
    saver.keys.keys_for("acme")  # keys cached: only the store's database is down
    fn = Counter()
    with pytest.raises(IdempotencyStoreUnavailable):
        store.execute(new_scope(), fn)
    assert fn.calls == 0


def test_result_that_cannot_be_serialized_marks_unknown(store: IdempotencyStore) -> None:
    from langgraph_securesaver.idempotency import IdempotencyError
    scope = new_scope()
    with pytest.raises(IdempotencyError):
        store.execute(scope, Counter(object()))
    rec = store.get(scope.tenant, scope.thread_id, scope.key)
    assert rec is not None and rec.state == "unknown"


# --- deletion -----------------------------------------------------------------------------------
async def test_delete_thread_and_tenant(store: IdempotencyStore) -> None:
    a1, a1b, a2 = new_scope(thread="t1"), new_scope(thread="t1"), new_scope(thread="t2")
    b1 = new_scope(tenant="beta", thread="t1")
    for s in (a1, a1b, a2, b1):
        store.execute(s, Counter())
    assert store.delete_thread("acme", "t1") == 2
    assert store.get("acme", "t1", a1.key) is None
    assert store.get("acme", "t2", a2.key) is not None
    assert store.get("beta", "t1", b1.key) is not None  # same thread id, other tenant: kept
    assert await store.adelete_tenant("acme") == 1
    assert store.list_records("acme") == []
    assert await store.adelete_thread("beta", "t1") == 1
    # a deleted key executes again
    fn = Counter()
    store.execute(a1, fn)
    assert fn.calls == 1
