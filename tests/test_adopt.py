"""Bringing in what a raw LangGraph saver wrote before SecureSaver wrapped it: such a thread
is never shown as empty (UnsealedDataError), and ``securesaver adopt`` seals it in place under
its tenant -- every old thread reads back through SecureSaver as it read raw, nothing of it
stays in clear in the live tables, a receipt each, and a run that stopped half-way finishes
when run again."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver, UnsealedDataError
from langgraph_securesaver.cli import app

from .graph_helpers import found_markers
from .test_thirdparty import build_graph, run_chat

runner = CliRunner()
THREADS = ["alpha", "beta"]


def _raw_saver(url: str) -> Any:
    if url.startswith("sqlite"):
        from langgraph.checkpoint.sqlite import SqliteSaver
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        return saver
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(conn)
    saver.setup()
    return saver


def _live_rows(url: str) -> bytes:
    """Every byte of every live row of the inner tables."""
    out = b""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        tables = ["checkpoints", "writes"]
        for t in tables:
            for row in conn.execute(f"SELECT * FROM {t}"):
                out += b"".join(v if isinstance(v, bytes) else str(v).encode() for v in row)
        conn.close()
        return out
    import psycopg
    with psycopg.connect(url) as conn:
        for t in ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]:
            for row in conn.execute(f"SELECT * FROM {t}"):
                out += b"".join(bytes(v) if isinstance(v, (bytes, memoryview))
                                else str(v).encode() for v in row)
    return out


def _state(saver: Any, thread: str) -> tuple[Any, ...]:
    graph = build_graph(saver)
    cfg = {"configurable": {"thread_id": thread}}
    history = [tuple(s.values.get("messages", [])) for s in graph.get_state_history(cfg)]
    return tuple(graph.get_state(cfg).values["messages"]), tuple(history)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent.db'}"
    return request.getfixturevalue("pg_url")


async def test_raw_threads_are_reported_then_adopted_in_place(url: str, tmp_path: Path) -> None:
    raw = _raw_saver(url)
    for thread in THREADS:
        await run_chat(raw, False, thread)
    expected = {t: _state(raw, t) for t in THREADS}
    assert found_markers(_live_rows(url))  # the raw saver keeps the conversation in clear

    ring = Keyring.generate()
    ring_path = ring.save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme", redaction=None) as s:
        with pytest.raises(UnsealedDataError, match="securesaver adopt"):
            s.get_tuple({"configurable": {"thread_id": "alpha"}})
        with pytest.raises(UnsealedDataError):  # what a graph run on it would hit first
            build_graph(s).get_state({"configurable": {"thread_id": "beta"}})

    dry = runner.invoke(app, ["adopt", "--url", url, "--tenant", "acme", "--keyring",
                              str(ring_path), "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout) == {"tenant": "acme", "would_adopt": THREADS}
    done = runner.invoke(app, ["adopt", "--url", url, "--tenant", "acme", "--keyring",
                               str(ring_path), "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert [a["thread_id"] for a in report["adopted"]] == THREADS
    assert all(a["checkpoints"] > 1 for a in report["adopted"])

    assert found_markers(_live_rows(url)) == []  # nothing of them in clear any more
    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme", redaction=None) as s:
        assert {t: _state(s, t) for t in THREADS} == expected
        assert {r.thread_id for r in s.receipts() if r.action == "adopted"} == set(THREADS)
        # the adopted threads are SecureSaver's now: deletion reaches them
        s.delete_thread("beta")
        assert s.get_tuple({"configurable": {"thread_id": "beta"}}) is None
    again = runner.invoke(app, ["adopt", "--url", url, "--tenant", "acme", "--keyring",
                                str(ring_path), "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["adopted"] == []


async def test_adopt_stopped_half_way_finishes_when_run_again(url: str) -> None:
    from langgraph_securesaver.ops.adopt import adopt_threads
    raw = _raw_saver(url)
    for thread in THREADS:
        await run_chat(raw, False, thread)
    expected = {t: _state(raw, t) for t in THREADS}
    ring = Keyring.generate()

    class Crash(Exception):
        pass

    real_delete = raw.delete_thread

    def crash_once(thread_id: str) -> None:
        raw.delete_thread = real_delete  # type: ignore[method-assign]
        raise Crash  # sealed copies written, clear rows not yet deleted

    raw.delete_thread = crash_once  # type: ignore[method-assign]
    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme", redaction=None) as s:
        with pytest.raises(Crash):
            adopt_threads(s, raw, "acme")
        report = adopt_threads(s, raw, "acme")
        assert sorted(report.adopted) == THREADS
        assert {t: _state(s, t) for t in THREADS} == expected
    assert found_markers(_live_rows(url)) == []
