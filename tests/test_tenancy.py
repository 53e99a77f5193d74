"""Tenant isolation for every method, sync and async, on InMemory and SQLite savers."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_securesaver import (
    AccessDenied,
    Keyring,
    SecureSaver,
    TenantRequired,
    tenant_scope,
)
from tests.fake_agent import build_chat_graph

from .conftest import _new_kms_alias, _point_boto3_at, copy_database


def _cfg(thread: str, tenant: str | None = None) -> dict:
    conf: dict[str, Any] = {"thread_id": thread}
    if tenant:
        conf["tenant_id"] = tenant
    return {"configurable": conf}


def _seed(saver: SecureSaver) -> None:
    graph = build_chat_graph(saver)
    for tenant in ("acme", "globex"):
        for text in ("one", "two"):
            graph.invoke({"messages": [HumanMessage(f"{tenant} says {text}")]},
                         {"configurable": {"thread_id": "shared", "tenant_id": tenant},
                          "metadata": {"run_id": f"run-{tenant}-{text}"}})


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Per SQLite saver kind, one database seeded by ``_seed`` (and its key provider, one per
    module): each test opens its own copy. Written once, the seeded threads' lease fence
    (5 s) has run out when most tests delete or prune them."""
    made: dict[str, tuple[Path, object]] = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        def seed(kind: str, request: pytest.FixtureRequest) -> tuple[Path, object]:
            if kind not in made:
                ring: object = Keyring.generate()
                if kind == "sqlite-aws-kms":
                    from langgraph_securesaver.keys.aws_kms import AwsKmsKeyProvider
                    port = request.getfixturevalue("moto_server")
                    _point_boto3_at(monkeypatch, f"http://127.0.0.1:{port}")
                    ring = AwsKmsKeyProvider(_new_kms_alias())
                if kind == "sqlite-pkcs11":
                    from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider
                    hsm = request.getfixturevalue("softhsm")
                    ring = Pkcs11KeyProvider.from_url(hsm.new_key_url())
                db = tmp_path_factory.mktemp("tenancy-seed") / "db.sqlite"
                with SecureSaver.from_url(f"sqlite:///{db}", keyring=ring,
                                          redaction=None) as s:
                    _seed(s)
                made[kind] = (db, ring)
            return made[kind]
        yield seed  # type: ignore[misc]


@pytest.fixture(params=["memory", "sqlite", "sqlite-aws-kms", "sqlite-pkcs11"])
def saver(request: pytest.FixtureRequest, tmp_path: Path, seeded: Any):
    """A saver holding ``_seed``'s conversation: in memory, or a copy of the module's seeded
    SQLite database (Keyring, AWS KMS or PKCS#11 key provider)."""
    if request.param == "memory":
        s = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
        _seed(s)
        yield s
        return
    db, ring = seeded(request.param, request)
    copy_database(f"sqlite:///{db}", f"sqlite:///{tmp_path / 'db.sqlite'}")
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}", keyring=ring,
                              redaction=None) as s:
        yield s


def _contents(saver: SecureSaver, tenant: str, thread: str = "shared") -> list[str]:
    tup = saver.get_tuple(_cfg(thread, tenant))
    return [] if tup is None else [m.content for m in tup.checkpoint["channel_values"]["messages"]]


class Caller:
    """Runs a saver method through the sync or the async API."""

    def __init__(self, saver: SecureSaver, mode: str) -> None:
        self.saver, self.mode = saver, mode

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "sync":
            result = getattr(self.saver, name)(*args, **kwargs)
            return list(result) if name == "list" else result

        async def run() -> Any:
            if name == "list":
                return [t async for t in self.saver.alist(*args, **kwargs)]
            return await getattr(self.saver, "a" + name)(*args, **kwargs)
        return asyncio.run(run())


@pytest.fixture(params=["sync", "async"])
def call(request: pytest.FixtureRequest, saver: SecureSaver) -> Caller:
    return Caller(saver, request.param)


def test_same_thread_id_two_tenants_do_not_collide(call: Caller) -> None:
    saver = call.saver
    assert not any("globex" in c for c in _contents(saver, "acme"))
    assert not any("acme" in c for c in _contents(saver, "globex"))
    assert "acme says two" in _contents(saver, "acme")
    assert "globex says two" in _contents(saver, "globex")


@pytest.mark.parametrize("method", ["get_tuple", "list", "put", "put_writes"])
def test_config_naming_another_tenant_is_denied_and_recorded(call: Caller, method: str) -> None:
    saver = call.saver
    latest = saver.get_tuple(_cfg("shared", "acme"))
    cfg = {"configurable": {**latest.config["configurable"]}}  # carries tenant_id=acme
    args: dict[str, tuple] = {
        "get_tuple": (cfg,),
        "list": (cfg,),
        "put": (cfg, latest.checkpoint, latest.metadata, {}),
        "put_writes": (cfg, [("messages", "x")], "task"),
    }
    with tenant_scope("globex"), pytest.raises(AccessDenied) as info:
        call(method, *args[method])
    assert isinstance(info.value, PermissionError)
    events = saver.registry.list_events(kind="access_denied")
    assert [(e.actor, e.tenant) for e in events] == [("globex", "acme")]
    assert _contents(saver, "acme")[-1] == "Thanks, noted (turn 2): acme says two"


def test_list_before_another_tenants_checkpoint_is_denied(call: Caller) -> None:
    acme_latest = call.saver.get_tuple(_cfg("shared", "acme"))
    with pytest.raises(AccessDenied):
        call("list", _cfg("shared", "globex"), before=acme_latest.config)


def test_delete_thread_only_touches_own_tenant(call: Caller) -> None:
    with tenant_scope("globex"):
        call("delete_thread", "shared")
    assert _contents(call.saver, "globex") == []
    assert "acme says two" in _contents(call.saver, "acme")
    assert [t.tenant for t in call.saver.registry.list_threads()] == ["acme"]


def test_copy_thread_stays_in_own_tenant(call: Caller) -> None:
    with tenant_scope("globex"):
        call("copy_thread", "shared", "copy")
    assert "globex says two" in _contents(call.saver, "globex", "copy")
    assert _contents(call.saver, "acme", "copy") == []
    with tenant_scope("acme"):
        call("copy_thread", "missing", "copy2")
    assert _contents(call.saver, "acme", "copy2") == []


def test_prune_only_touches_own_tenant(call: Caller) -> None:
    before = len(call("list", _cfg("shared", "acme")))
    with tenant_scope("globex"):
        call("prune", ["shared"], strategy="keep_latest")
        assert len(call("list", _cfg("shared"))) == 1
        call("prune", ["shared"], strategy="delete")
        assert call("list", _cfg("shared")) == []
    assert len(call("list", _cfg("shared", "acme"))) == before > 1


def test_delete_for_runs_only_touches_own_tenant(call: Caller) -> None:
    acme_runs = {t.metadata.get("run_id") for t in call("list", _cfg("shared", "acme"))}
    assert "run-acme-one" in acme_runs
    with tenant_scope("globex"):
        call("delete_for_runs", ["run-acme-one", "run-globex-one"])
    assert "run-acme-one" in {t.metadata.get("run_id") for t in call("list", _cfg("shared", "acme"))}
    globex_runs = {t.metadata.get("run_id") for t in call("list", _cfg("shared", "globex"))}
    assert "run-globex-one" not in globex_runs and "run-globex-two" in globex_runs


def test_unscoped_list_none_raises_and_scoped_list_is_filtered(call: Caller) -> None:
    with pytest.raises(TenantRequired):
        call("list", None)
    with tenant_scope("acme"):
        rows = call("list", None)
    assert rows
    # tenant namespacing is invisible: no tenant_id in configs the caller did not put there
    assert all("tenant_id" not in t.config["configurable"] for t in rows)
    texts = [m.content for t in rows for m in t.checkpoint["channel_values"].get("messages", [])]
    assert texts and all("acme" in c for c in texts if "says" in c)
    assert not any("globex" in c for c in texts)
    with tenant_scope("acme"):
        assert len(call("list", None, limit=2)) == 2


@pytest.mark.parametrize("method", ["get_tuple", "put_writes", "delete_thread", "prune",
                                    "copy_thread", "delete_for_runs"])
def test_no_tenant_anywhere_raises(call: Caller, method: str) -> None:
    args: dict[str, tuple] = {
        "get_tuple": (_cfg("shared"),),
        "put_writes": ({"configurable": {"thread_id": "shared", "checkpoint_id": "x"}},
                       [("a", 1)], "task"),
        "delete_thread": ("shared",),
        "prune": (["shared"],),
        "copy_thread": ("shared", "other"),
        "delete_for_runs": (["run-acme-one"],),
    }
    with pytest.raises(TenantRequired):
        call(method, *args[method])


def test_default_tenant_applies_when_nothing_else_does(tmp_path: Path) -> None:
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                        default_tenant="solo")
    build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _cfg("t"))
    assert saver.get_tuple(_cfg("t", "solo")) is not None
    assert saver.get_tuple(_cfg("t", "other")) is None


@pytest.mark.parametrize("bad", [None, "", True, 3.5, "a\x00b", ["t"]])
def test_bad_thread_ids_are_refused_with_a_clear_error(bad) -> None:
    from langgraph_securesaver import ConfigurationError
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                        default_tenant="acme")
    with pytest.raises(ConfigurationError):
        saver.delete_thread(bad)
    with pytest.raises(ConfigurationError):
        saver.get_tuple({"configurable": {"thread_id": bad}})
    with pytest.raises(ConfigurationError):
        saver.copy_thread(bad, "target")
    with pytest.raises(ConfigurationError):
        saver.prune([bad])


def test_copy_thread_onto_itself_is_refused() -> None:
    from langgraph_securesaver import ConfigurationError
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                        default_tenant="acme")
    with pytest.raises(ConfigurationError, match="different"):
        saver.copy_thread("t", "t")


# --- returned configs are the inner saver's: tenant namespacing is invisible ---------------------

def _strip_ids(value: Any) -> Any:
    """Configs/metadata with the (run-specific) checkpoint ids and run ids blanked."""
    if isinstance(value, dict):
        return {k: ("<id>" if k in ("checkpoint_id", "run_id") else _strip_ids(v))
                for k, v in value.items()}
    return value


def _history(graph: Any, config: dict) -> list[tuple[Any, Any, Any]]:
    return [(_strip_ids(s.config), _strip_ids(s.parent_config), _strip_ids(s.metadata))
            for s in graph.get_state_history(config)]


@pytest.mark.parametrize("how", ["default", "scope"])
def test_configs_and_metadata_equal_the_raw_savers_when_the_tenant_is_not_in_the_config(
        how: str) -> None:
    raw_graph = build_chat_graph(InMemorySaver())
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                        default_tenant="solo" if how == "default" else None)
    graph = build_chat_graph(saver)
    cfg = _cfg("t1")

    def run(g: Any) -> None:
        for text in ("one", "two", "three"):  # later turns resume from a loaded checkpoint
            g.invoke({"messages": [HumanMessage(text)]}, cfg)

    run(raw_graph)
    if how == "scope":
        with tenant_scope("acme"):
            run(graph)
            history, state = _history(graph, cfg), graph.get_state(cfg)
            listed = list(saver.list(cfg))
            saved = saver.put(listed[0].config, listed[0].checkpoint, listed[0].metadata, {})
    else:
        run(graph)
        history, state = _history(graph, cfg), graph.get_state(cfg)
        listed = list(saver.list(cfg))
        saved = saver.put(listed[0].config, listed[0].checkpoint, listed[0].metadata, {})
    assert history == _history(raw_graph, cfg)
    assert "tenant_id" not in state.config["configurable"]
    for tup in listed:
        assert "tenant_id" not in tup.config["configurable"]
        assert "tenant_id" not in (tup.parent_config or {"configurable": {}})["configurable"]
        assert "tenant_id" not in tup.metadata  # never copied into a later checkpoint
    assert "tenant_id" not in saved["configurable"]
    assert set(saved["configurable"]) == {"thread_id", "checkpoint_ns", "checkpoint_id"}


def test_stream_checkpoints_match_get_state_under_a_default_tenant() -> None:
    """The upstream failure shape: the checkpoint event a run pauses on (built from the run
    config) equals get_state's config."""
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    class State(TypedDict):
        x: int

    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                        default_tenant="solo")
    graph = (StateGraph(State).add_node("one", lambda s: {"x": 1})
             .add_node("two", lambda s: {"x": 2}).add_edge(START, "one").add_edge("one", "two")
             .compile(checkpointer=saver, interrupt_after=["one"]))
    cfg = _cfg("t2")
    events = list(graph.stream({"x": 0}, cfg, stream_mode="checkpoints"))
    assert events[-1]["config"] == graph.get_state(cfg).config
    assert events[-1]["next"] == ["two"]


def test_returned_configs_never_gain_tenant_id_but_their_thread_id_carries_it(
        call: Caller) -> None:
    """A config that named the tenant gets back the inner saver's configs (no tenant_id: LangGraph
    would copy it into metadata and merge it into runs); their thread id carries the tenant, so
    a returned config reused as is (e.g. LangGraph's subgraph state configs) acts for it."""
    saver = call.saver
    tup = call("get_tuple", _cfg("shared", "acme"))
    listed = call("list", _cfg("shared", "acme"))
    saved = call("put", tup.config, tup.checkpoint, tup.metadata, {})
    for cfg in (tup.config, tup.parent_config, *(t.config for t in listed), saved):
        assert "tenant_id" not in cfg["configurable"]
        assert cfg["configurable"]["thread_id"] == "shared"
        assert saver.get_tuple(cfg) is not None  # unscoped: the id carries acme
    assert set(saved["configurable"]) == {"thread_id", "checkpoint_ns", "checkpoint_id"}
    with tenant_scope("globex"), pytest.raises(AccessDenied):
        saver.get_tuple(saved)
    # the same calls without it (tenant from a scope) return plain configs
    with tenant_scope("acme"):
        bare = call("get_tuple", _cfg("shared"))
        saved = call("put", bare.config, bare.checkpoint, bare.metadata, {})
        assert saver.get_tuple(saved).checkpoint["id"] == bare.checkpoint["id"]
    with pytest.raises(TenantRequired):
        saver.get_tuple(saved)
    with pytest.raises(TenantRequired):
        saver.get_tuple(bare.config)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_graph_run_draws_the_same_uuid4s_wrapped_as_raw(backend: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """LangGraph's message/tool ids come from uuid.uuid4 (its tests pin the sequence): a
    drop-in saver must not draw from it (issue 11's database id once did, on first use)."""
    import uuid
    from contextlib import ExitStack

    real = uuid.uuid4
    drawn: list[int] = []
    monkeypatch.setattr(uuid, "uuid4", lambda: drawn.append(1) or real())

    def run(saver: Any) -> int:
        drawn.clear()
        build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _cfg("u", "acme"))
        return len(drawn)

    with ExitStack() as stack:
        if backend == "memory":
            raw, wrapped = InMemorySaver(), SecureSaver(InMemorySaver(),
                                                        keyring=Keyring.generate(), redaction=None)
        else:
            from langgraph.checkpoint.sqlite import SqliteSaver
            raw = stack.enter_context(SqliteSaver.from_conn_string(str(tmp_path / "raw.db")))
            wrapped = stack.enter_context(SecureSaver.from_url(
                f"sqlite:///{tmp_path / 'w.db'}", keyring=Keyring.generate(), redaction=None))
        assert run(wrapped) == run(raw)
