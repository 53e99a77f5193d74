"""Several put_writes calls under one task id, as LangGraph (and its own tests) make them, verify
on SQLite and PostgreSQL, sync and async: a task's interrupt/resume/error saved apart from its
other writes, upserted again, re-saved without a task path, a null task's accumulating writes.
Reads return exactly what the raw saver returns for the same calls, and the graph flow of
LangGraph's ``test_strict_resume`` resumes. The same multi-call rows still refuse a duplicated,
dropped or transplanted write (a reordered one reads in its sealed order)."""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.graph import START, StateGraph
from langgraph.types import Command, Interrupt, interrupt

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.audit.scan import scan

from .boundary_helpers import Raw
from .conftest import drop_pg_schema, new_pg_schema, pg_url_in

TENANT = "acme"
# LangGraph's special channels (private constants there; the values are the stored format)
ERROR, INTERRUPT, RESUME = "__error__", "__interrupt__", "__resume__"
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
PATH_A = "~__pregel_pull, a"
PATH_B = "~__pregel_pull, b"

# (task id, writes, task path or None when the caller passes none), in call order
CALLS: list[tuple[str, list[tuple[str, Any]], str | None]] = [
    ("task-a", [("log", "a1"), ("count", 1)], PATH_A),
    ("task-a", [(INTERRUPT, "first?")], PATH_A),
    ("task-a", [(INTERRUPT, "second?"), (RESUME, ["1"])], PATH_A),  # upserts -3, adds -4
    ("task-a", [(INTERRUPT, "second, again?")], None),  # re-saved without its task path
    ("task-a", [("log", "a1"), ("count", 1), ("extra", 3)], PATH_A),  # 0, 1 kept; 2 added
    (NULL_TASK_ID, [("log", "u1")], None),  # a null task's writes accumulate
    (NULL_TASK_ID, [("log", "u1"), ("count", 5)], None),
    (NULL_TASK_ID, [("log", "u1"), ("count", 5), (RESUME, "r0")], None),
    ("task-b", [(ERROR, "ValueError('boom')")], PATH_B),
    ("task-b", [(ERROR, "ValueError('boom again')")], PATH_B),  # retried: upserted
]


def _apply_sync(saver: BaseCheckpointSaver, thread: str) -> dict[str, Any]:
    config = saver.put({"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
                       empty_checkpoint(), {"source": "input", "step": -1}, {})
    for task, writes, path in CALLS:
        if path is None:
            saver.put_writes(config, writes, task)
        else:
            saver.put_writes(config, writes, task, path)
    return config


async def _apply_async(saver: BaseCheckpointSaver, thread: str) -> dict[str, Any]:
    config = await saver.aput({"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
                              empty_checkpoint(), {"source": "input", "step": -1}, {})
    for task, writes, path in CALLS:
        if path is None:
            await saver.aput_writes(config, writes, task)
        else:
            await saver.aput_writes(config, writes, task, path)
    return config


@contextmanager
def _raw_saver(backend: str, url: str, tmp_path: Path) -> Iterator[BaseCheckpointSaver]:
    """The raw LangGraph saver of the backend (its own database/schema)."""
    if backend == "sqlite":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver
        conn = sqlite3.connect(tmp_path / "raw.db", check_same_thread=False)
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            yield saver
        finally:
            conn.close()
    else:  # a schema of its own: the wrapped saver's database holds only sealed rows
        from langgraph.checkpoint.postgres import PostgresSaver
        schema = new_pg_schema()
        try:
            with PostgresSaver.from_conn_string(pg_url_in(schema)) as saver:
                saver.setup()
                yield saver
        finally:
            drop_pg_schema(schema)


def _raw_answer(backend: str, url: str, tmp_path: Path) -> list[tuple[str, str, Any]]:
    with _raw_saver(backend, url, tmp_path) as raw:
        config = _apply_sync(raw, "raw-thread")
        tup = raw.get_tuple(config)
        assert tup is not None
        return list(tup.pending_writes or [])


def _same(wrapped: list[Any] | None, raw: list[Any], backend: str) -> None:
    if backend == "sqlite":
        assert wrapped == raw
        return
    # PostgreSQL's upsert keeps a row's first task path: it orders task-a's interrupt, re-saved
    # without a path, by that one; SecureSaver returns the sealed writes_sort_key order
    assert wrapped is not None and sorted(map(repr, wrapped)) == sorted(map(repr, raw))
    assert [w for w in wrapped if w[0] != "task-a"] == [w for w in raw if w[0] != "task-a"]


def test_multi_call_writes_read_back_as_raw(database: tuple[str, Raw], keyring: Keyring,
                                            tmp_path: Path) -> None:
    url, raw = database
    backend = raw.backend
    want = _raw_answer(backend, url, tmp_path)
    # the raw saver kept the first regular writes, the last special ones and added idx 2
    assert ("task-a", INTERRUPT, "second, again?") in want
    assert ("task-a", "extra", 3) in want and ("task-b", ERROR, "ValueError('boom again')") in want
    with SecureSaver.from_url(url, keyring=keyring, default_tenant=TENANT) as saver:
        config = _apply_sync(saver, "t1")
        tup = saver.get_tuple(config)
        assert tup is not None
        _same(tup.pending_writes, want, backend)
        listed = next(iter(saver.list({"configurable": {"thread_id": "t1"}})))
        _same(listed.pending_writes, want, backend)
        assert scan(saver, keyring=keyring, verify=True).ok


def test_multi_call_writes_read_back_as_raw_async(database: tuple[str, Raw],
                                                  keyring: Keyring, tmp_path: Path) -> None:
    url, raw = database
    backend = raw.backend
    want = _raw_answer(backend, url, tmp_path)

    async def main() -> None:
        async with SecureSaver.afrom_url(url, keyring=keyring, default_tenant=TENANT) as saver:
            config = await _apply_async(saver, "t1")
            tup = await saver.aget_tuple(config)
            assert tup is not None
            _same(tup.pending_writes, want, backend)
            listed = [t async for t in saver.alist({"configurable": {"thread_id": "t1"}})]
            _same(listed[0].pending_writes, want, backend)

    asyncio.run(main())


# --- the same rows, edited by someone with write access to the database -------------------
def _rows(raw: Raw, cid: str, task: str) -> list[tuple[Any, ...]]:
    return [r for r in raw.write_rows("t1", cid) if r[0] == task]


def _duplicated(raw: Raw, cid: str) -> None:
    row = next(r for r in _rows(raw, cid, "task-a") if r[2] == 2)  # call 5's added write
    raw.insert_write("t1", cid, (row[0], row[1], 7, *row[3:]))


def _reordered(raw: Raw, cid: str) -> None:
    for old, new in ((0, 1000), (1, 0), (1000, 1)):
        assert raw.run(f"UPDATE {raw.writes} SET idx = ? WHERE checkpoint_id = ? AND "
                       "task_id = 'task-a' AND idx = ?", new, cid, old) == 1


def _dropped_regular(raw: Raw, cid: str) -> None:  # claimed by call 1's and call 5's rows
    assert raw.run(f"DELETE FROM {raw.writes} WHERE checkpoint_id = ? AND "
                   "task_id = 'task-a' AND idx = 1", cid) == 1


def _dropped_null_task_update(raw: Raw, cid: str) -> None:  # claimed by the third call's rows
    assert raw.run(f"DELETE FROM {raw.writes} WHERE checkpoint_id = ? AND task_id = ? AND "
                   "idx = 1", cid, NULL_TASK_ID) == 1


def _transplanted(raw: Raw, cid: str) -> None:
    """task-b's error value copied over task-a's interrupt (same checkpoint, same idx)."""
    (err,) = [r for r in _rows(raw, cid, "task-b")]
    assert raw.run(f"UPDATE {raw.writes} SET {raw.value_col} = ? WHERE checkpoint_id = ? AND "
                   "task_id = 'task-a' AND idx = -3", err[5], cid) == 1


EDITS: dict[str, Callable[[Raw, str], None]] = {
    "duplicated": _duplicated, "dropped_regular": _dropped_regular,
    "dropped_null_task_update": _dropped_null_task_update, "transplanted": _transplanted}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_edits_of_multi_call_writes_are_refused(database: tuple[str, Raw],
                                                keyring: Keyring, edit: str) -> None:
    url, raw = database
    with SecureSaver.from_url(url, keyring=keyring, default_tenant=TENANT) as saver:
        config = _apply_sync(saver, "t1")
        _apply_sync(saver, "t2")
        assert saver.get_tuple(config) is not None
    cid = config["configurable"]["checkpoint_id"]
    EDITS[edit](raw, cid)
    with SecureSaver.from_url(url, keyring=keyring, default_tenant=TENANT) as saver:
        with pytest.raises(TamperedDataError):
            saver.get_tuple(config)
        assert saver.get_tuple({"configurable": {"thread_id": "t2"}}) is not None
        assert not scan(saver, keyring=keyring, verify=True).ok

    async def main() -> None:
        async with SecureSaver.afrom_url(url, keyring=keyring,
                                         default_tenant=TENANT) as asaver:
            with pytest.raises(TamperedDataError):
                await asaver.aget_tuple(config)

    asyncio.run(main())


def test_reordered_writes_read_in_their_sealed_order(database: tuple[str, Raw],
                                                    keyring: Keyring) -> None:
    """Swapped stored idx values only change the order the inner saver returns the rows in
    (which the base API does not promise): reads return the sealed order, unchanged."""
    url, raw = database
    with SecureSaver.from_url(url, keyring=keyring, default_tenant=TENANT) as saver:
        config = _apply_sync(saver, "t1")
        before = saver.get_tuple(config).pending_writes
    _reordered(raw, config["configurable"]["checkpoint_id"])
    with SecureSaver.from_url(url, keyring=keyring, default_tenant=TENANT) as saver:
        assert saver.get_tuple(config).pending_writes == before


# --- the graph flow of LangGraph's test_strict_resume ---------------------------------------
class _State(TypedDict):
    log: Annotated[list[str], operator.add]


def _ask_twice(checkpointer: Any) -> Any:
    def ask_twice(state: _State) -> dict[str, Any]:
        first = interrupt("first?")
        second = interrupt("second?")
        return {"log": [f"{first},{second}"]}

    return (StateGraph(_State).add_node("ask", ask_twice).add_edge(START, "ask")
            .compile(checkpointer=checkpointer))


def test_interrupt_saved_again_under_its_task_id_is_answered(database: tuple[str, Raw],
                                                             keyring: Keyring) -> None:
    url, _raw = database
    with SecureSaver.from_url(url, keyring=keyring, default_tenant=TENANT) as saver:
        graph = _ask_twice(saver)
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        graph.invoke({"log": []}, config)
        (card,) = graph.get_state(config).interrupts
        graph.invoke(Command(resume={card.id: "1"}), config)
        state = graph.get_state(config)
        saver.put_writes(state.config, [(INTERRUPT, (Interrupt(value="second?", id=card.id),))],
                         state.tasks[0].id)
        assert graph.invoke(Command(resume={card.id: "2"}), config)["log"] == ["1,2"]


def test_interrupt_saved_again_under_its_task_id_is_answered_async(
        database: tuple[str, Raw], keyring: Keyring) -> None:
    url, _raw = database

    async def main() -> None:
        async with SecureSaver.afrom_url(url, keyring=keyring, default_tenant=TENANT) as saver:
            graph = _ask_twice(saver)
            config = {"configurable": {"thread_id": str(uuid.uuid4())}}
            await graph.ainvoke({"log": []}, config)
            (card,) = (await graph.aget_state(config)).interrupts
            await graph.ainvoke(Command(resume={card.id: "1"}), config)
            state = await graph.aget_state(config)
            await saver.aput_writes(
                state.config, [(INTERRUPT, (Interrupt(value="second?", id=card.id),))],
                state.tasks[0].id)
            result = await graph.ainvoke(Command(resume={card.id: "2"}), config)
            assert result["log"] == ["1,2"]

    asyncio.run(main())
