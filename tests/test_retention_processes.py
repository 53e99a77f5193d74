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
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.keys.lifecycle import LEASE_FENCE
from langgraph_securesaver.retention import RetentionPolicy
from langgraph_securesaver.tenancy import tenant_scope
from tests.fake_agent import build_chat_graph

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


def _spawn(url: str, now: float, ring: Keyring, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*WORKER, url, str(now), *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SECURESAVER_MASTER_KEY": ring.to_json()})


@pytest.mark.postgres
def test_three_pruners_and_writers_on_postgres(pg_url: str) -> None:
    expired, live = 60, 10
    ring = Keyring.generate()
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None,
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
        procs = [_spawn(pg_url, later, ring, "--batch", "3") for _ in range(3)]
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
        # three pruners appended to one tenant's receipt chain at once: it still verifies
        integrity = saver.registry.verify_integrity()
        assert integrity.ok, integrity.problems


def test_pruner_killed_mid_sweep_is_finished_by_the_next(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    expired = 40
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h")) as saver:
        _populate(saver, expired, 3)
    later = time.time() + 2 * HOUR
    proc = _spawn(url, later, ring, "--batch", "4", "--lease", "1", "--slow", "0.05")
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
    ring_path = Keyring.generate().save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path), redaction=None,
                              retention=RetentionPolicy(idle_ttl=1)) as saver:
        _populate(saver, 3, 1)
    time.sleep(LEASE_FENCE + 0.1)   # idle past the TTL and the write lease on each key
    # without the keyring the pruner cannot verify the retention rows: it refuses to run
    keyless = runner.invoke(app, ["prune", "--url", url, "--json"],
                            env={"SECURESAVER_MASTER_KEY": ""})
    assert keyless.exit_code == 2 and "keyring" in keyless.output
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path),
                              redaction=None) as saver:
        assert saver.receipts() == []
    # the dry run with the options of the real run below reports what it then does
    dry = runner.invoke(app, ["prune", "--url", url, "--keyring", str(ring_path), "--dry-run",
                              "--json", "--active-grace", "1s"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.stdout)
    assert len(report["would_delete"]) == 3 and report["deleted"] == []
    real = runner.invoke(app, ["prune", "--url", url, "--keyring", str(ring_path), "--json",
                               "--active-grace", "1s"])
    assert real.exit_code == 0, real.output
    assert len(json.loads(real.stdout)["deleted"]) == 3
    again = runner.invoke(app, ["prune", "--url", url, "--keyring", str(ring_path)])
    assert again.exit_code == 0 and "nothing expired" in again.stdout


@pytest.mark.parametrize("args, message", [
    (["--every", "ten minutes"], "not a duration"),
    (["--tenant", "nobody"], "unknown tenant"),
])
def test_cli_prune_bad_input_exits_2_and_deletes_nothing(tmp_path: Path, args, message) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    ring = Keyring.generate()
    ring_path = ring.save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl=1)) as saver:
        _populate(saver, 2, 0)
    time.sleep(1.1)
    result = runner.invoke(app, ["prune", "--url", url, "--keyring", str(ring_path), *args])
    assert result.exit_code == 2 and message in result.output
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        assert saver.receipts() == [] and len(saver.registry.list_threads()) == 2


def test_cli_prune_unreachable_database_exits_2() -> None:
    result = runner.invoke(app, ["prune", "--url", "postgresql://nobody@127.0.0.1:1/none"])
    assert result.exit_code == 2 and "error" in result.output


def test_cli_prune_every_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None):
        pass
    proc = subprocess.Popen([sys.executable, "-m", "langgraph_securesaver.cli", "prune",
                             "--url", url, "--every", "1h"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "120",
                                 "SECURESAVER_MASTER_KEY": ring.to_json()})
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


def _stored(conn, inner: str) -> tuple[int, int, int]:
    return tuple(conn.execute(f"SELECT count(*) FROM {table} WHERE thread_id = %s",
                              (inner,)).fetchone()[0]
                 for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"))


@pytest.mark.postgres
def test_pruner_killed_in_the_middle_of_a_batch_leaves_each_thread_untouched_or_gone(
        pg_url: str) -> None:
    """The second batch's transaction has deleted registry rows and some storage when it
    blocks on a row lock held here; the pruner is SIGKILLed there. Every thread of that batch
    must be untouched (rows, storage, no receipt), every thread of the first batch gone with
    exactly one receipt, and the next sweep finishes the rest, one receipt each."""
    import psycopg

    from langgraph_securesaver.idempotency import IdempotencyStore, KeyScope
    from langgraph_securesaver.tenancy import inner_thread_id

    expired = 12
    ring = Keyring.generate()   # one keyring: the pruner verifies the registry MACs
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h")) as saver:
        _populate(saver, expired, 2)
        store = IdempotencyStore.for_saver(saver)
        for i in range(expired):
            scope = KeyScope("acme", f"old-{i}", f"k-{i}", "tool", "send_email")
            store.execute(scope, lambda claim: "sent")
        for i in range(expired):   # claim order (by expiry) is old-0, old-1, ...
            saver.registry.set_thread_retention("acme", f"old-{i}", idle_ttl=1.0 + i)
    later = time.time() + 2 * HOUR
    inner = {i: inner_thread_id("acme", f"old-{i}") for i in range(expired)}
    with psycopg.connect(pg_url, autocommit=True) as probe:
        before = {i: _stored(probe, inner[i]) for i in range(expired)}
    assert all(c > 0 and b > 0 and w > 0 for c, b, w in before.values())
    victim = 6                      # in the second batch of 4
    # --slow: the first batch's progress lines take 4 x 0.3 s, time to lock the victim's rows
    proc = _spawn(pg_url, later, ring, "--batch", "4", "--lease", "1", "--slow", "0.3")
    with psycopg.connect(pg_url) as lock:
        for line in proc.stdout:
            if line.startswith("progress"):
                break                  # the first batch has committed
        lock.execute("SELECT 1 FROM checkpoints WHERE thread_id = %s FOR UPDATE",
                     (inner[victim],)).fetchall()
        my_pid = lock.info.backend_pid
        blocked = None
        with psycopg.connect(pg_url, autocommit=True) as probe:
            deadline = time.time() + 120
            while blocked is None and time.time() < deadline:
                # (other sessions on this server may wait for us too: CREATE INDEX
                # CONCURRENTLY waits for every open transaction)
                row = probe.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY("
                                    "pg_blocking_pids(pid)) AND query LIKE %s",
                                    (my_pid, "%DELETE FROM checkpoints%")).fetchone()
                blocked = row[0] if row else None
                time.sleep(0.05)
            assert blocked is not None, proc.communicate(timeout=5)
            query = probe.execute("SELECT query FROM pg_stat_activity WHERE pid = %s",
                                  (blocked,)).fetchone()[0]
            assert "DELETE FROM checkpoints" in query, query   # inside the batch's deletes
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            lock.rollback()            # the orphaned transaction can go on now, and must fail
            while probe.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                (blocked,)).fetchone()[0]:
                time.sleep(0.05)
            after = {i: _stored(probe, inner[i]) for i in range(expired)}
    assert proc.returncode == -signal.SIGKILL
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None) as saver:
        registered = {t.thread_id for t in saver.registry.list_threads()}
        receipts: dict[str, int] = {}
        for r in saver.receipts(tenant="acme"):
            receipts[r.thread_id] = receipts.get(r.thread_id, 0) + 1
        records = {r.thread_id for r in IdempotencyStore.for_saver(saver).list_records("acme")}
        for i in range(expired):
            thread = f"old-{i}"
            gone = (after[i] == (0, 0, 0) and thread not in registered
                    and receipts.get(thread) == 1 and thread not in records)
            untouched = (after[i] == before[i] and thread in registered
                         and thread not in receipts and thread in records)
            assert gone or untouched, (thread, before[i], after[i], receipts.get(thread))
            if i < 4:
                assert gone, thread              # the first batch committed
            elif i < 8:
                assert untouched, thread         # the batch in flight rolled back whole
        time.sleep(1.2)                          # the killed pruner's lease runs out
        report = saver.prune_expired(now=later)
        assert report.ok
        counts: dict[str, int] = {}
        for r in saver.receipts(tenant="acme"):
            counts[r.thread_id] = counts.get(r.thread_id, 0) + 1
        assert counts == {f"old-{i}": 1 for i in range(expired)}
        assert {t.thread_id for t in saver.registry.list_threads()} == {"live-0", "live-1"}
        integrity = saver.registry.verify_integrity()   # the rolled-back batch left no link
        assert integrity.ok, integrity.problems
    with psycopg.connect(pg_url, autocommit=True) as probe:
        assert all(_stored(probe, inner[i]) == (0, 0, 0) for i in range(expired))


@pytest.mark.postgres
def test_a_default_policy_saved_while_another_process_saves_it_too(pg_url: str) -> None:
    """Services starting together each save the configured default retention. Another
    process's save is held open (its row inserted, not committed) while this saver's first
    turn saves the same default: the turn waits, then succeeds, and one row remains (a
    delete-then-insert raised a unique violation once the other committed)."""
    import psycopg
    ring = Keyring.generate()
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None) as bare:
        bare.registry.setup()
    options = pg_url.split("options=")[1].replace("%3D", "=").replace("%20", " ")
    other = psycopg.connect(pg_url.split("?")[0], options=options)
    other.execute("INSERT INTO securesaver_policies (tenant, max_age, strategy, legal_hold, "
                  "updated_at) VALUES ('*', 60, 'delete', false, 0)")
    errors: list[BaseException] = []

    def first_turn() -> None:
        try:
            with SecureSaver.from_url(pg_url, keyring=ring, redaction=None,
                                      retention=RetentionPolicy(max_age="1d")) as saver:
                build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _cfg("t"))
        except BaseException as exc:
            errors.append(exc)

    turn = threading.Thread(target=first_turn)
    turn.start()
    turn.join(timeout=3)           # it waits on the other's uncommitted row
    other.commit()
    other.close()
    turn.join(timeout=120)
    assert not turn.is_alive() and errors == []
    with psycopg.connect(pg_url.split("?")[0], options=options) as conn:
        rows = conn.execute("SELECT tenant, max_age FROM securesaver_policies").fetchall()
    assert rows == [("*", 86400.0)]
