"""Sync calls on async-only inner savers fail clearly; async calls on sync-only savers work."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import AsyncOnlySaverError, Keyring, SecureSaver, tenant_scope
from tests.fake_agent import build_chat_graph


def _cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme"}}


async def test_sync_call_from_the_loop_on_an_async_only_saver_raises(tmp_path: Path) -> None:
    async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'a.db'}", keyring=Keyring.generate(),
                                     redaction=None) as saver:
        await build_chat_graph(saver).ainvoke({"messages": [HumanMessage("hi")]}, _cfg("t"))
        with pytest.raises(AsyncOnlySaverError, match="aget_tuple"):
            saver.get_tuple(_cfg("t"))
        with pytest.raises(AsyncOnlySaverError):
            build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _cfg("t"))
        # from a worker thread while the saver's loop runs, the sync API bridges to it
        tup = await asyncio.to_thread(saver.get_tuple, _cfg("t"))
        assert tup is not None and tup.checkpoint["channel_values"]["messages"][0].content == "hi"


def test_sync_call_without_a_running_loop_raises_instead_of_hanging(tmp_path: Path) -> None:
    async def make() -> SecureSaver:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        conn = await aiosqlite.connect(str(tmp_path / "b.db"))
        return SecureSaver(AsyncSqliteSaver(conn), keyring=Keyring.generate(),
                           registry=f"sqlite:///{tmp_path / 'b.db'}", redaction=None)

    saver = asyncio.run(make())
    with pytest.raises(AsyncOnlySaverError):
        saver.get_tuple(_cfg("t"))


async def test_async_api_over_a_sync_only_saver_runs_off_the_loop(tmp_path: Path) -> None:
    import threading
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'c.db'}", keyring=Keyring.generate(),
                              redaction=None) as saver:
        loop_thread = threading.get_ident()
        inner_threads: set[int] = set()
        for name in ("put", "put_writes", "get_tuple"):
            real = getattr(saver.inner, name)

            def spy(*args, _real=real, **kwargs):
                inner_threads.add(threading.get_ident())
                return _real(*args, **kwargs)
            setattr(saver.inner, name, spy)
        graph = build_chat_graph(saver)
        await graph.ainvoke({"messages": [HumanMessage("hello")]}, _cfg("t"))
        assert [t async for t in saver.alist(_cfg("t"))]
        assert inner_threads and loop_thread not in inner_threads
        assert saver.get_tuple(_cfg("t")) is not None


# --- early exit closes the inner saver's iterator ---------------------------------------------

class _ListSpy:
    """Counts the inner listings that are still open (not exhausted, not closed)."""

    def __init__(self) -> None:
        self.open = 0
        self.started = 0
        self.tamper_after: int | None = None

    def _tampered(self, tup, i):
        if self.tamper_after is not None and i >= self.tamper_after:
            return tup._replace(metadata={})  # sealed metadata gone: refused on read
        return tup


def _spying_saver():
    from langgraph.checkpoint.memory import InMemorySaver

    spy = _ListSpy()

    class SpiedSaver(InMemorySaver):
        def list(self, config, **kw):
            spy.open += 1
            spy.started += 1
            try:
                for i, tup in enumerate(super().list(config, **kw)):
                    yield spy._tampered(tup, i)
            finally:
                spy.open -= 1

        async def alist(self, config, **kw):
            spy.open += 1
            spy.started += 1
            try:
                for i, tup in enumerate(InMemorySaver.list(self, config, **kw)):
                    await asyncio.sleep(0)
                    yield spy._tampered(tup, i)
            finally:
                spy.open -= 1

    saver = SecureSaver(SpiedSaver(), keyring=Keyring.generate(), redaction=None)
    graph = build_chat_graph(saver)
    for text in ("one", "two", "three"):
        graph.invoke({"messages": [HumanMessage(text)]}, _cfg("t"))
    return saver, spy


def test_list_closes_the_inner_iterator_on_limit_break_and_error() -> None:
    from langgraph_securesaver import TamperedDataError

    saver, spy = _spying_saver()
    with tenant_scope("acme"):  # list(None) filters rows itself: the inner limit is not pushed
        assert len(list(saver.list(None, limit=1))) == 1
    assert spy.started == 1 and spy.open == 0
    rows = saver.list(_cfg("t"))
    next(rows)
    rows.close()  # the caller stops early
    assert spy.open == 0
    spy.tamper_after = 1
    with pytest.raises(TamperedDataError) as info:
        list(saver.list(_cfg("t")))
    assert info.value is not None and spy.open == 0  # closed although the traceback lives on


async def test_alist_closes_the_inner_iterator_on_limit_break_and_error() -> None:
    from langgraph_securesaver import TamperedDataError

    saver, spy = _spying_saver()
    assert len([t async for t in saver.alist(_cfg("t"), limit=1)]) == 1
    with tenant_scope("acme"):
        assert len([t async for t in saver.alist(None, limit=1)]) == 1
    assert spy.open == 0  # closed right away, not whenever the event loop finalizes it
    rows = saver.alist(_cfg("t"))
    await rows.__anext__()
    await rows.aclose()
    assert spy.open == 0
    spy.tamper_after = 1
    with pytest.raises(TamperedDataError) as info:
        _ = [t async for t in saver.alist(_cfg("t"))]
    assert info.value is not None and spy.open == 0


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_alist_with_limit_leaves_the_real_saver_usable_at_once(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """AsyncSqliteSaver/AsyncPostgresSaver hold a lock while listing: an abandoned inner
    listing kept it until finalized; closing the saver right after must work."""
    url = (f"sqlite:///{tmp_path / 'l.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))
    async with SecureSaver.afrom_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        graph = build_chat_graph(saver)
        for text in ("one", "two", "three"):
            await graph.ainvoke({"messages": [HumanMessage(text)]}, _cfg("t"))
        first = [t async for t in saver.alist(_cfg("t"), limit=1)]
        lock = getattr(saver.inner, "lock", None)
        assert lock is None or not lock.locked()
        assert len(first) == 1
    assert first[0].checkpoint["channel_values"]["messages"][-1].content.endswith("three")


# --- optional BaseCheckpointSaver parameters are forwarded only when accepted -------------------

def _old_style_saver():
    """A custom saver written before put_writes took task_path (works raw under LangGraph)."""
    from langgraph.checkpoint.memory import InMemorySaver

    class OldSaver(InMemorySaver):
        def put_writes(self, config, writes, task_id):  # type: ignore[override]
            return super().put_writes(config, writes, task_id)

        async def aput_writes(self, config, writes, task_id):  # type: ignore[override]
            return super().put_writes(config, writes, task_id)

    return OldSaver()


def _two_step_graph(checkpointer):
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    class State(TypedDict):
        x: int

    def boom(state):
        if state["x"] == 1:
            raise RuntimeError("stop after the first node's writes")
        return {"x": state["x"] + 10}

    return (StateGraph(State).add_node("one", lambda s: {"x": s["x"] + 1})
            .add_node("two", boom).add_edge(START, "one").add_edge("one", "two")
            .compile(checkpointer=checkpointer))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_saver_without_task_path_works_wrapped_as_it_does_raw(mode: str) -> None:
    from langgraph.pregel._checkpoint import put_writes_accepts_task_path

    def run(checkpointer) -> object:
        graph = _two_step_graph(checkpointer)
        if mode == "sync":
            with pytest.raises(RuntimeError):
                graph.invoke({"x": 0}, _cfg("t"))
            return graph.get_state(_cfg("t"))

        async def arun():
            with pytest.raises(RuntimeError):
                await graph.ainvoke({"x": 0}, _cfg("t"))
            return await graph.aget_state(_cfg("t"))
        return asyncio.run(arun())

    raw = run(_old_style_saver())
    wrapped_saver = SecureSaver(_old_style_saver(), keyring=Keyring.generate(), redaction=None)
    # LangGraph sees SecureSaver's own signature: it always takes task_path ...
    assert put_writes_accepts_task_path(wrapped_saver.put_writes)
    assert put_writes_accepts_task_path(wrapped_saver.aput_writes)
    wrapped = run(wrapped_saver)  # ... and drops it for an inner saver that does not
    assert wrapped.values == raw.values == {"x": 1}
    assert wrapped.next == raw.next == ("two",)
    # the API directly, as LangGraph calls it (it passes task_path to SecureSaver)
    cfg = wrapped_saver.get_tuple(_cfg("t")).config
    if mode == "sync":
        wrapped_saver.put_writes(cfg, [("x", 5)], "task-1", "~__pregel_pull, two")
        tup = wrapped_saver.get_tuple(cfg)
    else:
        async def awrite():
            await wrapped_saver.aput_writes(cfg, [("x", 5)], "task-1", "~__pregel_pull, two")
            return await wrapped_saver.aget_tuple(cfg)
        tup = asyncio.run(awrite())
    assert ("task-1", "x", 5) in tup.pending_writes


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_task_path_reaches_an_inner_saver_that_takes_it(mode: str) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    seen: list[str] = []

    class Recording(InMemorySaver):
        def put_writes(self, config, writes, task_id, task_path=""):
            seen.append(task_path)
            return super().put_writes(config, writes, task_id, task_path)

        async def aput_writes(self, config, writes, task_id, task_path=""):
            return self.put_writes(config, writes, task_id, task_path)

    graph = _two_step_graph(SecureSaver(Recording(), keyring=Keyring.generate(),
                                        redaction=None))
    with pytest.raises(RuntimeError):
        if mode == "sync":
            graph.invoke({"x": 0}, _cfg("t"))
        else:
            asyncio.run(graph.ainvoke({"x": 0}, _cfg("t")))
    assert any(p for p in seen), seen  # node tasks carry their path


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
async def test_sync_list_on_an_async_only_saver_closes_on_its_loop(tmp_path: Path) -> None:
    """From a worker thread, list() over AsyncSqliteSaver stopped early releases the saver's
    lock and cursor on its loop (the saver's own sync bridge left its async generator to be
    finalized in the worker thread, where closing the cursor fails: an unraisable error)."""
    import itertools

    async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'w.db'}", keyring=Keyring.generate(),
                                     redaction=None) as saver:
        graph = build_chat_graph(saver)
        for text in ("one", "two", "three"):
            await graph.ainvoke({"messages": [HumanMessage(text)]}, _cfg("t"))
        first = await asyncio.to_thread(lambda: list(itertools.islice(saver.list(_cfg("t")), 1)))
        assert len(first) == 1
        assert not saver.inner.lock.locked()
        history = await asyncio.to_thread(
            saver.get_delta_channel_history, config=first[0].config, channels=["messages"])
        assert not saver.inner.lock.locked()
        from langgraph.checkpoint.base import BaseCheckpointSaver
        assert history == await asyncio.to_thread(
            BaseCheckpointSaver.get_delta_channel_history, saver, config=first[0].config,
            channels=["messages"])
        assert history["messages"]["writes"]
