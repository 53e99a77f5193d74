"""The example's graph: a support agent that asks a human before issuing a refund.

A scripted chat model (no network, no API key) answers and looks orders up with a tool; a
message that mentions "refund" pauses the run with ``interrupt()`` until the caller resumes it
with ``Command(resume=...)``.
The server compiles it with the checkpointer from langgraph.json (SecureSaver).
"""

import re
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt

_ORDER = re.compile(r"order\s+([A-Z]{2,}-[A-Z0-9-]+)", re.IGNORECASE)


@tool
def lookup_order(order_id: str) -> str:
    """Look up an order's shipping status."""
    return f"Order {order_id} shipped yesterday."


class ScriptedChatModel(BaseChatModel):
    """Replace by your model: looks an order up when one is named, else acknowledges."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"Here is what I found: {last.content}")
        elif order := _ORDER.search(str(last.content)):
            reply = AIMessage(content="", tool_calls=[{
                "name": "lookup_order", "args": {"order_id": order.group(1)},
                "id": f"call_{len(messages)}"}])
        else:
            reply = AIMessage(content="Thanks, noted.")
        return ChatResult(generations=[ChatGeneration(message=reply)])


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    refund: str


model = ScriptedChatModel()


def agent(state: State) -> dict[str, Any]:
    return {"messages": [model.invoke(state["messages"])]}


def route(state: State) -> str:
    if getattr(state["messages"][-1], "tool_calls", None):
        return "tools"
    last_human = next(m for m in reversed(state["messages"]) if isinstance(m, HumanMessage))
    return "refund" if "refund" in str(last_human.content).lower() else END


def refund(state: State) -> dict[str, Any]:
    answer = interrupt({"question": "Approve this refund?"})
    decision = "approved" if str(answer).lower() in ("yes", "approve", "approved") else "denied"
    return {"refund": decision, "messages": [AIMessage(content=f"Refund {decision}.")]}


builder = StateGraph(State)
builder.add_node("agent", agent)
builder.add_node("tools", ToolNode([lookup_order]))
builder.add_node("refund", refund)
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", route, ["tools", "refund", END])
builder.add_edge("tools", "agent")
builder.add_edge("refund", END)
graph = builder.compile()
