"""``delete_for_runs`` racing a run of the same thread (LangGraph Server's rollback: the new
run starts while the rolled-back one's checkpoints are deleted), and the retention sweep that
deletes the threads ``delete_for_runs`` empties.

The races are made deterministic with events, never timing: the new run's writer is paused in
the inner saver's ``put`` -- after SecureSaver touched the registry, fetched the thread key and
sealed the checkpoint, before the checkpoint is stored -- and let go at the point the race
needs. What must hold: the new run's checkpoints are all stored, readable (never sealed under
a key that is then destroyed) and kept by every later sweep; a thread that really stays empty
is deleted by the sweep after its grace, key included, with one receipt.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.ops.pruner import Sweep
from langgraph_securesaver.tenancy import tenant_scope
from tests.fake_agent import build_chat_graph

OLD_RUN = "11111111-1111-4111-8111-111111111111"
NEW_RUN = "22222222-2222-4222-8222-222222222222"
WAIT = 120  # a bound on waiting for another thread, never a timing assertion


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    return Keyring.generate().save(tmp_path / "keyring.json")


@contextmanager
def _saver(url: str, ring: Path) -> Iterator[SecureSaver]:
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring)) as saver:
        yield saver


def _cfg(thread: str, run: str | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"configurable": {"thread_id": thread, "tenant_id": "acme"}}
    if run is not None:
        cfg["metadata"] = {"run_id": run}
    return cfg


def _run(saver: SecureSaver, thread: str, run: str, text: str, mode: str = "sync") -> None:
    graph = build_chat_graph(saver)
    if mode == "sync":
        graph.invoke({"messages": [HumanMessage(text)]}, _cfg(thread, run))
    else:
        asyncio.run(graph.ainvoke({"messages": [HumanMessage(text)]}, _cfg(thread, run)))


def _delete_runs(saver: SecureSaver, runs: list[str], mode: str) -> None:
    with tenant_scope("acme"):
        if mode == "sync":
            saver.delete_for_runs(runs)
        else:
            asyncio.run(saver.adelete_for_runs(runs))


def _key_rows(saver: SecureSaver, thread: str) -> int:
    import sqlalchemy as sa

    from langgraph_securesaver.registry.schema import thread_keys
    with saver.registry.begin() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(thread_keys).where(
            thread_keys.c.tenant == "acme", thread_keys.c.thread_id == thread)).scalar() or 0)


def _grace(saver: SecureSaver) -> float:
    return Sweep(saver, now=None, limit=None, dry_run=True, tenant=None).emptied_grace()


class PausedPut:
    """Pauses the first inner ``put`` once armed: the checkpoint is sealed, not stored."""

    def __init__(self, saver: SecureSaver, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = threading.Event()
        self.reached = threading.Event()
        self.resume = threading.Event()
        self.landed = threading.Event()
        original = saver.inner.put

        def put(*args: Any, **kwargs: Any) -> Any:
            if self.armed.is_set() and not self.reached.is_set():
                self.reached.set()
                assert self.resume.wait(WAIT)
                try:
                    return original(*args, **kwargs)
                finally:
                    self.landed.set()
            return original(*args, **kwargs)
        monkeypatch.setattr(saver.inner, "put", put)


def _writer(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # reported by the test
            errors.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def _check_new_run(saver: SecureSaver) -> None:
    """The new run is all there and every checkpoint of the thread opens (the old run's are
    gone; a run that read the thread before the deletion carries its messages on)."""
    state = build_chat_graph(saver).get_state(_cfg("t"))
    texts = [m.content for m in state.values["messages"]]
    assert texts[-2:] == ["new run", f"Thanks, noted (turn {len(texts) // 2}): new run"], texts
    tuples = list(saver.list(_cfg("t")))   # each authenticated and opened
    assert tuples and {t.metadata.get("run_id") for t in tuples} == {NEW_RUN}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("resume_at", ["after_delete", "between_count_and_delete"])
def test_a_run_writing_during_delete_for_runs_keeps_its_checkpoints_and_key(
        url: str, ring: Path, mode: str, resume_at: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``after_delete``: the writer sealed its first checkpoint under the thread key before
    ``delete_for_runs`` found the thread empty, and stores it afterwards (sealed under a key
    deleted meanwhile, it would not open). ``between_count_and_delete``: its checkpoint is
    stored after the thread was counted empty, before anything else happens (a deletion
    decided on that count would delete it)."""
    with _saver(url, ring) as saver:
        _run(saver, "t", OLD_RUN, "old run")
        paused = PausedPut(saver, monkeypatch)
        if resume_at == "between_count_and_delete":
            storage = saver.services.storage
            count = storage.count_checkpoints_many

            def counted(ids: Any) -> Any:
                found = count(ids)
                paused.resume.set()
                assert paused.landed.wait(WAIT)
                return found
            monkeypatch.setattr(storage, "count_checkpoints_many", counted)
        paused.armed.set()
        thread, errors = _writer(lambda: _run(saver, "t", NEW_RUN, "new run", mode))
        assert paused.reached.wait(WAIT)
        _delete_runs(saver, [OLD_RUN], mode)   # counts the thread empty: put not stored yet
        paused.resume.set()
        thread.join(WAIT)
        assert not thread.is_alive() and not errors, errors
        assert paused.landed.is_set()
        _check_new_run(saver)
        assert _key_rows(saver, "t") == 1
        assert saver.receipts(tenant="acme", thread_id="t") == []
        # the sweep after the grace finds the thread written again: kept, mark cleared
        report = saver.prune_expired(now=time.time() + _grace(saver) + 1)
        assert report.deleted == [] and report.errors == []
        row = saver.registry.get_thread("acme", "t")
        assert row is not None and row.state == "active"
        assert _key_rows(saver, "t") == 1
    with _saver(url, ring) as fresh:   # another process, cold caches
        _check_new_run(fresh)


@pytest.mark.parametrize("writer_process", ["same", "other"])
def test_a_write_between_the_sweeps_claim_and_delete_keeps_the_thread(
        url: str, ring: Path, writer_process: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep claims an emptied thread; before it deletes, a run writes the thread:
    from another process (its write touches the registry row first: the fenced delete finds
    it active) or from the sweep's own process (no touch due: the checkpoint count inside
    the deleting transaction finds it and rolls back). Either way nothing is deleted."""
    with _saver(url, ring) as saver, _saver(url, ring) as other:
        _run(saver, "t", OLD_RUN, "old run")
        _delete_runs(saver, [OLD_RUN], "sync")
        assert saver.registry.get_thread("acme", "t").state == "emptied"
        writer = saver if writer_process == "same" else other
        claim = saver.registry.claim_emptied
        wrote: list[bool] = []

        def claimed(**kwargs: Any) -> Any:
            rows = claim(**kwargs)
            if rows and not wrote:
                wrote.append(True)
                _run(writer, "t", NEW_RUN, "new run")
            return rows
        monkeypatch.setattr(saver.registry, "claim_emptied", claimed)
        report = saver.prune_expired(now=time.time() + _grace(saver) + 1)
        assert wrote and report.deleted == [] and report.errors == []
        assert report.survived == [("acme", "t")]
        row = saver.registry.get_thread("acme", "t")
        assert row is not None and row.state == "active" and row.claim_token is None
        assert _key_rows(saver, "t") == 1
        _check_new_run(saver)
        assert saver.receipts(tenant="acme", thread_id="t") == []


def test_an_emptied_thread_under_legal_hold_is_not_deleted(url: str, ring: Path) -> None:
    with _saver(url, ring) as saver:
        _run(saver, "t", OLD_RUN, "old run")
        with tenant_scope("acme"):
            saver.set_retention("t", legal_hold=True)
        _delete_runs(saver, [OLD_RUN], "sync")
        report = saver.prune_expired(now=time.time() + _grace(saver) + 1)
        assert report.deleted == []
        assert _key_rows(saver, "t") == 1
        with tenant_scope("acme"):
            saver.set_retention("t", legal_hold=False)
        report = saver.prune_expired(now=time.time() + _grace(saver) + 1)
        assert report.deleted == [("acme", "t")]
        assert _key_rows(saver, "t") == 0


def test_a_forged_emptied_row_is_reported_and_kept(url: str, ring: Path) -> None:
    """The sweep acts on MACed fields: an emptied row whose last activity was moved back
    without the registry key is reported, and its thread and key stay."""
    import sqlalchemy as sa

    from langgraph_securesaver.registry.schema import threads
    with _saver(url, ring) as saver:
        _run(saver, "t", OLD_RUN, "old run")
        _delete_runs(saver, [OLD_RUN], "sync")
        with saver.registry.begin() as conn:
            conn.execute(threads.update().where(threads.c.thread_id == "t").values(
                last_activity=0.0))
        report = saver.prune_expired(now=time.time() + 1)   # well within the grace
        assert report.deleted == []
        assert [(t, th) for t, th, _ in report.errors] == [("acme", "t")]
        assert _key_rows(saver, "t") == 1
        with saver.registry.begin() as conn:
            conn.execute(threads.update().where(threads.c.thread_id == "t").values(
                state=sa.literal("active")))


def test_dry_run_lists_an_emptied_thread_it_would_delete(url: str, ring: Path) -> None:
    with _saver(url, ring) as saver:
        _run(saver, "t", OLD_RUN, "old run")
        _run(saver, "u", OLD_RUN, "same run id, another thread")
        _run(saver, "u", NEW_RUN, "kept run")
        _delete_runs(saver, [OLD_RUN], "sync")
        later = time.time() + _grace(saver) + 1
        dry = saver.prune_expired(now=later, dry_run=True)
        assert dry.would_delete == [("acme", "t")] and dry.deleted == []
        assert _key_rows(saver, "t") == 1
        assert saver.prune_expired(now=later).deleted == [("acme", "t")]
        assert _key_rows(saver, "t") == 0 and _key_rows(saver, "u") == 1
