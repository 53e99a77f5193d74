"""The securesaver CLI: keygen and demo, through typer's runner and as a real process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from langgraph_securesaver import Keyring
from langgraph_securesaver.cli.main import app

runner = CliRunner()


def test_keygen_writes_a_0600_keyring(tmp_path: Path) -> None:
    out = tmp_path / "k.json"
    result = runner.invoke(app, ["keygen", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert Keyring.from_file(out).versions() == ["1"]
    again = runner.invoke(app, ["keygen", "--out", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    assert json.loads(out.read_text())["format"] == "securesaver-keyring/1"


def test_keygen_without_out_prints_an_env_line(monkeypatch) -> None:
    result = runner.invoke(app, ["keygen"])
    assert result.exit_code == 0
    line = next(s for s in result.stdout.splitlines() if s.startswith("export"))
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", line.split("=", 1)[1])
    assert Keyring.from_env().versions() == ["1"]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess,
                                                                 Path]:
    """``securesaver demo`` as a user runs it: a process, no keyring in the environment, an
    80-column terminal, defaults only. Run once; the tests below read what it printed and
    left behind."""
    where = tmp_path_factory.mktemp("demo")
    env = {k: v for k, v in os.environ.items() if k != "SECURESAVER_MASTER_KEY"}
    proc = subprocess.run(
        [sys.executable, "-m", "langgraph_securesaver.cli", "demo"],
        capture_output=True, text=True, env={**env, "COLUMNS": "80"}, timeout=300, cwd=where,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, where


def test_demo_runs_and_every_check_holds(demo_run: tuple[subprocess.CompletedProcess, Path]
                                         ) -> None:
    proc, where = demo_run
    assert "all checks passed" in proc.stdout
    assert "AccessDenied" in proc.stdout
    # redaction at work, with the default settings: the e-mail is a token in storage and
    # comes back whole for its tenant
    flat = " ".join(proc.stdout.split())
    stored = flat.split("in storage (decrypted, vault not read): ")[1].split(" acme reads")[0]
    assert "<EMAIL_ADDRESS:" in stored and "alice.liu@acme-mail.com" not in stored, flat
    assert "acme reads back: Hi, I'm Alice (alice.liu@acme-mail.com)" in flat
    assert "restored for its tenant │ yes" in proc.stdout
    raw = b"".join(p.read_bytes() for p in where.glob("securesaver-demo.db*"))
    assert b"alice.liu@acme-mail.com" not in raw and b"GLX-4410" not in raw


def test_demo_prints_whole_replies_and_no_log_lines_at_80_columns(
        demo_run: tuple[subprocess.CompletedProcess, Path]) -> None:
    """Replies are wrapped, never cut; the refused read is reported by the demo itself, not
    by a WARNING log line in the middle of its report (stdout and stderr alike)."""
    proc, where = demo_run
    flat = " ".join(proc.stdout.split())
    assert "Order ACME-7731 for the customer shipped yesterday." in flat
    assert "Order GLX-4410 for the customer shipped yesterday." in flat
    assert "my phone changed to +1 415 555 0199." in flat
    assert "WARNING" not in proc.stdout + proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    # its files are where the README says, and git ignores them
    made = sorted(p.name for p in where.iterdir())
    assert made == ["securesaver-demo.db", "securesaver-demo.db.keyring.json",
                    "securesaver-demo.db.keyring.json.lock"], made
    root = Path(__file__).resolve().parent.parent
    ignored = subprocess.run(["git", "check-ignore", *made], cwd=root, capture_output=True,
                             text=True)
    assert sorted(ignored.stdout.split()) == made, ignored.stdout + ignored.stderr


def test_demo_with_a_missing_keyring_file_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--db", str(tmp_path / "d.db"), "--keyring",
                                 str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert "securesaver keygen" in result.output


def test_recover_with_nothing_stalled_exits_0_and_a_bad_graph_exits_2(tmp_path: Path) -> None:
    from langgraph_securesaver import SecureSaver
    url = f"sqlite:///{tmp_path / 'r.db'}"
    ring = tmp_path / "k.json"
    Keyring.generate().save(ring)
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring), redaction=None):
        pass
    ok = runner.invoke(app, ["recover", "--url", url, "--keyring", str(ring), "--graph",
                             "tests.fake_agent:build_support_graph", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["resumed"] == 0
    bad = runner.invoke(app, ["recover", "--url", url, "--keyring", str(ring), "--graph",
                              "no_such_module:graph"])
    assert bad.exit_code == 2 and "cannot load graph" in bad.output
