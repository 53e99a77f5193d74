"""A real multi-node graph and raw-table editing (an attacker with database write access),
shared by the storage-boundary tests; one fingerprinted idempotent call to tamper with, shared
by the registry tests."""

from __future__ import annotations

import operator
import pickle
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import ormsgpack
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from langgraph_securesaver import SecureSaver
from langgraph_securesaver.idempotency import Claim, IdempotencyStore, KeyScope
from langgraph_securesaver.idempotency.keys import fingerprint
from langgraph_securesaver.keys.crypto import TenantKeys
from langgraph_securesaver.tenancy import inner_thread_id

TENANT = "acme"


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    count: int


SIDE_EFFECTS: list[str] = []


def build_graph(checkpointer: Any) -> Any:
    """a -> (b, c in parallel) -> (d1 interrupts, d2 writes) -> end.

    The first run stops at d1's interrupt, so the latest checkpoint holds pending writes of
    two tasks (d2's regular writes and d1's interrupt); resuming applies them."""

    def a(state: State) -> dict[str, Any]:
        return {"log": ["a"], "count": 1}

    def b(state: State) -> dict[str, Any]:
        return {"log": ["b"]}

    def c(state: State) -> dict[str, Any]:
        return {"log": ["c"]}

    def d1(state: State) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"log": [f"d1:{answer}"]}

    def d2(state: State) -> dict[str, Any]:
        SIDE_EFFECTS.append("d2")
        return {"log": ["d2", "d2b"], "count": state.get("count", 0) + 1}

    builder = StateGraph(State)
    for name, fn in (("a", a), ("b", b), ("c", c), ("d1", d1), ("d2", d2)):
        builder.add_node(name, fn)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("a", "c")
    builder.add_edge(["b", "c"], "d1")
    builder.add_edge(["b", "c"], "d2")
    builder.add_edge("d1", END)
    builder.add_edge("d2", END)
    return builder.compile(checkpointer=checkpointer)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": TENANT}}


def inner_id(thread: str) -> str:
    return inner_thread_id(TENANT, thread)


# ---------------------------------------------------------------------------------------------
# one idempotent call recorded with its fingerprint (the registry tests forge that row)
# ---------------------------------------------------------------------------------------------
class Calls:
    """An effect that counts how often it really ran."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, claim: Claim) -> str:
        self.n += 1
        return "sent"


@dataclass
class Refund:
    store: IdempotencyStore
    keys: TenantKeys
    scope: KeyScope
    calls: Calls  # ran once
    other: str  # the fingerprint of other arguments ({"amount": 99999}), to forge with


def execute_fingerprinted_refund(saver: SecureSaver, tenant: str) -> Refund:
    """A refund of ``{"amount": 10}`` executed once on thread t1 under a fresh key."""
    store = IdempotencyStore.for_saver(saver)
    keys = store.tenant_keys(tenant)
    scope = KeyScope(tenant, "t1", "k-" + uuid.uuid4().hex, "business", "refund")
    calls = Calls()
    store.execute(scope, calls, fingerprint=fingerprint(keys, {"amount": 10}))
    return Refund(store, keys, scope, calls, fingerprint(keys, {"amount": 99999}))


# ---------------------------------------------------------------------------------------------
# payloads that run code in LangGraph's default serializer
# ---------------------------------------------------------------------------------------------
class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        import os
        return (os.system, (f"touch {self.path}",))


def constructor_payload(marker: Path) -> bytes:
    """A msgpack document whose ext type 0 names os.system (JsonPlusSerializer calls it)."""
    call = ormsgpack.packb(("os", "system", f"touch {marker}"))
    return ormsgpack.packb({"v": 4, "id": "x", "channel_values": {"x": ormsgpack.Ext(0, call)},
                            "channel_versions": {}, "versions_seen": {}})


def ext_value(marker: Path) -> bytes:
    return ormsgpack.packb(ormsgpack.Ext(0, ormsgpack.packb(("os", "system",
                                                              f"touch {marker}"))))


def pickle_payload(marker: Path) -> bytes:
    return pickle.dumps(_Touch(marker))


def json_constructor(marker: Path) -> dict[str, Any]:
    return {"lc": 2, "type": "constructor", "id": ["os", "system"],
            "kwargs": {"command": f"touch {marker}"}}


# ---------------------------------------------------------------------------------------------
# raw access
# ---------------------------------------------------------------------------------------------
@contextmanager
def sqlite_conn(db: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(db)
    try:
        yield conn
        conn.commit()
    finally:
        conn.close()


@contextmanager
def pg_conn(url: str) -> Iterator[Any]:
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn


def latest_checkpoint_id(backend: str, where: Any, thread: str) -> str:
    sql = ("SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = "
           + ("?" if backend == "sqlite" else "%s"))
    if backend == "sqlite":
        with sqlite_conn(where) as conn:
            return str(conn.execute(sql, (inner_id(thread),)).fetchone()[0])
    with pg_conn(where) as conn:
        return str(conn.execute(sql, (inner_id(thread),)).fetchone()[0])


# ---------------------------------------------------------------------------------------------
# editing rows in place (SQLite: msgpack document + JSON text; PostgreSQL: JSONB)
# ---------------------------------------------------------------------------------------------
class Raw:
    """Raw SQL on one database, with the parameter style and table names of its backend."""

    def __init__(self, backend: str, where: Any) -> None:
        self.backend = backend
        self.where = where
        self.writes = "writes" if backend == "sqlite" else "checkpoint_writes"
        self.value_col = "value" if backend == "sqlite" else "blob"

    def q(self, sql: str) -> str:
        return sql if self.backend == "sqlite" else sql.replace("?", "%s")

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if self.backend == "sqlite":
            with sqlite_conn(self.where) as conn:
                return list(conn.execute(sql, args).fetchall())
        with pg_conn(self.where) as conn:
            return list(conn.execute(self.q(sql), args).fetchall())

    def run(self, sql: str, *args: Any) -> int:
        if self.backend == "sqlite":
            with sqlite_conn(self.where) as conn:
                return int(conn.execute(sql, args).rowcount)
        with pg_conn(self.where) as conn:
            return int(conn.execute(self.q(sql), args).rowcount)

    def latest(self, thread: str) -> str:
        return latest_checkpoint_id(self.backend, self.where, thread)

    def body(self, thread: str, cid: str) -> dict[str, Any]:
        (raw,) = self.rows("SELECT checkpoint FROM checkpoints WHERE thread_id = ? AND "
                           "checkpoint_id = ?", inner_id(thread), cid)[0]
        return ormsgpack.unpackb(raw) if self.backend == "sqlite" else dict(raw)

    def set_body(self, thread: str, cid: str, body: dict[str, Any]) -> None:
        import json
        value: Any = (ormsgpack.packb(body) if self.backend == "sqlite" else json.dumps(body))
        cast = "" if self.backend == "sqlite" else "::jsonb"
        assert self.run(f"UPDATE checkpoints SET checkpoint = ?{cast} WHERE thread_id = ? AND "
                        "checkpoint_id = ?", value, inner_id(thread), cid) == 1

    def metadata(self, thread: str, cid: str) -> dict[str, Any]:
        import json
        (raw,) = self.rows("SELECT metadata FROM checkpoints WHERE thread_id = ? AND "
                           "checkpoint_id = ?", inner_id(thread), cid)[0]
        return json.loads(raw) if self.backend == "sqlite" else dict(raw)

    def set_metadata(self, thread: str, cid: str, md: dict[str, Any]) -> None:
        import json
        cast = "" if self.backend == "sqlite" else "::jsonb"
        assert self.run(f"UPDATE checkpoints SET metadata = ?{cast} WHERE thread_id = ? AND "
                        "checkpoint_id = ?", json.dumps(md), inner_id(thread), cid) == 1

    def write_rows(self, thread: str, cid: str) -> list[tuple[Any, ...]]:
        """(task_id, task_path, idx, channel, type, value) of a checkpoint's writes."""
        return self.rows(f"SELECT task_id, task_path, idx, channel, type, {self.value_col} FROM "
                         f"{self.writes} WHERE thread_id = ? AND checkpoint_id = ? "
                         "ORDER BY task_id, idx", inner_id(thread), cid)

    def insert_write(self, thread: str, cid: str, row: tuple[Any, ...]) -> None:
        task_id, task_path, idx, channel, type_, value = row
        assert self.run(f"INSERT INTO {self.writes} (thread_id, checkpoint_ns, checkpoint_id, "
                        f"task_id, task_path, idx, channel, type, {self.value_col}) VALUES "
                        "(?, '', ?, ?, ?, ?, ?, ?, ?)", inner_id(thread), cid, task_id,
                        task_path, idx, channel, type_, value) == 1
