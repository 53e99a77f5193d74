"""The key lifecycle between processes (docs/key-lifecycle.md, issue 39): a turn that returned
stays readable until it is deleted on purpose, while other processes delete, prune, forget
and rotate under writers that cached keys and a keyring loaded before.

Every writer is a process of its own with its own saver and caches (tests/scripts/
lifecycle_writer.py, default settings but redaction); the destroyers run in the test process
or in `securesaver` subprocesses. SQLite and PostgreSQL, sync and async writers.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import KeyGoneError, Keyring, SecureSaver, tenant_scope
from langgraph_securesaver.keys.lifecycle import (
    DEFAULT_ACTIVE_GRACE,
    KEY_CACHE_TTL,
    LEASE_FENCE,
    WRITE_LEASE,
)
from langgraph_securesaver.tenancy import ThreadRef
from tests.fake_agent import build_chat_graph

from .lifecycle_helpers import (
    CLI,
    ROOT,
    Deletions,
    Writers,
    check_readback,
    cli,
    cli_here,
    env,
    protected,
    scan_verify,
)

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent.db'}"
    return str(request.getfixturevalue("pg_url"))


def new_database(url: str, tmp_path: Path) -> Path:
    ring = Keyring.generate()
    path = ring.save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=ring, redaction=None):
        pass
    return path


# --- 2. a thread deleted by another process while a writer holds its key --------------------
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("how", ["delete_thread", "forget_subject"])
def test_a_thread_deleted_by_another_process_never_loses_a_later_turn(
        url: str, tmp_path: Path, mode: str, how: str) -> None:
    """A service keeps writing a thread another process deletes (its key cached, 300 s by
    default): the writes around the deletion either land before it (deleted with the
    thread), or fail with KeyGoneError before anything is stored, or start the thread afresh
    under a new key -- never a turn stored under the destroyed key."""
    ring_path = new_database(url, tmp_path)
    writers = Writers(tmp_path / "stop")
    subject = "alice" if how == "forget_subject" else None
    writers.start(url=url, keyring=str(ring_path), tenant="acme", threads=["t0", "t1"],
                  mode=mode, subject=subject)
    deletions = Deletions()
    try:
        writers.wait_for(6)
        with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path),
                                  redaction=None) as saver:
            start = time.time()
            if how == "delete_thread":
                with tenant_scope("acme"):
                    saver.delete_thread("t0")
                deletions.add(["t0"], start, time.time())
            else:
                report = saver.forget_subject("alice", tenants=["acme"], requested_by="dpo")
                assert report.threads == {"acme": 2}
                deletions.add(["t0", "t1"], start, time.time())
        seen = len(writers.ok())
        writers.wait_for(seen + 10)   # the writer goes on with the key it had cached
    finally:
        writers.finish()
    assert writers.failed() == []
    later = protected(writers.ok(), deletions)
    assert {t.thread for t in later} >= {"t0"}, "nothing was written after the deletion"
    assert check_readback(url, ring_path, {"acme": writers.ok()}, deletions) == len(later)
    scan_verify(url, ring_path)


def test_a_write_sealed_under_a_key_deleted_meanwhile_is_refused_before_it_is_stored(
        tmp_path: Path) -> None:
    """The write lease at the last moment: a key dropped by the confirmation made right before
    the inner saver's call means the sealed bytes are under a key that is gone -- KeyGoneError,
    and the inner saver holds nothing of the write."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    ring_path = new_database(url, tmp_path)
    ring = Keyring.from_file(ring_path)
    cfg = {"configurable": {"thread_id": "t", "tenant_id": "acme"}}
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as writer, \
            SecureSaver.from_url(url, keyring=ring, redaction=None) as other:
        graph = build_chat_graph(writer)
        graph.invoke({"messages": [HumanMessage("first")]}, cfg)
        before = len(list(writer.inner.list(None)))
        # another saver (another process as far as the caches go) deletes and restarts the
        # thread while the writer's lease has run short
        with tenant_scope("acme"):
            other.delete_thread("t")
        other_graph = build_chat_graph(other)
        other_graph.invoke({"messages": [HumanMessage("fresh")]}, cfg)
        ref_key = ("acme", "t")
        writer.services._touched[ref_key] -= WRITE_LEASE   # the lease ran short meanwhile
        with pytest.raises(KeyGoneError):
            writer.services.check_lease(ThreadRef("acme", "t"))
        graph.invoke({"messages": [HumanMessage("second")]}, cfg)   # the retry works
        texts = [m.content for m in graph.get_state(cfg).values["messages"]]
        assert "fresh" in texts and "second" in texts and "first" not in texts
        assert before >= 1


# --- 2b. the pruner in another process --------------------------------------------------------
def test_the_default_grace_outlives_every_cache_of_a_key() -> None:
    assert DEFAULT_ACTIVE_GRACE >= KEY_CACHE_TTL + 60.0     # + the activity resolution
    assert LEASE_FENCE > WRITE_LEASE


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_pruner_beside_a_running_service_never_loses_a_turn(url: str, tmp_path: Path,
                                                               mode: str) -> None:
    """RetentionPolicy(max_age=...) and `securesaver prune` from cron in another process, with
    --active-grace 0s (the protocol holds even when the grace is shorter than every cache):
    threads idle past the write lease are deleted; the service then writes them again with
    their keys still cached -- every such turn starts a fresh thread and reads back."""
    ring_path = new_database(url, tmp_path)
    writers = Writers(tmp_path / "stop")
    writers.start(url=url, keyring=str(ring_path), tenant="acme", threads=["t0", "t1"],
                  mode=mode, max_age=1, burst=4, gap=LEASE_FENCE + 6)
    deletions = Deletions()
    deleted = 0
    try:
        writers.wait_for(4)
        deadline = time.monotonic() + 3 * (LEASE_FENCE + 6)
        while time.monotonic() < deadline:
            start = time.time()
            done = cli("prune", "--url", url, "--keyring", str(ring_path), "--active-grace",
                       "0s", "--json")
            deletions.add(None, start, time.time())
            assert done.returncode == 0, done.stdout + done.stderr
            deleted += len(json.loads(done.stdout)["deleted"])
            time.sleep(0.5)
        writers.wait_for(len(writers.ok()) + 8)   # a burst after the last prune
    finally:
        writers.finish()
    assert writers.failed() == []
    assert deleted >= 1, "the pruner never deleted a thread: the test proves nothing"
    later = protected(writers.ok(), deletions)
    assert later, "nothing was written after the last prune"
    assert check_readback(url, ring_path, {"acme": writers.ok()}, deletions) == len(later)
    scan_verify(url, ring_path)


def test_the_pruner_with_its_defaults_skips_a_thread_being_written(url: str,
                                                                   tmp_path: Path) -> None:
    ring_path = new_database(url, tmp_path)
    writers = Writers(tmp_path / "stop")
    writers.start(url=url, keyring=str(ring_path), tenant="acme", threads=["t0"],
                  mode="sync", max_age=1)
    try:
        writers.wait_for(4)
        time.sleep(1.5)                                   # every thread has expired
        done = cli("prune", "--url", url, "--keyring", str(ring_path), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["deleted"] == [] and report["skipped_active"], report
    finally:
        writers.finish()
    assert writers.failed() == []
    assert check_readback(url, ring_path, {"acme": writers.ok()}, Deletions()) == len(
        writers.ok())


# --- 1. key rotation beside writers with a keyring loaded before -----------------------------
def _rotate_killed(url: str, ring_path: Path, rng: random.Random) -> None:
    """`rotate-keys --reencrypt`, SIGKILLed at a random point (or finished before it)."""
    proc = subprocess.Popen([*CLI, "rotate-keys", "--url", url, "--keyring", str(ring_path),
                             "--reencrypt", "--batch-size", "5", "--format", "json"],
                            cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=rng.uniform(0.3, 2.5))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def rotate_beside_writers(url: str, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    ring_path = new_database(url, tmp_path)
    writers = Writers(tmp_path / "stop")
    for i, mode in enumerate(("sync", "async")):
        writers.start(url=url, keyring=str(ring_path), tenant=f"ten{i}",
                      threads=[f"t{j}" for j in range(4)], new_every=2, mode=mode)
    try:
        writers.wait_for(20)
        _rotate_killed(url, ring_path, rng)
        again = cli("rotate-keys", "--url", url, "--keyring", str(ring_path), "--reencrypt",
                    "--retire-old", "--format", "json")
        assert again.returncode in (0, 1), again.stdout + again.stderr   # 1: problems listed
        seen = len(writers.ok())
        writers.wait_for(seen + 20)    # the writers go on after the rotation
    finally:
        writers.finish()
    assert writers.failed() == []
    final = cli_here("rotate-keys", "--url", url, "--keyring", str(ring_path), "--reencrypt",
                     "--retire-old", "--format", "json")     # every writer has stopped
    assert final.returncode == 0, final.stdout + final.stderr
    report = json.loads(final.stdout)
    ring = Keyring.from_file(ring_path)
    assert ring.versions() == [ring.current_version]
    assert set(report["master_versions_in_use"]) == {ring.current_version}, report
    turns = {f"ten{i}": [t for t in writers.ok() if t.text.startswith(f"ten{i} ")]
             for i in range(2)}
    assert check_readback(url, ring_path, turns, Deletions()) == len(writers.ok())
    scan = scan_verify(url, ring_path)
    assert set(scan["master_versions_in_use"]) == {ring.current_version}


def test_rotation_killed_and_rerun_beside_writers_with_an_old_keyring(url: str,
                                                                      tmp_path: Path) -> None:
    """Writers that loaded the keyring before keep creating thread keys under the KEK they
    cached while `rotate-keys --reencrypt` is SIGKILLed and rerun with --retire-old: no key row
    is ever wrapped under a KEK the rotation deletes (checked in the inserting transaction),
    every turn reads back, the last --retire-old retires everything but the new version."""
    rotate_beside_writers(url, tmp_path, seed=39)
