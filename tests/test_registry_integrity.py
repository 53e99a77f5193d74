"""Tamper evidence of the registry rows that steer security decisions (issue 9), attacked the
way someone with write access to the database would: receipts and events (keyed hash chains,
``securesaver events --verify``), thread retention rows and policies (the pruner acts on MACed
fields only), idempotency fingerprints and recovery opt-ins. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import ConfigurationError, Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.idempotency import IdempotencyStore, KeyScope
from langgraph_securesaver.idempotency.keys import fingerprint
from langgraph_securesaver.idempotency.recovery import (
    mark_recoverable,
    recover_stalled,
    release_recoverable,
)
from langgraph_securesaver.registry.integrity import row_tag
from langgraph_securesaver.registry.schema import normalize_url
from langgraph_securesaver.retention import RetentionPolicy
from langgraph_securesaver.tenancy import tenant_scope
from tests.fake_agent import build_chat_graph

from .boundary_helpers import Calls, execute_fingerprinted_refund
from .conftest import (
    copy_database,
    drop_pg_schema,
    new_pg_schema,
    pg_clone_available,
    pg_url_in,
    schema_of,
)

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600.0
ACME, GLOBEX = "acmecorp-tenant", "globexinc-tenant"
FORGED = "FORGED-VALUE-7f3a"
runner = CliRunner()


@dataclass
class Db:
    url: str
    ring: Keyring
    ring_path: Path

    @contextmanager
    def saver(self, **options: Any) -> Iterator[SecureSaver]:
        with SecureSaver.from_url(self.url, keyring=self.ring, redaction=None,
                                  **options) as saver:
            yield saver

    def sql(self, statement: str, **params: Any) -> list[Any]:
        engine = sa.create_engine(normalize_url(self.url))
        try:
            with engine.begin() as conn:
                result = conn.execute(sa.text(statement), params)
                return list(result) if result.returns_rows else []
        finally:
            engine.dispose()

    def verify(self, *extra: str, keyring: bool = True) -> tuple[int, dict[str, Any], str]:
        args = ["events", "--url", self.url, "--verify", "--format", "json", *extra]
        if keyring:
            args += ["--keyring", str(self.ring_path)]
        result = runner.invoke(app, args, env={"SECURESAVER_MASTER_KEY": ""})
        text = result.stdout.strip()
        return result.exit_code, json.loads(text) if text.startswith("{") else {}, result.output


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    url = (f"sqlite:///{tmp_path / 'agent.db'}" if request.param == "sqlite"
           else request.getfixturevalue("pg_url"))
    ring = Keyring.generate()
    return Db(url, ring, ring.save(tmp_path / "keyring.json"))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Db]]:
    """One populated database per backend for the module (see ``populated``)."""
    made: dict[str, Db] = {}
    try:
        yield made
    finally:
        for seed in made.values():
            if not seed.url.startswith("sqlite:"):
                drop_pg_schema(schema_of(seed.url))


@pytest.fixture(params=BACKENDS)
def populated(request: pytest.FixtureRequest, seeds: dict[str, Db], tmp_path: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Db:
    """As ``db`` after ``populate``: the module populates one database per backend, once
    (its deletions wait out the lease fence), and each test gets its own copy of it, read
    with the same keyring."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'agent.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    if request.param == "postgres" and not pg_clone_available():
        ring = Keyring.generate()   # no pg_dump: populated here, as it was
        test_db = Db(url, ring, ring.save(tmp_path / "keyring.json"))
        populate(test_db)
        return test_db
    if request.param not in seeds:
        directory = tmp_path_factory.mktemp("registry-seed")
        seed_url = (f"sqlite:///{directory / 'agent.db'}" if request.param == "sqlite"
                    else pg_url_in(new_pg_schema()))
        ring = Keyring.generate()
        seeds[request.param] = Db(seed_url, ring, ring.save(directory / "keyring.json"))
        populate(seeds[request.param])
    seed = seeds[request.param]
    copy_database(seed.url, url)
    return Db(url, seed.ring, seed.ring_path)


def _cfg(thread: str, tenant: str = ACME) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def _say(saver: SecureSaver, thread: str, tenant: str = ACME) -> None:
    build_chat_graph(saver).invoke({"messages": [HumanMessage(f"hello {thread}")]},
                                   _cfg(thread, tenant))


def populate(db: Db) -> None:
    """Threads, retention changes, receipts and events on two tenants (and tenant-less)."""
    with db.saver(retention=RetentionPolicy(idle_ttl="1h")) as saver:
        for tenant, thread in ((ACME, "a1"), (ACME, "a2"), (ACME, "a3"), (GLOBEX, "g1"),
                               (GLOBEX, "g2")):
            _say(saver, thread, tenant)
        with tenant_scope(ACME):
            saver.set_retention("a1", legal_hold=True)
            saver.delete_thread("a3")
        with tenant_scope(GLOBEX):
            saver.set_retention("g1", idle_ttl="30d")
            saver.delete_thread("g2")
        for i in range(3):
            saver.registry.record_event("note", tenant=ACME, n=i)
        saver.registry.add_receipts([
            {"tenant": ACME, "thread_id": f"gone-{i}", "action": "deleted", "reason": "test"}
            for i in range(2)])
        saver.registry.record_event("support_note", note="tenant-less")


def chain_ids(db: Db, table: str, tenant: str = ACME) -> list[int]:
    """Row ids of one tenant's chain, in chain order."""
    return [r[0] for r in db.sql(f"SELECT id FROM {table} WHERE tenant = :t ORDER BY seq",
                                 t=tenant)]


def problems(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(p["table"], p["row"], p["problem"]) for p in data.get("problems", [])]


def assert_named(db: Db, table: str, row: str, words: str | None = None) -> list[Any]:
    code, data, output = db.verify()
    assert code == 1, output
    found = problems(data)
    hits = [p for p in found if p[0] == table and row in p[1].split(" ")]
    assert hits, found
    if words is not None:
        assert any(words in p[2] for p in hits), hits
    for secret in (FORGED, ACME, GLOBEX, "gone-0", "hello"):
        assert secret not in output  # rows are named, values never printed
    return found


# --------------------------------------------------------------------------------------------
# receipts and events: hash chains
# --------------------------------------------------------------------------------------------
def test_an_unforged_database_verifies_clean(populated: Db, tmp_path: Path) -> None:
    db = populated
    anchor = tmp_path / "anchor.json"
    code, data, output = db.verify("--save-anchor", str(anchor))
    assert code == 0, output
    assert data["ok"] and data["problems"] == []
    assert data["checked"]["securesaver_receipts"] == 4
    assert data["checked"]["securesaver_events"] >= 6
    assert data["checked"]["securesaver_threads"] == 3
    assert data["checked"]["securesaver_policies"] == 1
    # one chain per tenant and table, plus the tenant-less event chain
    chains = {(h["table"], h["chain"]) for h in json.loads(anchor.read_text())["heads"]}
    assert ("securesaver_events", row_tag("")) in chains
    assert ("securesaver_receipts", row_tag(ACME)) in chains
    assert db.verify("--anchor", str(anchor))[0] == 0


def test_verify_needs_the_keyring(populated: Db) -> None:
    db = populated
    code, _data, output = db.verify(keyring=False)
    assert code == 2 and "keyring" in output


def _alter_event(db: Db) -> tuple[str, str, str]:
    target = chain_ids(db, "securesaver_events")[1]
    db.sql("UPDATE securesaver_events SET detail = :d WHERE id = :i",
           d=json.dumps({"n": FORGED}), i=target)
    return "securesaver_events", f"id={target}", "altered"


def _alter_receipt(db: Db) -> tuple[str, str, str]:
    target = chain_ids(db, "securesaver_receipts")[0]
    db.sql("UPDATE securesaver_receipts SET reason = :r WHERE id = :i", r=FORGED, i=target)
    return "securesaver_receipts", f"id={target}", "altered"


def _backdate_receipt(db: Db) -> tuple[str, str, str]:
    target = chain_ids(db, "securesaver_receipts")[0]
    db.sql("UPDATE securesaver_receipts SET deleted_at = deleted_at - 86400 WHERE id = :i",
           i=target)
    return "securesaver_receipts", f"id={target}", "altered"


def _delete_middle_event(db: Db) -> tuple[str, str, str]:
    ids = chain_ids(db, "securesaver_events")
    db.sql("DELETE FROM securesaver_events WHERE id = :i", i=ids[1])
    return "securesaver_events", f"id={ids[2]}", "missing"


def _delete_newest_receipt(db: Db) -> tuple[str, str, str]:
    ids = chain_ids(db, "securesaver_receipts")
    db.sql("DELETE FROM securesaver_receipts WHERE id = :i", i=ids[-1])
    return "securesaver_receipts", f"chain#{row_tag(ACME)}", "newest 1 row(s)"


def _delete_every_receipt_of_a_tenant(db: Db) -> tuple[str, str, str]:
    db.sql("DELETE FROM securesaver_receipts WHERE tenant = :t", t=ACME)
    return "securesaver_receipts", f"chain#{row_tag(ACME)}", "missing"


def _reorder_events(db: Db) -> tuple[str, str, str]:
    first, second = chain_ids(db, "securesaver_events")[:2]
    db.sql("UPDATE securesaver_events SET seq = -seq WHERE id IN (:a, :b)", a=first, b=second)
    db.sql("UPDATE securesaver_events SET seq = CASE WHEN id = :a THEN 2 ELSE 1 END "
           "WHERE id IN (:a, :b)", a=first, b=second)
    return "securesaver_events", f"id={first}", "altered"


def _insert_event(db: Db) -> tuple[str, str, str]:
    db.sql("INSERT INTO securesaver_events (at, kind, tenant, detail) "
           "VALUES (:at, 'retention_changed', :t, :d)",
           at=time.time(), t=ACME, d=json.dumps({"legal_hold": False, "note": FORGED}))
    new = max(r[0] for r in db.sql("SELECT id FROM securesaver_events"))
    return "securesaver_events", f"id={new}", "no MAC"


def _copy_event(db: Db) -> tuple[str, str, str]:
    source = chain_ids(db, "securesaver_events")[1]
    db.sql("INSERT INTO securesaver_events (at, kind, tenant, thread_id, actor, detail, seq, "
           "prev_mac, mac) SELECT at, kind, tenant, thread_id, actor, detail, seq, prev_mac, "
           "mac FROM securesaver_events WHERE id = :i", i=source)
    new = max(r[0] for r in db.sql("SELECT id FROM securesaver_events"))
    return "securesaver_events", f"id={new}", "second row"


def _move_receipt_to_other_tenant(db: Db) -> tuple[str, str, str]:
    target = chain_ids(db, "securesaver_receipts")[0]
    db.sql("UPDATE securesaver_receipts SET tenant = :t WHERE id = :i", t=GLOBEX, i=target)
    return "securesaver_receipts", f"id={target}", "altered"


def _rewind_head(db: Db) -> tuple[str, str, str]:
    db.sql("UPDATE securesaver_chain_heads SET seq = seq - 1 WHERE tbl = 'securesaver_events' "
           "AND chain = :t", t=ACME)
    return "securesaver_chain_heads", f"chain#{row_tag(ACME)}", "does not verify"


CHAIN_EDITS: dict[str, Callable[[Db], tuple[str, str, str]]] = {
    "alter_event": _alter_event, "alter_receipt": _alter_receipt,
    "backdate_receipt": _backdate_receipt, "delete_middle_event": _delete_middle_event,
    "delete_newest_receipt": _delete_newest_receipt,
    "delete_every_receipt_of_a_tenant": _delete_every_receipt_of_a_tenant,
    "reorder_events": _reorder_events, "insert_event": _insert_event,
    "copy_event": _copy_event, "move_receipt_to_other_tenant": _move_receipt_to_other_tenant,
    "rewind_head": _rewind_head,
}


@pytest.mark.parametrize("edit", sorted(CHAIN_EDITS))
def test_chain_edits_exit_1_naming_the_row(populated: Db, edit: str) -> None:
    db = populated
    table, row, words = CHAIN_EDITS[edit](db)
    assert_named(db, table, row, words)


def test_appending_after_a_forged_head_does_not_launder_it(populated: Db) -> None:
    """A head rewound to hide deleted rows is not built upon: the next row marks the break."""
    db = populated
    ids = chain_ids(db, "securesaver_receipts")
    db.sql("DELETE FROM securesaver_receipts WHERE id = :i", i=ids[-1])
    db.sql("UPDATE securesaver_chain_heads SET seq = seq - 1 WHERE tbl = 'securesaver_receipts' "
           "AND chain = :t", t=ACME)
    with db.saver() as saver:
        saver.registry.add_receipt(tenant=ACME, thread_id="later", action="deleted",
                                   reason="test")
    newest = chain_ids(db, "securesaver_receipts")[-1]
    assert_named(db, "securesaver_receipts", f"id={newest}", "chain head that did not verify")


def test_tail_deletion_with_an_old_head_needs_the_anchor(populated: Db, tmp_path: Path) -> None:
    """What the chain cannot see on its own: the newest rows deleted AND the head restored
    from an older copy (e.g. a backup). An anchor kept outside the database catches it."""
    db = populated
    old_head = db.sql("SELECT seq, mac, head_mac FROM securesaver_chain_heads "
                      "WHERE tbl = 'securesaver_receipts' AND chain = :t", t=ACME)[0]
    with db.saver() as saver:
        saver.registry.add_receipts([{"tenant": ACME, "thread_id": f"late-{i}",
                                      "action": "deleted", "reason": "test"} for i in range(2)])
    anchor = tmp_path / "anchor.json"
    assert db.verify("--save-anchor", str(anchor))[0] == 0
    db.sql("DELETE FROM securesaver_receipts WHERE tenant = :t AND seq > :s", t=ACME,
           s=old_head[0])
    db.sql("UPDATE securesaver_chain_heads SET seq = :s, mac = :m, head_mac = :h "
           "WHERE tbl = 'securesaver_receipts' AND chain = :t", s=old_head[0], m=old_head[1],
           h=old_head[2], t=ACME)
    code, _data, _out = db.verify()
    assert code == 0  # documented limit: consistent with an older state of the chain
    code, data, output = db.verify("--anchor", str(anchor))
    assert code == 1, output
    assert any(p[0] == "securesaver_receipts" and "anchored row is gone" in p[2]
               for p in problems(data))


def test_concurrent_writers_from_two_processes_still_verify(populated: Db) -> None:
    db = populated
    env = {**os.environ, "SECURESAVER_MASTER_KEY": db.ring.to_json()}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.scripts.registry_writer", db.url,
                               name, "15"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for name in ("w1", "w2")]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    code, data, output = db.verify()
    assert code == 0, output
    assert data["checked"]["securesaver_receipts"] == 4 + 2 * 15 * 2
    seqs = [r[0] for r in db.sql("SELECT seq FROM securesaver_receipts WHERE tenant = :t "
                                 "ORDER BY seq", t="globex")]  # the writers' tenant
    assert seqs == list(range(1, 31))  # both processes extended one chain, no fork, no gap


def test_deleted_registry_key_row_is_reported_not_replaced(populated: Db) -> None:
    db = populated
    db.sql("DELETE FROM securesaver_tenant_keys WHERE purpose = 'registry'")
    with db.saver() as saver, pytest.raises(TamperedDataError, match="registry MAC key"):
        saver.registry.record_event("note", tenant=ACME)
    assert_named(db, "securesaver_tenant_keys", "purpose=registry", "missing")


# --------------------------------------------------------------------------------------------
# thread retention rows: the pruner never obeys a forged row
# --------------------------------------------------------------------------------------------
def _retention_setup(db: Db) -> None:
    with db.saver(retention=RetentionPolicy(idle_ttl="1h")) as saver:
        for thread in ("live", "held", "old"):
            _say(saver, thread)
        with tenant_scope(ACME):
            saver.set_retention("held", legal_hold=True)
        # "old" legitimately went idle 3 hours ago (registered through the API)
        saver.registry.forget_thread(ACME, "old")
        saver.registry.touch_thread(ACME, "old", now=time.time() - 3 * HOUR,
                                    policy=saver.services.policy_for(ACME))


THREAD_COLUMNS = ("created_at", "last_activity", "idle_ttl", "max_age", "strategy",
                  "legal_hold", "policy_source", "expires_at", "state", "policy_mac",
                  "activity_mac")


def _copy_row(db: Db, source: str, target: str) -> None:
    sets = ", ".join(f"{c} = (SELECT {c} FROM securesaver_threads WHERE tenant = :t AND "
                     f"thread_id = :s)" for c in THREAD_COLUMNS)
    db.sql(f"UPDATE securesaver_threads SET {sets} WHERE tenant = :t AND thread_id = :d",
           t=ACME, s=source, d=target)


FORGED_ROWS: dict[str, tuple[str, str, Callable[[Db, float], None]]] = {
    # name: (thread attacked, sweep time, edit)
    "expires_at_earlier": ("live", "soon", lambda db, now: db.sql(
        "UPDATE securesaver_threads SET expires_at = :e WHERE thread_id = 'live'", e=now - 60)),
    "idle_ttl_shortened": ("live", "soon", lambda db, now: db.sql(
        "UPDATE securesaver_threads SET idle_ttl = 1, expires_at = last_activity + 1 "
        "WHERE thread_id = 'live'")),
    "last_activity_backdated": ("live", "soon", lambda db, now: db.sql(
        "UPDATE securesaver_threads SET last_activity = last_activity - 7200, "
        "expires_at = last_activity - 7200 + 3600 WHERE thread_id = 'live'")),
    "created_at_backdated_with_max_age": ("live", "soon", lambda db, now: db.sql(
        "UPDATE securesaver_threads SET created_at = 0, max_age = 60, expires_at = 60 "
        "WHERE thread_id = 'live'")),
    "state_deleting": ("live", "soon", lambda db, now: db.sql(
        "UPDATE securesaver_threads SET state = 'deleting', expires_at = :e "
        "WHERE thread_id = 'live'", e=now - 60)),
    "legal_hold_removed": ("held", "later", lambda db, now: db.sql(
        "UPDATE securesaver_threads SET legal_hold = :f, expires_at = last_activity + 3600 "
        "WHERE thread_id = 'held'", f=False)),
    "row_transplanted": ("live", "soon", lambda db, now: _copy_row(db, "old", "live")),
}


@pytest.mark.parametrize("edit", sorted(FORGED_ROWS))
def test_the_pruner_does_not_obey_a_forged_thread_row(db: Db, edit: str) -> None:
    _retention_setup(db)
    thread, when, forge = FORGED_ROWS[edit]
    now = time.time() + (0.5 * HOUR if when == "soon" else 2 * HOUR)
    forge(db, now)
    with db.saver() as saver:
        report = saver.prune_expired(now=now, active_grace=0)
        assert (ACME, thread) not in report.deleted + report.pruned_to_latest
        assert any(t == thread and "TamperedDataError" in e for _, t, e in report.errors), (
            report.errors)
        assert saver.get_tuple(_cfg(thread)) is not None  # nothing was deleted
        assert not [r for r in saver.receipts(tenant=ACME) if r.thread_id == thread]
        if when == "soon":  # later, the untouched threads expire and go; the forged one stays
            later = saver.prune_expired(now=time.time() + 2 * HOUR, active_grace=0)
            assert (ACME, "old") in later.deleted and (ACME, thread) not in later.deleted
            assert saver.get_tuple(_cfg(thread)) is not None
    code, data, output = db.verify()
    assert code == 1 and any(p[0] == "securesaver_threads" for p in problems(data)), output


def test_a_forged_legal_hold_at_worst_keeps_data_and_is_reported(db: Db) -> None:
    _retention_setup(db)
    db.sql("UPDATE securesaver_threads SET legal_hold = :t, expires_at = NULL "
           "WHERE thread_id = 'old'", t=True)
    with db.saver() as saver:
        report = saver.prune_expired(now=time.time(), active_grace=0)
        assert (ACME, "old") not in report.deleted
        assert saver.get_tuple(_cfg("old")) is not None
    assert_named(db, "securesaver_threads", f"thread#{row_tag(ACME, 'old')}")


@pytest.mark.parametrize("later", ["NULL", "expires_at + 600"])
def test_a_forged_later_expiry_is_reported_by_verify(db: Db, later: str) -> None:
    """Delaying a deletion (expires_at pushed out) is not something the pruner can see; the
    verifier recomputes every expiry from the MACed fields."""
    _retention_setup(db)
    db.sql(f"UPDATE securesaver_threads SET expires_at = {later} WHERE thread_id = 'old'")
    assert_named(db, "securesaver_threads", f"thread#{row_tag(ACME, 'old')}", "expires_at")


def test_async_sweep_refuses_a_forged_expiry(db: Db) -> None:
    import asyncio
    _retention_setup(db)
    now = time.time() + 0.5 * HOUR
    db.sql("UPDATE securesaver_threads SET expires_at = :e WHERE thread_id = 'live'", e=now - 1)
    with db.saver() as saver:
        report = asyncio.run(saver.aprune_expired(now=now, active_grace=0))
        assert (ACME, "live") not in report.deleted and report.errors
        assert saver.get_tuple(_cfg("live")) is not None


def test_the_pruner_refuses_to_run_without_the_keyring(db: Db) -> None:
    from langgraph_securesaver.errors import KeyringRequired
    from langgraph_securesaver.keys.provider import NoKeys
    _retention_setup(db)
    with SecureSaver.from_url(db.url, keyring=NoKeys(), redaction=None) as saver:
        with pytest.raises(KeyringRequired):
            saver.prune_expired(now=time.time() + 2 * HOUR)
        assert saver.receipts() == []


def test_cli_prune_without_the_keyring_exits_2_with_one_line(db: Db) -> None:
    _retention_setup(db)
    for extra in ([], ["--dry-run"]):
        result = runner.invoke(app, ["prune", "--url", db.url, *extra],
                               env={"SECURESAVER_MASTER_KEY": ""})
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "--keyring" in lines[0] and "SECURESAVER_MASTER_KEY" in (
            lines[0]), result.output
    with db.saver() as saver:
        assert saver.receipts() == [] and saver.get_tuple(_cfg("old")) is not None


def test_set_retention_refuses_to_re_mac_a_forged_row(db: Db) -> None:
    _retention_setup(db)
    db.sql("UPDATE securesaver_threads SET created_at = 0 WHERE thread_id = 'live'")
    with db.saver() as saver, tenant_scope(ACME), pytest.raises(TamperedDataError):
        saver.set_retention("live", max_age="1d")
    assert_named(db, "securesaver_threads", f"thread#{row_tag(ACME, 'live')}")


# --------------------------------------------------------------------------------------------
# retention policies
# --------------------------------------------------------------------------------------------
def test_a_forged_policy_row_is_refused(db: Db) -> None:
    _retention_setup(db)
    db.sql("UPDATE securesaver_policies SET idle_ttl = 1 WHERE tenant = '*'")
    db.sql("INSERT INTO securesaver_policies (tenant, idle_ttl, strategy, legal_hold, "
           "updated_at) VALUES (:t, 1, 'delete', :f, 0)", t=GLOBEX, f=False)
    with db.saver() as saver:  # no retention= here: nothing rewrites the default at setup
        for tenant in (ACME, GLOBEX):
            with pytest.raises(TamperedDataError, match="securesaver_policies"):
                _say(saver, "brand-new", tenant)
            assert saver.registry.get_thread(tenant, "brand-new") is None
    found = assert_named(db, "securesaver_policies", "default")
    assert ("securesaver_policies", f"tenant#{row_tag(GLOBEX)}") in {p[:2] for p in found}


# --------------------------------------------------------------------------------------------
# idempotency fingerprints and recovery opt-ins
# --------------------------------------------------------------------------------------------
FP_EDITS = {
    "fingerprint_removed": "UPDATE securesaver_idempotency SET fingerprint = NULL WHERE key = :k",
    "fingerprint_replaced": "UPDATE securesaver_idempotency SET fingerprint = :other WHERE key = :k",
    "completed_flipped_to_failed":
        "UPDATE securesaver_idempotency SET state = 'failed' WHERE key = :k",
}


@pytest.mark.parametrize("edit", sorted(FP_EDITS))
def test_a_forged_idempotency_fingerprint_is_refused(db: Db, edit: str) -> None:
    with db.saver() as saver:
        refund = execute_fingerprinted_refund(saver, ACME)
        sql = FP_EDITS[edit]
        db.sql(sql, k=refund.scope.key, **({"other": refund.other} if ":other" in sql else {}))
        for args in ({"amount": 99999}, {"amount": 10}):
            with pytest.raises(TamperedDataError, match="securesaver_idempotency"):
                refund.store.execute(refund.scope, refund.calls,
                                     fingerprint=fingerprint(refund.keys, args))
        assert refund.calls.n == 1  # never executed again, never replayed for other arguments
    if edit != "completed_flipped_to_failed":
        assert_named(db, "securesaver_idempotency", f"key={refund.scope.key[:16]}")


def test_an_inserted_idempotency_record_is_refused(db: Db) -> None:
    with db.saver() as saver:
        store = IdempotencyStore.for_saver(saver)
        store.setup()
        scope = KeyScope(ACME, "t1", "k-" + uuid.uuid4().hex, "business", "refund")
        db.sql("INSERT INTO securesaver_idempotency (tenant, thread_id, key, kind, name, state, "
               "fencing_token, attempts, created_at, updated_at) VALUES (:t, 't1', :k, "
               "'business', 'refund', 'failed', 1, 1, 0, 0)", t=ACME, k=scope.key)
        calls = Calls()
        with pytest.raises(TamperedDataError):
            store.execute(scope, calls)
        assert calls.n == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_forged_recovery_opt_in_is_refused(db: Db, mode: str) -> None:
    with db.saver() as saver:
        graph = build_chat_graph(saver)
        mark_recoverable(_cfg("opted"), saver=saver)
        release_recoverable(_cfg("opted"), saver=saver)  # the opting process is done with it
        store = IdempotencyStore.for_saver(saver)
        # a row for a thread that never opted in, and a genuine opt-in copied to another one
        db.sql("INSERT INTO securesaver_recoverable (tenant, thread_id, state, fencing_token, "
               "attempts, created_at, updated_at) VALUES (:t, 'never', 'armed', 0, 0, 0, 0)",
               t=ACME)
        db.sql("INSERT INTO securesaver_recoverable (tenant, thread_id, state, fencing_token, "
               "attempts, created_at, updated_at, configurable) SELECT tenant, 'victim', state, "
               "fencing_token, attempts, created_at, updated_at, configurable FROM "
               "securesaver_recoverable WHERE thread_id = 'opted'")
        for thread in ("never", "victim"):
            _say(saver, thread)
        if mode == "sync":
            report = recover_stalled(graph, saver, older_than=0)
        else:
            import asyncio

            from langgraph_securesaver.idempotency.recovery import arecover_stalled
            report = asyncio.run(arecover_stalled(graph, saver, older_than=0))
        assert {(ACME, "never"), (ACME, "victim")} <= set(report.failed)
        assert not {(ACME, "never"), (ACME, "victim")} & set(report.resumed + report.finished)
        assert (ACME, "opted") in report.finished  # the genuine row is obeyed
        assert store is IdempotencyStore.for_saver(saver)


# --------------------------------------------------------------------------------------------
# nothing is migrated or adopted
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0", "5", "2"])
def test_a_registry_of_another_schema_version_is_refused_not_migrated(
        populated: Db, version: str) -> None:
    """An operator pointing this library at a registry a pre-release build wrote (or an
    attacker editing ``schema_version`` to make it look older): refused at setup, nothing
    written, the data as it was."""
    db = populated
    before = db.sql("SELECT count(*) FROM securesaver_events")
    db.sql("UPDATE securesaver_meta SET value = :v WHERE key = 'schema_version'", v=version)
    with pytest.raises(ConfigurationError, match=f"schema version '{version}'.*Nothing is "
                       "migrated"):
        with db.saver():
            pass
    assert db.sql("SELECT count(*) FROM securesaver_events") == before
    assert db.sql("SELECT value FROM securesaver_meta WHERE key = 'schema_version'") == [
        (version,)]


def test_a_registry_stripped_of_every_mac_is_reported_never_adopted(populated: Db) -> None:
    """NULL every MAC, delete the chain heads and the registry key row: a keyed start makes
    a new registry key but MACs nothing it finds; ``events --verify`` reports every stripped
    row."""
    db = populated
    for table, columns in (("securesaver_threads", ("policy_mac", "activity_mac")),
                           ("securesaver_policies", ("mac",)),
                           ("securesaver_receipts", ("prev_mac", "mac")),
                           ("securesaver_events", ("prev_mac", "mac"))):
        db.sql(f"UPDATE {table} SET " + ", ".join(f"{c} = NULL" for c in columns))
    db.sql("DELETE FROM securesaver_chain_heads")
    db.sql("DELETE FROM securesaver_tenant_keys WHERE purpose = 'registry'")
    with db.saver():
        pass
    code, data, output = db.verify()
    assert code == 1, output
    reasons = {p[2] for p in problems(data)}
    assert any("has no MAC" in r for r in reasons), reasons
    assert len(problems(data)) >= 4 + 3   # every receipt and thread row at least
    assert not db.sql("SELECT count(*) FROM securesaver_threads WHERE policy_mac IS NOT NULL"
                      )[0][0]


def test_receipts_of_a_shredded_tenant_still_verify(populated: Db) -> None:
    """The registry MAC key is the installation's, not the tenant's: shredding a tenant
    destroys its keys but its deletion receipts stay verifiable (and so does the rest)."""
    db = populated
    with SecureSaver.from_url(db.url, keyring=Keyring.from_file(db.ring_path),
                              redaction=None) as saver:
        assert saver.shred_tenant(GLOBEX, requested_by="dpo") >= 1
        assert GLOBEX not in saver.registry.tenants()
    code, data, output = db.verify()
    assert code == 0, output
    shredded = db.sql("SELECT count(*) FROM securesaver_receipts WHERE tenant = :t AND "
                      "action = 'shredded'", t=GLOBEX)[0][0]
    assert shredded >= 1 and data["checked"]["securesaver_receipts"] >= 4 + shredded


# --------------------------------------------------------------------------------------------
# the batched pruner: MACs checked before it decides and again under the delete's locks
# --------------------------------------------------------------------------------------------
def _claimed_batch(saver: SecureSaver, threads: int, now: float) -> list[Any]:
    for i in range(threads):
        _say(saver, f"t{i}")
    rows = saver.registry.claim_expired(now=now, owner="test", lease=300, limit=100)
    assert sorted(r.thread_id for r in rows) == sorted(f"t{i}" for i in range(threads))
    return rows


def _legit_then_forged(db: Db, saver: SecureSaver, how: str, now: float) -> None:
    """After the claim: a legitimate change that makes t2 not due (through the API, so it is
    MACed), then a forgery of the stored columns that makes it look due again."""
    with tenant_scope(ACME):
        if how == "hold_removed":
            saver.set_retention("t2", legal_hold=True)
            db.sql("UPDATE securesaver_threads SET legal_hold = :f, expires_at = :e "
                   "WHERE thread_id = 't2'", f=False, e=now - 60)
        else:
            saver.set_retention("t2", idle_ttl="30d")
            forged = ("expires_at = :e" if how == "expiry_forged"
                      else "state = 'deleting', expires_at = :e")
            db.sql(f"UPDATE securesaver_threads SET {forged} WHERE thread_id = 't2'", e=now - 60)


@pytest.mark.parametrize("how", ["hold_removed", "expiry_forged", "state_deleting"])
def test_a_row_forged_between_claim_and_batch_delete_is_not_obeyed(db: Db, how: str) -> None:
    """The claim saw t2 due (and it verified); then it stopped being due and the stored
    columns were forged back. The fenced batch delete re-checks the MACs of exactly the rows
    it deleted: the batch is rolled back, redone thread by thread, t2 reported and kept."""
    from collections import Counter

    from langgraph_securesaver.ops.pruner import Sweep, shares_database
    now = time.time() + 2 * HOUR
    with db.saver(retention=RetentionPolicy(idle_ttl="1h")) as saver:
        rows = _claimed_batch(saver, 6, now)
        _legit_then_forged(db, saver, how, now)
        sweep = Sweep(saver, now=now, limit=None, dry_run=False, tenant=None, active_grace=0)
        sweep._shared = shares_database(saver)
        assert sweep._shared            # from_url: the one-transaction batch path
        sweep._batch(rows)
        report = sweep.report
        assert sorted(report.deleted) == sorted((ACME, f"t{i}") for i in (0, 1, 3, 4, 5))
        assert any(t == "t2" and "TamperedDataError" in e for _, t, e in report.errors), (
            report.errors)
        assert saver.get_tuple(_cfg("t2")) is not None
        assert saver.registry.get_thread(ACME, "t2") is not None
        receipts = Counter(r.thread_id for r in saver.receipts(tenant=ACME))
        assert receipts == {f"t{i}": 1 for i in (0, 1, 3, 4, 5)}
    code, data, output = db.verify()
    assert code == 1, output
    assert {p[0] for p in problems(data)} == {"securesaver_threads"}, problems(data)


def test_marking_a_batch_deleting_re_checks_the_macs(db: Db) -> None:
    """The path for a registry outside the inner saver's database marks the batch
    `deleting` before it deletes storage: a forged row makes the mark roll back whole."""
    now = time.time() + 2 * HOUR
    with db.saver(retention=RetentionPolicy(idle_ttl="1h")) as saver:
        rows = _claimed_batch(saver, 4, now)
        _legit_then_forged(db, saver, "expiry_forged", now)
        with pytest.raises(TamperedDataError, match="securesaver_threads row"):
            saver.registry.mark_batch_state(rows, "deleting", now=now)
        assert {t.state for t in saver.registry.list_threads()} == {"active"}
        assert saver.registry.mark_batch_state(
            [r for r in rows if r.thread_id != "t2"], "deleting", now=now) == {
            (ACME, t) for t in ("t0", "t1", "t3")}


def test_a_batch_with_forged_rows_deletes_only_the_authentic_ones(db: Db) -> None:
    """Forged rows inside one claimed batch (expiry, TTL, hold, transplant): reported, kept;
    the authentic expired threads of the same batch go, one receipt each."""
    from collections import Counter
    with db.saver(retention=RetentionPolicy(idle_ttl="1h")) as saver:
        for i in range(8):
            _say(saver, f"t{i}")
        with tenant_scope(ACME):
            for i in (4, 5, 6, 7):
                saver.set_retention(f"t{i}", idle_ttl="30d")
            saver.set_retention("t3", legal_hold=True)
    now = time.time() + 2 * HOUR
    db.sql("UPDATE securesaver_threads SET expires_at = :e WHERE thread_id = 't4'", e=now - 1)
    db.sql("UPDATE securesaver_threads SET idle_ttl = 1, expires_at = last_activity + 1 "
           "WHERE thread_id = 't5'")
    db.sql("UPDATE securesaver_threads SET legal_hold = :f, expires_at = :e "
           "WHERE thread_id = 't3'", f=False, e=now - 1)
    _copy_row(db, "t0", "t6")
    with db.saver() as saver:
        report = saver.prune_expired(now=now, active_grace=0)
        assert sorted(report.deleted) == [(ACME, "t0"), (ACME, "t1"), (ACME, "t2")]
        assert {t for _, t, _e in report.errors} == {"t3", "t4", "t5", "t6"}
        for i in range(3, 8):
            assert saver.get_tuple(_cfg(f"t{i}")) is not None
        assert Counter(r.thread_id for r in saver.receipts(tenant=ACME)) == {
            "t0": 1, "t1": 1, "t2": 1}


def test_concurrent_batched_pruners_keep_every_chain_verifiable(db: Db) -> None:
    """Several sweeps at once over several tenants (small batches, so they interleave on the
    chain heads): one receipt per thread, and every tenant's receipt chain verifies."""
    import threading
    from collections import Counter
    tenants = [f"tenant-{k}-chain" for k in range(3)]
    with db.saver(retention=RetentionPolicy(idle_ttl="1h")) as saver:
        graph = build_chat_graph(saver)
        for tenant in tenants:
            for i in range(8):
                graph.invoke({"messages": [HumanMessage("hi")]}, _cfg(f"c{i}", tenant))
    now = time.time() + 2 * HOUR
    reports: list[Any] = []
    failures: list[BaseException] = []

    def sweep() -> None:
        try:
            with db.saver() as saver:
                reports.append(saver.prune_expired(now=now, batch=3, active_grace=0))
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    workers = [threading.Thread(target=sweep) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    assert not failures, failures
    deleted = [d for r in reports for d in r.deleted]
    assert len(deleted) == len(set(deleted)) == 24
    assert all(r.ok for r in reports), [r.errors for r in reports]
    with db.saver() as saver:
        for tenant in tenants:
            counts = Counter(r.thread_id for r in saver.receipts(tenant=tenant))
            assert counts == {f"c{i}": 1 for i in range(8)}
        seqs = [r[0] for r in db.sql("SELECT seq FROM securesaver_receipts WHERE tenant = :t "
                                     "ORDER BY seq", t=tenants[0])]
        assert seqs == list(range(1, 9))
    code, _data, output = db.verify()
    assert code == 0, output


@pytest.mark.parametrize("edit", ["deleted", "altered", "reordered"])
def test_receipts_written_by_a_batch_are_chained(db: Db, edit: str) -> None:
    """A batch's receipts (one bulk insert) are links of the tenant's chain: deleting,
    altering or reordering one of them is named by `events --verify`."""
    with db.saver(retention=RetentionPolicy(idle_ttl="1h")) as saver:
        for i in range(5):
            _say(saver, f"b{i}")
        report = saver.prune_expired(now=time.time() + 2 * HOUR, active_grace=0)
        assert len(report.deleted) == 5
    assert db.verify()[0] == 0
    ids = chain_ids(db, "securesaver_receipts")
    assert len(ids) == 5
    victim = ids[2]
    if edit == "deleted":
        db.sql("DELETE FROM securesaver_receipts WHERE id = :i", i=victim)
        named = f"id={ids[3]}"
    elif edit == "altered":
        db.sql("UPDATE securesaver_receipts SET reason = :r WHERE id = :i", r=FORGED, i=victim)
        named = f"id={victim}"
    else:
        db.sql("UPDATE securesaver_receipts SET seq = -seq WHERE id IN (:a, :b)",
               a=victim, b=ids[3])
        db.sql("UPDATE securesaver_receipts SET seq = CASE WHEN id = :a THEN :sb ELSE :sa END "
               "WHERE id IN (:a, :b)", a=victim, b=ids[3], sa=3, sb=4)
        named = f"id={victim}"
    assert_named(db, "securesaver_receipts", named)
