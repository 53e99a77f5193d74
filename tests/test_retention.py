"""Retention with a controllable clock: TTLs, overrides, holds, dry runs, keep_latest,
complete deletion, receipts, crypto-shredding against a database backup."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage

from langgraph_securesaver import ConfigurationError, Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.retention import RetentionPolicy, parse_duration
from langgraph_securesaver.tenancy import inner_thread_id, tenant_scope
from tests.fake_agent import build_chat_graph

HOUR = 3600.0


def _cfg(thread: str, tenant: str = "acme") -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def _say(saver: SecureSaver, thread: str, text: str = "hello", tenant: str = "acme") -> None:
    build_chat_graph(saver).invoke({"messages": [HumanMessage(text)]}, _cfg(thread, tenant))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "agent.db"


@pytest.fixture
def saver(db: Path):
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate(), redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h")) as s:
        yield s


def _rows(db: Path, sql: str, *args) -> list:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def test_idle_ttl_deletes_only_after_expiry_and_completely(saver: SecureSaver, db: Path) -> None:
    _say(saver, "old")
    tup = saver.get_tuple(_cfg("old"))
    saver.put_writes(tup.config, [("messages", "pending")], "task-1")
    t0 = time.time()
    assert saver.prune_expired(now=t0 + 0.5 * HOUR).deleted == []
    report = saver.prune_expired(now=t0 + 2 * HOUR)
    assert report.deleted == [("acme", "old")] and report.ok
    inner = inner_thread_id("acme", "old")
    assert _rows(db, "SELECT count(*) FROM checkpoints WHERE thread_id = ?", inner) == [(0,)]
    assert _rows(db, "SELECT count(*) FROM writes WHERE thread_id = ?", inner) == [(0,)]
    assert _rows(db, "SELECT count(*) FROM securesaver_threads") == [(0,)]
    assert saver.get_tuple(_cfg("old")) is None
    (receipt,) = saver.receipts(tenant="acme", thread_id="old")
    assert receipt.action == "deleted" and receipt.reason == "retention:idle_ttl"
    assert receipt.detail["checkpoints"] >= 2 and receipt.requested_by.startswith("pruner:")
    assert "hello" not in str(receipt)  # receipts are content-free


def test_max_age_deletes_even_an_active_thread(db: Path) -> None:
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate(), redaction=None,
                              retention=RetentionPolicy(max_age="1d")) as saver:
        _say(saver, "t")
        report = saver.prune_expired(now=time.time() + 2 * 86400)
        assert report.deleted == [("acme", "t")]
        assert saver.receipts()[0].reason == "retention:max_age"


def test_per_thread_override_and_legal_hold(saver: SecureSaver) -> None:
    for t in ("plain", "longer", "held"):
        _say(saver, t)
    with tenant_scope("acme"):
        assert saver.set_retention("longer", idle_ttl="10d").expires_at > time.time() + 9 * 86400
        assert saver.set_retention("held", legal_hold=True).expires_at is None
    report = saver.prune_expired(now=time.time() + 2 * HOUR)
    assert report.deleted == [("acme", "plain")]
    assert report.held == [("acme", "held")]
    assert saver.get_tuple(_cfg("longer")) is not None
    assert saver.get_tuple(_cfg("held")) is not None
    with tenant_scope("acme"):
        saver.set_retention("held", legal_hold=False)
    assert saver.prune_expired(now=time.time() + 2 * HOUR).deleted == [("acme", "held")]


def test_tenant_hold_and_tenant_policy(saver: SecureSaver) -> None:
    _say(saver, "a", tenant="acme")
    _say(saver, "g", tenant="globex")
    saver.set_tenant_retention("globex", RetentionPolicy(legal_hold=True))
    report = saver.prune_expired(now=time.time() + 2 * HOUR)
    assert report.deleted == [("acme", "a")]
    assert saver.get_tuple(_cfg("g", "globex")) is not None
    saver.set_tenant_retention("globex", None)  # back to the default policy
    assert saver.prune_expired(now=time.time() + 2 * HOUR).deleted == [("globex", "g")]


def test_dry_run_deletes_nothing(saver: SecureSaver) -> None:
    _say(saver, "t")
    report = saver.prune_expired(now=time.time() + 2 * HOUR, dry_run=True)
    assert report.would_delete == [("acme", "t")] and report.deleted == []
    assert saver.get_tuple(_cfg("t")) is not None
    assert saver.receipts() == []


def test_limit_and_tenant_filter(saver: SecureSaver) -> None:
    for i in range(5):
        _say(saver, f"t{i}")
    _say(saver, "g", tenant="globex")
    later = time.time() + 2 * HOUR
    assert len(saver.prune_expired(now=later, limit=2).deleted) == 2
    assert saver.prune_expired(now=later, tenant="globex").deleted == [("globex", "g")]
    assert len(saver.prune_expired(now=later).deleted) == 3


def test_keep_latest_leaves_a_thread_the_graph_continues(db: Path) -> None:
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate(), redaction=None,
                              retention=RetentionPolicy(idle_ttl="1h",
                                                        strategy="keep_latest")) as saver:
        for text in ("one", "two", "three"):
            _say(saver, "t", text)
        assert len(list(saver.list(_cfg("t")))) > 3
        report = saver.prune_expired(now=time.time() + 2 * HOUR)
        assert report.pruned_to_latest == [("acme", "t")]
        assert len(list(saver.list(_cfg("t")))) == 1
        assert saver.prune_expired(now=time.time() + 2 * HOUR).pruned_to_latest == []
        graph = build_chat_graph(saver)
        result = graph.invoke({"messages": [HumanMessage("four")]}, _cfg("t"))
        assert [m.content for m in result["messages"] if m.type == "human"] == [
            "one", "two", "three", "four"]
        assert saver.receipts()[0].action == "pruned"


def test_thread_written_a_moment_ago_survives(saver: SecureSaver, db: Path) -> None:
    """The registry lags (activity updates are coalesced); the sweep re-checks storage."""
    _say(saver, "t")
    # the registry heard of it 3 hours ago (re-registered through the API: a raw edit of the
    # row would no longer verify, and the pruner would refuse it)
    saver.registry.forget_thread("acme", "t")
    saver.registry.touch_thread("acme", "t", now=time.time() - 3 * HOUR,
                                policy=saver.services.policy_for("acme"))
    assert saver.registry.get_thread("acme", "t").expires_at < time.time()
    report = saver.prune_expired(now=time.time() + 0.5 * HOUR)
    assert report.survived == [("acme", "t")] and report.deleted == []
    assert saver.registry.get_thread("acme", "t").expires_at > time.time() + 0.5 * HOUR


def test_a_thread_with_a_run_in_flight_is_skipped(db: Path) -> None:
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate(), redaction=None,
                              retention=RetentionPolicy(max_age=1)) as saver:
        _say(saver, "busy")
        report = saver.prune_expired(now=time.time() + 5, active_grace=120)
        assert report.skipped_active == [("acme", "busy")] and report.deleted == []


def test_delete_thread_and_prune_leave_receipts(saver: SecureSaver) -> None:
    for t in ("a", "b"):
        _say(saver, t)
    with tenant_scope("acme"):
        saver.delete_thread("a")
        saver.prune(["b"], strategy="delete")
    got = {(r.thread_id, r.action, r.reason, r.requested_by) for r in saver.receipts()}
    assert got == {("a", "deleted", "delete_thread", "acme"), ("b", "deleted", "prune", "acme")}
    assert saver.registry.list_threads() == []


@pytest.mark.parametrize("bad", ["", "ten minutes", "-5m", "0", "1 year", "3x", True, [1]])
def test_malformed_durations_are_rejected(bad) -> None:
    with pytest.raises(ConfigurationError):
        parse_duration(bad)


def test_policy_and_override_input_errors(saver: SecureSaver) -> None:
    assert parse_duration("90s") == 90 and parse_duration("2w") == 14 * 86400
    assert parse_duration("1y") == 365 * 86400
    with pytest.raises(ConfigurationError):
        RetentionPolicy(strategy="shred")
    with tenant_scope("acme"), pytest.raises(LookupError):
        saver.set_retention("no-such-thread", idle_ttl="1h")
    with tenant_scope("acme"), pytest.raises(ConfigurationError):
        saver.set_retention("x")


def test_shredding_makes_a_database_backup_unreadable_for_that_tenant_only(tmp_path: Path) -> None:
    ring_path = tmp_path / "keyring.json"
    Keyring.generate().save(ring_path)
    live, backup = tmp_path / "live.db", tmp_path / "backup.db"
    with SecureSaver.from_url(f"sqlite:///{live}", keyring=Keyring.from_file(ring_path),
                              redaction=None) as saver:
        _say(saver, "t", "acme secret", tenant="acme")
        _say(saver, "t", "globex data", tenant="globex")
    for f in tmp_path.glob("live.db*"):
        shutil.copy(f, backup.with_name(f.name.replace("live", "backup")))
    with SecureSaver.from_url(f"sqlite:///{live}", keyring=Keyring.from_file(ring_path),
                              redaction=None) as saver:
        assert saver.shred_tenant("acme", requested_by="dpo@example.com") == 1
        assert saver.get_tuple(_cfg("t", "acme")) is None
        assert [r.action for r in saver.receipts(tenant="acme")] == ["shredded"]
        assert saver.get_tuple(_cfg("t", "globex")) is not None
    after = Keyring.from_file(ring_path)
    with SecureSaver.from_url(f"sqlite:///{backup}", keyring=after, redaction=None) as old:
        with pytest.raises(TamperedDataError):
            old.get_tuple(_cfg("t", "acme"))
        tup = old.get_tuple(_cfg("t", "globex"))
        assert "globex data" in [m.content for m in tup.checkpoint["channel_values"]["messages"]]
    # the backup still holds acme's ciphertext, but nothing can open it any more
    assert _rows(backup, "SELECT count(*) FROM securesaver_tenant_keys WHERE tenant = 'acme'") != [(0,)]


def test_shredding_needs_a_keyring_file(saver: SecureSaver) -> None:
    _say(saver, "t")
    with pytest.raises(ConfigurationError, match="from_file"):
        saver.shred_tenant("acme")
    assert saver.get_tuple(_cfg("t")) is not None


def test_deletion_removes_idempotency_records_and_counts_them(saver: SecureSaver) -> None:
    from langgraph_securesaver.idempotency import IdempotencyStore, KeyScope
    _say(saver, "t")
    _say(saver, "keep")
    store = IdempotencyStore.for_saver(saver)
    for thread in ("t", "keep"):
        scope = KeyScope("acme", thread, f"key-{thread}", "tool", "send_email")
        assert store.execute(scope, lambda claim: "sent").value == "sent"
    with tenant_scope("acme"):
        saver.delete_thread("t")
    assert [r.thread_id for r in store.list_records("acme")] == ["keep"]
    assert saver.receipts(thread_id="t")[0].detail["idempotency_records"] == 1


def _vault_entry(token: str, kind: str, value: str):
    from langgraph_securesaver.redaction import VaultEntry
    return VaultEntry(token, kind, value)


def _remember(saver: SecureSaver, keys: Any, thread: str, entries: list[Any]) -> list[str]:
    """What a redacted write does: create the vault entries, then record the thread's refs.
    Returns the entries' public tokens (what the conversation holds)."""
    resolved = list(saver.vault.resolve(keys, entries).values())
    saver.vault.store(keys, thread, resolved)
    return [e.token for e in resolved]


@pytest.mark.parametrize("layout", ["shared database", "registry elsewhere"])
def test_a_batch_deletes_companion_records_and_counts_them_per_thread(tmp_path: Path,
                                                                      layout: str) -> None:
    """The pruner's batch path (one transaction on a shared database, or storage first then
    one registry transaction when the registry is elsewhere) removes PII originals no
    remaining thread uses and idempotency records, and counts them in each receipt."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from langgraph_securesaver.idempotency import IdempotencyStore, KeyScope
    from langgraph_securesaver.ops.pruner import shares_database

    db = tmp_path / "agent.db"
    if layout == "shared database":
        ctx = SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate(),
                                   redaction=None, retention=RetentionPolicy(idle_ttl="1h"))
    else:
        conn = sqlite3.connect(db, check_same_thread=False)
        apart = SecureSaver(SqliteSaver(conn), keyring=Keyring.generate(), redaction=None,
                            retention=RetentionPolicy(idle_ttl="1h"),
                            registry=f"sqlite:///{tmp_path / 'registry.db'}")
        apart.setup()
        ctx = contextlib.nullcontext(apart)
    with ctx as saver:
        for t in ("a", "b", "c", "keep"):
            _say(saver, t)
        keys = saver.keys.keys_for("acme", create=True)
        shared, only_a, kept = "<EMAIL_ADDRESS:1>", "<PHONE_NUMBER:2>", "<EMAIL_ADDRESS:3>"
        _remember(saver, keys, "a", [_vault_entry(shared, "EMAIL_ADDRESS", "x@example.com"),
                                     _vault_entry(only_a, "PHONE_NUMBER", "+1 415 555 0101")])
        _remember(saver, keys, "b", [_vault_entry(shared, "EMAIL_ADDRESS", "x@example.com")])
        [kept_public] = _remember(saver, keys, "keep",
                                  [_vault_entry(kept, "EMAIL_ADDRESS", "k@example.com")])
        store = IdempotencyStore.for_saver(saver)
        for thread, n in (("a", 2), ("b", 1), ("keep", 1)):
            for k in range(n):
                store.execute(KeyScope("acme", thread, f"{thread}-{k}", "tool", "send"),
                              lambda claim: "sent")
        with tenant_scope("acme"):
            saver.set_retention("keep", idle_ttl="30d")
        assert shares_database(saver) is (layout == "shared database")
        from langgraph_securesaver.registry.pii_vault import pii_epoch

        def epoch() -> int:
            with saver.registry.begin() as c:
                return int(c.execute(sa.select(pii_epoch.c.epoch).where(
                    pii_epoch.c.tenant == "acme")).scalar() or 0)
        before = epoch()
        report = saver.prune_expired(now=time.time() + 2 * HOUR)
        assert epoch() > before   # the erasure is announced to other processes' caches
        assert sorted(report.deleted) == [("acme", "a"), ("acme", "b"), ("acme", "c")]
        got = {r.thread_id: r.detail for r in saver.receipts()}
        assert {t: (d["pii_values"], d["idempotency_records"]) for t, d in got.items()} == {
            "a": (2, 2), "b": (0, 1), "c": (0, 0)}   # the shared value counted once, on a
        assert all(d["checkpoints"] >= 2 for d in got.values())
        assert saver.pii_inventory("acme") == {("acme", "keep"): {"EMAIL_ADDRESS": 1}}
        assert [r.thread_id for r in store.list_records("acme")] == ["keep"]
        assert {t.thread_id for t in saver.registry.list_threads()} == {"keep"}
        assert _rows(db, "SELECT count(*) FROM checkpoints WHERE thread_id NOT LIKE ?",
                     "%:keep") == [(0,)]
        assert _rows(db, "SELECT count(*) FROM writes WHERE thread_id NOT LIKE ?",
                     "%:keep") == [(0,)]
        # the vault's process cache forgot the deleted threads: a new thread "a" stores again
        again = _vault_entry(only_a, "PHONE_NUMBER", "+1 415 555 0101")
        assert saver.vault.unknown("acme", "a", [again]) == [again]
        assert saver.vault.unknown("acme", "keep", [_vault_entry(kept_public, "", "")]) == []


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_batch_re_check_reads_each_threads_latest_checkpoint(tmp_path: Path, backend: str,
                                                             request) -> None:
    """The pruner's one-query re-check returns, per thread, what get_tuple's latest root
    checkpoint says (None for a thread with nothing stored)."""
    if backend == "postgres":
        from tests.conftest import require_postgres
        require_postgres()
        url = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path / 'agent.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        for t, turns in (("a", 1), ("b", 3)):
            for n in range(turns):
                _say(saver, t, f"turn {n}")
        ids = [inner_thread_id("acme", t) for t in ("a", "b", "nothing")]
        got = saver.services.storage.latest_checkpoint_times(ids)
        from langgraph_securesaver.ops.threads import latest_checkpoint_time
        from langgraph_securesaver.tenancy import ThreadRef
        want = {inner_thread_id("acme", t): latest_checkpoint_time(saver.services,
                                                                   ThreadRef("acme", t))
                for t in ("a", "b", "nothing")}
    assert got == want
    assert got[ids[0]] is not None and got[ids[1]] > got[ids[0]] and got[ids[2]] is None
