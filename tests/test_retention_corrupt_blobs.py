"""Retention meets an expired thread whose checkpoint rows parse but one of whose channel blobs
(``checkpoint_blobs``, PostgreSQL) or pending writes (``checkpoint_writes`` / SQLite
``writes``) does not (a wrong ``type``, garbage bytes: a database edit).

The semantics (README, Retention; :mod:`langgraph_securesaver.ops.pruner`): whether an expired
thread is deleted depends on its MACed registry row and its checkpoint rows only -- what the
batched re-check reads. A corrupt blob or write never changes that decision: the thread is
deleted with its blobs and writes, with exactly one receipt, whether it is swept in a batch
or thread by thread (a batch-mate's unreadable checkpoint row sends the batch down the
per-thread path), sync or async. The pruner is not an integrity checker; ``securesaver scan
--verify`` is. A batch-mate whose checkpoint row does not parse is still reported by name and
kept.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_securesaver import Keyring, RetentionPolicy, SecureSaver, TamperedDataError

from .boundary_helpers import Raw, inner_id
from .conftest import Seeds

HOUR = 3600.0
LATER = 2 * HOUR  # past the 1 h idle TTL
GARBAGE = b"\xc1 not msgpack"


def _conf(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme", "checkpoint_ns": ""}}


def _write(saver: SecureSaver, thread: str, ts: float | None = None) -> None:
    """Two checkpoints with channel values (PostgreSQL: blobs), the latest with a pending
    write and, when given, the ``ts`` (genuine: what LangGraph stores is the writer's clock)."""
    config: Any = _conf(thread)
    for step in range(2):
        checkpoint = empty_checkpoint()
        if ts is not None and step == 1:
            checkpoint["ts"] = datetime.fromtimestamp(ts, timezone.utc).isoformat()
        checkpoint["channel_values"] = {"log": [f"turn {step}"], "count": step}
        checkpoint["channel_versions"] = {"log": step + 1, "count": step + 1}
        config = saver.put(config, checkpoint, {"step": step}, {"log": step + 1,
                                                                 "count": step + 1})
    saver.put_writes(config, [("log", ["pending"])], "task-1")


def _blob_type(raw: Raw, thread: str) -> None:
    assert raw.run("UPDATE checkpoint_blobs SET type = 'bogus' WHERE thread_id = ? AND "
                   "channel = 'log'", inner_id(thread)) == 2


def _blob_bytes(raw: Raw, thread: str) -> None:
    assert raw.run("UPDATE checkpoint_blobs SET type = 'msgpack', blob = ? WHERE thread_id = ? "
                   "AND channel = 'log'", GARBAGE, inner_id(thread)) == 2


def _write_type(raw: Raw, thread: str) -> None:
    assert raw.run(f"UPDATE {raw.writes} SET type = 'bogus' WHERE thread_id = ?",
                   inner_id(thread)) == 1


def _write_bytes(raw: Raw, thread: str) -> None:
    assert raw.run(f"UPDATE {raw.writes} SET type = 'msgpack', {raw.value_col} = ? WHERE "
                   "thread_id = ?", GARBAGE, inner_id(thread)) == 1


def _blob_ciphertext(raw: Raw, thread: str) -> None:
    # under its own type tag: the inner decode passes, SecureSaver's authentication does not
    assert raw.run("UPDATE checkpoint_blobs SET blob = ? WHERE thread_id = ? AND "
                   "channel = 'log'", b"not a ciphertext", inner_id(thread)) == 2


def _write_ciphertext(raw: Raw, thread: str) -> None:
    assert raw.run(f"UPDATE {raw.writes} SET {raw.value_col} = ? WHERE thread_id = ?",
                   b"not a ciphertext", inner_id(thread)) == 1


EDITS = {"blob_type": _blob_type, "blob_bytes": _blob_bytes,
         "blob_ciphertext": _blob_ciphertext, "write_type": _write_type,
         "write_bytes": _write_bytes, "write_ciphertext": _write_ciphertext}
# SQLite keeps channel values in the checkpoint body
PG_ONLY = {"blob_type", "blob_bytes", "blob_ciphertext"}


def _garbage_body(raw: Raw, thread: str) -> None:
    if raw.backend == "sqlite":
        value: Any = GARBAGE
        sql = "UPDATE checkpoints SET checkpoint = ? WHERE thread_id = ?"
    else:
        value = json.dumps("not a checkpoint")
        sql = "UPDATE checkpoints SET checkpoint = ?::jsonb WHERE thread_id = ?"
    assert raw.run(sql, value, inner_id(thread)) == 2


def _stored(raw: Raw, thread: str) -> dict[str, int]:
    tables = ["checkpoints", raw.writes] + ([] if raw.backend == "sqlite"
                                            else ["checkpoint_blobs"])
    return {table: raw.rows(f"SELECT count(*) FROM {table} WHERE thread_id = ?",
                            inner_id(thread))[0][0] for table in tables}


def _written(url: str, ring: Keyring, strategy: str, beside: bool, ts: float | None) -> None:
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h", strategy=strategy)
                              ) as saver:
        for thread in ("corrupt", "good") + (("broken",) if beside else ()):
            _write(saver, thread, ts if thread == "corrupt" else None)


def _prepare(database: tuple[str, Raw], seeds: Seeds, edit: str, beside: bool,
             strategy: str = "delete", ts: float | None = None
             ) -> tuple[str, Raw, Keyring]:
    """``corrupt`` (one blob or write edited) and ``good``, and with ``beside`` a batch-mate
    ``broken`` whose checkpoint rows do not parse; all expiring after an idle hour. Without
    ``ts``, a copy of the module's seed."""
    url, raw = database
    if raw.backend == "sqlite" and edit in PG_ONLY:
        pytest.skip("SQLite stores no channel blobs")
    if ts is not None:
        ring = Keyring.generate()
        _written(url, ring, strategy, beside, ts)
    else:   # once per module, backend, strategy and batch-mate; each test edits its own copy
        def seed(seed_url: str) -> Keyring:
            seed_ring = Keyring.generate()
            _written(seed_url, seed_ring, strategy, beside, None)
            return seed_ring
        ring = seeds.copy((raw.backend, strategy, beside), seed, url)
    EDITS[edit](raw, "corrupt")
    if beside:
        _garbage_body(raw, "broken")
    # the edit is real: a full read of the thread refuses it, and the integrity check the
    # README points to (scan --verify) names the edited table
    table = "checkpoint_blobs" if edit in PG_ONLY else raw.writes
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        with pytest.raises(TamperedDataError):
            saver.get_tuple(_conf("corrupt"))
        scanned = saver.scan(keyring=ring, verify=True)
    assert table in {v.table for v in scanned.violations}, scanned.violations
    return url, raw, ring


def _check(report: Any, raw: Raw, receipts: list[Any], beside: bool) -> None:
    assert sorted(report.deleted) == [("acme", "corrupt"), ("acme", "good")], report
    assert set(_stored(raw, "corrupt").values()) == {0}, _stored(raw, "corrupt")
    ((receipt,),) = [receipts]
    assert receipt.action == "deleted" and receipt.detail["checkpoints"] == 2, receipt
    if beside:
        ((tenant, thread, error),) = report.errors
        assert (tenant, thread) == ("acme", "broken"), report.errors
        assert error.startswith("TamperedDataError: ") and "thread 'broken'" in error, error
        assert "retention kept the expired thread" in error, error
        assert _stored(raw, "broken")["checkpoints"] == 2
    else:
        assert report.errors == [], report.errors


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside_unparsable"])
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_prune_expired_deletes_a_thread_with_a_corrupt_blob_or_write(
        database, db_seeds: Seeds, edit: str, beside: bool) -> None:
    url, raw, ring = _prepare(database, db_seeds, edit, beside)
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        report = saver.prune_expired(now=time.time() + LATER)
        receipts = saver.receipts(tenant="acme", thread_id="corrupt")
    _check(report, raw, receipts, beside)


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside_unparsable"])
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_aprune_expired_deletes_a_thread_with_a_corrupt_blob_or_write(
        database, db_seeds: Seeds, edit: str, beside: bool) -> None:
    """Over the async-only inner savers (AsyncSqliteSaver, AsyncPostgresSaver)."""
    url, raw, ring = _prepare(database, db_seeds, edit, beside)

    async def sweep() -> tuple[Any, list[Any]]:
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as asaver:
            report = await asaver.aprune_expired(now=time.time() + LATER)
            return report, await asaver.areceipts(tenant="acme", thread_id="corrupt")
    report, receipts = asyncio.run(sweep())
    _check(report, raw, receipts, beside)


@pytest.mark.parametrize("edit", ["write_type", "write_bytes"])
def test_keep_latest_prunes_a_thread_with_a_corrupt_write(database, db_seeds: Seeds,
                                                         edit: str) -> None:
    """``keep_latest`` threads always take the per-thread path: the same decision."""
    url, raw, ring = _prepare(database, db_seeds, edit, beside=False, strategy="keep_latest")
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        report = saver.prune_expired(now=time.time() + LATER)
        (receipt,) = saver.receipts(tenant="acme", thread_id="corrupt")
    assert sorted(report.pruned_to_latest) == [("acme", "corrupt"), ("acme", "good")], report
    assert report.errors == [] and receipt.action == "pruned"
    assert receipt.detail["checkpoints_deleted"] == 1
    assert _stored(raw, "corrupt")["checkpoints"] == 1


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside_unparsable"])
def test_a_ts_that_would_keep_it_is_believed_only_from_a_full_authenticated_read(
        database, db_seeds: Seeds, beside: bool) -> None:
    """The authenticated-ts step (README: the pruner believes a ``ts`` only once it is
    authenticated) reads the latest checkpoint as ``get_tuple`` does, writes included: a thread
    whose stored ts says it is in use and whose pending write is corrupt cannot be believed
    in use, and is not deleted either -- reported and kept, alone and beside an unparsable
    batch-mate alike (a corrupt write never makes the pruner delete a thread it would
    otherwise keep)."""
    now = time.time() + LATER
    url, raw, ring = _prepare(database, db_seeds, "write_type", beside, ts=now - 10)
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        report = saver.prune_expired(now=now)
        assert not saver.receipts(tenant="acme", thread_id="corrupt")
    assert report.deleted == [("acme", "good")], report
    named = sorted(thread for _tenant, thread, _error in report.errors)
    assert named == (["broken", "corrupt"] if beside else ["corrupt"]), report.errors
    (error,) = [e for _t, thread, e in report.errors if thread == "corrupt"]
    assert f"{raw.writes} row" in error or "inner tables" in error, error  # the write, not ts
    assert "retention kept the expired thread" in error, error
    assert _stored(raw, "corrupt")["checkpoints"] == 2
