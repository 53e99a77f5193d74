"""Savers nobody here wrote, on real servers: langgraph-checkpoint-mysql on MariaDB (sync and
async), langgraph-checkpoint-plainredis on Redis (sync and async), langgraph-checkpoint-lmdb
(sync and async) and langgraph-checkpoint-objectstorage on local files.

Each wrapped saver gives the results the raw saver gives (a chat graph with a subgraph,
interrupt, resume, update_state and history), keeps no test string in any stored byte, refuses
tampered data (a payload that would execute included) without evaluating it, deletes and
prunes through its own API in the caller's mode, and copies every namespace of a thread.
The servers are started by the tests (tests/servers.py); under CI=true they must run.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from langgraph_securesaver import Keyring, SecureSaver, UnsupportedBySaverError

from .graph_helpers import MARKERS, found_markers
from .servers import MariaDb, RedisServer, start_mariadb, start_redis
from .thirdparty_savers import ASYNC_ONLY, SAVERS, open_saver


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDb]:
    server = start_mariadb(tmp_path_factory.mktemp("mariadb"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


def servers_for(name: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if name.startswith("mysql"):
        return {"mariadb": request.getfixturevalue("mariadb")}
    if name.startswith("redis"):
        return {"redis_server": request.getfixturevalue("redis_server")}
    return {}


# --- the chat graph: a subgraph, an interrupt, a resume ---------------------------------------
class State(TypedDict):
    messages: Annotated[list[str], operator.add]


def build_graph(checkpointer: Any) -> Any:
    def inner_step(state: State) -> dict[str, Any]:
        return {"messages": [f"sub saw {len(state['messages'])}"]}

    sub = StateGraph(State)
    sub.add_node("inner_step", inner_step)
    sub.add_edge(START, "inner_step")
    sub.add_edge("inner_step", END)

    def chat(state: State) -> dict[str, Any]:
        return {"messages": [f"reply to {state['messages'][-1]}"]}

    def approve(state: State) -> dict[str, Any]:
        answer = interrupt({"question": "send?"})
        return {"messages": [f"approved: {answer}"]}

    g = StateGraph(State)
    g.add_node("chat", chat)
    g.add_node("sub", sub.compile())
    g.add_node("approve", approve)
    g.add_edge(START, "chat")
    g.add_edge("chat", "sub")
    g.add_edge("sub", "approve")
    g.add_edge("approve", END)
    return g.compile(checkpointer=checkpointer)


def _shape(state: Any) -> tuple[Any, ...]:
    return (tuple(state.values.get("messages", [])), tuple(state.next),
            tuple(str(getattr(i, "value", "")) for i in state.interrupts))


async def run_chat(checkpointer: Any, use_async: bool, thread: str) -> dict[str, Any]:
    """A conversation: turn, interrupt, resume, update_state, history; what a user sees."""
    graph = build_graph(checkpointer)
    cfg = {"configurable": {"thread_id": thread}}
    first = f"Hello, my note is {MARKERS['message']} and my email is {MARKERS['email']}"
    if use_async:
        await graph.ainvoke({"messages": [first]}, cfg)
        paused = await graph.aget_state(cfg)
        await graph.ainvoke(Command(resume=MARKERS["write"]), cfg)
        await graph.aupdate_state(cfg, {"messages": [MARKERS["tool_arg"]]})
        final = await graph.aget_state(cfg)
        history = [s async for s in graph.aget_state_history(cfg)]
        sub_state = await graph.aget_state(cfg, subgraphs=True)
    else:
        graph.invoke({"messages": [first]}, cfg)
        paused = graph.get_state(cfg)
        graph.invoke(Command(resume=MARKERS["write"]), cfg)
        graph.update_state(cfg, {"messages": [MARKERS["tool_arg"]]})
        final = graph.get_state(cfg)
        history = list(graph.get_state_history(cfg))
        sub_state = graph.get_state(cfg, subgraphs=True)
    return {"paused": _shape(paused), "final": _shape(final),
            "history": [_shape(s) for s in history], "subgraphs": _shape(sub_state)}


def wrap(inner: Any, tmp: Path, **options: Any) -> SecureSaver:
    options.setdefault("redaction", None)
    options.setdefault("default_tenant", "acme")
    return SecureSaver(inner, keyring=options.pop("keyring", None) or Keyring.generate(),
                       registry=f"sqlite:///{tmp / ('reg-' + uuid.uuid4().hex[:8] + '.db')}",
                       **options)


async def setup(saver: SecureSaver) -> None:
    await saver.asetup()


@pytest.mark.parametrize("name", SAVERS)
async def test_chat_graph_matches_raw(name: str, tmp_path: Path,
                                      request: pytest.FixtureRequest) -> None:
    servers = servers_for(name, request)
    use_async = name in ASYNC_ONLY
    async with open_saver(name, tmp=tmp_path, **servers) as (raw, _backend):
        expected = await run_chat(raw, use_async, "raw-thread")
    async with open_saver(name, tmp=tmp_path, **servers) as (inner, backend):
        saver = wrap(inner, tmp_path)
        await setup(saver)
        got = await run_chat(saver, use_async, "t1")
        assert got == expected
        stored = backend.dump()
        assert stored  # the conversation is in the backend ...
        assert found_markers(stored) == []  # ... and none of it in clear


async def _call(saver: Any, use_async: bool, name: str, *args: Any, **kwargs: Any) -> Any:
    if use_async:
        return await getattr(saver, "a" + name)(*args, **kwargs)
    return getattr(saver, name)(*args, **kwargs)


async def _count(saver: Any, use_async: bool, thread: str, ns: str | None = None) -> int:
    conf: dict[str, Any] = {"thread_id": thread}
    if ns is not None:
        conf["checkpoint_ns"] = ns
    if use_async:
        return len([t async for t in saver.alist({"configurable": conf})])
    return len(list(saver.list({"configurable": conf})))


async def _namespaces(saver: SecureSaver, use_async: bool, thread: str) -> dict[str, int]:
    """Checkpoints per namespace of a thread (the root and the namespaces SecureSaver noted)."""
    out = {}
    for ns in ["", *saver.registry.namespaces("acme", thread)]:
        n = await _count(saver, use_async, thread, ns)
        if n:
            out[ns] = n
    return out


NO_DELETE = {"lmdb", "lmdb-async"}  # LMDBSaver has no delete_thread


@pytest.mark.parametrize("name", SAVERS)
async def test_copy_delete_prune(name: str, tmp_path: Path, request: pytest.FixtureRequest
                                 ) -> None:
    servers = servers_for(name, request)
    use_async = name in ASYNC_ONLY
    async with open_saver(name, tmp=tmp_path, **servers) as (inner, _backend):
        saver = wrap(inner, tmp_path)
        await setup(saver)
        await run_chat(saver, use_async, "t1")
        await run_chat(saver, use_async, "t2")
        before = await _namespaces(saver, use_async, "t1")
        assert len(before) == 2, before  # the root and the subgraph's namespace
        await _call(saver, use_async, "copy_thread", "t1", "t1-copy")
        assert await _namespaces(saver, use_async, "t1-copy") == before
        if name in NO_DELETE:
            with pytest.raises(UnsupportedBySaverError, match="delete_thread"):
                await _call(saver, use_async, "delete_thread", "t1")
            with pytest.raises(UnsupportedBySaverError):
                await _call(saver, use_async, "prune", ["t2"], strategy="delete")
            assert await _namespaces(saver, use_async, "t1") == before  # nothing changed
            assert saver.receipts() == []
            return
        t2 = await _namespaces(saver, use_async, "t2")
        await _call(saver, use_async, "prune", ["t2"], strategy="delete")
        await _call(saver, use_async, "delete_thread", "t1")
        for thread, spaces in (("t1", before), ("t2", t2)):  # every namespace went
            assert [await _count(saver, use_async, thread, ns) for ns in spaces] == [0, 0]
        assert await _namespaces(saver, use_async, "t1-copy") == before
        assert {r.thread_id for r in saver.receipts()} == {"t1", "t2"}
