"""forget_subject reaches every store a subject's memory lives in, or refuses (issue 43).

A SecureStore outside the registry's database (an InMemoryStore, a SQLite file of its own)
used to keep the subject's items while the receipt said ``store_items: 0``. Now the store is
named (``stores=[...]``, CLI ``--store-url``) and erased through its own API, counted per
store; a store the registry knows of but the call does not name is refused with
:class:`StoreNotReachedError` before anything is deleted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.store.memory import InMemoryStore

from langgraph_securesaver import Keyring, SecureSaver, SecureStore, StoreNotReachedError
from langgraph_securesaver.tenancy import tenant_scope
from tests.fake_agent import build_chat_graph

DANA, ERIN = "user-dana-17", "user-erin-42"
DANA_MAIL = "dana.person@example.com"
DANAS = [((DANA, "memories"), "m1"), ((DANA, "memories", "work"), "m2")]
ERINS = [((ERIN, "memories"), "m1")]


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent.db'}"
    return str(request.getfixturevalue("pg_url"))


def _cfg(thread: str, subject: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme", "subject_id": subject}}


def _put_memories(store: SecureStore) -> None:
    with tenant_scope("acme"):
        for (ns, key), text in zip(DANAS + ERINS, [f"likes tea, {DANA_MAIL}", "works late",
                                                  "erin stays"], strict=True):
            store.put(ns, key, {"text": text})


async def _aput_memories(store: SecureStore) -> None:
    with tenant_scope("acme"):
        for (ns, key), text in zip(DANAS + ERINS, [f"likes tea, {DANA_MAIL}", "works late",
                                                  "erin stays"], strict=True):
            await store.aput(ns, key, {"text": text})


def _left(store: SecureStore) -> list[tuple[tuple[str, ...], str]]:
    with tenant_scope("acme"):
        return sorted((tuple(i.namespace), i.key) for i in store.search((), limit=100))


async def _aleft(store: SecureStore) -> list[tuple[tuple[str, ...], str]]:
    with tenant_scope("acme"):
        return sorted((tuple(i.namespace), i.key) for i in await store.asearch((), limit=100))


def _receipt_stores(saver: SecureSaver) -> dict[str, Any]:
    receipt = [r for r in saver.receipts() if r.reason == "forget_subject"][-1]
    return dict(receipt.detail["stores"])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_in_memory_store_named_in_stores_is_erased_and_counted(
        registry_url: str, mode: str) -> None:
    with SecureSaver.from_url(registry_url, keyring=Keyring.generate()) as saver:
        store = SecureStore(InMemoryStore(), saver=saver)
        _put_memories(store)
        with pytest.raises(StoreNotReachedError) as refused:
            saver.forget_subject(DANA, tenants=["acme"])
        assert "stores=" in str(refused.value) and DANA not in str(refused.value)
        assert _left(store) == sorted(DANAS + ERINS)
        if mode == "sync":
            report = saver.forget_subject(DANA, tenants=["acme"], stores=[store])
        else:
            report = asyncio.run(saver.aforget_subject(DANA, tenants=["acme"], stores=[store]))
        assert report.store_items == {"acme": 2}
        assert report.stores == {"acme": {store.location: 2}}
        assert report.pii_values["acme"] == 1          # the e-mail only dana's item used
        assert _receipt_stores(saver) == {"acme": {store.location: 2}}
        assert _left(store) == ERINS


def test_a_sqlite_store_in_another_file_is_refused_unless_named(
        registry_url: str, tmp_path: Path) -> None:
    """Not named: refused, in this process and in another one (the registry recorded the
    file), and nothing at all is deleted -- not the thread, not the items in the registry's
    own database. Named: erased."""
    ring = Keyring.generate()
    other = f"sqlite:///{tmp_path / 'memories.db'}"
    with SecureSaver.from_url(registry_url, keyring=ring) as saver, \
            SecureStore.from_url(other, saver=saver) as elsewhere, \
            SecureStore.from_url(registry_url, saver=saver) as beside:
        build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _cfg("d1", DANA))
        _put_memories(elsewhere)
        _put_memories(beside)
    with SecureSaver.from_url(registry_url, keyring=ring) as saver, \
            SecureStore.from_url(other, saver=saver) as elsewhere, \
            SecureStore.from_url(registry_url, saver=saver) as beside:
        with pytest.raises(StoreNotReachedError) as refused:
            saver.forget_subject(DANA, tenants=["acme"])
        assert "memories.db" in str(refused.value)
        with pytest.raises(StoreNotReachedError):   # naming the registry's own is not enough
            saver.forget_subject(DANA, tenants=["acme"], stores=[beside])
        assert saver.get_tuple(_cfg("d1", DANA)) is not None
        assert _left(elsewhere) == _left(beside) == sorted(DANAS + ERINS)
        assert not [r for r in saver.receipts() if r.reason == "forget_subject"]
        report = saver.forget_subject(DANA, tenants=["acme"], stores=[elsewhere])
        assert report.total_threads == 1 and report.store_items == {"acme": 4}
        assert report.stores == {"acme": {elsewhere.location: 2}}
        assert saver.get_tuple(_cfg("d1", DANA)) is None
        assert _left(elsewhere) == _left(beside) == ERINS


def test_an_async_sqlite_store_in_another_file_is_refused_unless_named(
        registry_url: str, tmp_path: Path) -> None:
    other = f"sqlite:///{tmp_path / 'memories.db'}"

    async def main() -> None:
        async with SecureSaver.afrom_url(registry_url, keyring=Keyring.generate()) as saver, \
                SecureStore.afrom_url(other, saver=saver) as elsewhere:
            await build_chat_graph(saver).ainvoke({"messages": [HumanMessage("hi")]},
                                                  _cfg("d1", DANA))
            await _aput_memories(elsewhere)
            with pytest.raises(StoreNotReachedError):
                await saver.aforget_subject(DANA, tenants=["acme"])
            assert await saver.aget_tuple(_cfg("d1", DANA)) is not None
            assert await _aleft(elsewhere) == sorted(DANAS + ERINS)
            report = await saver.aforget_subject(DANA, tenants=["acme"], stores=[elsewhere])
            assert report.total_threads == 1
            assert report.stores == {"acme": {elsewhere.location: 2}}
            assert await saver.aget_tuple(_cfg("d1", DANA)) is None
            assert await _aleft(elsewhere) == ERINS

    asyncio.run(main())


def test_cli_forget_subject_reaches_a_store_url_and_refuses_without_it(
        registry_url: str, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from langgraph_securesaver.cli.main import app
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    other = f"sqlite:///{tmp_path / 'memories.db'}"
    with SecureSaver.from_url(registry_url, keyring=Keyring.from_file(ring)) as saver, \
            SecureStore.from_url(other, saver=saver) as elsewhere:
        build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _cfg("d1", DANA))
        _put_memories(elsewhere)
    runner = CliRunner()
    base = ["forget-subject", "--url", registry_url, "--keyring", str(ring), "--subject", DANA,
            "--yes", "--json"]
    result = runner.invoke(app, base)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "--store-url" in result.stderr
    missing = runner.invoke(app, [*base, "--store-url", f"sqlite:///{tmp_path / 'nope.db'}"])
    assert missing.exit_code == 2 and not (tmp_path / "nope.db").exists()
    with SecureSaver.from_url(registry_url, keyring=Keyring.from_file(ring)) as saver, \
            SecureStore.from_url(other, saver=saver) as elsewhere:
        assert saver.get_tuple(_cfg("d1", DANA)) is not None
        assert _left(elsewhere) == sorted(DANAS + ERINS)
    result = runner.invoke(app, [*base, "--store-url", other])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    counts = shown["counts"]["acme"]
    assert counts["threads"] == 1 and counts["store_items"] == 2
    assert list(shown["stores"]["acme"].values()) == [2]
    assert DANA not in result.output
    with SecureSaver.from_url(registry_url, keyring=Keyring.from_file(ring)) as saver, \
            SecureStore.from_url(other, saver=saver) as elsewhere:
        assert saver.get_tuple(_cfg("d1", DANA)) is None
        assert _left(elsewhere) == ERINS


def test_stores_takes_a_list_of_secure_stores(tmp_path: Path) -> None:
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'a.db'}",
                              keyring=Keyring.generate()) as saver:
        store = SecureStore(InMemoryStore(), saver=saver)
        for bad in (store, "sqlite:///x.db", [InMemoryStore()]):
            with pytest.raises(ValueError, match="stores="):
                saver.forget_subject(DANA, stores=bad)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_postgres_store_in_another_schema_is_refused_unless_named(
        registry_url: str, mode: str) -> None:
    """Another PostgreSQL schema (same server and database, another ``search_path``) is
    another store: the registry's own ``store`` table is not it."""
    from tests.conftest import drop_pg_schema, new_pg_schema, pg_url_in, require_postgres
    require_postgres()
    schema = new_pg_schema()
    other = pg_url_in(schema)
    try:
        if mode == "sync":
            with SecureSaver.from_url(registry_url, keyring=Keyring.generate()) as saver, \
                    SecureStore.from_url(other, saver=saver) as elsewhere:
                _put_memories(elsewhere)
                with pytest.raises(StoreNotReachedError) as refused:
                    saver.forget_subject(DANA, tenants=["acme"])
                assert schema in str(refused.value) and "postgres@" not in str(refused.value)
                assert _left(elsewhere) == sorted(DANAS + ERINS)
                report = saver.forget_subject(DANA, tenants=["acme"], stores=[elsewhere])
                assert report.stores == {"acme": {elsewhere.location: 2}}
                assert _left(elsewhere) == ERINS
            return

        async def main() -> None:
            async with SecureSaver.afrom_url(registry_url,
                                             keyring=Keyring.generate()) as saver, \
                    SecureStore.afrom_url(other, saver=saver) as elsewhere:
                await _aput_memories(elsewhere)
                with pytest.raises(StoreNotReachedError):
                    await saver.aforget_subject(DANA, tenants=["acme"])
                assert await _aleft(elsewhere) == sorted(DANAS + ERINS)
                report = await saver.aforget_subject(DANA, tenants=["acme"],
                                                     stores=[elsewhere])
                assert report.stores == {"acme": {elsewhere.location: 2}}
                assert await _aleft(elsewhere) == ERINS

        asyncio.run(main())
    finally:
        drop_pg_schema(schema)



@pytest.mark.postgres
def test_the_registry_databases_own_store_over_the_unix_socket_needs_no_naming() -> None:
    """A URL without a host (the Unix socket: ``postgresql://user@/db``) names the registry's
    database too: the pair ``from_url`` opens on it is not mistaken for a store elsewhere
    (the registry's location came from its URL, the store's from its connection, and every
    forget_subject on such a deployment was refused)."""
    from tests.conftest import drop_pg_schema
    schema, dbname = _socket_schema()
    url = f"postgresql://postgres@/{dbname}?options=-csearch_path%3D{schema}"
    try:
        with SecureSaver.from_url(url, keyring=Keyring.generate()) as saver, \
                SecureStore.from_url(url, saver=saver) as store:
            _put_memories(store)
            report = saver.forget_subject(DANA, tenants=["acme"])
            assert report.store_items == {"acme": 2}
            assert _left(store) == ERINS
    finally:
        drop_pg_schema(schema)


@pytest.mark.postgres
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_store_on_a_connection_pool_over_the_unix_socket_is_the_registrys_own(
        mode: str) -> None:
    """A PostgresStore built on a connection pool whose conninfo names no host (the Unix
    socket) is located from a live connection of the pool, as the registry is: not taken for
    a store elsewhere (every forget_subject was refused before)."""
    from langgraph.store.postgres import AsyncPostgresStore, PostgresStore
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    from tests.conftest import drop_pg_schema
    schema, dbname = _socket_schema()
    url = f"postgresql://postgres@/{dbname}?options=-csearch_path%3D{schema}"
    conninfo = f"dbname={dbname} user=postgres options=-csearch_path={schema}"
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    try:
        if mode == "sync":
            with SecureSaver.from_url(url, keyring=Keyring.generate()) as saver, \
                    ConnectionPool(conninfo, kwargs=kwargs, min_size=1, max_size=2) as pool:
                store = SecureStore(PostgresStore(pool), saver=saver)
                store.setup()
                _put_memories(store)
                report = saver.forget_subject(DANA, tenants=["acme"])
                assert report.store_items == {"acme": 2}
                assert _left(store) == ERINS
            return

        async def run() -> None:
            async with SecureSaver.afrom_url(url, keyring=Keyring.generate()) as saver, \
                    AsyncConnectionPool(conninfo, kwargs=kwargs, min_size=1, max_size=2,
                                        open=False) as pool:
                store = SecureStore(AsyncPostgresStore(pool), saver=saver)
                await store.setup()
                await _aput_memories(store)
                report = await saver.aforget_subject(DANA, tenants=["acme"])
                assert report.store_items == {"acme": 2}
                assert await _aleft(store) == ERINS

        asyncio.run(run())
    finally:
        drop_pg_schema(schema)


def _socket_schema() -> tuple[str, str]:
    """A fresh schema on the test database, and the database's name, for a connection over
    the Unix socket (skipped when the server listens on none)."""
    import psycopg

    from tests.conftest import PG_URL, new_pg_schema, require_postgres
    require_postgres()
    with psycopg.connect(PG_URL) as conn:
        socket_dir = str(conn.execute("SHOW unix_socket_directories").fetchone()[0])
    if not socket_dir:
        pytest.skip("this PostgreSQL listens on no Unix socket")
    return new_pg_schema(), str(psycopg.conninfo.conninfo_to_dict(PG_URL)["dbname"])
