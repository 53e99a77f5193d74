"""SecureStore keeps the promises SecureSaver keeps (issue 43): the caller is who the saver
says it is (scope, then the run config, then the default), queries reach the embedder
redacted in every tenant state, TTL refreshes touch what was returned, the async recipe and
``setup()`` work as LangGraph's stores do. Default settings unless a test says otherwise."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.graph import START, StateGraph
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore

from langgraph_securesaver import (
    AccessDenied,
    Keyring,
    SecureSaver,
    SecureStore,
    TenantRequired,
    tenant_scope,
)
from langgraph_securesaver.store import asecure_pair

EMAIL, PHONE = "jane.roe@example.com", "+1 415 555 0142"


class _State(TypedDict):
    out: list[str]


def _graph(store: BaseStore) -> Any:
    def node(state: _State, *, store: BaseStore) -> dict[str, Any]:
        store.put(("mem",), "seen", {"v": 1})
        return {"out": sorted(i.key for i in store.search(("mem",)))}

    async def anode(state: _State, *, store: BaseStore) -> dict[str, Any]:
        await store.aput(("mem",), "seen", {"v": 1})
        return {"out": sorted(i.key for i in await store.asearch(("mem",)))}

    sync = StateGraph(_State)
    sync.add_node("n", node)
    sync.add_edge(START, "n")
    asyn = StateGraph(_State)
    asyn.add_node("n", anode)
    asyn.add_edge(START, "n")
    return sync.compile(store=store), asyn.compile(store=store)


@pytest.fixture
def memory_store(keyring: Keyring) -> SecureStore:
    store = SecureStore(InMemoryStore(), keyring=keyring, default_tenant="acme")
    store.setup()
    return store


# (1) who the caller is -----------------------------------------------------------------------
def test_a_nodes_store_follows_the_run_configs_tenant(memory_store: SecureStore) -> None:
    """A run with configurable.tenant_id=globex never reads acme's memory, though the store
    has a default tenant (sync and async graphs)."""
    memory_store.put(("mem",), "acme-secret", {"card": "acme's"})
    sync, asyn = _graph(memory_store)
    globex = {"configurable": {"tenant_id": "globex"}}
    assert sync.invoke({"out": []}, globex)["out"] == ["seen"]
    assert asyncio.run(asyn.ainvoke({"out": []}, globex))["out"] == ["seen"]
    with tenant_scope("globex"):
        assert memory_store.get(("mem",), "seen") is not None
        assert memory_store.get(("mem",), "acme-secret") is None
    assert sync.invoke({"out": []}, {"configurable": {"tenant_id": "acme"}})["out"] == [
        "acme-secret", "seen"]


def test_a_run_config_naming_another_tenant_than_the_scope_is_refused_and_recorded(
        memory_store: SecureStore) -> None:
    sync, asyn = _graph(memory_store)
    globex = {"configurable": {"tenant_id": "globex"}}
    with tenant_scope("acme"):
        with pytest.raises(AccessDenied):
            sync.invoke({"out": []}, globex)
        with pytest.raises(AccessDenied):
            asyncio.run(asyn.ainvoke({"out": []}, globex))
    events = memory_store.saver.events(tenant="globex")
    assert any(e.kind == "access_denied" and e.actor == "acme"
               and "store" in str(e.detail) for e in events)
    with tenant_scope("globex"):
        assert memory_store.get(("mem",), "seen") is None   # nothing was written


def test_tenant_required_names_what_the_store_reads(keyring: Keyring) -> None:
    store = SecureStore(InMemoryStore(), keyring=keyring, redaction=None)
    with pytest.raises(TenantRequired) as caught:
        store.put(("m",), "k", {"v": 1})
    assert "tenant_scope" in str(caught.value) and "run's config" in str(caught.value)
    sync, _ = _graph(store)
    assert sync.invoke({"out": []}, {"configurable": {"tenant_id": "acme"}})["out"] == ["seen"]


def test_saver_and_store_agree_on_the_caller(keyring: Keyring) -> None:
    """One rule: the same config gives the same tenant to the saver and the store."""
    from langgraph.checkpoint.memory import InMemorySaver
    saver = SecureSaver(InMemorySaver(), keyring=keyring, default_tenant="acme",
                        redaction=None)
    store = SecureStore(InMemoryStore(), saver=saver)
    sync, _ = _graph(store)
    graph = sync.builder.compile(checkpointer=saver, store=store)
    config = {"configurable": {"tenant_id": "globex", "thread_id": "t1"}}
    graph.invoke({"out": []}, config)
    with tenant_scope("globex"):
        assert saver.get_tuple({"configurable": {"thread_id": "t1"}}) is not None
        assert store.get(("mem",), "seen") is not None
    assert saver.get_tuple({"configurable": {"thread_id": "t1"}}) is None
    assert store.get(("mem",), "seen") is None


# (2) queries reach the embedder redacted -----------------------------------------------------
class _Recorder:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, texts: list[str]) -> list[list[float]]:
        self.seen.extend(texts)
        return [[float(len(t) % 7), 1.0] for t in texts]


def _indexed(keyring: Keyring) -> tuple[SecureStore, _Recorder]:
    embed = _Recorder()
    store = SecureStore(InMemoryStore(), keyring=keyring, default_tenant="acme",
                        index={"dims": 2, "embed": embed})
    store.setup()
    return store, embed


QUERY = f"who wrote from {EMAIL} or {PHONE}?"


@pytest.mark.parametrize("state", ["new", "existing", "shredded", "rotated"])
def test_search_queries_reach_the_embedder_redacted(tmp_path: Path, state: str) -> None:
    store, embed = _indexed(Keyring.from_file(Keyring.generate().save(tmp_path / "ring.json")))
    if state != "new":
        store.put(("m",), "k", {"text": f"mail {EMAIL}"})
    if state == "shredded":
        store.shred_tenant("acme")
    if state == "rotated":
        store.saver.rotate_data_key("acme")
    embed.seen.clear()
    store.search(("m",), query=QUERY)
    asyncio.run(store.asearch(("m",), query=QUERY))
    assert len(embed.seen) == 2
    for text in embed.seen:
        # the phone number's digits, not '555' alone (a token's hex digest may hold it)
        assert EMAIL not in text and "555 0142" not in text and "5550142" not in text


# (3) TTL -------------------------------------------------------------------------------------
def _expiries(store: SecureStore) -> dict[str, float]:
    rows = store.inner.conn.execute("SELECT key, expires_at FROM store").fetchall()
    return {str(k): v for k, v in rows}


@pytest.fixture
def ttl_store(tmp_path: Path, keyring: Keyring) -> Iterator[SecureStore]:
    ttl = {"default_ttl": 10.0, "refresh_on_read": True}
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'ttl.db'}", keyring=keyring,
                              default_tenant="acme", ttl=ttl) as store:
        for n in range(30):
            store.put(("m",), f"k{n:02}", {"n": n, "tag": "a" if n < 2 else "b"})
        yield store


@pytest.mark.parametrize("how", ["range filter", "blind filter page", "offset page"])
def test_search_refreshes_only_what_it_returns(ttl_store: SecureStore, how: str) -> None:
    """The raw store refreshes the TTL of the items a search returns, nothing else."""
    before = _expiries(ttl_store)
    time.sleep(1.1)    # SQLite keeps expiry times in whole seconds
    if how == "range filter":
        found = ttl_store.search(("m",), filter={"n": {"$lt": 2}})
    elif how == "blind filter page":
        found = ttl_store.search(("m",), filter={"tag": "b", "n": {"$gte": 0}}, limit=2)
    else:
        found = ttl_store.search(("m",), filter={"n": {"$gte": 0}}, limit=2, offset=3)
    assert len(found) == 2
    after = _expiries(ttl_store)
    assert {k for k in after if after[k] != before[k]} == {i.key for i in found}


def test_async_search_refreshes_only_what_it_returns(tmp_path: Path, keyring: Keyring) -> None:
    import sqlite3
    path = tmp_path / "attl.db"

    def expiries() -> dict[str, float]:
        with sqlite3.connect(path) as conn:
            return {str(k): v for k, v in conn.execute("SELECT key, expires_at FROM store")}

    async def run() -> set[str]:
        ttl = {"default_ttl": 10.0, "refresh_on_read": True}
        async with SecureStore.afrom_url(f"sqlite:///{path}", keyring=keyring,
                                         default_tenant="acme", ttl=ttl) as store:
            for n in range(30):
                await store.aput(("m",), f"k{n:02}", {"n": n})
            before = expiries()
            await asyncio.sleep(1.1)
            found = await store.asearch(("m",), filter={"n": {"$lt": 2}})
            after = expiries()
            assert len(found) == 2
            return {k for k in after if after[k] != before[k]}
    assert asyncio.run(run()) == {"k00", "k01"}


# (6) the async recipe and setup() ------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_afrom_url_with_a_saver_and_the_async_pair(backend: str, tmp_path: Path,
                                                   keyring: Keyring,
                                                   request: pytest.FixtureRequest) -> None:
    url = (f"sqlite:///{tmp_path / 'a.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))

    async def run() -> None:
        async with asecure_pair(url, keyring=keyring, default_tenant="acme") as (saver, _s):
            async with SecureStore.afrom_url(url, saver=saver) as store:
                assert store.saver is saver
                await store.aput(("a",), "k", {"mail": EMAIL})
                item = await store.aget(("a",), "k")
                assert item is not None and item.value == {"mail": EMAIL}
    asyncio.run(run())
    with SecureSaver.from_url(url, keyring=keyring, default_tenant="acme") as saver, \
            SecureStore.from_url(url, saver=saver) as store:
        assert store.get(("a",), "k").value == {"mail": EMAIL}  # type: ignore[union-attr]


def test_setup_of_a_wrapped_async_postgres_store(pg_url: str, keyring: Keyring) -> None:
    """``await store.setup()`` sets a wrapped AsyncPostgresStore up, as LangGraph's own
    ``await AsyncPostgresStore.setup()`` does: no ``inner.setup()`` by hand."""
    from langgraph.store.postgres.aio import AsyncPostgresStore

    from langgraph_securesaver.storage.backends import libpq_url

    async def run() -> None:
        async with AsyncPostgresStore.from_conn_string(libpq_url(pg_url)) as inner:
            store = SecureStore(inner, keyring=keyring, registry=pg_url,
                                default_tenant="acme")
            await store.setup()
            await store.aput(("a",), "k", {"v": 1})
            assert (await store.aget(("a",), "k")).value == {"v": 1}  # type: ignore[union-attr]
    asyncio.run(run())
