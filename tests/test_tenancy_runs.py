"""The tenant of a graph run reaches every checkpointer call LangGraph makes for it, and no other.

A run's tenant is named once, by the call that starts or resumes it: a ``tenant_scope`` around
``graph.invoke`` (LangGraph then files task writes from executor threads that do not carry the
caller's context) or ``tenant_id`` in the config (LangGraph then builds subgraph state configs
from the thread id alone). No ``default_tenant`` anywhere here: it would hide both.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.runtime import RunControl
from langgraph.types import Command, Send, interrupt

from langgraph_securesaver import (
    AccessDenied,
    Keyring,
    SecureSaver,
    TenantRequired,
    tenant_scope,
)

BACKENDS = ["memory", "sqlite", "postgres"]


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: SecureSaver, tag: str = "") -> Any:
    """Parallel Send branches, then a subgraph that pauses on an interrupt: the shapes whose
    writes LangGraph files from executor threads, and whose state lives in a namespace."""
    def step(state: State) -> dict:
        return {"log": [f"sub{tag}"]}

    def ask(state: State) -> dict:
        return {"log": [f"answer{tag}:{interrupt('question')}"]}

    sub = (StateGraph(State).add_node("step", step).add_node("ask", ask)
           .add_edge(START, "step").add_edge("step", "ask").compile())

    def branch(state: State) -> dict:
        return {"log": [f"branch{tag}"]}

    return (StateGraph(State).add_node("branch", branch).add_node("sub", sub)
            .add_conditional_edges(START, lambda s: [Send("branch", {"log": []})] * 3,
                                   ["branch"])
            .add_edge("branch", "sub").compile(checkpointer=saver))


@contextmanager
def _sync_saver(backend: str, tmp_path: Path, request: pytest.FixtureRequest
                ) -> Iterator[SecureSaver]:
    if backend == "memory":
        yield SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
        return
    url = (f"sqlite:///{tmp_path / 'runs.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        yield saver


@asynccontextmanager
async def _async_saver(backend: str, tmp_path: Path, request: pytest.FixtureRequest
                       ) -> AsyncIterator[SecureSaver]:
    if backend == "memory":
        yield SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
        return
    url = (f"sqlite:///{tmp_path / 'aruns.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))
    async with SecureSaver.afrom_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        yield saver


def _cfg(thread: str, tenant: str | None = None) -> dict:
    conf: dict[str, Any] = {"thread_id": thread}
    if tenant is not None:
        conf["tenant_id"] = tenant
    return {"configurable": conf}


# what the raw saver gives for this graph (the subgraph returns its whole log, which the
# parent's reducer appends to the branches' entries)
FINAL = ["branch"] * 6 + ["sub", "answer:yes"]


# --- (1) the tenant from a scope: background writes, subgraphs, durability ----------------------

@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_scope_reaches_background_writes_and_subgraphs_sync(
        backend: str, durability: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _sync_saver(backend, tmp_path, request) as saver:
        graph = _graph(saver)
        cfg = _cfg("shared")
        with tenant_scope("acme"):
            chunks = list(graph.stream({"log": []}, cfg, subgraphs=True, durability=durability))
            assert any(ns for ns, _ in chunks)  # the subgraph streamed from its namespace
            paused = graph.get_state(cfg, subgraphs=True)
            assert paused.next == ("sub",)
            assert paused.tasks[0].state.values["log"] == ["branch"] * 3 + ["sub"]
            assert graph.invoke(Command(resume="yes"), cfg, durability=durability) == {
                "log": FINAL}
            assert graph.get_state(cfg).values == {"log": FINAL}
            history = list(graph.get_state_history(cfg))
            assert history and history[0].values == {"log": FINAL}
        with tenant_scope("globex"):  # the same thread id is another thread for globex
            assert graph.get_state(cfg).values == {}
        with pytest.raises(TenantRequired):  # unscoped, after the run: nobody's
            graph.get_state(cfg)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_scope_reaches_background_writes_and_subgraphs_async(
        backend: str, durability: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def run() -> None:
        async with _async_saver(backend, tmp_path, request) as saver:
            graph = _graph(saver)
            cfg = _cfg("shared")
            with tenant_scope("acme"):
                chunks = [c async for c in graph.astream({"log": []}, cfg, subgraphs=True,
                                                         durability=durability)]
                assert any(ns for ns, _ in chunks)
                paused = await graph.aget_state(cfg, subgraphs=True)
                assert paused.tasks[0].state.values["log"] == ["branch"] * 3 + ["sub"]
                assert await graph.ainvoke(Command(resume="yes"), cfg,
                                           durability=durability) == {"log": FINAL}
                assert (await graph.aget_state(cfg)).values == {"log": FINAL}
            with tenant_scope("globex"):
                assert (await graph.aget_state(cfg)).values == {}
            with pytest.raises(TenantRequired):
                await graph.aget_state(cfg)
    asyncio.run(run())


@pytest.mark.parametrize("backend", BACKENDS)
def test_scope_reaches_update_state_of_a_subgraph_and_its_resume(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _sync_saver(backend, tmp_path, request) as saver:
        graph = _graph(saver)
        cfg = _cfg("t-upd")
        with tenant_scope("acme"):
            graph.invoke({"log": []}, cfg)
            task_cfg = graph.get_state(cfg).tasks[0].state
            graph.update_state(task_cfg, {"log": ["edited"]})
            assert graph.get_state(cfg, subgraphs=True).tasks[0].state.values["log"][-1] == (
                "edited")
            assert graph.invoke(Command(resume="yes"), cfg)["log"][-1] == "answer:yes"


# --- (2) the tenant from the config: subgraph state reads ---------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_config_tenant_reaches_subgraph_state_sync(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _sync_saver(backend, tmp_path, request) as saver:
        graph = _graph(saver)
        cfg = _cfg("shared", "acme")
        graph.invoke({"log": []}, cfg)
        state = graph.get_state(cfg, subgraphs=True)
        sub = state.tasks[0].state
        assert sub.values == {"log": ["branch"] * 3 + ["sub"]}
        assert sub.next == ("ask",)
        # the task's state config (LangGraph builds it from the thread id alone) reads it too
        task_cfg = graph.get_state(cfg).tasks[0].state
        assert graph.get_state(task_cfg).values == sub.values
        assert next(s.values for s in graph.get_state_history(task_cfg)) == sub.values
        graph.update_state(task_cfg, {"log": ["edited"]})
        assert graph.invoke(Command(resume="yes"), cfg)["log"][-2:] == ["edited", "answer:yes"]
        # the returned configs equal the inner saver's (plus the tenant_id the caller named)
        assert sub.config["configurable"]["thread_id"] == "shared"
        assert "tenant_id" not in sub.config["configurable"]
        # another tenant's same thread id stays its own
        assert graph.get_state(_cfg("shared", "globex"), subgraphs=True).values == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_config_tenant_reaches_subgraph_state_async(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    async def run() -> None:
        async with _async_saver(backend, tmp_path, request) as saver:
            graph = _graph(saver)
            cfg = _cfg("shared", "acme")
            await graph.ainvoke({"log": []}, cfg)
            state = await graph.aget_state(cfg, subgraphs=True)
            assert state.tasks[0].state.values == {"log": ["branch"] * 3 + ["sub"]}
            task_cfg = (await graph.aget_state(cfg)).tasks[0].state
            assert (await graph.aget_state(task_cfg)).values == state.tasks[0].state.values
            await graph.aupdate_state(task_cfg, {"log": ["edited"]})
            assert (await graph.ainvoke(Command(resume="yes"), cfg))["log"][-2:] == [
                "edited", "answer:yes"]
            assert (await graph.aget_state(_cfg("shared", "globex"), subgraphs=True)
                    ).values == {}
    asyncio.run(run())


# --- it can never be widened ----------------------------------------------------------------------

def _writer_config(saver: SecureSaver) -> dict:
    """A config exactly as LangGraph hands put_writes, captured from inside a scoped run."""
    seen: list[dict] = []
    original = saver.put_writes

    def spy(config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        seen.append(config)
        original(config, writes, task_id, task_path)
    saver.put_writes = spy  # type: ignore[method-assign]
    try:
        with tenant_scope("acme"):
            _graph(saver).invoke({"log": []}, _cfg("shared"))
    finally:
        del saver.put_writes
    return seen[-1]


def test_a_tenantless_call_outside_any_run_still_needs_a_tenant() -> None:
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    with tenant_scope("acme"):
        _graph(saver).invoke({"log": []}, _cfg("shared"))
    for call in (lambda: saver.get_tuple(_cfg("shared")),
                 lambda: saver.put_writes(_cfg("shared"), [("log", ["x"])], "task"),
                 lambda: list(saver.list(_cfg("shared")))):
        with pytest.raises(TenantRequired):
            call()


def test_a_config_of_another_run_object_or_a_fresh_control_binds_nobody() -> None:
    from langgraph.runtime import Runtime
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    with tenant_scope("acme"):
        _graph(saver).invoke({"log": []}, _cfg("shared"))
    for runtime in (Runtime(), Runtime(control=RunControl()), object()):
        conf = {"thread_id": "shared", "checkpoint_ns": "", "__pregel_runtime": runtime}
        with pytest.raises(TenantRequired):
            saver.put_writes({"configurable": conf}, [("log", ["forged"])], "task")


def test_a_run_config_reused_under_another_scope_is_denied_and_recorded() -> None:
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    config = _writer_config(saver)  # carries acme's run (its runtime and control)
    with tenant_scope("globex"), pytest.raises(AccessDenied):
        saver.put_writes(config, [("log", ["globex"])], "task-x")
    events = saver.registry.list_events(kind="access_denied")
    assert [(e.actor, e.tenant) for e in events] == [("globex", "acme")]
    # ... and the run's tenant-less calls are refused from then on (ambiguous, fail closed)
    with pytest.raises(TenantRequired):
        saver.put_writes(config, [("log", ["late"])], "task-y")
    with tenant_scope("acme"):
        pending = saver.get_tuple(config).pending_writes
    assert not any(task in ("task-x", "task-y") for task, _c, _v in pending)


def test_the_run_binding_is_what_lets_a_tenantless_write_of_the_run_through() -> None:
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    config = _writer_config(saver)
    saver.put_writes(config, [("log", ["bg"])], "task-bg")  # as LangGraph's executor thread
    with tenant_scope("acme"):
        assert ("task-bg", "log", ["bg"]) in saver.get_tuple(config).pending_writes
    with tenant_scope("globex"):
        assert saver.get_tuple(_cfg("shared")) is None
    # the same config without the run's runtime names nobody
    bare = {"configurable": {k: v for k, v in config["configurable"].items()
                             if k != "__pregel_runtime"}}
    with pytest.raises(TenantRequired):
        saver.put_writes(bare, [("log", ["bare"])], "task-bare")


def test_a_returned_thread_id_is_worth_a_tenant_id_never_more() -> None:
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    graph = _graph(saver)
    graph.invoke({"log": []}, _cfg("shared", "acme"))
    task_cfg = graph.get_state(_cfg("shared", "acme")).tasks[0].state
    assert "tenant_id" not in task_cfg["configurable"]  # built by LangGraph from the id alone
    assert saver.get_tuple(task_cfg) is not None  # the id carries acme
    with tenant_scope("globex"), pytest.raises(AccessDenied):
        saver.get_tuple(task_cfg)
    # a plain copy of the id carries nothing
    plain = {"configurable": {**task_cfg["configurable"],
                              "thread_id": "".join(task_cfg["configurable"]["thread_id"])}}
    with pytest.raises(TenantRequired):
        saver.get_tuple(plain)
    # a tenant_id in the config wins over the id's
    assert saver.get_tuple({"configurable": {**task_cfg["configurable"],
                                             "tenant_id": "globex"}}) is None


def test_two_runs_sharing_a_run_control_and_thread_id_fail_closed_never_cross() -> None:
    """LangGraph asks for a fresh RunControl per run; two tenants' runs that share one (and a
    thread id) make the binding ambiguous: their tenant-less writes are refused, never filed
    under the other tenant."""
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    control = RunControl()
    with tenant_scope("acme"):
        _graph(saver, "~A~").invoke({"log": []}, _cfg("shared"), control=control)
    with tenant_scope("globex"), pytest.raises((AccessDenied, TenantRequired)):
        _graph(saver, "~G~").invoke({"log": []}, _cfg("shared"), control=control)
    for tenant, other in (("acme", "~G~"), ("globex", "~A~")):
        with tenant_scope(tenant):
            tup = saver.get_tuple(_cfg("shared"))
            seen = repr(tup.checkpoint) + repr(tup.pending_writes) if tup else ""
            assert other not in seen


# --- concurrency: A and B at once, same thread id --------------------------------------------------

def _check_isolated(saver: SecureSaver, tags: dict[str, str]) -> None:
    for tenant, tag in tags.items():
        with tenant_scope(tenant):
            tup = saver.get_tuple(_cfg("shared"))
            assert tup is not None
            text = repr(tup.checkpoint["channel_values"]) + repr(tup.pending_writes)
            for other_tag in set(tags.values()) - {tag}:
                assert other_tag not in text
            snapshot = _graph(saver, tag).get_state(_cfg("shared"), subgraphs=True)
            _only_own(snapshot.values["log"] + snapshot.tasks[0].state.values["log"], tag)


def _only_own(log: list[str], tag: str) -> None:
    """Every entry is this tenant's (the runs of one tenant accumulate in its thread)."""
    assert log and f"sub{tag}" in log
    assert all(entry.startswith((f"branch{tag}", f"sub{tag}", f"answer{tag}:"))
               for entry in log), log


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_concurrent_runs_of_two_tenants_on_one_thread_id_threads(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _sync_saver(backend, tmp_path, request) as saver:
        tenants = {f"tenant-{i}": f"~{i}~" for i in range(4)}
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(tenants))

        def run(tenant: str, tag: str) -> None:
            try:
                graph = _graph(saver, tag)
                barrier.wait()
                for _ in range(3):  # pause, resume-less re-runs overlap the others' writes
                    with tenant_scope(tenant):
                        graph.invoke({"log": []}, _cfg("shared"))
                        graph.invoke(Command(resume=tenant), _cfg("shared"))
                with tenant_scope(tenant):
                    graph.invoke({"log": []}, _cfg("shared"))
            except BaseException as exc:
                errors.append(exc)
        threads = [threading.Thread(target=run, args=item) for item in tenants.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        _check_isolated(saver, tenants)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_concurrent_runs_of_two_tenants_on_one_thread_id_asyncio(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    tenants = {f"tenant-{i}": f"~{i}~" for i in range(4)}

    async def run_all() -> SecureSaver:
        async with _async_saver(backend, tmp_path, request) as saver:
            async def run(tenant: str, tag: str) -> None:
                graph = _graph(saver, tag)
                for _ in range(3):
                    with tenant_scope(tenant):
                        await graph.ainvoke({"log": []}, _cfg("shared"))
                        await graph.ainvoke(Command(resume=tenant), _cfg("shared"))
                with tenant_scope(tenant):
                    await graph.ainvoke({"log": []}, _cfg("shared"))
            await asyncio.gather(*(run(t, tag) for t, tag in tenants.items()))
            for tenant, tag in tenants.items():
                with tenant_scope(tenant):
                    snap = await _graph(saver, tag).aget_state(_cfg("shared"), subgraphs=True)
                    _only_own(snap.values["log"] + snap.tasks[0].state.values["log"], tag)
            return saver
    asyncio.run(run_all())


def test_concurrent_runs_sync_mixed_scope_and_config_same_thread_id() -> None:
    """One tenant names itself by scope, the other by config, at the same time."""
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    errors: list[BaseException] = []

    def by_scope() -> None:
        try:
            for _ in range(5):
                with tenant_scope("acme"):
                    _graph(saver, "~A~").invoke({"log": []}, _cfg("shared"))
        except BaseException as exc:
            errors.append(exc)

    def by_config() -> None:
        try:
            for _ in range(5):
                _graph(saver, "~G~").invoke({"log": []}, _cfg("shared", "globex"))
        except BaseException as exc:
            errors.append(exc)
    workers: list[Callable[[], None]] = [by_scope, by_config]
    threads = [threading.Thread(target=w) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    _check_isolated(saver, {"acme": "~A~", "globex": "~G~"})


def test_a_checkpointer_call_from_a_thread_the_run_did_not_start_needs_a_tenant() -> None:
    """The documented limit: a node that calls the checkpointer from its own plain thread
    with a config it built itself names no tenant (the node's own config still works)."""
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    outcome: dict[str, Any] = {}

    def node(state: State, config: RunnableConfig) -> dict:
        def elsewhere() -> None:
            for name, cfg in (("own", config), ("built", _cfg("shared"))):
                try:
                    saver.get_tuple(cfg)
                    outcome[name] = "ok"
                except TenantRequired:
                    outcome[name] = "TenantRequired"
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        return {"log": ["n"]}
    graph = StateGraph(State).add_node("n", node).add_edge(START, "n").compile(
        checkpointer=saver)
    with tenant_scope("acme"):
        graph.invoke({"log": []}, _cfg("shared"))
    assert outcome == {"own": "ok", "built": "TenantRequired"}


def test_a_tenant_thread_id_keeps_its_tenant_through_str_copy_and_pickle_not_json() -> None:
    import copy
    import json
    import pickle

    from langgraph_securesaver.tenancy import TenantThreadId, thread_id_tenant
    tid = TenantThreadId("shared", "acme")
    assert tid == "shared" and hash(tid) == hash("shared")
    for same in (str(tid), copy.copy(tid), copy.deepcopy(tid), pickle.loads(pickle.dumps(tid))):
        assert same == "shared" and thread_id_tenant(same) == "acme"
    assert thread_id_tenant(json.loads(json.dumps(tid))) is None
    assert thread_id_tenant("".join(tid)) is None and thread_id_tenant(tid + "") is None
    # stored ids are plain strings: the inner saver never sees the subclass
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    _graph(saver).invoke({"log": []}, _cfg(tid))
    inner_ids = {type(k) for k in saver.inner.storage}
    assert inner_ids == {str}
