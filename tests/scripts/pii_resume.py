"""Run a tool call whose arguments hold an email, crashing inside the tool the first time.

usage: pii_resume.py DB KEYRING OUT {start|resume}
"start" runs the graph; the tool kills the process (os._exit) before finishing.
"resume" resumes the thread from its checkpoint; the tool writes the email it got to OUT.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from langgraph_securesaver import Keyring, SecureSaver

EMAIL = "zhang.wei+vip@example.cn"


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def main() -> int:
    db, keyring, out, mode = sys.argv[1:5]

    @tool
    def send_receipt(email: str) -> str:
        """Send the receipt."""
        if mode == "start":
            os._exit(17)  # the process dies inside the tool call
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(email)
        return "sent"

    def model(state: State) -> dict[str, Any]:
        if any(m.type == "tool" for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        return {"messages": [AIMessage("", tool_calls=[{
            "name": "send_receipt", "args": {"email": EMAIL}, "id": "call-1"}])]}

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([send_receipt]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges(
        "model", lambda s: "tools" if s["messages"][-1].tool_calls else "__end__")
    builder.add_edge("tools", "model")
    config = {"configurable": {"thread_id": "t", "tenant_id": "acme"}}
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.from_file(keyring)) as saver:
        graph = builder.compile(checkpointer=saver)
        if mode == "start":
            graph.invoke({"messages": [HumanMessage(f"please email me at {EMAIL}")]}, config,
                         durability="sync")
        else:
            graph.invoke(None, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
