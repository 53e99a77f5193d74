"""DeltaChannel threads: state rebuilt through encrypted history, keep_latest refused,
copy_thread keeps the whole chain (the base-class warnings)."""

from __future__ import annotations

import asyncio
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from langgraph_securesaver import DeltaChannelPruneError, Keyring, SecureSaver, tenant_scope


def _extend(state: Any, writes: list[Any]) -> list[Any]:
    out = list(state or [])
    for w in writes:
        out.extend(w)
    return out


class State(TypedDict):
    items: Annotated[list, DeltaChannel(_extend, snapshot_frequency=3)]
    count: Annotated[int, operator.add]


def _graph(saver: SecureSaver) -> Any:
    def add(state: State) -> dict[str, Any]:
        return {"items": [f"item-{state.get('count', 0)}"], "count": 1}

    builder = StateGraph(State)
    builder.add_node("add", add)
    builder.add_edge(START, "add")
    return builder.compile(checkpointer=saver)


def _cfg(thread: str) -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme"}}


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def saver(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        yield SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    elif request.param == "sqlite":
        with SecureSaver.from_url(f"sqlite:///{tmp_path / 'd.db'}", keyring=Keyring.generate(),
                                  redaction=None) as s:
            yield s
    else:
        url = request.getfixturevalue("pg_url")
        with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as s:
            yield s


def test_delta_state_rebuilds_through_encrypted_history(saver: SecureSaver) -> None:
    graph = _graph(saver)
    for _ in range(7):
        graph.invoke({"items": [], "count": 0}, _cfg("t"))
    state = graph.get_state(_cfg("t")).values
    assert state["count"] == 7
    assert state["items"] == [f"item-{i}" for i in range(7)]


def test_keep_latest_is_refused_and_nothing_is_lost(saver: SecureSaver) -> None:
    graph = _graph(saver)
    for _ in range(5):
        graph.invoke({"items": [], "count": 0}, _cfg("t"))
    before = len(list(saver.list(_cfg("t"))))
    with tenant_scope("acme"), pytest.raises((DeltaChannelPruneError, NotImplementedError)):
        saver.prune(["t"], strategy="keep_latest")
    assert len(list(saver.list(_cfg("t")))) == before
    assert graph.get_state(_cfg("t")).values["items"] == [f"item-{i}" for i in range(5)]


def test_copy_thread_keeps_the_delta_chain(saver: SecureSaver) -> None:
    graph = _graph(saver)
    for _ in range(5):
        graph.invoke({"items": [], "count": 0}, _cfg("src"))
    with tenant_scope("acme"):
        saver.copy_thread("src", "dst")
    assert graph.get_state(_cfg("dst")).values["items"] == [f"item-{i}" for i in range(5)]
    graph.invoke({"items": [], "count": 0}, _cfg("dst"))
    assert graph.get_state(_cfg("dst")).values["items"][-1] == "item-5"


# --- get_delta_channel_history: the fast path answers what the base-class walk answers --------

def _base_walk(saver: SecureSaver, config: dict, channels: list[str]) -> Any:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    return BaseCheckpointSaver.get_delta_channel_history(saver, config=config, channels=channels)


async def _abase_walk(saver: SecureSaver, config: dict, channels: list[str]) -> Any:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    return await BaseCheckpointSaver.aget_delta_channel_history(saver, config=config,
                                                                channels=channels)


def _forked_history(saver: SecureSaver, thread: str) -> list[dict]:
    """A thread with snapshots, a fork (update_state on an old checkpoint) and runs after it;
    returns configs of checkpoints worth asking about (latest, fork, old)."""
    graph = _graph(saver)
    for _ in range(8):
        graph.invoke({"items": [], "count": 0}, _cfg(thread))
    history = list(saver.list(_cfg(thread)))
    old = history[len(history) // 2].config
    fork = graph.update_state(old, {"items": ["forked"], "count": 1})
    graph.invoke(None, fork)
    graph.invoke({"items": [], "count": 0}, _cfg(thread))
    latest = saver.get_tuple(_cfg(thread)).config
    return [latest, fork, old, history[-1].config]


def test_delta_history_equals_the_base_class_walk_across_forks(saver: SecureSaver) -> None:
    configs = _forked_history(saver, "f")
    for config in configs:
        for channels in (["items"], ["items", "count"], ["count"]):
            assert saver.get_delta_channel_history(config=config, channels=channels) == \
                _base_walk(saver, config, channels)
    assert saver.get_delta_channel_history(config=configs[0], channels=[]) == {}
    missing = {"configurable": {"thread_id": "nope", "tenant_id": "acme"}}
    assert saver.get_delta_channel_history(config=missing, channels=["items"]) == \
        {"items": {"writes": []}}


async def test_adelta_history_equals_the_base_class_walk(tmp_path: Path,
                                                         request: pytest.FixtureRequest) -> None:
    for url in (f"sqlite:///{tmp_path / 'a.db'}", request.getfixturevalue("pg_url"), None):
        if url is None:
            saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
            await _acheck(saver)
            continue
        async with SecureSaver.afrom_url(url, keyring=Keyring.generate(), redaction=None) as s:
            await _acheck(s)


async def _acheck(saver: SecureSaver) -> None:
    graph = _graph(saver)
    for _ in range(8):
        await graph.ainvoke({"items": [], "count": 0}, _cfg("a"))
    rows = [t async for t in saver.alist(_cfg("a"))]
    fork = await graph.aupdate_state(rows[4].config, {"items": ["forked"], "count": 1})
    await graph.ainvoke(None, fork)
    latest = (await saver.aget_tuple(_cfg("a"))).config
    for config in (latest, fork, rows[4].config):
        assert await saver.aget_delta_channel_history(config=config, channels=["items"]) == \
            await _abase_walk(saver, config, ["items"])
    state = await graph.aget_state(_cfg("a"))
    assert state.values["items"][-2] == "forked"


def test_delta_history_reads_the_inner_saver_in_pages_not_per_ancestor() -> None:
    calls = {"get_tuple": 0, "list": 0}

    class Counting(InMemorySaver):
        def get_tuple(self, config):
            calls["get_tuple"] += 1
            return super().get_tuple(config)

        def list(self, config, **kw):
            calls["list"] += 1
            return super().list(config, **kw)

    class Sparse(TypedDict):
        items: Annotated[list, DeltaChannel(_extend, snapshot_frequency=1000)]
        count: Annotated[int, operator.add]

    saver = SecureSaver(Counting(), keyring=Keyring.generate(), redaction=None)
    builder = StateGraph(Sparse)
    builder.add_node("add", lambda s: {"items": [f"item-{s.get('count', 0)}"], "count": 1})
    builder.add_edge(START, "add")
    graph = builder.compile(checkpointer=saver)
    for _ in range(40):  # 80 checkpoints, no snapshot: the walk goes to the root
        graph.invoke({"items": [], "count": 0}, _cfg("p"))
    latest = saver.get_tuple(_cfg("p")).config
    calls.update(get_tuple=0, list=0)
    history = saver.get_delta_channel_history(config=latest, channels=["items"])
    assert calls["get_tuple"] == 1 and calls["list"] <= 4  # pages of 16, 64, ...
    assert [v for _t, _c, v in history["items"]["writes"] if v] == \
        [[f"item-{i}"] for i in range(40)]
    assert history == _base_walk(saver, latest, ["items"])


def test_delta_history_refuses_a_tampered_ancestor() -> None:
    from langgraph_securesaver import TamperedDataError

    inner = InMemorySaver()
    saver = SecureSaver(inner, keyring=Keyring.generate(), redaction=None)
    graph = _graph(saver)
    for _ in range(2):
        graph.invoke({"items": [], "count": 0}, _cfg("x"))
    latest = saver.get_tuple(_cfg("x")).config
    parent = saver.get_tuple(latest).parent_config["configurable"]["checkpoint_id"]
    # swap a sealed write of the first ancestor with one stored at another checkpoint
    at_parent = next(k for k in inner.writes if k[2] == parent and inner.writes[k])
    other = next(k for k in inner.writes if k[2] != parent and inner.writes[k])
    a, b = inner.writes[at_parent], inner.writes[other]
    ka, kb = next(iter(a)), next(iter(b))
    a[ka], b[kb] = (a[ka][0], a[ka][1], b[kb][2], a[ka][3]), (b[kb][0], b[kb][1], a[ka][2], b[kb][3])
    with pytest.raises(TamperedDataError):
        saver.get_delta_channel_history(config=latest, channels=["items", "count"])
    with pytest.raises(TamperedDataError):  # the async runner of the same walk
        asyncio.run(saver.aget_delta_channel_history(config=latest, channels=["items", "count"]))


def test_delta_history_restores_redacted_pii() -> None:
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate())  # redaction on (default)

    def add(state: State) -> dict[str, Any]:
        return {"items": [f"mail bob{state.get('count', 0)}@example.com"], "count": 1}

    builder = StateGraph(State)
    builder.add_node("add", add)
    builder.add_edge(START, "add")
    graph = builder.compile(checkpointer=saver)
    for _ in range(5):
        graph.invoke({"items": [], "count": 0}, _cfg("pii"))
    latest = saver.get_tuple(_cfg("pii")).config
    history = saver.get_delta_channel_history(config=latest, channels=["items"])
    text = repr(history)
    assert "bob4@example.com" in text or "bob3@example.com" in text
    assert "<EMAIL_ADDRESS:" not in text
    assert history == _base_walk(saver, latest, ["items"])
    assert graph.get_state(_cfg("pii")).values["items"][-1] == "mail bob4@example.com"


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_delta_history_follows_parents_whose_ids_sort_after_their_children(
        backend: str, tmp_path: Path) -> None:
    """Migrated or hand-written histories need not have time-ordered ids: the walk follows
    parent links, not id order (a parent the paged listing cannot reach is fetched by id)."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        if backend == "memory":
            saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
        else:
            saver = stack.enter_context(SecureSaver.from_url(
                f"sqlite:///{tmp_path / 'o.db'}", keyring=Keyring.generate(), redaction=None))
        target = _out_of_order_thread(saver, lambda i: [f"w{i}"])
        history = saver.get_delta_channel_history(config=target, channels=["items"])
        assert history == _base_walk(saver, target, ["items"])
        assert history["items"]["seed"] == ["seed"]
        assert [w[2] for w in history["items"]["writes"]] == [["w0"], ["w1"], ["w2"]]


async def test_adelta_history_fetches_out_of_order_parents_and_restores_pii() -> None:
    """The async runner takes the same paths: a parent fetched by id, PII restored."""
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate())  # redaction on (default)
    target = _out_of_order_thread(saver, lambda i: [f"mail bob{i}@example.com"])
    history = await saver.aget_delta_channel_history(config=target, channels=["items"])
    assert [w[2] for w in history["items"]["writes"]] == \
        [[f"mail bob{i}@example.com"] for i in range(3)]
    assert history == await _abase_walk(saver, target, ["items"])


def _out_of_order_thread(saver: SecureSaver, write: Any) -> dict:
    """Thread "o": root 9 -> 5 -> 7 -> 1 (the returned target), ``write(i)`` written at each
    checkpoint i; the root seeds ``items``."""
    from langgraph.checkpoint.base import empty_checkpoint

    parent: str | None = None
    for i, cid in enumerate(["9", "5", "7", "1"]):
        ckpt = empty_checkpoint()
        ckpt["id"] = cid
        if parent is None:
            ckpt["channel_values"] = {"items": ["seed"]}
            ckpt["channel_versions"] = {"items": 1}
        conf: dict[str, Any] = {"thread_id": "o", "tenant_id": "acme", "checkpoint_ns": ""}
        if parent is not None:
            conf["checkpoint_id"] = parent
        saved = saver.put({"configurable": conf}, ckpt, {"step": i},
                          dict(ckpt["channel_versions"]))
        saver.put_writes(saved, [("items", write(i))], f"task-{i}")
        parent = cid
    return {"configurable": {"thread_id": "o", "tenant_id": "acme", "checkpoint_ns": "",
                             "checkpoint_id": "1"}}


# --- ancestors fetched by id: a detached parent link, a parent the listing cannot reach ------

def _detached_thread(saver: SecureSaver) -> dict:
    """Thread "d": two turns, pruned to its latest checkpoint (its parent link removed, the
    parent gone), then one more turn; returns the new latest config (the detached checkpoint
    is its parent, reached by the walk's listing)."""
    from langchain_core.messages import HumanMessage

    from tests.fake_agent import build_chat_graph

    graph = build_chat_graph(saver)
    conf = {"configurable": {"thread_id": "d", "tenant_id": "acme"}}
    for text in ("one", "two"):
        graph.invoke({"messages": [HumanMessage(text)]}, conf)
    with tenant_scope("acme"):
        saver.prune(["d"], strategy="keep_latest")
    graph.invoke({"messages": [HumanMessage("three")]}, conf)
    return saver.get_tuple(conf).config


def _thread_for(situation: str) -> Any:
    if situation == "detached":
        return _detached_thread
    return lambda saver: _out_of_order_thread(saver, lambda i: [f"w{i}"])


def _channels(situation: str) -> list[str]:
    return ["messages", "nope"] if situation == "detached" else ["items"]


def _stored_ids(saver: SecureSaver, config: dict) -> set[str]:
    conf = {"configurable": {"thread_id": config["configurable"]["thread_id"],
                             "tenant_id": "acme"}}
    return {t.config["configurable"]["checkpoint_id"] for t in saver.list(conf)}


def _check_lookups(situation: str, asked: list[str], stored: set[str]) -> None:
    """The walk really fetched by id: the detached checkpoint's (pruned) parent, or the
    out-of-order parents."""
    if situation == "detached":
        assert set(asked) - stored, asked  # the lookup that accepts the detached link
    else:
        assert {"7", "9"} <= set(asked), asked


@pytest.mark.parametrize("situation", ["detached", "out_of_order"])
def test_adelta_history_over_an_async_only_saver_fetches_ancestors_asynchronously(
        situation: str, tmp_path: Path) -> None:
    """AsyncSqliteSaver has no sync API on its loop: every checkpoint the async walk needs
    (a detached ancestor's parent included) is asked for with aget_tuple, after the listing
    (which holds the saver's lock) is released."""
    from langgraph.checkpoint.base import BaseCheckpointSaver

    async def main() -> None:
        async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'a.db'}",
                                         keyring=Keyring.generate(), redaction=None) as saver:
            target = await asyncio.to_thread(_thread_for(situation), saver)
            stored = await asyncio.to_thread(_stored_ids, saver, target)
            inner = saver.inner
            asked: list[str] = []
            real = inner.aget_tuple

            async def spy(config: dict) -> Any:
                assert not inner.lock.locked(), "looked up while a listing holds the lock"
                asked.append(config["configurable"].get("checkpoint_id"))
                return await real(config)
            inner.aget_tuple = spy
            channels = _channels(situation)
            history = await saver.aget_delta_channel_history(config=target, channels=channels)
            _check_lookups(situation, asked, stored)
            assert history == await BaseCheckpointSaver.aget_delta_channel_history(
                saver, config=target, channels=channels)
            # the sync walk from a worker thread (bridged to the saver's loop) agrees
            assert history == await asyncio.to_thread(
                lambda: saver.get_delta_channel_history(config=target, channels=channels))
            assert history[channels[0]].get("seed") is not None

    asyncio.run(main())


@pytest.mark.parametrize("situation", ["detached", "out_of_order"])
def test_adelta_history_makes_no_sync_inner_call_on_the_event_loop(situation: str) -> None:
    """Over a saver with both APIs the async walk never calls the sync one on the loop."""
    import threading

    sync_threads: set[int] = set()

    class Spying(InMemorySaver):  # the async API here does not go through the sync one
        def get_tuple(self, config):
            sync_threads.add(threading.get_ident())
            return super().get_tuple(config)

        def list(self, config, **kw):
            sync_threads.add(threading.get_ident())
            return super().list(config, **kw)

        async def aget_tuple(self, config):
            return InMemorySaver.get_tuple(self, config)

        async def alist(self, config, **kw):
            for tup in InMemorySaver.list(self, config, **kw):
                yield tup

    saver = SecureSaver(Spying(), keyring=Keyring.generate(), redaction=None)
    target = _thread_for(situation)(saver)
    channels = _channels(situation)
    expected = _base_walk(saver, target, channels)

    async def main() -> tuple[int, Any]:
        sync_threads.clear()
        return threading.get_ident(), await saver.aget_delta_channel_history(
            config=target, channels=channels)

    loop_thread, history = asyncio.run(main())
    assert loop_thread not in sync_threads
    assert history == expected and history[channels[0]].get("seed") is not None


def test_delta_history_looks_up_a_detached_ancestor_after_releasing_the_listing(
        tmp_path: Path) -> None:
    """SqliteSaver's listing holds its (non-reentrant) lock until closed: the lookup that
    accepts a detached ancestor comes after the listing is closed (it used to deadlock)."""
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 's.db'}", keyring=Keyring.generate(),
                              redaction=None) as saver:
        target = _detached_thread(saver)
        stored = _stored_ids(saver, target)
        inner = saver.inner
        asked: list[str] = []
        real = inner.get_tuple

        def spy(config: dict) -> Any:
            assert not inner.lock.locked(), "looked up while a listing holds the lock"
            asked.append(config["configurable"].get("checkpoint_id"))
            return real(config)
        inner.get_tuple = spy
        channels = _channels("detached")
        history = saver.get_delta_channel_history(config=target, channels=channels)
        _check_lookups("detached", asked, stored)
        assert history == _base_walk(saver, target, channels)
        assert history["messages"]["seed"]


def test_delta_history_refuses_an_ancestor_whose_parent_link_was_removed() -> None:
    """A parent link nulled while the parent still exists is tampering, for both runners
    (the refusal names the row)."""
    from langchain_core.messages import HumanMessage

    from langgraph_securesaver import TamperedDataError
    from tests.fake_agent import build_chat_graph

    inner = InMemorySaver()
    saver = SecureSaver(inner, keyring=Keyring.generate(), redaction=None)
    graph = build_chat_graph(saver)
    conf = {"configurable": {"thread_id": "n", "tenant_id": "acme"}}
    for text in ("one", "two"):
        graph.invoke({"messages": [HumanMessage(text)]}, conf)
    latest = saver.get_tuple(conf)
    victim = latest.parent_config["configurable"]["checkpoint_id"]
    by_id = next(iter(inner.storage.values()))[""]
    by_id[victim] = (*by_id[victim][:2], None)
    channels = ["messages", "nope"]
    with pytest.raises(TamperedDataError, match=f"{victim}.*parent still exists"):
        saver.get_delta_channel_history(config=latest.config, channels=channels)
    with pytest.raises(TamperedDataError, match=f"{victim}.*parent still exists"):
        asyncio.run(saver.aget_delta_channel_history(config=latest.config, channels=channels))
