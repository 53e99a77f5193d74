"""Maintained audit summaries (issue 32): after any interleaving of the operations that change
stored rows, the summaries the audit reads agree with a recount of the raw rows; a drift
planted in them is reported by ``scan --verify`` and never hides a thread's data."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver, tenant_scope
from langgraph_securesaver.audit import summaries
from langgraph_securesaver.audit.inventory import audit
from langgraph_securesaver.audit.scan import scan
from langgraph_securesaver.audit.sql import AuditDatabase
from tests.fake_agent import build_chat_graph

from .boundary_helpers import Raw

EMAIL = "jane.doe@example.com"
RESOLUTION = 0.05      # how far a write may be behind the registry's last activity


@pytest.fixture(scope="module")
def redactor():
    from langgraph_securesaver.redaction import Redactor
    return Redactor()


def _cfg(thread: str, tenant: str) -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def _threads(report) -> dict:
    """A report's registered threads, without what only its timing decides."""
    return {(t.tenant, t.thread_id): (t.checkpoints, t.stored_bytes, t.key_versions, t.pii,
                                      t.first_checkpoint, t.last_checkpoint, t.overdue)
            for t in report.threads if t.registered}


def _tenants(report) -> dict:
    return {t.tenant: (t.threads, t.checkpoints, t.stored_bytes, t.key_versions)
            for t in report.tenants}


def _same_audit(url: str, ring: Keyring, busy_tenant: str | None = None) -> None:
    """The audit from summaries (without a refresh first) is the recount's. ``busy_tenant``:
    another process is writing its threads right now, so the two audits, read one after the
    other, may each see a different moment of them: that tenant is left out."""
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              activity_resolution=RESOLUTION) as saver:
        now = time.time()
        fast = audit(saver, now=now, source="summaries")
        full = audit(saver, now=now, source="recount")

        def quiet(rows: dict) -> dict:
            return {k: v for k, v in rows.items()
                    if (k[0] if isinstance(k, tuple) else k) != busy_tenant}
        assert quiet(_threads(fast)) == quiet(_threads(full))
        assert quiet(_tenants(fast)) == quiet(_tenants(full))
        if busy_tenant is None:
            assert fast.age_bytes == full.age_bytes


_WRITER = textwrap.dedent("""
    import sys
    from langchain_core.messages import HumanMessage
    from langgraph_securesaver import Keyring, SecureSaver
    from tests.fake_agent import build_chat_graph
    url, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with SecureSaver.from_url(url, keyring=Keyring.from_file(path), redaction=None,
                              activity_resolution=%r) as saver:
        graph = build_chat_graph(saver)
        for i in range(n):
            cfg = {"configurable": {"thread_id": f"w-{i %% 3}", "tenant_id": "beta"}}
            graph.invoke({"messages": [HumanMessage(f"from the other process {i}")]}, cfg)
""") % RESOLUTION


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_summaries_equal_a_recount_after_random_interleavings(
        database: tuple[str, Raw], tmp_path: Path, redactor) -> None:
    url, _raw = database
    ring_path = tmp_path / "keyring.json"
    Keyring.generate().save(ring_path)
    ring = Keyring.from_file(ring_path)
    rng = random.Random(32)
    tenants = ("acme", "beta", "gamma")
    with SecureSaver.from_url(url, keyring=ring, redaction=redactor,
                              activity_resolution=RESOLUTION) as saver:
        graph = build_chat_graph(saver)
        assert summaries.built(saver.registry)          # setup() built them (none yet)
        writer = subprocess.Popen(
            [sys.executable, "-c", _WRITER, url, str(ring_path), "12"],
            cwd=Path(__file__).resolve().parent.parent)
        live: set[tuple[str, str]] = set()
        counter = 0
        for step in range(60):
            op = rng.choice(["put", "put", "put", "pii", "writes", "delete", "prune",
                             "keep_latest", "copy", "refresh", "refresh", "forget", "runs"])
            tenant = rng.choice(tenants[:2] if op == "forget" else tenants)
            mine = sorted(t for te, t in live if te == tenant)
            if op in ("put", "pii") or not mine:
                thread = f"t{rng.randrange(6)}"
                text = f"mail {EMAIL} step {step}" if op == "pii" else f"hello {step}"
                graph.invoke({"messages": [HumanMessage(text)]}, _cfg(thread, tenant))
                live.add((tenant, thread))
            elif op == "writes":
                thread = rng.choice(mine)
                cfg = saver.get_tuple(_cfg(thread, tenant)).config
                saver.put_writes(cfg, [("messages", [HumanMessage(f"pending {step}")])],
                                 f"task-{step}")
            elif op == "delete":
                thread = rng.choice(mine)
                with tenant_scope(tenant):
                    saver.delete_thread(thread)
                live.discard((tenant, thread))
            elif op == "prune":
                thread = rng.choice(mine)
                with tenant_scope(tenant):
                    saver.prune([thread], strategy="delete")
                live.discard((tenant, thread))
            elif op == "keep_latest":
                with tenant_scope(tenant):
                    saver.prune(mine, strategy="keep_latest")
            elif op == "copy":
                counter += 1
                with tenant_scope(tenant):
                    saver.copy_thread(rng.choice(mine), f"copy-{counter}")
                live.add((tenant, f"copy-{counter}"))
            elif op == "forget":
                saver.forget_pii(tenant, EMAIL)
            elif op == "runs":
                with tenant_scope(tenant):
                    saver.delete_for_runs([f"run-{step}"])
            else:
                time.sleep(2 * RESOLUTION)
                summaries.refresh(saver)
            if step % 15 == 14:
                _same_audit(url, ring, busy_tenant="beta" if writer.poll() is None else None)
        # the other process writes with the keyring file as it was: it finishes before the
        # shred rotates the master key (on a loaded machine it may start late)
        assert writer.wait(timeout=300) == 0
        saver.shred_tenant("gamma")
        _same_audit(url, ring)
        time.sleep(2 * RESOLUTION)
        summaries.refresh(saver)
        # every summary as a recount computes it: nothing due, nothing drifted
        db = AuditDatabase(saver.registry)
        assert summaries.recount(db) == []
        empty = {(t.tenant, t.thread_id) for t in audit(saver, source="recount").threads
                 if not t.checkpoints and not t.stored_bytes}
        for name in saver.registry.tenants():    # due: only what stores nothing at all
            due = summaries.due_threads(saver.registry, name, time.time())
            assert {(name, t) for t in due} <= empty, (name, due)
        _same_audit(url, ring)
        totals = {t["tenant"]: t for t in summaries.tenant_totals(saver.registry)}
        report = audit(saver, source="recount")
        for t in report.tenants:
            if t.threads:
                assert (totals[t.tenant]["threads"], totals[t.tenant]["checkpoints"],
                        totals[t.tenant]["stored_bytes"]) == (t.threads, t.checkpoints,
                                                            t.stored_bytes)
        assert "gamma" not in totals


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_planted_drift_is_reported_by_the_scan_and_hides_no_data(
        database: tuple[str, Raw], tmp_path: Path, redactor) -> None:
    url, raw = database
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=redactor,
                              activity_resolution=RESOLUTION) as saver:
        graph = build_chat_graph(saver)
        for thread in ("a", "b", "c", "d"):
            for turn in range(2):
                graph.invoke({"messages": [HumanMessage(f"{thread} {turn}")]},
                             _cfg(thread, "acme"))
        time.sleep(2 * RESOLUTION)
        summaries.refresh(saver)
        truth = _threads(audit(saver, source="recount"))
        assert scan(saver, keyring=ring, verify=True).ok
        # lowered, emptied, deleted, and dated in the future
        raw.run("UPDATE securesaver_thread_summaries SET checkpoints = 1, stored_bytes = 1 "
                "WHERE thread_id = 'a'")
        raw.run("UPDATE securesaver_thread_summaries SET checkpoints = 0, stored_bytes = 0 "
                "WHERE thread_id = 'b'")
        raw.run("DELETE FROM securesaver_thread_summaries WHERE thread_id = 'c'")
        raw.run("UPDATE securesaver_thread_summaries SET refreshed_at = refreshed_at + 1e9, "
                "stored_bytes = 5 WHERE thread_id = 'd'")
        report = scan(saver, keyring=ring, verify=True)
        drifted = {v.location.split("thread=")[1]: v.detail for v in report.violations
                   if v.kind == "summary_drift"}
        assert set(drifted) == {"a", "b", "d"}        # a missing summary is only due
        assert "checkpoints" in drifted["a"] and "stored_bytes" in drifted["a"]
        assert "refreshed_at" in drifted["d"] and "stored_bytes" in drifted["d"]
        seen = _threads(audit(saver, source="summaries"))
        assert set(seen) == set(truth)                  # every thread listed
        for key in (("acme", "b"), ("acme", "c"), ("acme", "d")):
            assert seen[key] == truth[key]              # recomputed from the raw rows
        assert seen[("acme", "a")][0] >= 1 and seen[("acme", "a")][1] >= 1
        # a refresh does not repair a drift it cannot see; the scan keeps reporting it
        assert any(v.kind == "summary_drift" for v in
                   scan(saver, keyring=ring, verify=True).violations)


def test_an_unregistered_thread_is_reported_by_the_scan(tmp_path: Path, redactor) -> None:
    """What the audit from summaries does not list (stored rows with no registry row) the
    scan does."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        graph = build_chat_graph(saver)
        graph.invoke({"messages": [HumanMessage("hi")]}, _cfg("x", "acme"))
        graph.invoke({"messages": [HumanMessage("hi")]}, _cfg("y", "acme"))
    Raw("sqlite", tmp_path / "agent.db").run(
        "DELETE FROM securesaver_threads WHERE thread_id = 'y'")
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        assert [t.thread_id for t in audit(saver, source="summaries").threads] == ["x"]
        kinds = [v.kind for v in scan(saver, keyring=ring, verify=True).violations]
        assert kinds.count("unregistered_thread") == 1


@pytest.mark.parametrize("batch", [500, 1])
def test_setup_builds_summaries_for_a_database_written_without_them(
        tmp_path: Path, redactor, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """A database whose summaries are gone (their tables dropped, never built): setup()
    builds them from the raw rows, logging progress; the audit then reads them. (Batch 1:
    most of a tenant due, built by one statement over the tenant's rows.)"""
    monkeypatch.setattr(summaries, "BATCH", batch)
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=redactor) as saver:
        graph = build_chat_graph(saver)
        for thread in ("a", "b", "c"):
            graph.invoke({"messages": [HumanMessage(f"hi {EMAIL}")]}, _cfg(thread, "acme"))
    raw = Raw("sqlite", tmp_path / "agent.db")
    raw.run("DROP TABLE securesaver_thread_summaries")
    raw.run("DROP TABLE securesaver_tenant_summaries")
    raw.run("DELETE FROM securesaver_meta WHERE key LIKE 'summaries%'")
    caplog.set_level("INFO", logger="langgraph_securesaver.audit.summaries")
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        assert summaries.built(saver.registry)
        later = time.time() + 3600
        assert summaries.recount(AuditDatabase(saver.registry), now=later) == []
        rows = raw.rows("SELECT thread_id, checkpoints FROM securesaver_thread_summaries "
                       "ORDER BY thread_id")
        assert [r[0] for r in rows] == ["a", "b", "c"] and all(r[1] > 0 for r in rows)
        now = time.time()
        fast, full = (audit(saver, now=now, source=s) for s in ("summaries", "recount"))
        assert _threads(fast) == _threads(full) and fast.age_bytes == full.age_bytes
    assert any("audit summaries" in r.getMessage() for r in caplog.records)


def test_the_retention_sweep_refreshes_due_summaries(tmp_path: Path) -> None:
    """The pruner's sweep refreshes the summaries that are due (what bounds how long the audit
    recomputes a thread from its rows)."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None,
                              activity_resolution=RESOLUTION) as saver:
        graph = build_chat_graph(saver)
        for thread in ("a", "b"):
            graph.invoke({"messages": [HumanMessage("hi")]}, _cfg(thread, "acme"))
        time.sleep(2 * RESOLUTION)
        assert sorted(summaries.due_threads(saver.registry, "acme", time.time())) == ["a", "b"]
        saver.prune_expired()
        assert summaries.due_threads(saver.registry, "acme", time.time()) == []
        assert summaries.recount(AuditDatabase(saver.registry)) == []


def test_summary_columns_read_as_json_loads_reads_them() -> None:
    """The audit reads the summaries' JSON columns without json.loads' per-call checks: the
    same value for what a refresh writes, and json.loads' own answer (or error) for anything
    else a database edit may leave there."""
    from langgraph_securesaver.audit.summaries import _json_column
    for text in ("[0, 0, 12345, 0, 0, 0, 7]", "{}", '{"checkpoints": 2}', "[]",
                 ' [1, 2] ', "[1, 2]\n", b"[1, 2]", '"x"', "1e400", "[-0.0, 1.5]"):
        assert _json_column(text) == json.loads(text), text
    for bad in ("[1, 2] x", "[1, 2", "", "nan-ish", 7, None, [1]):
        with pytest.raises(Exception) as expected:
            json.loads(bad)   # type: ignore[arg-type]
        with pytest.raises(type(expected.value)) as got:
            _json_column(bad)
        assert str(got.value) == str(expected.value), bad
