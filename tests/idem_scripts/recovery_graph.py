"""A two-node graph for the stalled-run recovery tests.

``work`` fails while the file named by ``$IDEM_RECOVERY_FAIL_FLAG`` exists (the "crash" that
leaves the thread stalled with ``next == ("work",)``) and otherwise records one effect per run
in the downstream SQLite file ``$IDEM_RECOVERY_DOWNSTREAM``.
"""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Annotated, Any

from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict

from tests.idem_scripts.scenario import Downstream


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    ask: bool


def build(saver: Any, downstream_path: str, fail_flag: str | None) -> Any:
    downstream = Downstream(downstream_path)

    def prepare(state: State) -> State:
        return {"log": ["prepared"]}

    def work(state: State) -> State:
        if state.get("ask"):
            interrupt("approve?")
        if fail_flag and Path(fail_flag).exists():
            raise RuntimeError("worker crashed (token=abc123)")
        thread = get_config()["configurable"]["thread_id"]
        downstream.effect(f"work:{thread}")
        return {"log": ["worked"]}

    g = StateGraph(State)
    g.add_node("prepare", prepare)
    g.add_node("work", work)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=saver)


def factory(saver: Any) -> Any:
    """For recover_main("...:factory"): configuration comes from the environment."""
    return build(saver, os.environ["IDEM_RECOVERY_DOWNSTREAM"],
                 os.environ.get("IDEM_RECOVERY_FAIL_FLAG"))


def abuild(saver: Any, downstream_path: str, fail_flag: str | None) -> Any:
    """The same graph with async-only nodes (they cannot run under ``invoke``)."""
    downstream = Downstream(downstream_path)

    async def prepare(state: State) -> State:
        return {"log": ["prepared"]}

    async def work(state: State) -> State:
        import asyncio
        if fail_flag and Path(fail_flag).exists():
            raise RuntimeError("worker crashed (token=abc123)")
        thread = get_config()["configurable"]["thread_id"]
        await asyncio.to_thread(downstream.effect, f"work:{thread}")
        return {"log": ["worked"]}

    g = StateGraph(State)
    g.add_node("prepare", prepare)
    g.add_node("work", work)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=saver)


def afactory(saver: Any) -> Any:
    """For ``securesaver recover`` on an async URL."""
    return abuild(saver, os.environ["IDEM_RECOVERY_DOWNSTREAM"],
                  os.environ.get("IDEM_RECOVERY_FAIL_FLAG"))
