"""Pruners as real processes: several at once on PostgreSQL with writers running, one killed
with SIGKILL mid-sweep on SQLite, and the `securesaver prune` CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.cli import app
from langgraph_securesaver.demo import build_chat_graph
from langgraph_securesaver.retention import RetentionPolicy
from langgraph_securesaver.tenancy import tenant_scope

WORKER = [sys.executable, "-m", "tests.scripts.prune_worker"]
ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600.0


def _cfg(thread: str, tenant: str = "acme") -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def _populate(saver: SecureSaver, expired: int, live: int) -> None:
    graph = build_chat_graph(saver)
    for i in range(expired):
        graph.invoke({"messages": [HumanMessage(f"old {i}")]}, _cfg(f"old-{i}"))
    for i in range(live):
        graph.invoke({"messages": [HumanMessage(f"live {i}")]}, _cfg(f"live-{i}"))
        with tenant_scope("acme"):
            saver.set_retention(f"live-{i}", idle_ttl="30d")


def _spawn(url: str, now: float, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*WORKER, url, str(now), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.postgres
def test_three_pruners_and_writers_on_postgres(pg_url: str) -> None:
    expired, live = 60, 10
    with SecureSaver.from_url(pg_url, keyring=Keyring.generate(), redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h")) as saver:
        _populate(saver, expired, live)
        later = time.time() + 2 * HOUR
        writes = {i: 1 for i in range(live)}
        stop = threading.Event()

        def writer() -> None:
            graph = build_chat_graph(saver)
            n = 0
            while not stop.is_set() and n < 200:
                i = n % live
                graph.invoke({"messages": [HumanMessage(f"more {n}")]}, _cfg(f"live-{i}"))
                writes[i] += 1
                n += 1

        thread = threading.Thread(target=writer)
        thread.start()
        procs = [_spawn(pg_url, later, "--batch", "3") for _ in range(3)]
        outputs = [p.communicate(timeout=300) for p in procs]
        stop.set()
        thread.join()
        assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
        reports = [json.loads(next(line[7:] for line in out.splitlines()
                                   if line.startswith("report "))) for out, _ in outputs]
        deleted = [(d["tenant"], d["thread_id"]) for r in reports for d in r["deleted"]]
        assert len(deleted) == len(set(deleted)) == expired
        receipts = saver.receipts(tenant="acme")
        assert sorted(r.thread_id for r in receipts) == sorted(f"old-{i}" for i in range(expired))
        for i in range(live):
            tup = saver.get_tuple(_cfg(f"live-{i}"))
            humans = [m for m in tup.checkpoint["channel_values"]["messages"] if m.type == "human"]
            assert len(humans) == writes[i]
        assert {t.thread_id for t in saver.registry.list_threads()} == {
            f"live-{i}" for i in range(live)}


def test_pruner_killed_mid_sweep_is_finished_by_the_next(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    expired = 40
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h")) as saver:
        _populate(saver, expired, 3)
    later = time.time() + 2 * HOUR
    proc = _spawn(url, later, "--batch", "4", "--lease", "1", "--slow", "0.05")
    seen = 0
    for line in proc.stdout:
        if line.startswith("progress"):
            seen += 1
            if seen == 10:
                proc.send_signal(signal.SIGKILL)
                break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        first = len(saver.receipts())
        assert 0 < first < expired
        time.sleep(1.2)  # the killed pruner's lease runs out
        report = saver.prune_expired(now=later)
        assert report.ok
        receipts = saver.receipts()
        assert sorted(r.thread_id for r in receipts) == sorted(f"old-{i}" for i in range(expired))
        assert {t.thread_id for t in saver.registry.list_threads()} == {"live-0", "live-1",
                                                                        "live-2"}
        with tenant_scope("acme"):
            stored = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
        assert stored == {"live-0", "live-1", "live-2"}


runner = CliRunner()


def test_cli_prune_dry_run_json_then_real_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None,
                              retention=RetentionPolicy(idle_ttl=1)) as saver:
        _populate(saver, 3, 1)
    time.sleep(1.1)
    dry = runner.invoke(app, ["prune", "--url", url, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.stdout)
    assert len(report["would_delete"]) == 3 and report["deleted"] == []
    real = runner.invoke(app, ["prune", "--url", url, "--json", "--active-grace", "1s"])
    assert real.exit_code == 0, real.output
    assert len(json.loads(real.stdout)["deleted"]) == 3
    again = runner.invoke(app, ["prune", "--url", url])
    assert again.exit_code == 0 and "nothing expired" in again.stdout


@pytest.mark.parametrize("args, message", [
    (["--every", "ten minutes"], "not a duration"),
    (["--tenant", "nobody"], "unknown tenant"),
])
def test_cli_prune_bad_input_exits_2_and_deletes_nothing(tmp_path: Path, args, message) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None,
                              retention=RetentionPolicy(idle_ttl=1)) as saver:
        _populate(saver, 2, 0)
    time.sleep(1.1)
    result = runner.invoke(app, ["prune", "--url", url, *args])
    assert result.exit_code == 2 and message in result.output
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        assert saver.receipts() == [] and len(saver.registry.list_threads()) == 2


def test_cli_prune_unreachable_database_exits_2() -> None:
    result = runner.invoke(app, ["prune", "--url", "postgresql://nobody@127.0.0.1:1/none"])
    assert result.exit_code == 2 and "error" in result.output


def test_cli_prune_every_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None):
        pass
    proc = subprocess.Popen([sys.executable, "-m", "langgraph_securesaver.cli", "prune",
                             "--url", url, "--every", "1h"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "120"})
    for line in proc.stdout:
        if "nothing expired" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_cli_shred_tenant(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    ring_path = tmp_path / "keyring.json"
    Keyring.generate().save(ring_path)
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path), redaction=None) as s:
        _populate(s, 2, 0)
    bad = runner.invoke(app, ["shred-tenant", "nobody", "--url", url, "--keyring",
                              str(ring_path), "--yes"])
    assert bad.exit_code == 2
    ok = runner.invoke(app, ["shred-tenant", "acme", "--url", url, "--keyring", str(ring_path),
                             "--yes", "--requested-by", "dpo"])
    assert ok.exit_code == 0, ok.output
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path), redaction=None) as s:
        assert {r.action for r in s.receipts(tenant="acme")} == {"shredded"}
        assert s.registry.list_threads() == []
