"""DeltaChannel threads: state rebuilt through encrypted history, keep_latest refused,
copy_thread keeps the whole chain (the base-class warnings)."""

from __future__ import annotations

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
