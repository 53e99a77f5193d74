"""Retention and deletion meet a stored checkpoint row that does not parse (garbage body,
broken clear metadata) on an expired thread, SQLite and PostgreSQL, sync and async.

What the right behaviour is, and why:

* The pruner (``prune_expired``, ``aprune_expired``, ``securesaver prune``) decides on the
  MACed registry row, then reads the thread's latest root checkpoint to see whether it is
  still in use. When that row does not parse, the pruner cannot make that check, and the row
  is evidence of an incident (README: a ``TamperedDataError`` is "treat as an incident ...
  restore from backup"; a forged retention row is "reported in errors, its thread
  untouched"). So it fails closed as it does for a forged retention row: the thread is
  reported in ``errors`` with the ``TamperedDataError`` that ``get_tuple`` gives for the same
  row (naming it), exit 1, its claim kept, nothing of it deleted, the other threads swept.
  Deleting it unreported would destroy the evidence a compliance team needs for the incident
  report; the retention breach is bounded, because the report is loud and repeats every sweep
  after the claim's lease, and a person closes it with ``delete_thread``.
* ``delete_thread`` is that person's (or the data subject's) explicit request: it reads no
  stored row and deletes the thread completely, with a receipt, whatever the row holds.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from typer.testing import CliRunner

from langgraph_securesaver import (
    Keyring,
    RetentionPolicy,
    SecureSaver,
    TamperedDataError,
    tenant_scope,
)
from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401  (registers the commands)
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.keys.lifecycle import LEASE_FENCE

from .boundary_helpers import Raw, inner_id
from .conftest import Seeds

runner = CliRunner()
HOUR = 3600.0
LATER = 2 * HOUR  # past the 1 h idle TTL


def _conf(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme", "checkpoint_ns": ""}}


def _garbage_body(raw: Raw, thread: str) -> None:
    if raw.backend == "sqlite":
        value: Any = b"\xc1 not msgpack"
        sql = "UPDATE checkpoints SET checkpoint = ? WHERE thread_id = ?"
    else:
        value = json.dumps("not a checkpoint")
        sql = "UPDATE checkpoints SET checkpoint = ?::jsonb WHERE thread_id = ?"
    assert raw.run(sql, value, inner_id(thread)) == 2


def _metadata_unparsable(raw: Raw, thread: str) -> None:
    # SQLite's clear metadata is JSON text (SqliteSaver parses it); PostgreSQL's JSONB always
    # parses, so its "unparsable row" is a body PostgresSaver cannot read
    if raw.backend == "sqlite":
        assert raw.run("UPDATE checkpoints SET metadata = ? WHERE thread_id = ?", b"{not json",
                       inner_id(thread)) == 2
    else:
        _garbage_body(raw, thread)


EDITS = {"garbage_body": _garbage_body, "metadata_unparsable": _metadata_unparsable}


def _two_expiring_threads(url: str, ring: Keyring) -> None:
    """``bad`` and ``good``, two checkpoints each, expiring after an idle hour."""
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h")) as saver:
        for thread in ("bad", "good"):
            parent = saver.put(_conf(thread), empty_checkpoint(), {"step": 0}, {})
            saver.put(parent, empty_checkpoint(), {"step": 1}, {})


def _seeded(seeds: Seeds, database: tuple[str, Raw]) -> Keyring:
    """A copy of ``_two_expiring_threads`` written once per module and backend; its keyring."""
    url, raw = database

    def seed(seed_url: str) -> Keyring:
        ring = Keyring.generate()
        _two_expiring_threads(seed_url, ring)
        return ring
    return seeds.copy(raw.backend, seed, url)


def _stored(raw: Raw, thread: str) -> int:
    ((n,),) = raw.rows("SELECT count(*) FROM checkpoints WHERE thread_id = ?", inner_id(thread))
    return int(n)


def _get_tuple_refusal(url: str, ring: Keyring) -> tuple[str, str]:
    """What get_tuple / aget_tuple say about bad's latest checkpoint (the row the pruner reads)."""
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        with pytest.raises(TamperedDataError) as refused:
            saver.get_tuple(_conf("bad"))

    async def aread() -> str:
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as asaver:
            with pytest.raises(TamperedDataError) as arefused:
                await asaver.aget_tuple(_conf("bad"))
            return str(arefused.value)
    return str(refused.value), asyncio.run(aread())


def _check_kept(report: Any, expected: str, raw: Raw) -> None:
    assert report.deleted == [("acme", "good")], report
    ((tenant, thread, error),) = report.errors
    assert (tenant, thread) == ("acme", "bad")
    # get_tuple's own refusal of the row (naming tenant, thread and the latest checkpoint),
    # then what the pruner did about it
    assert error.startswith(f"TamperedDataError: {expected}; retention kept the expired "
                            "thread"), (error, expected)
    assert "thread 'bad'" in error and "(latest checkpoint)" in error
    assert _stored(raw, "bad") == 2 and _stored(raw, "good") == 0


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("batch", [500, 1])
def test_prune_expired_reports_an_unparsable_row_and_keeps_its_thread(
        database, db_seeds: Seeds, edit: str, batch: int) -> None:
    url, raw = database
    ring = _seeded(db_seeds, database)
    EDITS[edit](raw, "bad")
    expected, _ = _get_tuple_refusal(url, ring)
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        report = saver.prune_expired(now=time.time() + LATER, batch=batch)
        _check_kept(report, expected, raw)
        # the claim is kept: the same sweep time does not pick the thread up again
        assert saver.prune_expired(now=time.time() + LATER).errors == []
        assert not saver.receipts(tenant="acme", thread_id="bad")
    if raw.backend == "sqlite" and edit == "metadata_unparsable":
        assert "column metadata" in report.errors[0][2]  # the sync path locates the column


def test_a_batch_with_an_unparsable_row_decides_every_other_thread_once(
        database, db_seeds: Seeds) -> None:
    """The unreadable row sends its batch-mates to be checked one by one; what the batch had
    already decided (here: a forged registry row, reported) is not decided again, so the
    report names each thread once."""
    url, raw = database
    ring = _seeded(db_seeds, database)
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h")) as saver:
        saver.put(_conf("forged"), empty_checkpoint(), {"step": 0}, {})
    # a writer with database access edits the forged thread's retention (its MAC no longer
    # verifies) and breaks bad's latest checkpoint
    assert raw.run("UPDATE securesaver_threads SET idle_ttl = idle_ttl + 1 WHERE thread_id = ?",
                   "forged") == 1
    _garbage_body(raw, "bad")
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        report = saver.prune_expired(now=time.time() + LATER)
    assert report.deleted == [("acme", "good")]
    named = sorted((tenant, thread) for tenant, thread, _error in report.errors)
    assert named == [("acme", "bad"), ("acme", "forged")], report.errors
    assert _stored(raw, "bad") == 2 and _stored(raw, "forged") == 1


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_aprune_expired_reports_an_unparsable_row_and_keeps_its_thread(database,
                                                                       db_seeds: Seeds,
                                                                       edit: str) -> None:
    """Over the async-only inner savers (AsyncSqliteSaver, AsyncPostgresSaver)."""
    url, raw = database
    ring = _seeded(db_seeds, database)
    EDITS[edit](raw, "bad")
    _, aexpected = _get_tuple_refusal(url, ring)

    async def sweep() -> Any:
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as asaver:
            return await asaver.aprune_expired(now=time.time() + LATER)
    _check_kept(asyncio.run(sweep()), aexpected, raw)


def test_cli_prune_exits_1_naming_the_row(database, tmp_path: Path) -> None:
    url, raw = database
    ring = Keyring.generate()
    ring_path = ring.save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl=1)) as saver:
        for thread in ("bad", "good"):
            parent = saver.put(_conf(thread), empty_checkpoint(), {"step": 0}, {})
            saver.put(parent, empty_checkpoint(), {"step": 1}, {})
    _garbage_body(raw, "bad")
    expected, _ = _get_tuple_refusal(url, ring)
    time.sleep(LEASE_FENCE + 0.2)  # the 1 s TTL has run out, the 1 s grace, the write lease
    result = runner.invoke(app, ["prune", "--url", url, "--keyring", str(ring_path),
                                 "--active-grace", "1s", "--json"],
                           env={"SECURESAVER_MASTER_KEY": ""})
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert [(t["thread_id"]) for t in report["deleted"]] == ["good"], report
    ((error,),) = [[e["error"] for e in report["errors"] if e["thread_id"] == "bad"]]
    assert error.startswith(f"TamperedDataError: {expected}"), error
    assert _stored(raw, "bad") == 2


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_delete_thread_deletes_a_thread_whose_row_does_not_parse(database, db_seeds: Seeds,
                                                                edit: str) -> None:
    """The explicit deletion the pruner's report points to: complete, with a receipt."""
    url, raw = database
    ring = _seeded(db_seeds, database)
    EDITS[edit](raw, "bad")
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver, tenant_scope("acme"):
        saver.delete_thread("bad")
        (receipt,) = saver.receipts(thread_id="bad")
    assert receipt.action == "deleted" and receipt.detail["checkpoints"] == 2
    assert _stored(raw, "bad") == 0 and _stored(raw, "good") == 2

    EDITS[edit](raw, "good")

    async def adelete() -> Any:
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as asaver:
            with tenant_scope("acme"):
                await asaver.adelete_thread("good")
            return await asaver.areceipts(tenant="acme", thread_id="good")
    (areceipt,) = asyncio.run(adelete())
    assert areceipt.detail["checkpoints"] == 2 and _stored(raw, "good") == 0


class _Unparsable:
    """A custom inner saver whose every read hits a row it cannot parse (JSON metadata)."""

    def get_tuple(self, config: Any) -> Any:
        json.loads("{not json")

    def list(self, config: Any, **kwargs: Any) -> Any:
        yield from ()
        json.loads("{not json")


def test_custom_saver_fallbacks_refuse_an_unparsable_row_by_name() -> None:
    """The StorageOps fallbacks (savers without native SQL: receipt counts, retention's
    re-check) and the registry-less thread discovery of shred_tenant read rows through the
    inner saver's API: a row it cannot parse is a TamperedDataError naming where, never a raw
    JSONDecodeError."""
    from types import SimpleNamespace

    from langgraph_securesaver.ops.threads import inner_thread_ids
    from langgraph_securesaver.storage.ops import StorageOps

    ops = StorageOps(_Unparsable())  # type: ignore[arg-type]
    with pytest.raises(TamperedDataError, match=r"stored thread 'tx:t1' namespace '' \(listing\)"
                       r" was refused: its clear metadata is not valid JSON"):
        ops.count_checkpoints("tx:t1")
    with pytest.raises(TamperedDataError, match=r"stored thread 'tx:t1' namespace '' \(latest "
                       r"checkpoint\) was refused: its clear metadata is not valid JSON"):
        ops.latest_checkpoint_times(["tx:t1"])
    services = SimpleNamespace(storage=SimpleNamespace(thread_ids=lambda prefix: None,
                                                       async_mode=lambda: False),
                               inner=_Unparsable(), async_only=False)
    with pytest.raises(TamperedDataError, match=r"tenant 'acme'.* was refused: its clear "
                       "metadata is not valid JSON"):
        inner_thread_ids(services, "acme")  # type: ignore[arg-type]
