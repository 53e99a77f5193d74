"""agent -> tools (idempotent charge_card) -> agent -> send_receipt, for the recovery-lease tests.

The scripted model gives every AIMessage and every tool call a fresh id, as real providers do
(so a second copy of a run would charge under a new key and send a second receipt). Every
effect is recorded with its process id in the downstream SQLite file
``$LEASE_DOWNSTREAM`` (shared by all processes):

* ``model:<thread>``: one model call;
* ``tool_started:<thread>``: charge_card began (then sleeps ``$LEASE_TOOL_SECONDS`` and waits
  for the file ``$LEASE_TOOL_GATE``, if set, to exist);
* the ``requests`` / ``charges`` tables: the payment API (deduplicates by key);
* ``receipt:<thread>``: send_receipt ran to its end (outside any idempotent tool).

``$LEASE_MARK=node`` makes the first agent call opt the thread in with ``mark_recoverable()``
inside the node. ``$LEASE_CRASH`` = ``tool`` (before the charge) or ``agent`` (the model call
after the tool result) kills the process with ``os._exit``. While the file
``$LEASE_POISON`` exists, send_receipt opts in again (``mark_recoverable()``, the documented
way inside a node) and raises.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.config import get_config
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from langgraph_securesaver.idempotency import (
    current_idempotency_key,
    idempotent,
    mark_recoverable,
)
from tests.idem_scripts.scenario import Downstream


def _thread() -> str:
    return str(get_config()["configurable"]["thread_id"])


def build(saver: Any) -> Any:
    downstream = Downstream(os.environ["LEASE_DOWNSTREAM"])

    @tool
    @idempotent
    def charge_card(amount: int) -> str:
        """Charge the card."""
        downstream.effect(f"tool_started:{_thread()}")
        if os.environ.get("LEASE_CRASH") == "tool":
            os._exit(1)
        time.sleep(float(os.environ.get("LEASE_TOOL_SECONDS", "0")))
        gate = os.environ.get("LEASE_TOOL_GATE")
        deadline = time.monotonic() + 120
        while gate and not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # a long tool: runs until the test opens the gate
        return downstream.charge(current_idempotency_key(), amount)

    def agent(state: MessagesState) -> dict[str, Any]:
        thread = _thread()
        last = state["messages"][-1]
        if isinstance(last, ToolMessage) and os.environ.get("LEASE_CRASH") == "agent":
            os._exit(1)
        if os.environ.get("LEASE_MARK") == "node" and not isinstance(last, ToolMessage):
            mark_recoverable(saver=saver)
        downstream.effect(f"model:{thread}")
        if isinstance(last, ToolMessage):
            msg = AIMessage(content="charged", id=f"run-{uuid.uuid4()}")
        else:
            msg = AIMessage(content="", id=f"run-{uuid.uuid4()}", tool_calls=[
                {"name": "charge_card", "args": {"amount": 4200},
                 "id": f"call_{uuid.uuid4().hex[:12]}", "type": "tool_call"}])
        return {"messages": [msg]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else "send_receipt"

    def send_receipt(state: MessagesState) -> dict[str, Any]:
        thread = _thread()
        poison = os.environ.get("LEASE_POISON")
        if poison and Path(poison).exists():
            mark_recoverable(saver=saver)
            downstream.effect(f"receipt_failed:{thread}")
            raise RuntimeError("the receipt service is down")
        downstream.effect(f"receipt:{thread}")
        return {"messages": [AIMessage(content="receipt sent", id=f"run-{uuid.uuid4()}")]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([charge_card]))
    g.add_node("send_receipt", send_receipt)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", "send_receipt"])
    g.add_edge("tools", "agent")
    g.add_edge("send_receipt", END)
    return g.compile(checkpointer=saver)


def factory(saver: Any) -> Any:
    """For ``securesaver recover --graph tests.idem_scripts.lease_graph:factory``."""
    return build(saver)
