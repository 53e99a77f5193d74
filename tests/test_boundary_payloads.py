"""A code-running payload in every column an inner saver decodes executes nothing, anywhere.

For each column (SQLite: checkpoint body, pending-write value as msgpack and as pickle, clear
metadata; PostgreSQL: checkpoint_blobs, checkpoint_writes, metadata JSONB, an inlined value in
the checkpoint JSONB) the payload is planted by raw SQL (an attacker with database write access),
then every path that reads the row runs: get_tuple, list, aget_tuple, a graph resume, `scan
--verify`, `audit`, the key-less pruner and `rotate-keys --reencrypt`. A marker file the payload
would create must never appear; each read raises TamperedDataError, each command reports it,
and the tenant's other thread keeps working.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401  (registers the commands)
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.retention import RetentionPolicy

from .boundary_helpers import (
    build_graph,
    cfg,
    constructor_payload,
    ext_value,
    inner_id,
    json_constructor,
    latest_checkpoint_id,
    pg_conn,
    pickle_payload,
    sqlite_conn,
)

runner = CliRunner()

CASES = [
    ("sqlite", "checkpoint_body"), ("sqlite", "write_msgpack"), ("sqlite", "write_pickle"),
    ("sqlite", "metadata_json"),
    ("postgres", "blob"), ("postgres", "write_msgpack"), ("postgres", "metadata_json"),
    ("postgres", "inline_value"),
]

#: what the refusal names: the inner table's row, or (for a value the wrapper opens itself,
#: on any saver) the checkpoint as the inner saver stores it
NAMED = {"checkpoint_body": "checkpoints row", "write_msgpack": "writes row",
         "write_pickle": "writes row", "metadata_json": "(as the inner saver stores it",
         "blob": "checkpoint_blobs row", "inline_value": "(as the inner saver stores it"}


def _inject(backend: str, where: Any, column: str, marker: Path) -> None:
    thread = inner_id("t1")
    cid = latest_checkpoint_id(backend, where, "t1")
    if backend == "sqlite":
        with sqlite_conn(where) as conn:
            if column == "checkpoint_body":
                n = conn.execute("UPDATE checkpoints SET type = 'msgpack', checkpoint = ? "
                                 "WHERE thread_id = ? AND checkpoint_id = ?",
                                 (constructor_payload(marker), thread, cid)).rowcount
            elif column in ("write_msgpack", "write_pickle"):
                kind, blob = (("msgpack", ext_value(marker)) if column == "write_msgpack"
                              else ("pickle", pickle_payload(marker)))
                n = conn.execute("UPDATE writes SET type = ?, value = ? WHERE thread_id = ? "
                                 "AND checkpoint_id = ?", (kind, blob, thread, cid)).rowcount
            else:
                n = conn.execute("UPDATE checkpoints SET metadata = ? WHERE thread_id = ? AND "
                                 "checkpoint_id = ?", (json.dumps(json_constructor(marker)),
                                                       thread, cid)).rowcount
        assert n >= 1
        return
    with pg_conn(where) as conn:
        if column == "blob":
            n = conn.execute("UPDATE checkpoint_blobs SET type = 'msgpack', blob = %s WHERE "
                             "thread_id = %s AND channel = 'log'",
                             (ext_value(marker), thread)).rowcount
        elif column == "write_msgpack":
            n = conn.execute("UPDATE checkpoint_writes SET type = 'msgpack', blob = %s WHERE "
                             "thread_id = %s AND checkpoint_id = %s",
                             (ext_value(marker), thread, cid)).rowcount
        elif column == "metadata_json":
            n = conn.execute("UPDATE checkpoints SET metadata = %s::jsonb WHERE thread_id = %s "
                             "AND checkpoint_id = %s",
                             (json.dumps(json_constructor(marker)), thread, cid)).rowcount
        else:
            n = conn.execute("UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, "
                             "'{channel_values,injected}', %s::jsonb) WHERE thread_id = %s AND "
                             "checkpoint_id = %s",
                             (json.dumps(json_constructor(marker)), thread, cid)).rowcount
    assert n >= 1


@pytest.mark.parametrize(("database", "column"), CASES, indirect=["database"],
                         ids=[f"{b}-{c}" for b, c in CASES])
def test_payload_in_every_decoded_column_executes_nothing(database, column: str,
                                                          tmp_path: Path) -> None:
    url, raw = database
    backend, where = raw.backend, raw.where
    ring = Keyring.generate()
    ring_path = ring.save(tmp_path / "keyring.json")
    marker = tmp_path / "PWNED"
    with SecureSaver.from_url(url, keyring=ring,
                              retention=RetentionPolicy(idle_ttl="1h")) as saver:
        graph = build_graph(saver)
        for thread in ("t1", "t2"):
            graph.invoke({"log": []}, cfg(thread))
        assert saver.get_tuple(cfg("t1")).pending_writes  # d1's interrupt and d2's writes
    _inject(backend, where, column, marker)

    def untouched() -> None:
        assert not marker.exists(), "a stored payload was evaluated"

    with SecureSaver.from_url(url, keyring=ring) as saver:
        with pytest.raises(TamperedDataError) as refused:
            saver.get_tuple(cfg("t1"))
        assert str(marker) not in str(refused.value)
        assert NAMED[column] in str(refused.value)   # the table and row, never the value
        untouched()
        with pytest.raises(TamperedDataError):
            list(saver.list(cfg("t1")))
        untouched()
        with pytest.raises(TamperedDataError):
            build_graph(saver).invoke(Command(resume="yes"), cfg("t1"))
        untouched()
        # the tenant's other thread is unaffected, and the tampered one was left as it was
        assert build_graph(saver).invoke(Command(resume="yes"), cfg("t2"))["log"][-1] in (
            "d1:yes", "d2b")
    untouched()

    async def async_read() -> None:
        async with SecureSaver.afrom_url(url, keyring=ring) as asaver:
            with pytest.raises(TamperedDataError):
                await asaver.aget_tuple(cfg("t1"))
            with pytest.raises(TamperedDataError):
                [t async for t in asaver.alist(cfg("t1"))]
            with pytest.raises(TamperedDataError):
                await build_graph(asaver).ainvoke(Command(resume="yes"), cfg("t1"))
            assert await asaver.aget_tuple(cfg("t2")) is not None
    asyncio.run(async_read())
    untouched()

    scan = runner.invoke(app, ["scan", "--url", url, "--keyring", str(ring_path), "--verify",
                               "--format", "json"])
    assert scan.exit_code == 1, scan.output
    report = json.loads(scan.stdout)
    assert any("t1" in v["location"] for v in report["violations"])
    untouched()

    audit = runner.invoke(app, ["audit", "--url", url, "--format", "json"])
    assert audit.exit_code == 1, audit.output
    assert any("tampered" in p for p in json.loads(audit.stdout)["problems"])
    untouched()

    rotate = runner.invoke(app, ["rotate-keys", "--url", url, "--keyring", str(ring_path),
                                 "--reencrypt", "--format", "json"])
    assert rotate.exit_code == 1, rotate.output
    assert json.loads(rotate.stdout)["reencrypt"]["errors"]
    untouched()

    # the pruner needs the keyring (to verify the registry rows' MACs) but never opens values
    # (the keyring file, as rotate-keys above left it)
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path),
                              redaction=None) as pruner:
        swept = pruner.prune_expired(now=time.time() + 7200)
    untouched()
    refused_t1 = [e for e in swept.errors if e[1] == "t1"]
    deleted_t1 = ("acme", "t1") in swept.deleted
    # the sweep never opens values: it refuses the row it cannot parse, or (plain JSON
    # columns) deletes the expired thread without evaluating anything
    # (the batched pruner deletes set-based, so a binary column is never parsed either: the
    # expired thread goes by retention, the payload unevaluated — the marker check above)
    assert deleted_t1 or (refused_t1 and "TamperedDataError" in refused_t1[0][2])
    assert not (deleted_t1 and refused_t1)
