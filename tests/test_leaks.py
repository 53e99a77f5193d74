"""No marker written through a compiled graph may appear anywhere in raw storage."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver
from tests.fake_agent import build_support_graph

from .graph_helpers import INT_MARKER, MARKERS, found_markers, sqlite_files_bytes, turns


def _config(thread: str) -> dict:
    return {
        "configurable": {"thread_id": thread, "tenant_id": "acme",
                         "user_phone": MARKERS["configurable"]},
        "metadata": {"customer_note": MARKERS["metadata"]},
    }


def _run_sync(saver: SecureSaver, thread: str) -> dict:
    graph = build_support_graph(saver)
    cfg = _config(thread)
    graph.update_state(cfg, {"turns": INT_MARKER})
    for text in turns():
        graph.invoke({"messages": [HumanMessage(text)]}, cfg)
    # a pending write that stays pending: a node's output recorded against the latest checkpoint
    tup = saver.get_tuple(cfg)
    saver.put_writes(tup.config, [("customer_email", MARKERS["write"])], str(uuid.uuid4()))
    return graph.get_state(cfg).values


async def _run_async(saver: SecureSaver, thread: str) -> dict:
    graph = build_support_graph(saver)
    cfg = _config(thread)
    await graph.aupdate_state(cfg, {"turns": INT_MARKER})
    for text in turns():
        await graph.ainvoke({"messages": [HumanMessage(text)]}, cfg)
    tup = await saver.aget_tuple(cfg)
    await saver.aput_writes(tup.config, [("customer_email", MARKERS["write"])],
                            str(uuid.uuid4()))
    return (await graph.aget_state(cfg)).values


def _assert_state_intact(values: dict) -> None:
    text = " ".join(str(m.content) for m in values["messages"])
    assert MARKERS["message"] in text
    assert MARKERS["tool_arg"] in text
    assert values["customer_email"] == MARKERS["email"]
    assert values["turns"] == INT_MARKER + 4  # one agent step per turn, two for the tool turn
    calls = [c for m in values["messages"] for c in getattr(m, "tool_calls", [])]
    assert calls and calls[0]["args"]["order_id"] == MARKERS["tool_arg"]


def _assert_metadata_intact(saver: SecureSaver, thread: str) -> None:
    tup = saver.get_tuple(_config(thread))
    assert tup.metadata["user_phone"] == MARKERS["configurable"]
    assert tup.metadata["customer_note"] == MARKERS["metadata"]
    assert any(w[2] == MARKERS["write"] for w in tup.pending_writes)


def test_control_raw_sqlite_saver_leaks_every_marker(tmp_path: Path) -> None:
    """The leak check itself works: without SecureSaver the markers are all visible."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    db = tmp_path / "raw.db"
    with SqliteSaver.from_conn_string(str(db)) as raw:
        graph = build_support_graph(raw)
        cfg = _config("t")
        graph.update_state(cfg, {"turns": INT_MARKER})
        for text in turns():
            graph.invoke({"messages": [HumanMessage(text)]}, cfg)
        tup = raw.get_tuple(cfg)
        raw.put_writes(tup.config, [("customer_email", MARKERS["write"])], "task")
    assert set(found_markers(sqlite_files_bytes(db))) >= {
        "message", "tool_arg", "email", "configurable", "metadata", "write"}


def test_sqlite_sync_leaks_nothing(tmp_path: Path, key_provider: object) -> None:
    db = tmp_path / "agent.db"
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=key_provider,
                              redaction=None) as saver:
        _assert_state_intact(_run_sync(saver, "thread-1"))
        _assert_metadata_intact(saver, "thread-1")
    assert found_markers(sqlite_files_bytes(db)) == []


async def test_sqlite_async_leaks_nothing(tmp_path: Path, key_provider: object) -> None:
    db = tmp_path / "agent.db"
    async with SecureSaver.afrom_url(f"sqlite:///{db}", keyring=key_provider,
                                     redaction=None) as saver:
        _assert_state_intact(await _run_async(saver, "thread-1"))
    assert found_markers(sqlite_files_bytes(db)) == []


def _postgres_dump(url: str, *, ours: bool = True) -> bytes:
    out = []
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
        expected = {"checkpoints", "checkpoint_blobs", "checkpoint_writes"}
        if ours:
            expected |= {"securesaver_threads", "securesaver_tenant_keys", "securesaver_events"}
        assert expected <= {t[0] for t in tables}
        for (table,) in tables:
            for (row,) in conn.execute(f'SELECT t::text FROM "{table}" t'):
                out.append(row)
    return "\n".join(out).encode()


@pytest.mark.postgres
def test_control_raw_postgres_saver_leaks(pg_url: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver
    with PostgresSaver.from_conn_string(pg_url) as raw:
        raw.setup()
        graph = build_support_graph(raw)
        cfg = _config("t")
        graph.update_state(cfg, {"turns": INT_MARKER})
        for text in turns():
            graph.invoke({"messages": [HumanMessage(text)]}, cfg)
    assert {"message", "email", "configurable", "metadata", "int"} <= set(
        found_markers(_postgres_dump(pg_url, ours=False)))


@pytest.mark.postgres
def test_postgres_sync_leaks_nothing(pg_url: str) -> None:
    with SecureSaver.from_url(pg_url, keyring=Keyring.generate(), redaction=None) as saver:
        _assert_state_intact(_run_sync(saver, "thread-1"))
        _assert_metadata_intact(saver, "thread-1")
    assert found_markers(_postgres_dump(pg_url)) == []


@pytest.mark.postgres
async def test_postgres_async_leaks_nothing(pg_url: str) -> None:
    async with SecureSaver.afrom_url(pg_url, keyring=Keyring.generate(),
                                     redaction=None) as saver:
        _assert_state_intact(await _run_async(saver, "thread-1"))
    assert found_markers(_postgres_dump(pg_url)) == []
