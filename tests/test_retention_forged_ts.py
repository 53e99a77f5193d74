"""The pruner and a checkpoint ``ts`` it did not authenticate.

The pruner decides on the registry's MACed ``last_activity`` + TTLs, then reads the latest
root checkpoint's ``ts`` to see whether the thread was written since the registry last heard
of it (it then survives and the registry is touched with that ts) or is in use right now
(``active_grace``: skipped). That ts is in the inner saver's own row; a writer with database
access can set it to "now" every day, or to the far future, to keep a thread past its
retention -- and, through the registry touch, launder the forged value into the MACed
``last_activity``. The ts is covered by SecureSaver's seal, so the pruner believes a ts that
would save a thread only after reading that checkpoint as ``get_tuple`` does:

* a ts that does not authenticate (row edited, row copied from another thread) is reported in
  ``errors`` with the TamperedDataError naming the row, the thread kept for a person to look
  at (nothing deleted, the registry untouched), and ``delete_thread`` still deletes it;
* a genuine recent write still keeps its thread;
* an authenticated ts in the future (another machine's clock) is clamped to the sweep's
  ``now``: it keeps the thread, and never moves ``last_activity`` past ``now``.

SQLite and PostgreSQL (real databases, rows edited with raw SQL), sync and async-only inner
savers, and InMemorySaver; the batched path (strategy ``delete``) and the per-thread path
(``keep_latest`` threads, and every thread of a batch with an unreadable row).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_securesaver import Keyring, RetentionPolicy, SecureSaver, tenant_scope
from langgraph_securesaver.tenancy import inner_thread_id

from .boundary_helpers import Raw, inner_id
from .conftest import Seeds

HOUR = 3600.0
LATER = 2 * HOUR  # past the 1 h idle TTL
YEAR = 365 * 24 * HOUR
MANIFEST = "differs from its sealed manifest in ['ts']"


def _conf(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme", "checkpoint_ns": ""}}


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Raw]:
    if request.param == "sqlite":
        db = tmp_path / "r.db"
        return f"sqlite:///{db}", Raw("sqlite", db)
    url = request.getfixturevalue("pg_url")
    return url, Raw("postgres", url)


def _open(url: str, ring: Keyring, **options: Any) -> Any:
    return SecureSaver.from_url(url, keyring=ring, redaction=None, **options)


def _write(saver: SecureSaver, thread: str, ts: float | None = None, turns: int = 2) -> None:
    """``turns`` checkpoints through the saver (genuine, sealed); the last one's ts is ``ts``
    when given (what LangGraph stores is the writer's clock)."""
    config: Any = _conf(thread)
    for n in range(turns):
        checkpoint = empty_checkpoint()
        if ts is not None and n == turns - 1:
            checkpoint["ts"] = _iso(ts)
        config = saver.put(config, checkpoint, {"step": n}, {})


def _expiring(url: str, ring: Keyring, strategy: str = "delete",
              policy: RetentionPolicy | None = None) -> None:
    """``bad`` and ``good``, two checkpoints each, expiring after an idle hour."""
    policy = policy or RetentionPolicy(idle_ttl="1h", strategy=strategy)
    with _open(url, ring, retention=policy) as saver:
        for thread in ("bad", "good"):
            _write(saver, thread)


def _seeded(seeds: Seeds, database: tuple[str, Raw], strategy: str = "delete",
            policy: RetentionPolicy | None = None) -> Keyring:
    """A copy of ``_expiring``'s threads, written once per module, backend and policy (each
    test forges its own copy); their keyring."""
    url, raw = database

    def seed(seed_url: str) -> Keyring:
        ring = Keyring.generate()
        _expiring(seed_url, ring, strategy, policy)
        return ring
    return seeds.copy((raw.backend, strategy, repr(policy)), seed, url)


def _forge_ts(raw: Raw, thread: str, ts: float) -> str:
    """Set the ts of the thread's latest checkpoint in its stored document; its id."""
    cid = raw.latest(thread)
    body = raw.body(thread, cid)
    body["ts"] = _iso(ts)
    raw.set_body(thread, cid, body)
    return cid


def _stored(raw: Raw, thread: str) -> int:
    ((n,),) = raw.rows("SELECT count(*) FROM checkpoints WHERE thread_id = ?", inner_id(thread))
    return int(n)


def _activity(saver: SecureSaver, thread: str) -> tuple[float, float | None]:
    row = saver.registry.get_thread("acme", thread)
    assert row is not None
    return row.last_activity, row.expires_at


def _check_refused(report: Any, cid: str, thread: str = "bad") -> None:
    """``thread`` reported (TamperedDataError naming its latest checkpoint), nothing else."""
    mine = [(t, th, e) for t, th, e in report.errors if th == thread]
    assert len(mine) == 1, report
    ((tenant, _thread, error),) = mine
    assert tenant == "acme"
    assert error.startswith(f"TamperedDataError: checkpoint '{cid}' of tenant 'acme' thread "
                            f"'{thread}'"), error
    assert "retention kept the expired thread for a person to look at" in error, error
    key = ("acme", thread)
    assert key not in report.survived and key not in report.skipped_active, report
    assert key not in report.deleted and key not in report.pruned_to_latest, report


# ---------------------------------------------------------------------------------------------
# a forged ts on an expired thread's latest checkpoint
# ---------------------------------------------------------------------------------------------
FORGERIES = {"now_every_day": -30.0, "far_future": 10 * YEAR}


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_ts_is_reported_and_never_touches_the_registry(
        database, db_seeds: Seeds, forgery: str, strategy: str) -> None:
    """``delete``: the batched re-check; ``keep_latest``: the per-thread path."""
    url, raw = database
    ring = _seeded(db_seeds, database, strategy)
    now = time.time() + LATER
    cid = _forge_ts(raw, "bad", now + FORGERIES[forgery])
    with _open(url, ring) as saver:
        before = _activity(saver, "bad")
        report = saver.prune_expired(now=now)
        _check_refused(report, cid)
        assert MANIFEST in report.errors[0][2]
        # the forged value is not laundered into the MACed last activity
        assert _activity(saver, "bad") == before
        assert before[0] < now - HOUR
        if strategy == "delete":
            assert report.deleted == [("acme", "good")]
        else:
            assert report.pruned_to_latest == [("acme", "good")]
        assert _stored(raw, "bad") == 2
        assert not saver.receipts(tenant="acme", thread_id="bad")
        # the claim is kept: the same sweep time does not pick the thread up again
        assert saver.prune_expired(now=now).errors == []
        # the person the report points to deletes it
        with tenant_scope("acme"):
            saver.delete_thread("bad")
        (receipt,) = saver.receipts(tenant="acme", thread_id="bad")
        assert receipt.action == "deleted" and receipt.detail["checkpoints"] == 2
    assert _stored(raw, "bad") == 0


def test_a_forged_ts_beside_an_unparsable_row_is_reported_on_the_per_thread_path(
        database, db_seeds: Seeds) -> None:
    """A batch-mate's unreadable row sends the batch thread by thread (``_process``): the
    forged ts is refused there too, and each thread is named once."""
    url, raw = database
    ring = _seeded(db_seeds, database)
    with _open(url, ring) as saver:
        _write(saver, "broken")
    now = time.time() + LATER
    cid = _forge_ts(raw, "bad", now - 30)
    if raw.backend == "sqlite":
        garbage: Any = b"\xc1 not msgpack"
        sql = "UPDATE checkpoints SET checkpoint = ? WHERE thread_id = ?"
    else:
        garbage = '"not a checkpoint"'
        sql = "UPDATE checkpoints SET checkpoint = ?::jsonb WHERE thread_id = ?"
    assert raw.run(sql, garbage, inner_id("broken")) == 2
    with _open(url, ring) as saver:
        before = _activity(saver, "bad")
        report = saver.prune_expired(now=now)
        assert _activity(saver, "bad") == before
    _check_refused(report, cid)
    assert sorted(th for _t, th, _e in report.errors) == ["bad", "broken"], report.errors
    assert report.deleted == [("acme", "good")] and _stored(raw, "bad") == 2


def test_active_grace_believes_only_an_authenticated_ts(database, db_seeds: Seeds) -> None:
    """A thread past its max age, whose forged ts says it was written 10 s ago: not skipped as
    "a run in flight" (default grace), reported."""
    url, raw = database
    ring = _seeded(db_seeds, database, policy=RetentionPolicy(max_age="1h"))
    now = time.time() + LATER
    cid = _forge_ts(raw, "bad", now - 10)
    with _open(url, ring) as saver:
        report = saver.prune_expired(now=now)
    _check_refused(report, cid)
    assert report.deleted == [("acme", "good")] and report.skipped_active == []
    assert _stored(raw, "bad") == 2


def _copy_row(raw: Raw, source: str, target: str) -> str:
    """Insert the source thread's latest checkpoint row into the target thread (it sorts
    newest there: checkpoint ids are time-ordered and the source was written later)."""
    cid = raw.latest(source)
    assert raw.run(
        "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
        "type, checkpoint, metadata) SELECT ?, checkpoint_ns, checkpoint_id, "
        "parent_checkpoint_id, type, checkpoint, metadata FROM checkpoints WHERE thread_id = ? "
        "AND checkpoint_id = ?", inner_id(target), inner_id(source), cid) == 1
    assert raw.latest(target) == cid
    return cid


def _copy_ts(raw: Raw, source: str, target: str) -> str:
    """Copy only the ts of the source's latest checkpoint into the target's latest body."""
    ts = raw.body(source, raw.latest(source))["ts"]
    cid = raw.latest(target)
    body = raw.body(target, cid)
    body["ts"] = ts
    raw.set_body(target, cid, body)
    return cid


COPIES = {"whole_row": _copy_row, "ts_only": _copy_ts}


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_a_checkpoint_of_another_thread_does_not_keep_a_thread(database, db_seeds: Seeds,
                                                               copy: str) -> None:
    """``fresh`` was genuinely written a minute before the sweep; its row (sealed under
    ``fresh``), or just its ts, is copied onto expired ``bad``: ``fresh`` survives, ``bad``
    is reported."""
    url, raw = database
    ring = _seeded(db_seeds, database)
    now = time.time() + LATER
    with _open(url, ring) as saver:
        _write(saver, "fresh", ts=now - 60)
    cid = COPIES[copy](raw, "fresh", "bad")
    with _open(url, ring) as saver:
        before = _activity(saver, "bad")
        report = saver.prune_expired(now=now)
        _check_refused(report, cid)
        assert _activity(saver, "bad") == before
        assert report.survived == [("acme", "fresh")], report
        assert report.deleted == [("acme", "good")], report
        assert _activity(saver, "fresh")[0] == pytest.approx(now - 60, abs=1e-3)


# ---------------------------------------------------------------------------------------------
# authenticated times: a recent write keeps its thread, a future one is clamped
# ---------------------------------------------------------------------------------------------
def test_a_genuine_recent_write_keeps_its_thread(database) -> None:
    """Default settings: the registry heard of the thread at its first write; its latest
    checkpoint (sealed by the saver) was written a minute before the sweep. (No gap here: this
    is what the authentication must not break.)"""
    url, _raw = database
    ring = Keyring.generate()
    now = time.time() + LATER
    with _open(url, ring, retention=RetentionPolicy(idle_ttl="1h")) as saver:
        _write(saver, "busy", ts=now - 60)
        _write(saver, "idle")
    with _open(url, ring) as saver:
        report = saver.prune_expired(now=now)
        assert report.errors == [] and report.survived == [("acme", "busy")]
        assert report.deleted == [("acme", "idle")]
        last, expires = _activity(saver, "busy")
        assert last == pytest.approx(now - 60, abs=1e-3) and expires is not None
        assert expires == pytest.approx(now - 60 + HOUR, abs=1e-3)


@pytest.mark.parametrize("policy", ["idle_ttl", "max_age"])
def test_a_future_authenticated_ts_is_clamped_to_now(database, policy: str) -> None:
    """A writer whose clock is a minute fast (its checkpoint is sealed, so genuine): the thread
    is kept as written now; ``last_activity`` never moves past the sweep's ``now``.
    ``max_age``: skipped as active; the clamp neither deletes it nor touches the registry."""
    url, _raw = database
    ring = Keyring.generate()
    now = time.time() + LATER
    retention = RetentionPolicy(**{policy: "1h"})
    with _open(url, ring, retention=retention) as saver:
        _write(saver, "skewed", ts=now + 60)
    with _open(url, ring) as saver:
        before = _activity(saver, "skewed")
        report = saver.prune_expired(now=now)
        assert report.errors == [] and report.deleted == []
        last, expires = _activity(saver, "skewed")
        if policy == "idle_ttl":
            assert report.survived == [("acme", "skewed")]
            assert last == now and expires == now + HOUR  # not a minute past now
        else:  # no idle TTL to extend: written "now", so skipped for the grace period
            assert report.skipped_active == [("acme", "skewed")]
            assert (last, expires) == before


@pytest.mark.parametrize("policy", ["idle_ttl", "max_age"])
def test_a_far_future_authenticated_ts_does_not_keep_a_thread(database, policy: str) -> None:
    """A key holder's own ts ten years ahead (sealed, genuine). Counted as "written now" it
    would keep the idle thread at every sweep for ten years (each sweep touching the registry
    again): no clock is that far off, so it is no evidence of a write, and the thread is
    deleted on its first sweep past its retention, with its receipt."""
    url, _raw = database
    ring = Keyring.generate()
    now = time.time() + LATER
    with _open(url, ring, retention=RetentionPolicy(**{policy: "1h"})) as saver:
        _write(saver, "skewed", ts=now + 10 * YEAR)
        _write(saver, "plain")
    with _open(url, ring) as saver:
        report = saver.prune_expired(now=now)
        assert report.errors == [] and report.survived == [] and report.skipped_active == []
        assert sorted(report.deleted) == [("acme", "plain"), ("acme", "skewed")]
        assert saver.registry.get_thread("acme", "skewed") is None
        (receipt,) = saver.receipts(tenant="acme", thread_id="skewed")
        assert receipt.action == "deleted"


# ---------------------------------------------------------------------------------------------
# async-only inner savers (AsyncSqliteSaver, AsyncPostgresSaver) and InMemorySaver
# ---------------------------------------------------------------------------------------------
def test_aprune_expired_reports_a_forged_ts(database, db_seeds: Seeds) -> None:
    url, raw = database
    ring = _seeded(db_seeds, database)
    now = time.time() + LATER
    cid = _forge_ts(raw, "bad", now - 30)

    async def sweep() -> tuple[Any, Any, Any]:
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as asaver:
            before = _activity(asaver, "bad")
            report = await asaver.aprune_expired(now=now)
            return report, before, _activity(asaver, "bad")
    report, before, after = asyncio.run(sweep())
    _check_refused(report, cid)
    assert MANIFEST in report.errors[0][2] and after == before
    assert report.deleted == [("acme", "good")] and _stored(raw, "bad") == 2


def _forge_memory_ts(inner: InMemorySaver, thread: str, ts: float) -> str:
    by_id = inner.storage[inner_thread_id("acme", thread)][""]
    cid = max(by_id)
    checkpoint, metadata, parent = by_id[cid]
    body = inner.serde.loads_typed(checkpoint)
    body["ts"] = _iso(ts)
    by_id[cid] = (inner.serde.dumps_typed(body), metadata, parent)
    return cid


@pytest.mark.parametrize("api", ["sync", "async"])
def test_in_memory_saver_reports_a_forged_ts(api: str) -> None:
    inner = InMemorySaver()
    saver = SecureSaver(inner, keyring=Keyring.generate(), redaction=None,
                        retention=RetentionPolicy(idle_ttl="1h"))
    saver.setup()
    now = time.time() + LATER
    for thread in ("bad", "good"):
        _write(saver, thread)
    _write(saver, "busy", ts=now - 60)
    cid = _forge_memory_ts(inner, "bad", now - 30)
    before = _activity(saver, "bad")
    if api == "sync":
        report = saver.prune_expired(now=now)
    else:
        report = asyncio.run(saver.aprune_expired(now=now))
    _check_refused(report, cid)
    assert MANIFEST in report.errors[0][2] and _activity(saver, "bad") == before
    assert report.deleted == [("acme", "good")] and report.survived == [("acme", "busy")]
