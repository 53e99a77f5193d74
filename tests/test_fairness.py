"""Redaction that is fair between tenants and never drops a user's words.

Each reproduction (a victim charged for a neighbour's load and its data withheld, writes
outside every bound, a denial spray, vaulted numbers, reads on the loop), attacked as a hostile tenant would; no timing assertions:
what is stored, what is raised, row counts, and in which thread the work ran.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import string
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.store.memory import InMemoryStore

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver, SecureStore, tenant_scope
from langgraph_securesaver.redaction import RedactionError, RedactionPolicy, Redactor
from langgraph_securesaver.redaction import pool as pool_mod
from langgraph_securesaver.redaction.budget import WriteBudget
from langgraph_securesaver.redaction.scheduler import FairScheduler
from langgraph_securesaver.seal import SealedCodec

MD: Any = {"source": "input", "step": -1, "parents": {}}


def _cfg(thread: str, tenant: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant, "checkpoint_ns": ""}}


def _checkpoint(channel: str, value: Any) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = {channel: value}
    cp["channel_versions"] = {channel: 1}
    return cp


def _storage_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))


def _filler(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + "      ") for _ in range(n))


def _search_result(seed: int, records: int = 300) -> str:
    """A legitimate ~310 K-character tool output: records with an e-mail and a phone each."""
    rng = random.Random(seed)
    return json.dumps([{"id": i, "email": f"person.{seed}.{i}@example.com",
                        "phone": f"+1 415 555 {1000 + i % 9000:04d}",
                        "snippet": _filler(rng, 950)} for i in range(records)])


# --------------------------------------------------------------------------------------------
# the scheduler: one tenant's work only delays its own
# --------------------------------------------------------------------------------------------
def _blocked_jobs(scheduler: FairScheduler, tenant: str, count: int,
                  release: threading.Event) -> list[Any]:
    return [scheduler.submit(tenant, release.wait, 30) for _ in range(count)]


@pytest.mark.parametrize("settings", [{}, {"slots": 2, "per_tenant": 1}])
def test_a_tenant_flooding_the_scheduler_never_holds_another_tenants_job(
        settings: dict[str, int]) -> None:
    """Tenant A fills its queue with jobs that never finish (until released); tenant B's
    job still runs and finishes at once -- with the default settings too."""
    scheduler = FairScheduler(**settings)
    release = threading.Event()
    try:
        hostile = _blocked_jobs(scheduler, "mallory", 20, release)
        assert scheduler.call("victim", lambda: "done") == "done"
        assert not any(f.done() for f in hostile)
    finally:
        release.set()
    assert all(f.result(timeout=30) for f in hostile)


def test_a_tenants_queue_is_bounded_and_refuses_before_any_work() -> None:
    scheduler = FairScheduler(slots=2, per_tenant=1, queue_limit=3)
    release = threading.Event()
    ran: list[int] = []
    started = threading.Event()
    try:
        scheduler.submit("mallory", lambda: (started.set(), release.wait(30)))
        assert started.wait(30)  # one running...
        _blocked_jobs(scheduler, "mallory", 3, release)  # ...three waiting
        with pytest.raises(RedactionError, match="waiting"):
            scheduler.submit("mallory", ran.append, 1)
        assert ran == []  # refused before any of its work was done
        assert scheduler.call("victim", lambda: 7) == 7
    finally:
        release.set()


async def test_an_async_burst_past_the_queue_bound_waits_and_completes() -> None:
    """LangGraph's async stores gather thousands of calls at once: past the tenant's queue
    bound an awaited job waits for room; none is refused, none is lost (threads calling
    ``submit`` are still refused)."""
    scheduler = FairScheduler(slots=2, per_tenant=1, queue_limit=3)
    release = threading.Event()
    started = threading.Event()
    try:
        scheduler.submit("acme", lambda: (started.set(), release.wait(30)))
        assert started.wait(30)                            # one running...
        _blocked_jobs(scheduler, "acme", 3, release)       # ...and the queue full
        with pytest.raises(RedactionError, match="waiting"):
            scheduler.submit("acme", int)
        burst = asyncio.ensure_future(asyncio.gather(
            *(scheduler.arun("acme", lambda i=i: i * 2) for i in range(50))))
        for _ in range(5):
            await asyncio.sleep(0)                         # each tried while full
        assert not burst.done()
    finally:
        release.set()
    assert await burst == [i * 2 for i in range(50)]


def test_a_job_submitted_from_a_job_runs_in_place() -> None:
    scheduler = FairScheduler(slots=1, per_tenant=1)
    outer = scheduler.call("acme", lambda: scheduler.call("acme", threading.get_ident))
    assert outer != threading.get_ident()


def test_tenants_are_served_in_turn() -> None:
    """With one thread, a tenant that queued first does not go first again while another
    tenant waits: the order alternates."""
    scheduler = FairScheduler(slots=1, per_tenant=1)
    gate, started = threading.Event(), threading.Event()
    order: list[str] = []
    first = scheduler.submit("a", lambda: (started.set(), gate.wait(30)))
    assert started.wait(30)
    jobs = [scheduler.submit("a", order.append, "a") for _ in range(3)]
    jobs += [scheduler.submit("b", order.append, "b") for _ in range(3)]
    gate.set()
    for job in [first, *jobs]:
        job.result(timeout=30)
    assert order == ["b", "a", "b", "a", "b", "a"]  # "a" had its turn: "b" goes next


# --------------------------------------------------------------------------------------------
# reading and writing never run redaction, restoring or decryption on the event loop
# --------------------------------------------------------------------------------------------
def test_async_writes_and_reads_do_their_work_off_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproduction: a checkpoint of many strings read back with aget_tuple decrypted and
    restored on the loop thread. Here every redaction, decryption and restore of aput and
    aget_tuple runs in another thread (redaction and restoring: the scheduler's)."""
    pool_mod.configure_pool(0)
    seen: dict[str, set[str]] = {"redact": set(), "restore": set(), "open": set()}

    def spy(kind: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen[kind].add(threading.current_thread().name)
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(Redactor, "redact_value", spy("redact", Redactor.redact_value))
    monkeypatch.setattr(Redactor, "restore_value", spy("restore", Redactor.restore_value))
    monkeypatch.setattr(SealedCodec, "open_tuple", spy("open", SealedCodec.open_tuple))
    rows = [f"row {i} mail r{i}@example.com" for i in range(2000)] + ["x"] * 20_000
    cfg = _cfg("t", "acme")

    async def run() -> tuple[Any, str]:
        async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'a.db'}",
                                         keyring=Keyring.generate()) as saver:
            await saver.aput(cfg, _checkpoint("rows", rows), MD, {"rows": 1})
            return await saver.aget_tuple(cfg), threading.current_thread().name

    tup, loop_thread = asyncio.run(run())
    assert tup.checkpoint["channel_values"]["rows"] == rows
    for kind, threads in seen.items():
        assert threads and loop_thread not in threads, kind
    assert all(t.startswith("securesaver-redaction") for t in seen["redact"] | seen["restore"])


def test_store_writes_go_through_the_scheduler_as_one_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Store puts were outside every bound: their redaction now runs on the scheduler, and
    the puts of one batch share one write budget (refused whole, nothing stored)."""
    pool_mod.configure_pool(0)
    threads: set[str] = set()
    real = Redactor.redact_value

    def spy(self: Redactor, *args: Any, **kwargs: Any) -> Any:
        threads.add(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Redactor, "redact_value", spy)
    policy = RedactionPolicy(write_budget=WriteBudget(max_parts=50))
    store = SecureStore(InMemoryStore(), keyring=Keyring.generate(), default_tenant="acme",
                        redaction=Redactor(policy))
    store.put(("u",), "k", {"note": "mail ann@example.org"})
    assert threads and all(t.startswith("securesaver-redaction") for t in threads)
    from langgraph.store.base import PutOp
    ops = [PutOp(("u",), f"k{i}", {"rows": [f"r{i}.{j}@example.com" for j in range(20)]})
           for i in range(4)]  # 80 strings in one batch: past 50
    with pytest.raises(RedactionError, match="budget"):
        store.batch(ops)
    assert all(store.get(("u",), f"k{i}") is None for i in range(4))


# --------------------------------------------------------------------------------------------
# no silent loss
# --------------------------------------------------------------------------------------------
def test_a_legitimate_write_beside_a_loaded_neighbour_is_stored_in_full(tmp_path: Path) -> None:
    """The reproduction: another tenant sends concurrent writes, each under half the budget;
    the victim's ~310 K-character search result is stored in full, redacted in storage,
    restored for the owner, never refused -- and the neighbour's writes too."""
    db = tmp_path / "agent.db"
    victim_doc = _search_result(1)
    assert 300_000 < len(victim_doc) < 330_000
    errors: list[BaseException] = []
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate()) as saver:
        def put(tenant: str, thread: str, doc: str) -> None:
            try:
                msg = ToolMessage(doc, tool_call_id=f"call-{thread}")
                saver.put(_cfg(thread, tenant), _checkpoint("messages", [msg]), MD,
                          {"messages": 1})
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=put, args=("loud", f"n{i}", _search_result(10 + i,
                                                                                     200)))
                   for i in range(4)]
        workers.append(threading.Thread(target=put, args=("victim", "v", victim_doc)))
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert errors == []
        stored = saver.get_tuple(_cfg("v", "victim")).checkpoint["channel_values"]["messages"]
    assert stored[0].content == victim_doc
    assert b"person.1.299@example.com" not in _storage_bytes(db)


def test_a_pii_number_in_a_write_past_its_budget_is_never_vaulted(tmp_path: Path) -> None:
    """The reproduction: past the budget a phone number under a PII name was tokenized under
    the kind WITHHELD, vaulted, and restored for the owner. Now the write is refused: nothing
    stored, nothing vaulted."""
    db = tmp_path / "agent.db"
    policy = RedactionPolicy(write_budget=WriteBudget(max_parts=10))
    value = {"notes": [f"mail user{i}@example.com" for i in range(20)],
             "phone": 4155550142, "card": 4111111111111111}
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate(),
                              redaction=Redactor(policy)) as saver:
        with pytest.raises(RedactionError, match="budget"):
            saver.put(_cfg("t", "acme"), _checkpoint("customer", value), MD, {"customer": 1})
        assert saver.get_tuple(_cfg("t", "acme")) is None
        assert saver.pii_inventory("acme") == {}
    raw = _storage_bytes(db)
    assert b"4155550142" not in raw and b"WITHHELD" not in raw


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_message_of_500_parts_is_refused_whole_or_stored_whole(tmp_path: Path,
                                                                mode: str) -> None:
    """The reproduction: 500 parts of ~2 KB (1.1 MB) had part of it withheld on a busy
    machine. With default settings it is now refused, deterministically, before anything
    is stored; the conversation's earlier turn is intact and the next turn goes through."""
    db = tmp_path / "agent.db"
    rng = random.Random(5)
    parts = [{"type": "text", "text": f"{_filler(rng, 2200)} p{i}@example.com"}
             for i in range(500)]
    cfg = _cfg("t", "mallory")
    first = _checkpoint("messages", [HumanMessage("hello, mail me at ann@example.org")])
    hostile = _checkpoint("messages", [HumanMessage(content=parts)])

    async def aput(saver: SecureSaver, cp: Any) -> Any:
        await saver.aput(cfg, cp, MD, {"messages": 1})
        return await saver.aget_tuple(cfg)

    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate()) as saver:
        def put(cp: Any) -> Any:
            if mode == "sync":
                saver.put(cfg, cp, MD, {"messages": 1})
                return saver.get_tuple(cfg)
            return asyncio.run(aput(saver, cp))

        put(first)
        with pytest.raises(RedactionError, match="budget"):
            put(hostile)
        msgs = saver.get_tuple(cfg).checkpoint["channel_values"]["messages"]
        assert [m.content for m in msgs] == ["hello, mail me at ann@example.org"]
        again = put(_checkpoint("messages", [HumanMessage("and the summary?")]))
        assert again.checkpoint["channel_values"]["messages"][0].content == "and the summary?"
    assert b"p499@example.com" not in _storage_bytes(db)


# --------------------------------------------------------------------------------------------
# denial records: bounded per actor, whatever the target names
# --------------------------------------------------------------------------------------------
def test_a_denial_spray_over_made_up_targets_writes_a_bounded_number_of_rows(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The reproduction: naming a new made-up target tenant on each attempt wrote one event
    row, one new chain and one log line per attempt. Now: every attempt is refused and
    counted exactly, in at most a few rows and one warning."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    attempts = 300
    with caplog.at_level(logging.WARNING, logger="langgraph_securesaver"), \
            SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        with tenant_scope("mallory"):
            for i in range(attempts):
                with pytest.raises(AccessDenied):
                    saver.get_tuple(_cfg("t1", f"made-up-{i}"))
        saver.registry.dispose()  # flushes the pending summary
        rows = saver.registry.list_events(kind="access_denied")
    assert len(rows) <= 3
    assert sum(int(e.detail.get("count", 1)) for e in rows) == attempts
    summary = rows[-1]
    assert (summary.tenant, summary.actor) == ("mallory", "mallory")
    assert summary.detail["distinct_targets"] == attempts - 1
    assert len(summary.detail["targets"]) == 8
    assert len({e.tenant for e in rows}) <= 2  # no chain per made-up target
    warnings = [r for r in caplog.records if "access denied" in r.getMessage()]
    assert len(warnings) <= 2
