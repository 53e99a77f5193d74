"""Tenant isolation for every method, sync and async, on InMemory and SQLite savers."""

from __future__ import annotations

import asyncio
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
from langgraph_securesaver.demo import build_chat_graph


def _cfg(thread: str, tenant: str | None = None) -> dict:
    conf: dict[str, Any] = {"thread_id": thread}
    if tenant:
        conf["tenant_id"] = tenant
    return {"configurable": conf}


@pytest.fixture(params=["memory", "sqlite"])
def saver(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        yield SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
        return
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}", keyring=Keyring.generate(),
                              redaction=None) as s:
        yield s


def _seed(saver: SecureSaver) -> None:
    graph = build_chat_graph(saver)
    for tenant in ("acme", "globex"):
        for text in ("one", "two"):
            graph.invoke({"messages": [HumanMessage(f"{tenant} says {text}")]},
                         {"configurable": {"thread_id": "shared", "tenant_id": tenant},
                          "metadata": {"run_id": f"run-{tenant}-{text}"}})


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
    _seed(saver)
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
    assert rows and {t.config["configurable"]["tenant_id"] for t in rows} == {"acme"}
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
