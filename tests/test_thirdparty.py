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
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from langgraph_securesaver import (
    ConfigurationError,
    Keyring,
    SecureSaver,
    TamperedDataError,
    UnsupportedBySaverError,
)

from .boundary_helpers import ext_value
from .graph_helpers import MARKERS, found_markers
from .thirdparty_savers import ASYNC_ONLY, SAVERS, open_saver


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


def wrap(inner: Any, tmp: Path, backend: Any = None, **options: Any) -> SecureSaver:
    """The saver wrapped as its users deploy it: beside a MySQL saver the registry lives in
    the same MariaDB database; beside the others in a SQLite file."""
    options.setdefault("redaction", None)
    options.setdefault("default_tenant", "acme")
    registry = (backend.mysql_url if backend is not None and backend.mysql_url
                else f"sqlite:///{tmp / ('reg-' + uuid.uuid4().hex[:8] + '.db')}")
    return SecureSaver(inner, keyring=options.pop("keyring", None) or Keyring.generate(),
                       registry=registry, **options)


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
        saver = wrap(inner, tmp_path, backend)
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
    async with open_saver(name, tmp=tmp_path, **servers) as (inner, backend):
        saver = wrap(inner, tmp_path, backend)
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


# --- tampering: a payload that would execute, written in the saver's own format -------------
class EvilSerde:
    """What an attacker with write access to the backend stores: every value a msgpack
    constructor document naming os.system (LangGraph's default serializer would call it)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return "msgpack", ext_value(self.marker)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        raise AssertionError("the attacker only writes")

    def dumps(self, obj: Any) -> bytes:
        return ext_value(self.marker)


@pytest.mark.parametrize("name", SAVERS)
async def test_payload_that_would_execute_is_refused_unevaluated(
        name: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from langgraph_securesaver.tenancy import inner_thread_id
    servers = servers_for(name, request)
    use_async = name in ASYNC_ONLY
    marker = tmp_path / "executed"
    async with open_saver(name, tmp=tmp_path, **servers) as (inner, backend):
        saver = wrap(inner, tmp_path, backend)
        await setup(saver)
        await run_chat(saver, use_async, "t1")
        # the attacker: the same saver class on the same storage, writing its own rows
        evil = EvilSerde(marker)
        target = getattr(inner, "_saver", inner)  # AsyncLMDBSaver delegates to its sync twin
        if name == "objectstorage":  # files only: not the saver's AES key; a module serializer
            from fsspec.implementations.local import LocalFileSystem
            from langgraph_checkpoint_objectstorage import ObjectStorageSaver
            target = ObjectStorageSaver(LocalFileSystem(), str(backend.files))
            import langgraph_checkpoint_objectstorage.envelope as envelope
            monkeypatch.setattr(envelope, "_serde", evil)
        original = target.serde
        target.serde = evil
        ckpt = empty_checkpoint()
        ckpt["channel_values"] = {"messages": ["x"]}
        ckpt["channel_versions"] = {"messages": "99.0"}
        cfg = {"configurable": {"thread_id": inner_thread_id("acme", "t1"),
                                "checkpoint_ns": ""}}
        try:
            if use_async and name != "lmdb-async":
                saved = await inner.aput(cfg, ckpt, {"source": "input"}, {"messages": "99.0"})
                await inner.aput_writes(saved, [("messages", "y")], "evil-task")
            else:
                saved = target.put(cfg, ckpt, {"source": "input"}, {"messages": "99.0"})
                target.put_writes(saved, [("messages", "y")], "evil-task")
        finally:
            target.serde = original
            monkeypatch.undo()
        with pytest.raises(Exception) as refused:
            await _call(saver, use_async, "get_tuple", {"configurable": {"thread_id": "t1"}})
        assert not marker.exists()  # nothing ran
        if name == "objectstorage":  # its own AEAD refuses the unencrypted object first
            assert "never encrypted" in str(refused.value)
        else:
            assert isinstance(refused.value, TamperedDataError), refused.value
        assert not marker.exists()


async def test_objectstorage_without_its_own_encryption_is_refused(tmp_path: Path) -> None:
    """Its files are decoded with a module-level serializer SecureSaver cannot replace: a
    wrapper over it would evaluate stored bytes before authenticating them."""
    from fsspec.implementations.local import LocalFileSystem
    from langgraph_checkpoint_objectstorage import ObjectStorageSaver
    inner = ObjectStorageSaver(LocalFileSystem(), str(tmp_path / "objects"))
    serde_before = inner.serde
    with pytest.raises(ConfigurationError, match=r"envelope\._serde.*encryption="):
        wrap(inner, tmp_path)
    assert inner.serde is serde_before  # nothing half-applied


async def test_a_constructor_that_fails_leaves_the_saver_as_it_was(tmp_path: Path) -> None:
    import lmdb
    from langgraph_checkpoint_lmdb import AsyncLMDBSaver
    env = lmdb.open(str(tmp_path / "l"), max_dbs=8)
    inner = AsyncLMDBSaver(env)
    before = (inner.serde, inner._saver.serde)
    with pytest.raises(ConfigurationError):
        SecureSaver(inner, keyring=Keyring.generate(), redaction=None, retention="bad",
                    registry=f"sqlite:///{tmp_path / 'r.db'}")
    assert (inner.serde, inner._saver.serde) == before
    saver = wrap(inner, tmp_path)  # and a construction that succeeds makes both strict
    assert type(inner.serde).__name__ == type(inner._saver.serde).__name__ == "StrictSerializer"
    assert saver.inner is inner
    env.close()


async def test_missing_registry_message_names_what_works(tmp_path: Path) -> None:
    import lmdb
    from langgraph_checkpoint_lmdb import LMDBSaver
    env = lmdb.open(str(tmp_path / "l"), max_dbs=8)
    with pytest.raises(ConfigurationError) as refused:
        SecureSaver(LMDBSaver(env), keyring=Keyring.generate(), redaction=None)
    assert "from_url" not in str(refused.value) and "PostgreSQL" in str(refused.value)
    env.close()


@pytest.mark.parametrize("name", SAVERS)
async def test_retention_sweep_deletes_every_namespace(name: str, tmp_path: Path,
                                                       request: pytest.FixtureRequest) -> None:
    """prune_expired (aprune_expired on async savers) through the saver's own API."""
    import time

    from langgraph_securesaver import RetentionPolicy
    servers = servers_for(name, request)
    use_async = name in ASYNC_ONLY
    async with open_saver(name, tmp=tmp_path, **servers) as (inner, backend):
        saver = wrap(inner, tmp_path, backend, retention=RetentionPolicy(idle_ttl=60))
        await setup(saver)
        await run_chat(saver, use_async, "old")
        spaces = await _namespaces(saver, use_async, "old")
        later = time.time() + 3600
        if use_async:
            report = await saver.aprune_expired(now=later)
        else:
            report = saver.prune_expired(now=later)
        if name in NO_DELETE:  # refused before anything changed, reported, thread kept
            assert report.deleted == [] and [e[1] for e in report.errors] == ["old"]
            assert await _namespaces(saver, use_async, "old") == spaces
            return
        assert report.deleted == [("acme", "old")] and report.errors == []
        assert [await _count(saver, use_async, "old", ns) for ns in spaces] == [0, 0]


# --- the public conformance suite, wrapped and raw ---------------------------------------------
@pytest.mark.parametrize("name", SAVERS)
async def test_conformance_equals_raw(name: str, tmp_path: Path,
                                      request: pytest.FixtureRequest) -> None:
    """Every capability the raw saver passes, the wrapped saver passes (sync savers driven
    through their sync API, as a user of them would). The ones the saver lacks fail wrapped
    as they fail raw -- with UnsupportedBySaverError where SecureSaver cannot do them."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    from .test_conformance import SyncDriven
    servers = servers_for(name, request)
    drive = (lambda s: s) if name in ASYNC_ONLY else SyncDriven

    @checkpointer_test(name=f"raw[{name}]")
    async def raw_factory() -> Any:
        async with open_saver(name, tmp=tmp_path, **servers) as (inner, _b):
            yield drive(inner)

    @checkpointer_test(name=f"SecureSaver[{name}]")
    async def wrapped_factory() -> Any:
        async with open_saver(name, tmp=tmp_path, **servers) as (inner, backend):
            saver = wrap(inner, tmp_path, backend, default_tenant="conformance")
            await setup(saver)
            yield drive(saver)

    raw = await validate(raw_factory)
    wrapped = await validate(wrapped_factory)
    raw_passed = {cap for cap, r in raw.results.items() if r.passed}
    wrapped_passed = {cap for cap, r in wrapped.results.items() if r.passed}
    assert raw_passed, raw.results  # the raw saver works here at all
    assert raw_passed <= wrapped_passed, {
        cap: r.failures for cap, r in wrapped.results.items()
        if cap in raw_passed and not r.passed}
