"""`securesaver scan`: a clean database passes; plaintext slipped in by a raw saver, clear
metadata keys, personal data in clear columns, unknown keys and forged ciphertexts are caught,
on SQLite and PostgreSQL, and neither the table nor the JSON output ever holds the value."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.audit.scan import scan
from langgraph_securesaver.cli import main as cli_module
from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401  (registers the commands)
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.tenancy import inner_thread_id, tenant_tag
from tests.fake_agent import build_support_graph

runner = CliRunner()

MARKER = "SCAN-PLAINTEXT-MARKER-4417"
EMAIL = "dana.scully@fbi-files.org"
PHONE = "+1 415 555 0199"
SECRET = "sk-proj-" + "Q7wE9rT2yU4iO6pA8sD1fG3hJ5kL0zXc"
SENSITIVE = (MARKER, EMAIL, PHONE, SECRET)


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich wraps at 80 columns under the runner; a wrapped value could hide a leak."""
    monkeypatch.setattr(cli_module.console, "width", 250)
    monkeypatch.delenv("SECURESAVER_MASTER_KEY", raising=False)


def _cfg(thread: str, tenant: str) -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def _populate(saver: SecureSaver) -> None:
    graph = build_support_graph(saver)
    for tenant in ("acme", "globex"):
        for thread in ("t1", "t2"):
            graph.invoke({"messages": [HumanMessage("hi, where is order ACME-1234?")]},
                         _cfg(thread, tenant))


def _flat(text: str) -> str:
    return re.sub(r"[\s\u2500-\u257f…]", "", text)


def assert_no_leak(output: str) -> None:
    for value in SENSITIVE:
        assert value not in output
        assert _flat(value) not in _flat(output), f"{value!r} leaked (wrapped) into the output"


def run_scan(url: str, *args: str) -> tuple[int, dict, str]:
    """Run the CLI twice (json, then table); return the exit code, the report and both
    outputs, after checking that neither holds a sensitive value."""
    as_json = runner.invoke(app, ["scan", "--url", url, *args, "--format", "json"])
    as_table = runner.invoke(app, ["scan", "--url", url, *args])
    assert as_json.exit_code == as_table.exit_code, as_table.output
    both = as_json.output + as_table.output
    assert_no_leak(both)
    report = json.loads(as_json.stdout) if as_json.exit_code in (0, 1) else {}
    return as_json.exit_code, report, both


@pytest.fixture
def sqlite_db(tmp_path: Path) -> tuple[str, Path, Path]:
    db = tmp_path / "agent.db"
    ring = Keyring.generate()
    ring_path = ring.save(tmp_path / "keyring.json")
    url = f"sqlite:///{db}"
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        _populate(saver)
    return url, db, ring_path


def _kinds(report: dict) -> dict[str, int]:
    return report["violations_by_kind"]


def test_clean_sqlite_database_passes_and_verifies(sqlite_db) -> None:
    url, _db, ring_path = sqlite_db
    code, report, output = run_scan(url, "--keyring", str(ring_path), "--verify")
    assert code == 0, output
    assert report["ok"] and report["violations"] == []
    assert report["tokens"] > 20 and report["verified"] == report["tokens"]
    assert report["rows"]["checkpoints"] > 0 and report["rows"]["writes"] > 0
    # 2 tenants x (data, index, the KEK of their threads) + the registry MAC key row
    assert report["rows"]["securesaver_tenant_keys"] == 7
    assert report["data_key_versions"].keys() == {"acme", "globex"}
    assert "clean" in output


def test_plaintext_checkpoint_from_a_raw_saver_is_caught(sqlite_db) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver
    url, db, _ring = sqlite_db
    conn = sqlite3.connect(db, check_same_thread=False)
    raw = SqliteSaver(conn)
    thread = f"{tenant_tag('acme')}:x"   # lands in acme's namespace, unencrypted
    build_support_graph(raw).invoke(
        {"messages": [HumanMessage(f"{MARKER}: mail me at {EMAIL}")]},
        {"configurable": {"thread_id": thread, "user_phone": PHONE}})
    conn.close()
    code, report, output = run_scan(url)
    assert code == 1
    kinds = _kinds(report)
    assert kinds["plaintext_channel_value"] >= 1
    assert kinds["missing_sealed_metadata"] >= 1
    assert kinds["plaintext_write"] >= 1
    assert kinds["clear_metadata_key"] >= 1          # user_phone, copied from configurable
    clear = [v for v in report["violations"] if v["kind"] == "clear_metadata_key"]
    assert any("user_phone" in v["location"] and "PHONE_NUMBER" in v["detail"] for v in clear)
    located = {v["location"].split(" ns=")[0] for v in report["violations"]
               if v["kind"] == "plaintext_channel_value"}
    assert located == {"tenant=acme thread=x"}
    assert "plaintext_channel_value" in output and "tenant=acme thread=x" in output


def test_clear_metadata_key_is_caught_without_its_value(sqlite_db) -> None:
    url, db, _ring = sqlite_db
    conn = sqlite3.connect(db)
    (cid, md) = conn.execute("SELECT checkpoint_id, metadata FROM checkpoints WHERE thread_id = ? "
                             "ORDER BY checkpoint_id DESC LIMIT 1",
                             (inner_thread_id("globex", "t2"),)).fetchone()
    metadata = json.loads(md)
    metadata["customer_email"] = EMAIL
    conn.execute("UPDATE checkpoints SET metadata = ? WHERE checkpoint_id = ?",
                 (json.dumps(metadata), cid))
    conn.commit()
    conn.close()
    code, report, _output = run_scan(url)
    assert code == 1
    assert _kinds(report) == {"clear_metadata_key": 1}
    (found,) = report["violations"]
    assert found["table"] == "checkpoints"
    assert f"tenant=globex thread=t2 ns='' checkpoint={cid} key=customer_email" == \
        found["location"]
    assert "EMAIL_ADDRESS" in found["detail"]


def test_personal_data_in_clear_columns_is_caught_and_masked(sqlite_db) -> None:
    url, _db, ring_path = sqlite_db
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path), redaction=None) as saver:
        # a thread id holding an email (thread ids are stored in clear, by design)
        build_support_graph(saver).invoke({"messages": [HumanMessage("hello")]},
                                          _cfg(f"ticket:{EMAIL}", "acme"))
        saver.registry.record_event("support_note", tenant="acme", note=f"key is {SECRET}")
        saver.registry.add_receipt(tenant="globex", thread_id="t1", action="deleted",
                                   reason="manual", requested_by=PHONE, detail={})
        code, report, output = run_scan(url)
        assert code == 1
        pii = [v for v in report["violations"] if v["kind"] == "pii_in_clear_column"]
        where = {(v["table"], v["detail"]) for v in pii}
        assert ("checkpoints", "column thread_id: EMAIL_ADDRESS") in where
        assert ("writes", "column thread_id: EMAIL_ADDRESS") in where
        assert ("securesaver_threads", "column thread_id: EMAIL_ADDRESS") in where
        assert ("securesaver_events", "column detail: API_SECRET") in where
        assert ("securesaver_receipts", "column requested_by: PHONE_NUMBER") in where
        assert _kinds(report) == {"pii_in_clear_column": len(pii)}
        assert "thread=ticket:<EMAIL_ADDRESS>" in output  # the row key is masked, not dropped
        # the programmatic scan finds the same
        assert len(scan(saver).violations) == len(report["violations"])


def test_unknown_data_key_and_foreign_master_key(sqlite_db, tmp_path: Path) -> None:
    url, db, ring_path = sqlite_db
    conn = sqlite3.connect(db)
    (tid, cid, task, idx, value) = conn.execute(
        "SELECT thread_id, checkpoint_id, task_id, idx, value FROM writes LIMIT 1").fetchone()
    forged = value[:3] + (9).to_bytes(4, "big") + value[7:]   # names data key v9
    conn.execute("UPDATE writes SET value = ? WHERE thread_id = ? AND checkpoint_id = ? AND "
                 "task_id = ? AND idx = ?", (forged, tid, cid, task, idx))
    conn.commit()
    conn.close()
    code, report, _ = run_scan(url, "--keyring", str(ring_path))
    assert code == 1 and _kinds(report) == {"unknown_data_key": 1}
    assert "data key v9" in report["violations"][0]["detail"]
    other = Keyring.generate()
    other._masters = {"7": other._masters["1"]}
    other._current = "7"
    other_path = other.save(tmp_path / "other.json")
    # a keyring the database was not created with: one line naming it, nothing scanned
    code, report, output = run_scan(url, "--keyring", str(other_path))
    assert code == 2 and report == {}
    assert "this database was created with another keyring" in output
    assert "master version 1 is not in it" in output
    # with the right keyring, a tenant key row that names a master version nobody holds
    conn = sqlite3.connect(db)
    conn.execute("UPDATE securesaver_tenant_keys SET master_version = '7' "
                 "WHERE tenant = 'acme' AND purpose = 'index'")
    conn.commit()
    conn.close()
    code, report, _ = run_scan(url, "--keyring", str(ring_path))
    assert code == 1
    assert _kinds(report) == {"unknown_data_key": 1, "unknown_master_key": 1}


def test_verify_catches_a_forged_ciphertext(sqlite_db) -> None:
    url, db, ring_path = sqlite_db
    conn = sqlite3.connect(db)
    (tid, cid, task, idx, value) = conn.execute(
        "SELECT thread_id, checkpoint_id, task_id, idx, value FROM writes LIMIT 1").fetchone()
    flipped = value[:-1] + bytes([value[-1] ^ 1])
    conn.execute("UPDATE writes SET value = ? WHERE thread_id = ? AND checkpoint_id = ? AND "
                 "task_id = ? AND idx = ?", (flipped, tid, cid, task, idx))
    conn.commit()
    conn.close()
    code, _report, _ = run_scan(url, "--keyring", str(ring_path))
    assert code == 0   # the header is fine: only authentication can tell
    code, report, _ = run_scan(url, "--keyring", str(ring_path), "--verify")
    # the row itself, and the checkpoint it belongs to (refused by reads too)
    assert code == 1 and _kinds(report) == {"token_fails_authentication": 1,
                                            "checkpoint_fails_verification": 1}


def test_scan_exit_2_when_it_cannot_run(sqlite_db, tmp_path: Path) -> None:
    url, _db, _ring = sqlite_db
    result = runner.invoke(app, ["scan", "--url", url, "--verify"])
    assert result.exit_code == 2 and "--keyring" in result.output
    result = runner.invoke(app, ["scan", "--url", f"sqlite:///{tmp_path / 'missing.db'}"])
    assert result.exit_code == 2 and "no database" in result.output
    assert not (tmp_path / "missing.db").exists()
    result = runner.invoke(app, ["scan", "--url", "mysql://nope"])
    assert result.exit_code == 2


@pytest.mark.postgres
def test_postgres_clean_then_raw_saver_clear_metadata_and_pii(pg_url: str, tmp_path: Path
                                                              ) -> None:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    ring = Keyring.generate()
    ring_path = ring.save(tmp_path / "keyring.json")
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None) as saver:
        _populate(saver)
    code, report, _ = run_scan(pg_url, "--keyring", str(ring_path), "--verify")
    assert code == 0, report
    assert report["backend"] == "postgres"
    assert report["rows"]["checkpoint_blobs"] > 0 and report["rows"]["checkpoint_writes"] > 0
    assert report["verified"] == report["tokens"] > 20

    with PostgresSaver.from_conn_string(pg_url) as raw:
        graph = build_support_graph(raw)
        cfg = {"configurable": {"thread_id": f"{tenant_tag('globex')}:x"}}
        graph.update_state(cfg, {"customer_email": EMAIL, "turns": 3})
        graph.invoke({"messages": [HumanMessage(f"{MARKER} call {PHONE}")]}, cfg)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE checkpoints SET metadata = metadata || jsonb_build_object('user_phone', "
            "%s::text) WHERE thread_id = %s", (PHONE, inner_thread_id("acme", "t1")))
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None) as saver:
        saver.registry.record_event("support_note", tenant="acme", note=f"mail {EMAIL}")
    code, report, _ = run_scan(pg_url, "--keyring", str(ring_path))
    assert code == 1
    kinds = _kinds(report)
    assert kinds["inline_channel_value"] >= 2            # customer_email and turns, inlined
    assert kinds["plaintext_channel_value"] >= 1         # messages, a clear msgpack blob
    assert kinds["missing_sealed_metadata"] >= 1
    assert kinds["plaintext_write"] >= 1
    assert kinds["pii_in_clear_column"] >= 1
    inline = {v["location"].rsplit("channel=", 1)[1] for v in report["violations"]
              if v["kind"] == "inline_channel_value"}
    assert {"customer_email", "turns"} <= inline
    clear = [v for v in report["violations"] if v["kind"] == "clear_metadata_key"
             and "tenant=acme thread=t1" in v["location"]]
    assert clear and all("PHONE_NUMBER" in v["detail"] for v in clear)
    assert any(v["table"] == "securesaver_events" and "EMAIL_ADDRESS" in v["detail"]
               for v in report["violations"])
