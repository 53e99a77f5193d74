"""What a newcomer meets first on the command line: messages naming the real cause and the
CLI's own flags, ``--version``, cron-clean output, unknown names refused, reports that never
say "no problems" beside a failure (issue 45)."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from langgraph_securesaver import Keyring
from langgraph_securesaver.audit.report_html import ReportContext, render_html
from langgraph_securesaver.audit.trail import EVENT_KINDS, TrailEntry
from langgraph_securesaver.cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The demo's database (two tenants, one refused read) and its keyring file."""
    where = tmp_path_factory.mktemp("newcomer")
    db = where / "demo.db"
    env = {"SECURESAVER_MASTER_KEY": ""}
    result = runner.invoke(app, ["demo", "--db", str(db)], env=env)
    assert result.exit_code == 0, result.output
    return f"sqlite:///{db}", where / "demo.db.keyring.json"


def _one_error_line(result: object) -> str:
    err = result.stderr  # type: ignore[attr-defined]
    assert result.exit_code == 2, (result.stdout, err)  # type: ignore[attr-defined]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


# -- messages ---------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["prune", "audit", "scan", "events"])
def test_an_unusable_master_key_variable_is_named_not_taken_for_missing(
        demo_db: tuple[str, Path], command: str) -> None:
    url, _ = demo_db
    result = runner.invoke(app, [command, "--url", url],
                           env={"SECURESAVER_MASTER_KEY": "garbage"})
    line = _one_error_line(result)
    assert "SECURESAVER_MASTER_KEY" in line and "not valid base64" in line, line
    assert "pass --keyring or set" not in line


def test_a_missing_keyring_names_the_cli_flags_not_the_python_api(
        demo_db: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = demo_db
    for args in (["recover", "--url", url, "--dead-letters"],
                 ["prune", "--url", url, "--keyring", str(tmp_path / "missing.json")]):
        line = _one_error_line(runner.invoke(app, args, env={"SECURESAVER_MASTER_KEY": ""}))
        assert "--keyring" in line and "SECURESAVER_MASTER_KEY" in line, line
        assert "Keyring.from_file" not in line and "keyring=" not in line, line


@pytest.mark.parametrize("mode", [0o640, 0o644, 0o604, 0o660, 0o620, 0o602, 0o606, 0o666])
def test_a_keyring_file_group_or_others_can_read_or_write_is_refused(
        tmp_path: Path, mode: int) -> None:
    path = tmp_path / "k.json"
    Keyring.generate().save(path)
    os.chmod(path, mode)
    result = runner.invoke(app, ["prune", "--url", "sqlite:///nowhere.db", "--keyring",
                                 str(path)], env={"SECURESAVER_ALLOW_INSECURE_KEYRING": ""})
    line = _one_error_line(result)
    assert f"mode {mode:04o}" in line and "chmod 600" in line, line
    can = {bool(mode & 0o044): "read", bool(mode & 0o022): "write"}
    assert all(word in line for flag, word in can.items() if flag), line


def test_a_keyring_file_loaded_by_opting_out_is_loaded_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "k.json"
    Keyring.generate().save(path)
    os.chmod(path, 0o644)
    monkeypatch.setenv("SECURESAVER_ALLOW_INSECURE_KEYRING", "1")
    with caplog.at_level("WARNING"):
        Keyring.from_file(path)
    assert any("0644" in r.getMessage() and str(path) in r.getMessage()
               for r in caplog.records), caplog.text
    os.chmod(path, 0o600)
    caplog.clear()
    Keyring.from_file(path)
    assert not caplog.records
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_version() -> None:
    from importlib.metadata import version
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip().endswith(version("langgraph-securesaver"))


# -- cron and scripts -------------------------------------------------------------------------
def test_prune_json_writes_nothing_on_stderr(demo_db: tuple[str, Path]) -> None:
    url, ring = demo_db
    result = runner.invoke(app, ["prune", "--url", url, "--keyring", str(ring), "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert json.loads(result.stdout)["deleted"] == []


def test_audit_json_is_one_document_as_documented(demo_db: tuple[str, Path]) -> None:
    url, _ = demo_db
    result = runner.invoke(app, ["audit", "--url", url, "--format", "json"],
                           env={"SECURESAVER_MASTER_KEY": ""})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {t["tenant"] for t in doc["tenants"]} == {"acme", "globex"} and doc["ok"] is True
    texts = [(ROOT / "docs/reference/cli.md").read_text(), (ROOT / "README.md").read_text()]
    assert not any(re.search(r"json lines|jsonl", t, re.I) for t in texts)
    assert "one JSON document" in texts[0]


@pytest.mark.parametrize("args, named", [
    (["--kind", "deletion"], "--kind 'deletion'"),
    (["--kind", "receipt:erased"], "--kind 'receipt:erased'"),
    (["--tenant", "nobody"], "tenant 'nobody'"),
])
def test_events_refuses_names_this_database_does_not_know(
        demo_db: tuple[str, Path], args: list[str], named: str) -> None:
    url, _ = demo_db
    line = _one_error_line(runner.invoke(app, ["events", "--url", url, *args],
                                         env={"SECURESAVER_MASTER_KEY": ""}))
    assert named in line and "unknown" in line, line


def test_events_with_known_names_and_no_match_exits_0(demo_db: tuple[str, Path]) -> None:
    url, _ = demo_db
    for args in (["--kind", "tenant_shredded"], ["--kind", "receipt:deleted"],
                 ["--tenant", "acme", "--since", "2000-01-01", "--until", "2000-01-02"]):
        result = runner.invoke(app, ["events", "--url", url, "--format", "json", *args],
                               env={"SECURESAVER_MASTER_KEY": ""})
        assert result.exit_code == 0, (args, result.output)
        assert json.loads(result.stdout) == []
    found = runner.invoke(app, ["events", "--url", url, "--format", "json", "--kind",
                                "access_denied"], env={"SECURESAVER_MASTER_KEY": ""})
    assert found.exit_code == 0 and json.loads(found.stdout)


def test_every_event_kind_written_in_the_source_is_known() -> None:
    """``events --kind`` refuses a kind it does not know: every kind the library records must
    be in EVENT_KINDS (the source's string literals and the rotation job's constants)."""
    source = "\n".join(p.read_text() for p in (ROOT / "langgraph_securesaver").rglob("*.py"))
    literals = set(re.findall(r"record_event\(\s*\"([a-z_]+)\"", source))
    literals |= set(re.findall(r"kind=\"([a-z_]+)\"", source))
    literals |= set(re.findall(r"^JOB_[A-Z]+ = \"([a-z_]+)\"", source, re.M))
    assert literals and literals <= EVENT_KINDS, literals - EVENT_KINDS


# -- reports ----------------------------------------------------------------------------------
def test_audit_table_without_a_keyring_says_what_it_did_not_check(
        demo_db: tuple[str, Path]) -> None:
    url, _ = demo_db
    result = runner.invoke(app, ["audit", "--url", url], env={"SECURESAVER_MASTER_KEY": "",
                                                               "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert "no problems" not in flat.replace("no inventory problems", "")
    assert "Not checked here" in flat and "scan --verify" in flat


def test_html_report_without_a_keyring_says_what_it_could_not_check(
        demo_db: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = demo_db
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["audit", "--url", url, "--format", "html", "--out", str(out)],
                           env={"SECURESAVER_MASTER_KEY": ""})
    assert result.exit_code == 0, result.output
    page = out.read_text()
    verdict = re.search(r'<div[^>]*id="verdict">(.*?)</div>', page, re.S).group(1)
    assert "No problems" not in verdict and "without the keyring" in verdict, verdict


def _report(context: ReportContext) -> str:
    from langgraph_securesaver.audit.report import AuditReport
    return render_html(AuditReport(tenants=[], threads=[], orphans=[], generated_at=0.0,
                                   backend="sqlite", tenant_filter=None, age_bytes={}),
                       context=context)


@pytest.mark.parametrize("failing", ["scan", "registry"])
def test_html_banner_never_says_no_problems_beside_a_failed_check(failing: str) -> None:
    parts = {"scan": {"ok": True, "rows": {}, "violations": []},
             "registry": {"ok": True, "checked": {}, "problems": []}}
    parts[failing] = {**parts[failing], "ok": False}
    page = _report(ReportContext(**parts))
    verdict = re.search(r'<div[^>]*id="verdict">(.*?)</div>', page, re.S).group(1)
    assert "No problems" not in page and "FAIL" in verdict, verdict
    passing = _report(ReportContext(scan={"ok": True, "rows": {}, "violations": []},
                                    registry={"ok": True, "checked": {}, "problems": []}))
    assert "No problems" in passing and "every verification below passed" in passing


def test_html_receipts_show_times_as_dates() -> None:
    when = 1_767_225_600.0      # 2026-01-01T00:00:00Z
    receipt = TrailEntry(at=when, kind="receipt:deleted", tenant="acme", thread_id="t1",
                         actor="pruner", detail={"expired_at": when, "checkpoints": 3},
                         source="receipt", ref="1")
    page = _report(ReportContext(receipts=[receipt]))
    assert "expired_at: 2026-01-01 00:00:00 UTC" in page
    assert "1767225600" not in page
