"""Stalled-run recovery: two worker processes over 50 stalled threads resume each exactly once;
attempts are capped into sealed dead letters; recent, waiting and un-armed threads are left
alone."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import (
    IdempotencyStore,
    dead_letters_of,
    rearm_dead_letter,
    recover_stalled,
    recoverable_run,
    recovery_state,
)
from langgraph_securesaver.idempotency.recovery import _claim
from langgraph_securesaver.idempotency.schema import dead_letters

from .idem_scripts.recovery_graph import build
from .idem_scripts.scenario import Downstream

WORKER = Path(__file__).parent / "idem_scripts" / "recover_worker.py"


def cfg(thread: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme", **extra}}


def stall(graph: Any, saver: SecureSaver, thread: str, *, mark: bool = True,
          ask: bool = False) -> None:
    """Run ``thread`` until it fails (or asks); opted in, the run holds the recovery lease
    while it runs and gives it back when it stops."""
    with recoverable_run(cfg(thread), saver=saver) if mark else contextlib.nullcontext():
        state: dict[str, Any] = {"log": []}
        if ask:
            state["ask"] = True
            graph.invoke(state, cfg(thread), durability="sync")  # stops at the interrupt
            return
        with pytest.raises(RuntimeError):
            graph.invoke(state, cfg(thread), durability="sync")
    assert graph.get_state(cfg(thread)).next == ("work",)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres",
                                                            marks=pytest.mark.postgres)])
def test_two_workers_resume_fifty_stalled_threads_exactly_once(
        tmp_path: Path, request: pytest.FixtureRequest, backend: str) -> None:
    url = (f"sqlite:///{tmp_path / 'cp.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))
    ring = Keyring.generate()
    ring.save(tmp_path / "keyring.json")
    flag = tmp_path / "fail.flag"
    flag.touch()
    ds_path = str(tmp_path / "downstream.db")
    downstream = Downstream(ds_path)
    threads = [f"th-{i:02d}" for i in range(50)]
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        graph = build(saver, ds_path, str(flag))
        for t in threads:
            stall(graph, saver, t)
        stall(graph, saver, "not-armed", mark=False)  # stalled but never opted in
    flag.unlink()

    ready = tmp_path / "ready"
    ready.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "IDEM_RECOVERY_DOWNSTREAM": ds_path}
    procs = [subprocess.Popen([sys.executable, str(WORKER), url, str(tmp_path / "keyring.json"),
                               str(ready), f"worker-{i}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))

    resumed = [tuple(x) for r in reports for x in r["resumed"]]
    assert sorted(t for _, t in resumed) == threads  # every thread once, none twice
    assert all(r["failed"] == [] for r in reports)
    effects = downstream.rows("SELECT label, count(*) FROM effects GROUP BY label")
    assert dict(effects) == {f"work:{t}": 1 for t in threads}  # resumed exactly once each
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        assert {recovery_state(saver, "acme", t)["state"] for t in threads} == {"done"}
        assert recovery_state(saver, "acme", "not-armed") is None
        graph = build(saver, ds_path, None)
        assert graph.get_state(cfg("th-00")).values["log"] == ["prepared", "worked"]
        assert graph.get_state(cfg("not-armed")).next == ("work",)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[SecureSaver, Any, Path, Downstream]]:
    flag = tmp_path / "fail.flag"
    ds_path = str(tmp_path / "downstream.db")
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'cp.db'}", keyring=Keyring.generate(),
                              redaction=None) as saver:
        yield saver, build(saver, ds_path, str(flag)), flag, Downstream(ds_path)


def test_attempts_are_capped_into_sealed_dead_letters(setup: Any) -> None:
    saver, graph, flag, _ = setup
    flag.touch()  # keeps failing
    stall(graph, saver, "doomed")
    first = recover_stalled(graph, saver, older_than=0, max_attempts=2, worker_id="w1")
    assert first.failed == [("acme", "doomed")] and first.dead_lettered == []
    second = recover_stalled(graph, saver, older_than=0, max_attempts=2, worker_id="w1")
    assert second.dead_lettered == [("acme", "doomed")]
    state = recovery_state(saver, "acme", "doomed")
    assert state is not None and (state["state"], state["attempts"]) == ("dead", 2)
    (letter,) = dead_letters_of(saver, tenant="acme")
    assert letter.thread_id == "doomed" and letter.attempts == 2 and letter.worker == "w1"
    assert letter.error_type == "RuntimeError" and "token=abc123" in (letter.error or "")
    store = IdempotencyStore.for_saver(saver)
    with store.engine.begin() as conn:
        raw = conn.execute(sa.select(dead_letters.c.error)).scalar_one()
    assert b"abc123" not in bytes(raw)  # the error text is sealed at rest
    third = recover_stalled(graph, saver, older_than=0, max_attempts=2)
    assert third.examined == 0  # dead threads are not retried
    # re-arming gives the thread a fresh budget; deleting it removes the rows
    flag.unlink()
    assert rearm_dead_letter(saver, "acme", "doomed")
    assert not rearm_dead_letter(saver, "acme", "doomed")  # armed now, not dead
    assert recover_stalled(graph, saver, older_than=0).resumed == [("acme", "doomed")]
    assert store.delete_thread("acme", "doomed") == 2  # recovery row + dead letter
    assert recovery_state(saver, "acme", "doomed") is None


def test_recent_waiting_busy_and_finished_threads_are_left_alone(setup: Any) -> None:
    saver, graph, flag, downstream = setup
    flag.touch()
    stall(graph, saver, "recent")
    stall(graph, saver, "busy")
    flag.unlink()
    stall(graph, saver, "waiting", ask=True)
    with recoverable_run(cfg("finished"), saver=saver):
        graph.invoke({"log": []}, cfg("finished"), durability="sync")
    store = IdempotencyStore.for_saver(saver)
    assert _claim(store, "acme", "busy", "another-worker", 600) is not None

    report = recover_stalled(graph, saver, older_than=3600, worker_id="w")
    assert report.skipped_recent == 1  # "recent": its last activity is younger than an hour
    assert report.skipped_waiting == 1  # waits for a human, not stalled
    assert report.finished == [("acme", "finished")]
    assert report.skipped_busy == 1  # "busy" is leased by a live holder (this process)
    assert report.resumed == [] and downstream.rows("SELECT * FROM effects") == [
        (1, "work:finished", None, os.getpid())]
    report = recover_stalled(graph, saver, older_than=0, worker_id="w")
    assert report.resumed == [("acme", "recent")]
    assert recovery_state(saver, "acme", "busy")["state"] == "armed"


def test_recovered_run_gets_its_configurable_back(setup: Any) -> None:
    saver, _, flag, _ = setup
    seen: list[Any] = []
    from langgraph.graph import START, StateGraph

    from .idem_scripts.recovery_graph import State

    def node(state: State) -> State:
        from langgraph.config import get_config
        conf = get_config()["configurable"]
        seen.append(conf.get("user_plan"))
        if flag.exists():
            raise RuntimeError("crash")
        return {"log": ["ok"]}

    g = StateGraph(State)
    g.add_node("n", node)
    g.add_edge(START, "n")
    graph2 = g.compile(checkpointer=saver)
    flag.touch()
    with recoverable_run(cfg("t", user_plan="gold"), saver=saver), \
            pytest.raises(RuntimeError):
        graph2.invoke({"log": []}, cfg("t", user_plan="gold"), durability="sync")
    flag.unlink()
    assert recover_stalled(graph2, saver, older_than=0).resumed == [("acme", "t")]
    assert seen == ["gold", "gold"]
