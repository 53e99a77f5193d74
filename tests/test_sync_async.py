"""Sync calls on async-only inner savers fail clearly; async calls on sync-only savers work."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import AsyncOnlySaverError, Keyring, SecureSaver
from langgraph_securesaver.demo import build_chat_graph


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
