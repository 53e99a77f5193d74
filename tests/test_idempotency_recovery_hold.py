"""The recovery lease inside one process: who holds it when, on the database clock.

A run opted in inside a node gives its lease back when its loop exits (failed, finished or
interrupted), sync and async; a run opted in before ``invoke`` holds it until released; a
holder whose liveness cannot be checked keeps it until its lease expires on the database
clock; a new opt-in resets a dead-lettered thread, a resumed node's opt-in does not.
"""

from __future__ import annotations

import asyncio
import operator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import (
    IdempotencyStore,
    amark_recoverable,
    arecover_stalled,
    mark_recoverable,
    recover_stalled,
    recoverable_run,
    recovery_state,
    release_recoverable,
)
from langgraph_securesaver.idempotency.schema import recoverable_threads

_R = recoverable_threads


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme"}}


def _graph(saver: SecureSaver, flag: Path, runs: list[str], *, mark: bool) -> Any:
    def node(state: State) -> State:
        if mark:
            mark_recoverable(saver=saver)
        runs.append("run")
        if flag.exists():
            raise RuntimeError("down")
        return {"log": ["ok"]}

    g = StateGraph(State)
    g.add_node("n", node)
    g.add_edge(START, "n")
    return g.compile(checkpointer=saver)


@pytest.fixture
def saver(tmp_path: Path) -> Any:
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'cp.db'}", keyring=Keyring.generate(),
                              redaction=None) as sv:
        yield sv


def test_a_node_opt_in_is_held_while_the_run_lasts_and_released_when_it_fails(
        saver: SecureSaver, tmp_path: Path) -> None:
    flag = tmp_path / "down"
    flag.touch()
    runs: list[str] = []
    seen: list[Any] = []
    graph = _graph(saver, flag, runs, mark=True)

    def spy(state: State) -> State:  # a second node reads the row while the run is live
        seen.append(recovery_state(saver, "acme", "t"))
        seen.append(recover_stalled(graph, saver))
        return {}

    g = StateGraph(State)
    g.add_node("first", lambda s: (mark_recoverable(saver=saver), {"log": ["a"]})[1])
    g.add_node("spy", spy)
    g.add_node("n", graph.nodes["n"].bound)
    g.add_edge(START, "first")
    g.add_edge("first", "spy")
    g.add_edge("spy", "n")
    live = g.compile(checkpointer=saver)
    with pytest.raises(RuntimeError):
        live.invoke({"log": []}, cfg("t"), durability="sync")
    row, report = seen
    assert row["owner"] is not None  # held by this process while it ran
    assert report.resumed == [] and report.skipped_busy == 1
    after = recovery_state(saver, "acme", "t")
    assert after is not None and after["owner"] is None and after["state"] == "armed"
    flag.unlink()
    assert recover_stalled(live, saver).resumed == [("acme", "t")]


def test_an_async_node_opt_in_is_released_off_the_event_loop(saver: SecureSaver,
                                                            tmp_path: Path) -> None:
    flag = tmp_path / "down"
    flag.touch()
    runs: list[str] = []

    async def node(state: State) -> State:
        await amark_recoverable()  # the saver comes from the run's config
        runs.append("run")
        if flag.exists():
            raise RuntimeError("down")
        return {"log": ["ok"]}

    g = StateGraph(State)
    g.add_node("n", node)
    g.add_edge(START, "n")

    async def go() -> Any:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'a.db'}",
                                         keyring=Keyring.generate(), redaction=None) as asv:
            assert isinstance(asv.inner, AsyncSqliteSaver)
            graph = g.compile(checkpointer=asv)
            with pytest.raises(RuntimeError):
                await graph.ainvoke({"log": []}, cfg("t"), durability="sync")
            held = await asyncio.to_thread(recovery_state, asv, "acme", "t")
            flag.unlink()
            report = await arecover_stalled(graph, asv)
            return held, report, await asyncio.to_thread(recovery_state, asv, "acme", "t")

    held, report, final = asyncio.run(go())
    assert held["owner"] is None and held["state"] == "armed"
    assert report.resumed == [("acme", "t")] and final["state"] == "done"
    assert runs == ["run", "run"]


def test_an_opt_in_before_invoke_is_held_until_released(saver: SecureSaver,
                                                        tmp_path: Path) -> None:
    flag = tmp_path / "down"
    flag.touch()
    runs: list[str] = []
    graph = _graph(saver, flag, runs, mark=False)
    mark_recoverable(cfg("t"), saver=saver)
    with pytest.raises(RuntimeError):
        graph.invoke({"log": []}, cfg("t"), durability="sync")
    flag.unlink()
    # still held by this live process: not resumed, whatever older_than says
    assert recover_stalled(graph, saver).skipped_busy == 1
    assert release_recoverable(cfg("t"), saver=saver)
    assert not release_recoverable(cfg("t"), saver=saver)
    assert recover_stalled(graph, saver).resumed == [("acme", "t")]
    assert runs == ["run", "run"]


def _set(saver: SecureSaver, thread: str, **values: Any) -> None:
    store = IdempotencyStore.for_saver(saver)
    with store.engine.begin() as conn:
        conn.execute(_R.update().where(_R.c.thread_id == thread).values(**values))


def test_a_holder_that_cannot_be_checked_keeps_the_lease_until_it_expires_on_the_db_clock(
        saver: SecureSaver, tmp_path: Path) -> None:
    flag = tmp_path / "down"
    flag.touch()
    graph = _graph(saver, flag, [], mark=False)
    with recoverable_run(cfg("t"), saver=saver), pytest.raises(RuntimeError):
        graph.invoke({"log": []}, cfg("t"), durability="sync")
    flag.unlink()
    store = IdempotencyStore.for_saver(saver)
    now = store.db_time()
    # a holder on another host (its pid cannot be checked here), lease valid for a minute
    _set(saver, "t", owner="elsewhere", holder_host="another-host", holder_pid=1,
         holder_start=1, holder_nonce="x", lease_expires_at=now + 60)
    assert recover_stalled(graph, saver).skipped_busy == 1
    _set(saver, "t", lease_expires_at=now - 1)  # expired on the database clock
    assert recover_stalled(graph, saver).resumed == [("acme", "t")]


def test_older_than_is_measured_from_recorded_activity_not_checkpoint_ts(
        saver: SecureSaver, tmp_path: Path) -> None:
    flag = tmp_path / "down"
    flag.touch()
    graph = _graph(saver, flag, [], mark=False)
    with recoverable_run(cfg("t"), saver=saver), pytest.raises(RuntimeError):
        graph.invoke({"log": []}, cfg("t"), durability="sync")
    flag.unlink()
    store = IdempotencyStore.for_saver(saver)
    report = recover_stalled(graph, saver, older_than=3600)
    assert report.skipped_recent == 1  # the run ended just now (database clock)
    _set(saver, "t", active_at=store.db_time() - 3601)
    assert recover_stalled(graph, saver, older_than=3600).resumed == [("acme", "t")]


def test_a_new_opt_in_resets_a_dead_thread(saver: SecureSaver, tmp_path: Path) -> None:
    flag = tmp_path / "down"
    flag.touch()
    runs: list[str] = []
    graph = _graph(saver, flag, runs, mark=True)
    with pytest.raises(RuntimeError):
        graph.invoke({"log": []}, cfg("t"), durability="sync")
    tokens = []
    for _ in range(4):
        recover_stalled(graph, saver, max_attempts=2)
        tokens.append(recovery_state(saver, "acme", "t")["fencing_token"])  # type: ignore[index]
    state = recovery_state(saver, "acme", "t")
    assert state is not None and (state["state"], state["attempts"]) == ("dead", 2)
    assert len(runs) == 3 and tokens[2] == tokens[3]  # left alone once dead
    # a new user turn opts in again: a fresh budget
    flag.unlink()
    with recoverable_run(cfg("t"), saver=saver):
        state = recovery_state(saver, "acme", "t")
        assert state is not None and (state["state"], state["attempts"]) == ("armed", 0)
        assert state["fencing_token"] > tokens[-1]


def test_a_resumed_node_opting_in_through_another_saver_keeps_the_count(tmp_path: Path) -> None:
    url, ring = f"sqlite:///{tmp_path / 'cp.db'}", Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as sv, \
            SecureSaver.from_url(url, keyring=ring, redaction=None) as other:
        runs: list[str] = []

        def node(state: State) -> State:
            mark_recoverable(saver=other)  # not the graph's saver object: same database
            runs.append("run")
            raise RuntimeError("poison")

        g = StateGraph(State)
        g.add_node("n", node)
        g.add_edge(START, "n")
        graph = g.compile(checkpointer=sv)
        with pytest.raises(RuntimeError):
            graph.invoke({"log": []}, cfg("t"), durability="sync")
        reports = [recover_stalled(graph, sv, max_attempts=3) for _ in range(5)]
        assert [len(r.dead_lettered) for r in reports] == [0, 0, 1, 0, 0]
        assert len(runs) == 4
        state = recovery_state(sv, "acme", "t")
        assert state is not None and (state["state"], state["attempts"]) == ("dead", 3)
