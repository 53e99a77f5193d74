"""`securesaver audit` and `securesaver events` on SQLite and PostgreSQL: the inventory matches
what the saver's public API holds, expiry, holds and unregistered threads are flagged, personal
data kinds come from the vault, and the audit trail filters events and deletion receipts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver, tenant_scope
from langgraph_securesaver.audit.inventory import AGE_BUCKETS, audit
from langgraph_securesaver.audit.trail import events
from langgraph_securesaver.cli import main as cli_module
from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401  (registers the commands)
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.cli.ops import parse_when
from langgraph_securesaver.keys.crypto import THREAD_KEY_VERSION
from tests.fake_agent import build_chat_graph

runner = CliRunner()
EMAIL = "li.na@example.com"
PHONE = "+1 415 555 0199"
DAY = 86400


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_module.console, "width", 250)
    monkeypatch.delenv("SECURESAVER_MASTER_KEY", raising=False)


@pytest.fixture(scope="module")
def redactor():
    from langgraph_securesaver.redaction import Redactor
    return Redactor()


def _cfg(thread: str, tenant: str) -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def build(url: str, redactor) -> Keyring:
    """acme: t-pii (an email and a phone number), t-held (legal hold, past its TTL),
    t-plain; globex: g-expired (past its expiry), g-live. Returns the keyring."""
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=redactor) as saver:
        graph = build_chat_graph(saver)
        graph.invoke({"messages": [HumanMessage(f"I am {EMAIL}, call {PHONE}")]},
                     _cfg("t-pii", "acme"))
        for thread, tenant in (("t-held", "acme"), ("t-plain", "acme"), ("g-expired", "globex"),
                               ("g-live", "globex")):
            for turn in range(2):
                graph.invoke({"messages": [HumanMessage(f"turn {turn}")]}, _cfg(thread, tenant))
        with tenant_scope("acme"):
            saver.set_retention("t-held", legal_hold=True, idle_ttl=0.001)
        with tenant_scope("globex"):
            saver.set_retention("g-expired", idle_ttl=0.001)
            saver.set_retention("g-live", idle_ttl="30d")
    time.sleep(0.01)
    return ring


def _public_counts(saver: SecureSaver) -> dict[tuple[str, str], int]:
    counts = {}
    for tenant, thread in (("acme", "t-pii"), ("acme", "t-held"), ("acme", "t-plain"),
                           ("globex", "g-expired"), ("globex", "g-live")):
        counts[(tenant, thread)] = len(list(saver.list(_cfg(thread, tenant))))
    return counts


def check_inventory(url: str, ring: Keyring) -> None:
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        report = audit(saver)
        expected = _public_counts(saver)
        inventory = saver.pii_inventory()
    threads = {(t.tenant, t.thread_id): t for t in report.threads}
    assert set(threads) == set(expected)
    for key, n in expected.items():
        assert threads[key].checkpoints == n > 0
        assert threads[key].stored_bytes > 0
        assert threads[key].key_versions == [THREAD_KEY_VERSION]   # each thread's own key
        assert threads[key].registered
    assert threads[("acme", "t-pii")].pii == inventory[("acme", "t-pii")]
    assert threads[("acme", "t-pii")].pii == {"EMAIL_ADDRESS": 1, "PHONE_NUMBER": 1}
    assert threads[("acme", "t-plain")].pii == {}
    assert threads[("globex", "g-expired")].overdue
    assert not threads[("globex", "g-live")].overdue
    assert threads[("globex", "g-live")].expires_at > time.time() + 29 * DAY
    held = threads[("acme", "t-held")]
    assert held.legal_hold and held.held_past_ttl and not held.overdue and held.expires_at is None
    tenants = {t.tenant: t for t in report.tenants}
    assert tenants["acme"].threads == 3 and tenants["globex"].threads == 2
    assert tenants["acme"].pii == {"EMAIL_ADDRESS": 1, "PHONE_NUMBER": 1}
    assert tenants["acme"].stored_bytes == sum(
        t.stored_bytes for k, t in threads.items() if k[0] == "acme")
    assert tenants["globex"].overdue == 1 and tenants["acme"].held == 1
    assert tenants["acme"].data_keys == [1] and tenants["acme"].master_versions == ["1"]
    # every stored byte is in an age bucket, all of it written just now
    total = sum(t.stored_bytes for t in report.tenants)
    assert sum(sum(per.values()) for per in report.age_bytes.values()) == total
    assert set(report.age_bytes["acme"]) == {AGE_BUCKETS[0][0]}
    assert not report.ok and any("past their expiry" in p for p in report.problems)


def test_audit_sqlite_inventory(tmp_path: Path, redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    check_inventory(url, build(url, redactor))


@pytest.mark.postgres
def test_audit_postgres_inventory(pg_url: str, redactor) -> None:
    check_inventory(pg_url, build(pg_url, redactor))


def test_audit_ages_and_unregistered_threads(tmp_path: Path, redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    ring = build(url, redactor)
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        later = audit(saver, now=time.time() + 40 * DAY)
        assert {b for per in later.age_bytes.values() for b in per} == {"30-90 days"}
        saver.registry.forget_thread("acme", "t-plain")   # the registry lost a thread
        report = audit(saver, tenant="acme")
    plain = next(t for t in report.threads if t.thread_id == "t-plain")
    assert not plain.registered and plain.checkpoints > 0 and plain.created_at is None
    assert {t.tenant for t in report.threads} == {"acme"}
    assert any("no registry row" in p for p in report.problems)


def test_audit_cli_table_json_and_exit_codes(tmp_path: Path, redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    table = runner.invoke(app, ["audit", "--url", url])
    assert table.exit_code == 1, table.output        # g-expired is past its expiry
    assert "PAST EXPIRY" in table.output and "held" in table.output
    assert "EMAIL_ADDRESS" in table.output and EMAIL not in table.output
    as_json = runner.invoke(app, ["audit", "--url", url, "--format", "json"])
    data = json.loads(as_json.stdout)
    assert as_json.exit_code == 1 and not data["ok"]
    assert [t["thread_id"] for t in data["threads"] if t["overdue"]] == ["g-expired"]
    assert {t["tenant"] for t in data["tenants"]} == {"acme", "globex"}
    only_acme = runner.invoke(app, ["audit", "--url", url, "--tenant", "acme", "--format",
                                    "json"])
    assert only_acme.exit_code == 0, only_acme.output   # acme's only stale thread is held
    assert {t["tenant"] for t in json.loads(only_acme.stdout)["threads"]} == {"acme"}
    unknown = runner.invoke(app, ["audit", "--url", url, "--tenant", "nobody"])
    assert unknown.exit_code == 2 and "unknown tenant" in unknown.output
    missing = runner.invoke(app, ["audit", "--url", f"sqlite:///{tmp_path / 'no.db'}"])
    assert missing.exit_code == 2


def _trail(url: str, ring: Keyring) -> None:
    """A denied cross-tenant read, a deleted thread, then the audit trail."""
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        with tenant_scope("globex"), pytest.raises(AccessDenied):
            saver.get_tuple(_cfg("t-pii", "acme"))
        with tenant_scope("acme"):
            saver.delete_thread("t-plain")
        entries = events(saver, tenant="acme")
    kinds = [e.kind for e in entries]
    assert "access_denied" in kinds and "receipt:deleted" in kinds


def check_events_cli(url: str) -> None:
    def run(*args: str) -> tuple[int, list]:
        result = runner.invoke(app, ["events", "--url", url, "--format", "json", *args])
        return result.exit_code, json.loads(result.stdout) if result.exit_code < 2 else []

    code, denied = run("--kind", "access_denied")
    assert code == 0 and len(denied) == 1
    assert denied[0]["tenant"] == "acme" and denied[0]["actor"] == "globex"
    assert denied[0]["thread_id"] == "t-pii" and denied[0]["detail"] == {
        "operation": "get_tuple"}
    code, receipts = run("--kind", "receipt", "--tenant", "acme", "--thread", "t-plain")
    assert code == 0 and [r["kind"] for r in receipts] == ["receipt:deleted"]
    assert receipts[0]["detail"]["reason"] == "delete_thread"
    assert receipts[0]["detail"]["checkpoints"] >= 2 and receipts[0]["actor"] == "acme"
    code, only_deleted = run("--kind", "receipt:deleted")
    assert code == 0 and len(only_deleted) == 1
    code, everything = run()
    assert code == 0 and {"access_denied", "receipt:deleted", "retention_changed"} <= {
        e["kind"] for e in everything}
    assert [e["at"] for e in everything] == sorted(e["at"] for e in everything)
    code, none = run("--since", "1d", "--until", "2000-01-01")
    assert code == 0 and none == []         # nothing matched is no failure (cron, set -e)
    code, recent = run("--since", "10m", "--tenant", "globex")
    assert code == 0 and {e["tenant"] for e in recent} == {"globex"}
    code, future = run("--kind", "access_denied", "--since", "2999-01-01T00:00:00Z")
    assert code == 0 and future == []
    code, limited = run("--limit", "1")
    assert code == 0 and limited == everything[-1:]
    table = runner.invoke(app, ["events", "--url", url, "--kind", "access_denied"])
    assert table.exit_code == 0 and "access_denied" in table.output and "globex" in table.output
    bad = runner.invoke(app, ["events", "--url", url, "--since", "last tuesday"])
    assert bad.exit_code == 2


def test_events_sqlite(tmp_path: Path, redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    _trail(url, build(url, redactor))
    check_events_cli(url)


@pytest.mark.postgres
def test_events_postgres(pg_url: str, redactor) -> None:
    _trail(pg_url, build(pg_url, redactor))
    check_events_cli(pg_url)


def test_parse_when() -> None:
    now = 1_800_000_000.0
    assert parse_when("7d", what="--since", now=now) == now - 7 * DAY
    assert parse_when("2025-11-01", what="--since") == 1761955200.0
    assert parse_when("2025-11-01T10:00:00Z", what="--since") == 1761991200.0
    assert parse_when("1761955200", what="--since") == 1761955200.0
    assert parse_when(None, what="--since") is None
