"""Fuzz the stored tables of a real multi-node graph: flip, delete, duplicate and transplant
rows and fields (pending writes included). Every mutation must be refused (TamperedDataError
from the resume, and `scan --verify` reports it) or provably harmless: the resumed graph's
result is exactly the untouched database's.

Deleting whole rows is outside what any at-rest check can see (README, threat model): a
deleted checkpoint or a task's deleted writes look like a crash before they were saved, and
LangGraph re-runs that work. Those mutations are still run here and must be harmless.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.audit.scan import scan

from .boundary_helpers import build_graph, cfg, inner_id

SEED = 20261201
MUTATIONS_PER_KIND = 14

Mutation = Callable[[sqlite3.Connection, random.Random], str]


def _rows(conn: sqlite3.Connection, table: str) -> list[sqlite3.Row]:
    conn.row_factory = sqlite3.Row
    return list(conn.execute(f"SELECT rowid AS rid, * FROM {table} ORDER BY rowid"))


def _flip_bytes(value: Any, rng: random.Random) -> Any:
    if isinstance(value, int):
        return value + rng.choice((-1, 1))
    if value is None:
        return "x"
    raw = bytearray(value if isinstance(value, bytes) else str(value).encode())
    if not raw:
        return b"\x00" if isinstance(value, bytes) else "x"
    at = rng.randrange(len(raw))
    raw[at] ^= 1 << rng.randrange(8)
    if isinstance(value, bytes):
        return bytes(raw)
    return raw.decode("utf-8", "replace")


def flip(conn: sqlite3.Connection, rng: random.Random) -> str:
    table = rng.choice(("checkpoints", "writes"))
    row = rng.choice(_rows(conn, table))
    columns = [c for c in row.keys() if c not in ("rid", "thread_id", "checkpoint_ns")]
    column = rng.choice(columns)
    conn.execute(f"UPDATE OR IGNORE {table} SET {column} = ? WHERE rowid = ?",
                 (_flip_bytes(row[column], rng), row["rid"]))
    return f"flip {table}.{column} of row {row['rid']}"


def delete(conn: sqlite3.Connection, rng: random.Random) -> str:
    table = rng.choice(("checkpoints", "writes"))
    row = rng.choice(_rows(conn, table))
    conn.execute(f"DELETE FROM {table} WHERE rowid = ?", (row["rid"],))
    return f"delete {table} row {row['rid']}"


def duplicate(conn: sqlite3.Connection, rng: random.Random) -> str:
    if rng.random() < 0.5:
        row = rng.choice(_rows(conn, "writes"))
        new_idx = row["idx"] + rng.choice((1, 2, 50))
        conn.execute("INSERT OR IGNORE INTO writes (thread_id, checkpoint_ns, checkpoint_id, "
                     "task_id, task_path, idx, channel, type, value) VALUES (?,?,?,?,?,?,?,?,?)",
                     (row["thread_id"], row["checkpoint_ns"], row["checkpoint_id"],
                      row["task_id"], row["task_path"], new_idx, row["channel"], row["type"],
                      row["value"]))
        return f"duplicate write row {row['rid']} at idx {new_idx}"
    row = rng.choice(_rows(conn, "checkpoints"))
    (latest,) = conn.execute("SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = ?",
                             (row["thread_id"],)).fetchone()
    new_id = latest[:-1] + ("f" if latest[-1] != "f" else "e")
    if new_id <= latest:
        new_id = latest + "0"
    conn.execute("INSERT OR IGNORE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
                 "parent_checkpoint_id, type, checkpoint, metadata) VALUES (?,?,?,?,?,?,?)",
                 (row["thread_id"], row["checkpoint_ns"], new_id, latest, row["type"],
                  row["checkpoint"], row["metadata"]))
    return f"replay checkpoint row {row['rid']} as the newest"


def transplant(conn: sqlite3.Connection, rng: random.Random) -> str:
    table = rng.choice(("checkpoints", "writes"))
    rows = _rows(conn, table)
    src, dst = rng.sample(rows, 2)
    columns = (["checkpoint", "metadata", "parent_checkpoint_id"] if table == "checkpoints"
               else ["value", "task_id", "channel", "task_path", "idx"])
    column = rng.choice(columns)
    conn.execute(f"UPDATE OR IGNORE {table} SET {column} = ? WHERE rowid = ?",
                 (src[column], dst["rid"]))
    return f"transplant {table}.{column} from row {src['rid']} to row {dst['rid']}"


KINDS: dict[str, Mutation] = {"flip": flip, "delete": delete, "duplicate": duplicate,
                              "transplant": transplant}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fuzz")
    db = root / "base.db"
    ring = Keyring.generate()
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=ring, redaction=None) as saver:
        graph = build_graph(saver)
        for thread in ("t1", "t2"):
            graph.invoke({"log": []}, cfg(thread))
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=ring, redaction=None) as saver:
        history = {thread: _history(saver, thread) for thread in ("t1", "t2")}
    expected = {}
    for thread in ("t1", "t2"):
        copy = root / f"expected-{thread}.db"
        shutil.copy(db, copy)
        with SecureSaver.from_url(f"sqlite:///{copy}", keyring=ring, redaction=None) as saver:
            expected[thread] = build_graph(saver).invoke(Command(resume="yes"), cfg(thread))
    with sqlite3.connect(db) as conn:
        writes = conn.execute("SELECT count(*) FROM writes WHERE thread_id = ?",
                              (inner_id("t1"),)).fetchone()[0]
    assert writes >= 4
    return {"db": db, "ring": ring, "expected": expected, "history": history, "root": root}


def _history(saver: SecureSaver, thread: str) -> dict[str, Any]:
    return {t.checkpoint["id"]: (t.checkpoint, t.metadata, t.parent_config, t.pending_writes)
            for t in saver.list(cfg(thread))}


def _harmless_history(seen: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    """Every checkpoint still listed reads exactly as before; rows may be missing (deleted),
    and a task's pending writes may be missing only as a whole (a crash before they were
    saved), never in part."""
    for cid, (checkpoint, metadata, parent, writes) in seen.items():
        assert cid in expected, f"{what}: a checkpoint appeared"
        want = expected[cid]
        assert (checkpoint, metadata, parent) == want[:3], f"{what}: a checkpoint changed"
        kept = {w[0] for w in writes}
        assert writes == [w for w in want[3] if w[0] in kept], f"{what}: writes changed"


def _outcome(db: Path, ring: Keyring, baseline: dict[str, Any], what: str) -> list[str]:
    """The threads whose reads refused the database (the others were checked harmless)."""
    refused = []
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=ring, redaction=None) as saver:
        for thread in ("t1", "t2"):
            try:
                _harmless_history(_history(saver, thread), baseline["history"][thread], what)
                result = build_graph(saver).invoke(Command(resume="yes"), cfg(thread))
            except TamperedDataError:
                refused.append(thread)
                continue
            # accepted: the result is exactly what the untouched database gives
            assert result == baseline["expected"][thread], f"{what}: accepted and harmful"
    return refused


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_mutation_is_refused_or_harmless(baseline: dict[str, Any], kind: str) -> None:
    rng = random.Random(f"{SEED}-{kind}")
    outcomes: dict[str, int] = {}
    for n in range(MUTATIONS_PER_KIND):
        db = baseline["root"] / f"{kind}-{n}.db"
        shutil.copy(baseline["db"], db)
        with sqlite3.connect(db) as conn:
            what = KINDS[kind](conn, rng)
            conn.commit()
        # scan first: it must flag what reads will refuse (and it changes nothing)
        with SecureSaver.from_url(f"sqlite:///{db}", keyring=baseline["ring"],
                                  redaction=None) as saver:
            report = scan(saver, keyring=baseline["ring"], verify=True)
        refused = _outcome(db, baseline["ring"], baseline, what)
        if refused:
            assert not report.ok, f"{what}: refused by reads, passed by scan --verify"
        status = "refused" if refused else "harmless"
        outcomes[status] = outcomes.get(status, 0) + 1
    assert sum(outcomes.values()) == MUTATIONS_PER_KIND
    if kind != "delete":  # the fuzz must actually reach rows reads depend on
        assert outcomes.get("refused", 0) >= MUTATIONS_PER_KIND // 3, outcomes
