"""A realistic multi-turn support agent with a scripted chat model (no network).

Used by ``securesaver demo`` and the benchmarks (the tests and the examples have their own
models: tests/fake_agent.py, examples/_fake_model.py): a compiled LangGraph graph with a
``messages`` channel, a ToolNode, a str channel and an int channel, so every kind of state
SecureSaver protects is exercised.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

logger = logging.getLogger(__name__)

_ORDER = re.compile(r"order\s+(?:is\s+|number\s+|#)?([A-Z]{2,}-[A-Z0-9-]+)", re.IGNORECASE)
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")


class SupportState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    customer_email: str
    turns: int


@tool
def lookup_order(order_id: str, email: str = "") -> str:
    """Look up an order's shipping status."""
    return f"Order {order_id} for {email or 'the customer'} shipped yesterday."


class ScriptedChatModel(BaseChatModel):
    """A deterministic chat model: asks for a tool when an order is mentioned, else answers."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        last = messages[-1]
        turn = sum(isinstance(m, HumanMessage) for m in messages)
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"Here is what I found: {last.content}")
        else:
            text = str(last.content)
            order = _ORDER.search(text)
            email = _EMAIL.search(text)
            if order:
                reply = AIMessage(content="", tool_calls=[{
                    "name": "lookup_order",
                    "args": {"order_id": order.group(1), "email": email.group(0) if email else ""},
                    "id": f"call_{turn}_{order.group(1)}",
                }])
            else:
                reply = AIMessage(content=f"Thanks, noted (turn {turn}): {text}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def build_support_graph(checkpointer: BaseCheckpointSaver | None, *,
                        pause_before_tools: bool = False) -> Any:
    """The compiled demo agent (optionally pausing before tools, to show a resume)."""
    model = ScriptedChatModel()

    def agent(state: SupportState) -> dict[str, Any]:
        reply = model.invoke(state["messages"])
        update: dict[str, Any] = {"messages": [reply], "turns": state.get("turns", 0) + 1}
        for message in reversed(state["messages"]):
            if isinstance(message, HumanMessage):
                found = _EMAIL.search(str(message.content))
                if found:
                    update["customer_email"] = found.group(0)
                break
        return update

    builder = StateGraph(SupportState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([lookup_order]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer,
                           interrupt_before=["tools"] if pause_before_tools else None)


