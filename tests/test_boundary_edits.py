"""Every silent edit a database writer tried on the whole checkpoint is refused, by reads (sync
and async) and by `scan --verify` (exit 1), on SQLite and PostgreSQL; nothing is rewritten and
the other threads keep working."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401  (registers the commands)
from langgraph_securesaver.cli.main import app

from .boundary_helpers import Raw, build_graph, cfg, inner_id
from .conftest import Seeds

runner = CliRunner()


def _user_cfg(thread: str, user: str) -> dict[str, Any]:
    conf = cfg(thread)
    conf["configurable"]["user_id"] = user   # LangGraph copies it into the metadata
    return conf


# each edit: (raw, thread) -> None, tampering t1's latest checkpoint (or its writes)
def _versions_seen(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    body = raw.body(thread, cid)
    seen = body["versions_seen"]
    node = next(n for n in seen if seen[n])
    seen[node] = {ch: v for ch, v in list(seen[node].items())[:0]}   # "never saw anything"
    raw.set_body(thread, cid, body)


def _ts(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    body = raw.body(thread, cid)
    body["ts"] = "2020-01-01T00:00:00+00:00"
    raw.set_body(thread, cid, body)


def _updated_channels(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    body = raw.body(thread, cid)
    body["updated_channels"] = []
    raw.set_body(thread, cid, body)


def _value_deleted(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    if raw.backend == "sqlite":
        body = raw.body(thread, cid)
        del body["channel_values"]["count"]
        raw.set_body(thread, cid, body)
    else:  # the blob of the version the checkpoint names
        version = raw.body(thread, cid)["channel_versions"]["count"]
        assert raw.run("DELETE FROM checkpoint_blobs WHERE thread_id = ? AND channel = 'count' "
                       "AND version = ?", inner_id(thread), version) == 1


def _value_emptied(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    if raw.backend == "sqlite":
        body = raw.body(thread, cid)
        body["channel_values"] = {}
        raw.set_body(thread, cid, body)
    else:
        version = raw.body(thread, cid)["channel_versions"]["log"]
        assert raw.run("UPDATE checkpoint_blobs SET type = 'empty', blob = NULL WHERE "
                       "thread_id = ? AND channel = 'log' AND version = ?",
                       inner_id(thread), version) == 1


def _parent_nulled(raw: Raw, thread: str) -> None:
    assert raw.run("UPDATE checkpoints SET parent_checkpoint_id = NULL WHERE thread_id = ? AND "
                   "checkpoint_id = ?", inner_id(thread), raw.latest(thread)) == 1


def _body_rolled_back(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    (parent,) = raw.rows("SELECT parent_checkpoint_id FROM checkpoints WHERE thread_id = ? AND "
                         "checkpoint_id = ?", inner_id(thread), cid)[0]
    raw.set_body(thread, cid, raw.body(thread, parent))


def _clear_key_removed(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    md = raw.metadata(thread, cid)
    del md["source"]
    raw.set_metadata(thread, cid, md)


def _clear_key_altered(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    md = raw.metadata(thread, cid)
    md["step"] = 99
    raw.set_metadata(thread, cid, md)


def _clear_key_added(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    md = raw.metadata(thread, cid)
    md["run_id"] = "forged-run"
    raw.set_metadata(thread, cid, md)


def _blind_index_copied(raw: Raw, thread: str) -> None:
    """t2's latest checkpoint gets t1's (user u1's) blind-index entry."""
    mine = raw.metadata(thread, raw.latest(thread))
    other_cid = raw.latest("t2")
    other = raw.metadata("t2", other_cid)
    for key, value in mine.items():
        if key.startswith("ssbi_"):
            other[key] = value
    raw.set_metadata("t2", other_cid, other)


def _blind_index_removed(raw: Raw, thread: str) -> None:
    cid = raw.latest(thread)
    md = {k: v for k, v in raw.metadata(thread, cid).items() if not k.startswith("ssbi_")}
    raw.set_metadata(thread, cid, md)


def _d2_writes(raw: Raw, thread: str) -> list[tuple[Any, ...]]:
    rows = [r for r in raw.write_rows(thread, raw.latest(thread)) if r[3] in ("log", "count")]
    assert len(rows) == 2 and rows[0][0] == rows[1][0]
    return rows


def _write_duplicated(raw: Raw, thread: str) -> None:
    row = _d2_writes(raw, thread)[0]
    raw.insert_write(thread, raw.latest(thread), (row[0], row[1], 7, *row[3:]))


def _write_dropped(raw: Raw, thread: str) -> None:
    task, _path, idx, *_ = _d2_writes(raw, thread)[1]
    assert raw.run(f"DELETE FROM {raw.writes} WHERE thread_id = ? AND checkpoint_id = ? AND "
                   "task_id = ? AND idx = ?", inner_id(thread), raw.latest(thread), task,
                   idx) == 1


def _writes_reordered(raw: Raw, thread: str) -> None:
    """Swap the idx of a task's two writes (its values now apply in the other order)."""
    first, second = _d2_writes(raw, thread)
    cid = raw.latest(thread)
    task, a, b = first[0], first[2], second[2]
    for old, new in ((a, 1000), (b, a), (1000, b)):
        assert raw.run(f"UPDATE {raw.writes} SET idx = ? WHERE thread_id = ? AND "
                       "checkpoint_id = ? AND task_id = ? AND idx = ?", new, inner_id(thread),
                       cid, task, old) == 1


def _write_moved_to_other_path(raw: Raw, thread: str) -> None:
    task = _d2_writes(raw, thread)[0][0]
    assert raw.run(f"UPDATE {raw.writes} SET task_path = '~~zzz' WHERE thread_id = ? AND "
                   "checkpoint_id = ? AND task_id = ? AND idx = 1", inner_id(thread),
                   raw.latest(thread), task) == 1


EDITS: dict[str, Callable[[Raw, str], None]] = {
    "versions_seen": _versions_seen, "ts": _ts, "updated_channels": _updated_channels,
    "value_deleted": _value_deleted, "value_emptied": _value_emptied,
    "parent_nulled": _parent_nulled, "body_rolled_back": _body_rolled_back,
    "clear_key_removed": _clear_key_removed, "clear_key_altered": _clear_key_altered,
    "clear_key_added": _clear_key_added, "blind_index_copied": _blind_index_copied,
    "blind_index_removed": _blind_index_removed, "write_duplicated": _write_duplicated,
    "write_dropped": _write_dropped,
}
# moving a write to another task path, or swapping two writes' idx, only changes the order in
# which the inner saver returns them (the base API promises no order; LMDB returns idx -3
# before -4): reads return writes in sealed order (harmless); the scan still reports the move
SCAN_ONLY = {"write_moved_to_other_path": _write_moved_to_other_path,
             "writes_reordered": _writes_reordered}


def _populate(url: str, ring: Keyring) -> dict[str, Any]:
    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme") as saver:
        graph = build_graph(saver)
        graph.invoke({"log": []}, _user_cfg("t1", "u1"))
        graph.invoke({"log": []}, _user_cfg("t2", "u2"))
        graph.invoke({"log": []}, _user_cfg("t3", "u3"))
        assert [t.config["configurable"]["thread_id"]
                for t in saver.list(None, filter={"user_id": "u1"})][:1] == ["t1"]
        return saver.get_tuple(cfg("t3")).checkpoint["channel_values"]


def _seeded(seeds: Seeds, database: tuple[str, Raw]) -> tuple[Keyring, dict[str, Any]]:
    """A copy of ``_populate``'s threads, written once per module and backend (each test
    edits its own copy): their keyring and t3's channel values."""
    url, raw = database

    def seed(seed_url: str) -> tuple[Keyring, dict[str, Any]]:
        ring = Keyring.generate()
        return ring, _populate(seed_url, ring)
    ring, t3_before = seeds.copy(raw.backend, seed, url)
    return ring, copy.deepcopy(t3_before)


def _scan(url: str, ring_path: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["scan", "--url", url, "--keyring", str(ring_path), "--verify",
                                 "--format", "json"])
    return result.exit_code, (json.loads(result.stdout) if result.exit_code in (0, 1) else {})


def _reads_refuse(url: str, ring: Keyring, edit: str) -> None:
    def read(saver: SecureSaver) -> Any:
        if edit == "blind_index_copied":  # u1's filter now also matches t2's checkpoint
            return list(saver.list(None, filter={"user_id": "u1"}))
        return saver.get_tuple(cfg("t1"))

    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme") as saver:
        with pytest.raises(TamperedDataError):
            read(saver)
        with pytest.raises(TamperedDataError):   # the tenant-wide listing meets it too
            list(saver.list(None))
        assert saver.get_tuple(cfg("t3")) is not None   # other threads keep working

    async def aread() -> None:
        async with SecureSaver.afrom_url(url, keyring=ring, default_tenant="acme") as asaver:
            with pytest.raises(TamperedDataError):
                if edit == "blind_index_copied":
                    [t async for t in asaver.alist(None, filter={"user_id": "u1"})]
                else:
                    await asaver.aget_tuple(cfg("t1"))
            with pytest.raises(TamperedDataError):
                [t async for t in asaver.alist(None)]
            assert await asaver.aget_tuple(cfg("t3")) is not None
    asyncio.run(aread())


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_silent_edit_is_refused_by_reads_and_scan(database, db_seeds: Seeds, edit: str,
                                                  tmp_path: Path) -> None:
    url, raw = database
    ring, t3_before = _seeded(db_seeds, database)
    ring_path = ring.save(tmp_path / "keyring.json")
    code, report = _scan(url, ring_path)
    assert code == 0, report
    EDITS[edit](raw, "t1")
    snapshot = raw.rows("SELECT thread_id, checkpoint_id FROM checkpoints ORDER BY 1, 2")
    _reads_refuse(url, ring, edit)
    code, report = _scan(url, ring_path)
    assert code == 1 and report["violations"], report
    # nothing was deleted or rewritten as a side effect; t3 reads as before
    assert raw.rows("SELECT thread_id, checkpoint_id FROM checkpoints ORDER BY 1, 2") == snapshot
    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme") as saver:
        assert saver.get_tuple(cfg("t3")).checkpoint["channel_values"] == t3_before


@pytest.mark.parametrize("edit", sorted(SCAN_ONLY))
def test_moved_write_is_reported_by_scan_and_harmless_to_reads(database, db_seeds: Seeds,
                                                               edit: str,
                                                               tmp_path: Path) -> None:
    url, raw = database
    ring, _t3 = _seeded(db_seeds, database)
    ring_path = ring.save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme") as saver:
        before = saver.get_tuple(cfg("t1")).pending_writes
    SCAN_ONLY[edit](raw, "t1")
    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme") as saver:
        assert saver.get_tuple(cfg("t1")).pending_writes == before
    code, report = _scan(url, ring_path)
    assert code == 1 and {v["kind"] for v in report["violations"]} == {"write_moved"}


@pytest.mark.parametrize("strategy_async", [False, True])
def test_keep_latest_detaches_the_head_and_it_still_reads(database, db_seeds: Seeds,
                                                          strategy_async: bool) -> None:
    """keep_latest leaves the kept checkpoint without its (deleted) parent: that is not
    tampering, for get_tuple and for listings (which must not deadlock on the lookup)."""
    url, raw = database
    ring, _t3 = _seeded(db_seeds, database)
    with SecureSaver.from_url(url, keyring=ring, default_tenant="acme") as saver:
        saver.prune(["t1"], strategy="keep_latest")
        (parent,) = raw.rows("SELECT parent_checkpoint_id FROM checkpoints WHERE thread_id = ?",
                             inner_id("t1"))[0]
        assert parent is None
        assert saver.get_tuple(cfg("t1")).parent_config is None
        assert len(list(saver.list(None))) > 1
    if strategy_async:
        async def aread() -> None:
            async with SecureSaver.afrom_url(url, keyring=ring, default_tenant="acme") as asaver:
                assert (await asaver.aget_tuple(cfg("t1"))).parent_config is None
                assert len([t async for t in asaver.alist(None)]) > 1
        asyncio.run(aread())


@pytest.mark.parametrize("inner", ["memory", "sqlite", "postgres"])
def test_legitimate_write_patterns_still_read(inner: str, tmp_path: Path,
                                             request: pytest.FixtureRequest) -> None:
    """What LangGraph really does with put_writes is accepted: the null task's writes saved
    again with more appended (the saver ignores the rows it has), special channels replaced by
    a later call, a mixed call with a special channel named twice."""
    from langgraph.checkpoint.memory import InMemorySaver
    ERROR, INTERRUPT = "__error__", "__interrupt__"  # LangGraph's special channels

    from langgraph_securesaver.tenancy import tenant_scope
    null_task = "00000000-0000-0000-0000-000000000000"

    def run(saver: SecureSaver) -> None:
        with tenant_scope("acme"):
            saved = saver.put(cfg("w"), {"v": 4, "id": "1f000000-0000-6000-8000-000000000001",
                                         "ts": "2026-01-01T00:00:00+00:00",
                                         "channel_values": {"x": 1},
                                         "channel_versions": {"x": 1}, "versions_seen": {},
                                         "updated_channels": ["x"]},
                              {"source": "loop", "step": 1, "parents": {}}, {"x": 1})
            saver.put_writes(saved, [("a", 1)], null_task)
            saver.put_writes(saved, [("a", 1), ("b", 2)], null_task)
            saver.put_writes(saved, [("c", 3), (INTERRUPT, "first"), (INTERRUPT, "again")],
                             "task-1", "~path-1")
            saver.put_writes(saved, [(INTERRUPT, "replaced")], "task-1", "~path-1")
            saver.put_writes(saved, [(ERROR, "boom")], "task-2", "~path-0")
            writes = saver.get_tuple(saved).pending_writes
            listed = next(iter(saver.list(cfg("w")))).pending_writes
        assert writes == listed
        assert sorted(writes) == sorted([
            (null_task, "a", 1), (null_task, "b", 2), ("task-1", "c", 3),
            ("task-1", INTERRUPT, "replaced"), ("task-2", ERROR, "boom")])

    if inner == "memory":
        run(SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None))
        return
    url = (f"sqlite:///{tmp_path / 'w.db'}" if inner == "sqlite"
           else request.getfixturevalue("pg_url"))
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        run(saver)

