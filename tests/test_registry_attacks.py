"""Attacks on registry tamper evidence (issue 9) by someone who can write the database but does
not hold the keyring: making the schema-v2 adoption MAC a forgery, forged holds/expiries against
every pruner path, forged fingerprints and policies, and chain edits (swaps between tenants,
truncated tails, middle inserts). SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langgraph.checkpoint.sqlite import SqliteSaver

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.idempotency import IdempotencyStore
from langgraph_securesaver.idempotency.keys import fingerprint
from langgraph_securesaver.registry.integrity import row_tag
from langgraph_securesaver.retention import RetentionPolicy
from langgraph_securesaver.tenancy import tenant_scope
from tests import test_registry_integrity as registry_integrity
from tests.boundary_helpers import execute_fingerprinted_refund
from tests.test_registry_integrity import (
    ACME,
    BACKENDS,
    FORGED,
    GLOBEX,
    HOUR,
    Db,
    _cfg,
    _retention_setup,
    _say,
    assert_named,
    chain_ids,
    problems,
    runner,
)

HELD = f"thread#{row_tag(ACME, 'held')}"

# a copy of a database populated once per module and backend (test_registry_integrity.py)
seeds = registry_integrity.seeds
populated = registry_integrity.populated


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    url = (f"sqlite:///{tmp_path / 'agent.db'}" if request.param == "sqlite"
           else request.getfixturevalue("pg_url"))
    ring = Keyring.generate()
    return Db(url, ring, ring.save(tmp_path / "keyring.json"))


# --------------------------------------------------------------------------------------------
# forged rows without MACs: never adopted by a later keyed start
# --------------------------------------------------------------------------------------------
def _forge_held_row_unmaced(db: Db) -> None:
    """Remove the legal hold on 'held' and drop its MACs."""
    db.sql("UPDATE securesaver_threads SET legal_hold = :f, expires_at = last_activity + 3600, "
           "policy_mac = NULL, activity_mac = NULL WHERE thread_id = 'held'", f=False)


RESETS: dict[str, list[str]] = {
    "row_only": [],
    "schema_version_deleted": ["DELETE FROM securesaver_meta WHERE key = 'schema_version'"],
    "heads_deleted": ["DELETE FROM securesaver_chain_heads"],
}


@pytest.mark.parametrize("reset", sorted(RESETS))
def test_a_forged_unmaced_hold_removal_is_not_adopted_on_the_next_keyed_start(
        db: Db, reset: str) -> None:
    _retention_setup(db)
    _forge_held_row_unmaced(db)
    for statement in RESETS[reset]:
        db.sql(statement)
    with db.saver() as saver:  # the next keyed start
        assert db.sql("SELECT policy_mac FROM securesaver_threads WHERE thread_id = 'held'"
                      ) == [(None,)]
        report = saver.prune_expired(now=time.time() + 2 * HOUR, active_grace=0)
        assert (ACME, "held") not in report.deleted + report.pruned_to_latest
        assert any(t == "held" and "TamperedDataError" in e for _, t, e in report.errors)
        assert saver.get_tuple(_cfg("held")) is not None
    with db.saver():
        pass  # nor on any later start
    assert db.sql("SELECT policy_mac FROM securesaver_threads WHERE thread_id = 'held'"
                  ) == [(None,)]
    assert_named(db, "securesaver_threads", HELD)


def test_forged_unmaced_event_policy_and_fingerprint_are_not_adopted(populated: Db) -> None:
    db = populated
    with db.saver() as saver:
        refund = execute_fingerprinted_refund(saver, ACME)
    event = chain_ids(db, "securesaver_events")[1]
    db.sql("UPDATE securesaver_events SET detail = :d, seq = NULL, prev_mac = NULL, mac = NULL "
           "WHERE id = :i", d=json.dumps({"n": FORGED}), i=event)
    db.sql("UPDATE securesaver_policies SET idle_ttl = 1, mac = NULL WHERE tenant = '*'")
    db.sql("UPDATE securesaver_idempotency SET fingerprint = :o, fp_mac = NULL WHERE key = :k",
           o=refund.other, k=refund.scope.key)
    for statement in RESETS["heads_deleted"]:
        db.sql(statement)
    with db.saver() as saver:
        with pytest.raises(TamperedDataError, match="securesaver_idempotency"):
            IdempotencyStore.for_saver(saver).execute(
                refund.scope, refund.calls, fingerprint=fingerprint(refund.keys, {"amount": 99999}))
        assert refund.calls.n == 1
        with pytest.raises(TamperedDataError, match="securesaver_policies"):
            _say(saver, "brand-new")
    found = assert_named(db, "securesaver_events", f"id={event}", "no MAC")
    assert ("securesaver_policies", "default") in {p[:2] for p in found}


def test_a_registry_stripped_of_every_mac_is_not_adopted(db: Db) -> None:
    """Every MAC, chain head and the registry key row gone: the forged hold removal is still
    refused (nothing is ever adopted)."""
    _retention_setup(db)
    _forge_held_row_unmaced(db)
    _strip_every_mac(db)
    with db.saver() as saver:
        report = saver.prune_expired(now=time.time() + 2 * HOUR, active_grace=0)
        assert (ACME, "held") not in report.deleted


def _strip_every_mac(db: Db) -> None:
    db.sql("UPDATE securesaver_threads SET policy_mac = NULL, activity_mac = NULL")
    db.sql("UPDATE securesaver_policies SET mac = NULL")
    db.sql("UPDATE securesaver_idempotency SET fp_mac = NULL")
    for table in ("securesaver_events", "securesaver_receipts"):
        db.sql(f"UPDATE {table} SET seq = NULL, prev_mac = NULL, mac = NULL")
    db.sql("DELETE FROM securesaver_tenant_keys WHERE purpose = 'registry'")
    db.sql("DELETE FROM securesaver_chain_heads")


def test_a_registry_stripped_of_every_mac_is_reported_with_and_without_an_anchor(
        populated: Db, tmp_path: Path) -> None:
    db = populated
    anchor = tmp_path / "anchor.json"
    assert db.verify("--save-anchor", str(anchor))[0] == 0
    _strip_every_mac(db)
    with db.saver():
        pass
    assert db.verify()[0] == 1
    code, data, output = db.verify("--anchor", str(anchor))
    assert code == 1, output
    assert {p[0] for p in problems(data)} >= {"securesaver_events", "securesaver_receipts"}


# --------------------------------------------------------------------------------------------
# forged holds and expiries against the other pruner paths
# --------------------------------------------------------------------------------------------
def _forge_hold_removed(sql: Callable[..., Any]) -> None:
    sql("UPDATE securesaver_threads SET legal_hold = :f, idle_ttl = 1, "
        "expires_at = last_activity + 1 WHERE thread_id = 'held'", f=False)


def _forge_ttl_shortened(sql: Callable[..., Any]) -> None:
    sql("UPDATE securesaver_threads SET idle_ttl = 1, expires_at = last_activity + 1 "
        "WHERE thread_id = 'live'")


PATH_FORGERIES: dict[str, tuple[str, Callable[[Callable[..., Any]], None]]] = {
    "hold_removed": ("held", _forge_hold_removed),
    "ttl_shortened": ("live", _forge_ttl_shortened),
}


@pytest.mark.parametrize("forgery", sorted(PATH_FORGERIES))
@pytest.mark.parametrize("batch", [1, 100])
def test_forged_rows_are_not_obeyed_by_single_or_batched_sweeps(
        db: Db, forgery: str, batch: int) -> None:
    thread, forge = PATH_FORGERIES[forgery]
    _retention_setup(db)
    forge(db.sql)
    now = time.time() + 2 * HOUR
    with db.saver() as saver:
        report = saver.prune_expired(now=now, active_grace=0, batch=batch)
        assert (ACME, "old") in report.deleted  # the authentic expired thread does go
        assert (ACME, thread) not in report.deleted + report.pruned_to_latest
        assert any(t == thread and "TamperedDataError" in e for _, t, e in report.errors)
        assert saver.get_tuple(_cfg(thread)) is not None
        assert not [r for r in saver.receipts(tenant=ACME) if r.thread_id == thread]
    assert_named(db, "securesaver_threads", f"thread#{row_tag(ACME, thread)}")


@pytest.mark.parametrize("forgery", sorted(PATH_FORGERIES))
def test_forged_rows_are_not_obeyed_by_the_cli_prune(db: Db, forgery: str) -> None:
    thread, forge = PATH_FORGERIES[forgery]
    _retention_setup(db)
    forge(db.sql)
    time.sleep(2.2)  # the forged 1 s TTL has run out, and the 1 s grace
    result = runner.invoke(app, ["prune", "--url", db.url, "--keyring", str(db.ring_path),
                                 "--active-grace", "1s", "--json"],
                           env={"SECURESAVER_MASTER_KEY": ""})
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert not report["deleted"] and not report["pruned_to_latest"], report
    assert [(e["thread_id"], e["error"].split(":")[0]) for e in report["errors"]] == [
        (thread, "TamperedDataError")], report
    with db.saver() as saver:
        assert saver.get_tuple(_cfg(thread)) is not None


@pytest.mark.parametrize("forgery", sorted(PATH_FORGERIES))
def test_forged_rows_are_not_obeyed_by_the_async_sweep(db: Db, forgery: str) -> None:
    thread, forge = PATH_FORGERIES[forgery]
    _retention_setup(db)
    forge(db.sql)

    async def sweep() -> Any:
        async with SecureSaver.afrom_url(db.url, keyring=db.ring, redaction=None) as saver:
            return await saver.aprune_expired(now=time.time() + 2 * HOUR, active_grace=0)

    report = asyncio.run(sweep())
    assert (ACME, "old") in report.deleted
    assert (ACME, thread) not in report.deleted + report.pruned_to_latest
    with db.saver() as saver:
        assert saver.get_tuple(_cfg(thread)) is not None


@pytest.mark.parametrize("forgery", sorted(PATH_FORGERIES))
def test_forged_rows_are_not_obeyed_when_the_registry_is_elsewhere(
        tmp_path: Path, forgery: str) -> None:
    """The mark-``deleting`` path (storage and registry in different databases)."""
    thread, forge = PATH_FORGERIES[forgery]
    registry_url = f"sqlite:///{tmp_path / 'registry.db'}"
    conn = sqlite3.connect(tmp_path / "agent.db", check_same_thread=False)
    saver = SecureSaver(SqliteSaver(conn), keyring=Keyring.generate(), redaction=None,
                        retention=RetentionPolicy(idle_ttl="1h"), registry=registry_url)
    saver.setup()
    try:
        for name in ("live", "held", "old"):
            _say(saver, name)
        with tenant_scope(ACME):
            saver.set_retention("held", legal_hold=True)
        saver.registry.forget_thread(ACME, "old")
        saver.registry.touch_thread(ACME, "old", now=time.time() - 3 * HOUR,
                                    policy=saver.services.policy_for(ACME))
        engine = sa.create_engine(registry_url)

        def sql(statement: str, **params: Any) -> None:
            with engine.begin() as c:
                c.execute(sa.text(statement), params)

        forge(sql)
        engine.dispose()
        for batch in (100, 1):
            report = saver.prune_expired(now=time.time() + 2 * HOUR, active_grace=0,
                                         batch=batch)
            assert (ACME, thread) not in report.deleted + report.pruned_to_latest
        assert saver.get_tuple(_cfg(thread)) is not None
        assert saver.get_tuple(_cfg("old")) is None
        assert saver.registry.get_thread(ACME, thread) is not None
        assert not saver.registry.verify_integrity().ok
    finally:
        saver.registry.dispose()
        conn.close()


def test_set_retention_does_not_launder_a_forged_hold_removal(db: Db) -> None:
    _retention_setup(db)
    _forge_hold_removed(db.sql)
    with db.saver() as saver, tenant_scope(ACME):
        with pytest.raises(TamperedDataError, match="securesaver_threads"):
            saver.set_retention("held", idle_ttl="1h")
    assert_named(db, "securesaver_threads", HELD)


# --------------------------------------------------------------------------------------------
# receipts and events: edits the first suite does not make
# --------------------------------------------------------------------------------------------
def _swap_events_between_tenants(db: Db) -> tuple[str, str]:
    mine = chain_ids(db, "securesaver_events", ACME)[0]
    theirs = chain_ids(db, "securesaver_events", GLOBEX)[0]
    db.sql("UPDATE securesaver_events SET tenant = CASE WHEN id = :a THEN :g ELSE :c END "
           "WHERE id IN (:a, :b)", a=mine, b=theirs, g=GLOBEX, c=ACME)
    return "securesaver_events", f"id={mine}"


def _graft_receipt_onto_other_tenants_chain(db: Db) -> tuple[str, str]:
    """Move ACME's newest receipt, MACs and all, onto the end of GLOBEX's chain."""
    mine = chain_ids(db, "securesaver_receipts", ACME)[-1]
    top, head = db.sql("SELECT seq, mac FROM securesaver_receipts WHERE tenant = :g "
                       "ORDER BY seq DESC LIMIT 1", g=GLOBEX)[0]
    db.sql("UPDATE securesaver_receipts SET tenant = :g, seq = :s, prev_mac = :p WHERE id = :i",
           g=GLOBEX, s=top + 1, p=head, i=mine)
    return "securesaver_receipts", f"id={mine}"


def _truncate_tail_events(db: Db) -> tuple[str, str]:
    ids = chain_ids(db, "securesaver_events", ACME)
    db.sql("DELETE FROM securesaver_events WHERE id IN (:a, :b)", a=ids[-1], b=ids[-2])
    return "securesaver_events", f"chain#{row_tag(ACME)}"


def _insert_middle_with_renumbering(db: Db) -> tuple[str, str]:
    """Shift the tail's seq up by one and insert a row at the gap, prev_mac copied."""
    ids = chain_ids(db, "securesaver_events", ACME)
    seqs = dict(db.sql("SELECT id, seq FROM securesaver_events WHERE tenant = :t", t=ACME))
    middle = seqs[ids[1]]
    db.sql("UPDATE securesaver_events SET seq = seq + 1000 WHERE tenant = :t AND seq >= :m",
           t=ACME, m=middle)
    db.sql("UPDATE securesaver_events SET seq = seq - 999 WHERE tenant = :t AND seq >= :m",
           t=ACME, m=middle + 1000)
    db.sql("INSERT INTO securesaver_events (at, kind, tenant, detail, seq, prev_mac, mac) "
           "SELECT at, 'retention_changed', tenant, :d, :s, prev_mac, mac FROM "
           "securesaver_events WHERE id = :i", d=json.dumps({"note": FORGED}), s=middle,
           i=ids[1])
    return "securesaver_events", f"id={ids[1]}"


def _receipt_id_swapped(db: Db) -> tuple[str, str]:
    """Two receipts of one tenant exchange their thread ids (receipt names the wrong thread)."""
    a, b = chain_ids(db, "securesaver_receipts", ACME)[:2]
    db.sql("UPDATE securesaver_receipts SET thread_id = CASE WHEN id = :a THEN "
           "(SELECT thread_id FROM securesaver_receipts WHERE id = :b) ELSE "
           "(SELECT thread_id FROM securesaver_receipts WHERE id = :a) END "
           "WHERE id IN (:a, :b)", a=a, b=b)
    return "securesaver_receipts", f"id={a}"


MORE_CHAIN_EDITS: dict[str, Callable[[Db], tuple[str, str]]] = {
    "swap_events_between_tenants": _swap_events_between_tenants,
    "graft_receipt_onto_other_tenants_chain": _graft_receipt_onto_other_tenants_chain,
    "truncate_tail_events": _truncate_tail_events,
    "insert_middle_with_renumbering": _insert_middle_with_renumbering,
    "receipt_thread_ids_swapped": _receipt_id_swapped,
}


@pytest.mark.parametrize("edit", sorted(MORE_CHAIN_EDITS))
def test_more_chain_edits_exit_1_naming_the_row(populated: Db, edit: str) -> None:
    db = populated
    with db.saver() as saver:  # GLOBEX gets events and receipts of its own too
        saver.registry.record_event("note", tenant=GLOBEX, n=1)
        saver.registry.add_receipts([{"tenant": GLOBEX, "thread_id": "gone-g",
                                      "action": "deleted", "reason": "test"}])
    assert db.verify()[0] == 0
    table, row = MORE_CHAIN_EDITS[edit](db)
    found = assert_named(db, table, row)
    assert all(FORGED not in json.dumps(p) for p in found)


def test_a_deleted_key_row_with_only_event_macs_left_is_not_replaced(populated: Db) -> None:
    """Deleting the registry key row after stripping the thread MACs and chain heads (what the
    key-row check looked at) still leaves MACed events: no new key is made."""
    db = populated
    db.sql("UPDATE securesaver_threads SET policy_mac = NULL, activity_mac = NULL")
    db.sql("DELETE FROM securesaver_chain_heads")
    db.sql("DELETE FROM securesaver_tenant_keys WHERE purpose = 'registry'")
    with pytest.raises(TamperedDataError, match="registry MAC key row"):
        with db.saver() as saver:
            saver.prune_expired(active_grace=0)
    assert db.sql("SELECT count(*) FROM securesaver_tenant_keys WHERE purpose = 'registry'"
                  ) == [(0,)]
