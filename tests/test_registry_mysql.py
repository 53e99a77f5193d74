"""The registry on MariaDB, the database a MySQL deployment already runs: its tables beside
LangGraph's MySQL saver in one database, attacked and raced the way they are on SQLite and
PostgreSQL. (The chat graph, deletion, retention, copy, conformance and the CLI on this
deployment are in tests/test_thirdparty.py and tests/test_thirdparty_cli.py; the
idempotency race and the key-lifecycle stress in their own files, on MariaDB too.)"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.mysql.pymysql import PyMySQLSaver

from langgraph_securesaver import (
    ConfigurationError,
    Keyring,
    RetentionPolicy,
    SecureSaver,
    TamperedDataError,
)
from langgraph_securesaver.registry.core import Registry
from langgraph_securesaver.registry.schema import normalize_url

from .test_thirdparty import run_chat


@pytest.fixture
def db(mariadb: Any) -> str:
    return str(mariadb.new_database())


@pytest.fixture
def deployment(db: str) -> Iterator[tuple[Any, str]]:
    """LangGraph's MySQL saver and the registry in one MariaDB database."""
    with PyMySQLSaver.from_conn_string(db) as inner:
        inner.setup()
        yield inner, db


def _sql(url: str, statement: str, **params: Any) -> list[Any]:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(statement), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


async def test_tenants_differing_in_case_stay_apart(deployment: tuple[Any, str]) -> None:
    """MySQL's default collations compare ``Acme``, ``acme`` and ``ACME`` as equal: the
    registry's keys, rows and vault would be shared between three tenants."""
    _inner, url = deployment
    ring = Keyring.generate()
    stack = contextlib.ExitStack()
    savers = {t: SecureSaver(stack.enter_context(PyMySQLSaver.from_conn_string(url)),
                             keyring=ring, registry=url, redaction=None, default_tenant=t)
              for t in ("acme", "Acme", "ACME")}
    for saver in savers.values():
        saver.setup()
        await run_chat(saver, False, "t1")
    first = savers["acme"].registry
    assert set(first.tenants()) >= {"acme", "Acme", "ACME"}
    keys = _sql(url, "SELECT tenant FROM securesaver_thread_keys WHERE thread_id = 't1'")
    assert sorted(r[0] for r in keys) == sorted(["acme", "Acme", "ACME"])
    # each reads its own thread; deleting one tenant's thread leaves the others readable
    cfg = {"configurable": {"thread_id": "t1"}}
    for saver in savers.values():
        assert saver.get_tuple(cfg) is not None
    savers["Acme"].delete_thread("t1")
    assert savers["Acme"].get_tuple(cfg) is None
    assert savers["acme"].get_tuple(cfg) is not None
    assert savers["ACME"].get_tuple(cfg) is not None
    stack.close()


def test_registry_timestamps_keep_their_precision(db: str) -> None:
    """A FLOAT column would round an epoch to minutes: every MAC over a time would fail."""
    registry = Registry(db)
    registry.attach_keys(Keyring.generate())
    registry.setup()
    at = 1_765_000_000.123456
    registry.touch_thread("acme", "t1", now=at, policy=RetentionPolicy(idle_ttl=60))
    row = registry.get_thread("acme", "t1")
    assert row is not None and row.last_activity == at and row.expires_at == at + 60
    assert registry.verified_expiry(row) == at + 60
    registry.dispose()


def test_two_pruners_claim_disjoint_sets(db: str) -> None:
    """Claims are taken with SKIP LOCKED: pruners on two machines never take one thread."""
    ring = Keyring.generate()
    setup = Registry(db)
    setup.attach_keys(ring)
    setup.setup()
    for i in range(60):
        setup.touch_thread("acme", f"t{i}", now=1000.0, policy=RetentionPolicy(idle_ttl=1))
    registries = [Registry(db) for _ in range(4)]
    claimed: list[list[str]] = [[] for _ in registries]
    start = threading.Barrier(len(registries))

    def prune(i: int) -> None:
        registries[i].attach_keys(ring)
        start.wait()
        while rows := registries[i].claim_expired(now=time.time(), owner=f"p{i}", lease=60,
                                                  limit=7):
            claimed[i].extend(r.thread_id for r in rows)

    workers = [threading.Thread(target=prune, args=(i,)) for i in range(len(registries))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    every = [t for c in claimed for t in c]
    assert sorted(every) == sorted(f"t{i}" for i in range(60))   # each claimed exactly once
    owners = _sql(db, "SELECT DISTINCT claim_owner FROM securesaver_threads")
    assert {o[0] for o in owners} <= {f"p{i}" for i in range(4)}
    for r in (setup, *registries):
        r.dispose()


async def test_a_forged_hold_removal_in_mariadb_is_not_obeyed(deployment: tuple[Any, str]
                                                              ) -> None:
    inner, url = deployment
    saver = SecureSaver(inner, keyring=Keyring.generate(), registry=url, redaction=None,
                        default_tenant="acme")
    saver.setup()
    await run_chat(saver, False, "held")
    saver.set_retention("held", legal_hold=True)
    # a database writer lifts the hold and makes the thread due
    _sql(url, "UPDATE securesaver_threads SET legal_hold = 0, idle_ttl = 1, "
              "expires_at = 1 WHERE thread_id = 'held'")
    report = saver.prune_expired(now=time.time() + 7200, active_grace=0)
    assert any(t == "held" and "TamperedDataError" in e for _, t, e in report.errors)
    assert saver.get_tuple({"configurable": {"thread_id": "held"}}) is not None
    with pytest.raises(TamperedDataError, match="securesaver_threads"):
        saver.set_retention("held", legal_hold=False)


def test_receipts_and_events_chain_across_processes(db: str) -> None:
    """Two registries (two processes' worth of connections) append to one tenant's chains at
    once; the chains verify, with every row in them."""
    ring = Keyring.generate()
    registries = [Registry(db) for _ in range(3)]
    for r in registries:
        r.attach_keys(ring)
        r.setup()
    start = threading.Barrier(len(registries))

    def append(i: int) -> None:
        start.wait()
        for n in range(15):
            registries[i].add_receipt(tenant="acme", thread_id=f"t{i}-{n}", action="deleted",
                                      reason="test")

    workers = [threading.Thread(target=append, args=(i,)) for i in range(len(registries))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert len(registries[0].list_receipts(tenant="acme")) == 45
    assert registries[0].verify_integrity().ok
    for r in registries:
        r.dispose()


def test_a_thread_id_too_long_for_mysql_is_refused_and_nothing_is_stored(db: str) -> None:
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), registry=db,
                        redaction=None, default_tenant="acme")
    saver.setup()
    from langgraph.checkpoint.base import empty_checkpoint
    cfg = {"configurable": {"thread_id": "x" * 300, "checkpoint_ns": ""}}
    with pytest.raises((ConfigurationError, sa.exc.DataError)):
        saver.put(cfg, empty_checkpoint(), {}, {})
    assert saver.get_tuple(cfg) is None


def test_an_unsupported_database_is_refused_before_anything_is_created() -> None:
    with pytest.raises(ConfigurationError, match="SQLite, PostgreSQL or MySQL"):
        Registry("oracle://nobody@nowhere/db")


async def test_from_url_and_afrom_url_open_langgraphs_mysql_savers(db: str) -> None:
    """``mysql://`` in from_url: PyMySQLSaver (afrom_url: asyncmy's AsyncMySaver) with the
    registry in the same database; what one writes the other reads, nothing in clear."""
    from .thirdparty_savers import _mysql_rows
    ring = Keyring.generate()
    with SecureSaver.from_url(db, keyring=ring, redaction=None,
                              default_tenant="acme") as saver:
        assert type(saver.inner).__name__ == "PyMySQLSaver"
        written = await run_chat(saver, False, "t1")
    async with SecureSaver.afrom_url(db, keyring=ring, redaction=None,
                                     default_tenant="acme") as asaver:
        assert type(asaver.inner).__name__ == "AsyncMySaver"
        got = await asaver.aget_tuple({"configurable": {"thread_id": "t1"}})
        assert got is not None
        assert tuple(got.checkpoint["channel_values"]["messages"]) == written["final"][0]
    from .graph_helpers import found_markers
    assert found_markers(_mysql_rows(db)) == []


def test_an_engine_of_the_callers_own_is_made_strict_and_read_committed_or_refused(db: str
                                                                                   ) -> None:
    """An engine the caller made: run at READ COMMITTED whatever it was made with; without
    strict mode (values cut to their column with a warning) refused before any table."""
    loose = sa.create_engine(normalize_url(db).split("?")[0],
                             connect_args={"init_command": "SET SESSION sql_mode = ''"})
    with pytest.raises(ConfigurationError, match="strict mode"):
        Registry(loose).setup()
    assert _sql(db, "SHOW TABLES LIKE 'securesaver%'") == []
    loose.dispose()
    own = sa.create_engine(normalize_url(db), isolation_level="REPEATABLE READ")
    registry = Registry(own)
    registry.setup()
    with registry.engine.connect() as conn:
        assert conn.get_isolation_level() == "READ COMMITTED"
    registry.dispose()


async def test_thread_ids_differing_in_case_or_trailing_space_stay_apart(db: str) -> None:
    """LangGraph's MySQL saver creates its tables with the server's default collation, under
    which ``abc``, ``ABC`` and ``abc `` are one thread: from_url makes them compare byte for
    byte, so each reads its own, and deleting one never deletes a held other."""
    ring = Keyring.generate()
    threads = ["abc", "ABC", "pad", "pad "]
    with SecureSaver.from_url(db, keyring=ring, redaction=None,
                              default_tenant="acme") as saver:
        seen = {t: (await run_chat(saver, False, t))["final"] for t in threads}
        saver.set_retention("ABC", legal_hold=True)
        saver.delete_thread("abc")
        assert saver.get_tuple({"configurable": {"thread_id": "abc"}}) is None
        for t in ("ABC", "pad", "pad "):
            got = saver.get_tuple({"configurable": {"thread_id": t}})
            assert got is not None
            assert tuple(got.checkpoint["channel_values"]["messages"]) == seen[t][0]
    # a second open changes nothing, and the async twin reads the same threads
    async with SecureSaver.afrom_url(db, keyring=ring, redaction=None,
                                     default_tenant="acme") as asaver:
        assert await asaver.aget_tuple({"configurable": {"thread_id": "ABC"}}) is not None


def test_store_items_are_bound_to_their_version_with_the_registry_on_mariadb(db: str) -> None:
    """SecureStore's item keys and versions in a MariaDB registry: an older copy of a live
    item put back is refused, in this store and in another with its own caches."""
    from langgraph.store.base import PutOp
    from langgraph.store.memory import InMemoryStore

    from langgraph_securesaver import SecureStore
    from langgraph_securesaver.tenancy import tenant_scope, tenant_tag
    ring = Keyring.generate()
    inner = InMemoryStore()
    saver = SecureSaver(InMemorySaver(), keyring=ring, registry=db, redaction=None)
    other = SecureSaver(InMemorySaver(), keyring=ring, registry=db, redaction=None)
    a, b = SecureStore(inner, saver=saver), SecureStore(inner, saver=other)
    ns = ("user-1", "memories")
    with tenant_scope("acme"):
        a.put(ns, "m1", {"text": "v1"})
        old = inner.get((tenant_tag("acme"), *ns), "m1")
        assert old is not None
        a.put(ns, "m1", {"text": "v2"})
        got = b.get(ns, "m1")
        assert got is not None and got.value == {"text": "v2"}
        inner.batch([PutOp((tenant_tag("acme"), *ns), "m1", old.value)])   # rolled back
        for store in (a, b):
            with pytest.raises(TamperedDataError):
                store.get(ns, "m1")
        a.put(ns, "m1", {"text": "v3"})
        got = b.get(ns, "m1")
        assert got is not None and got.value == {"text": "v3"}
    saver.registry.dispose()
    other.registry.dispose()
