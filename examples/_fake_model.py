"""What the examples share, and nothing of langgraph-securesaver itself: a chat model that
needs no network and no API key (replace it by your real model), a tool it calls, a one-node
chat graph, and a fresh data directory with a keyring file for each example.

Examples import it as ``from _fake_model import ...``: Python puts the directory of the script
it runs (examples/) first on ``sys.path``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_securesaver import Keyring

_ORDER = re.compile(r"order\s+(?:is\s+|number\s+|#)?([A-Z]{2,}-[A-Z0-9-]+)", re.IGNORECASE)

#: where the examples keep their data, relative to the directory they are run from
EXAMPLES_DIR = ".securesaver-examples"


@tool
def lookup_order(order_id: str) -> str:
    """Look up an order's shipping status."""
    return f"Order {order_id} shipped yesterday."


class FakeChatModel(BaseChatModel):
    """Deterministic: asks for ``lookup_order`` when the user names an order, answers with the
    tool's result, and otherwise acknowledges the user's message."""

    @property
    def _llm_type(self) -> str:
        return "fake-example-model"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> FakeChatModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        turn = sum(isinstance(m, HumanMessage) for m in messages)
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"Here is what I found: {last.content}")
        elif order := _ORDER.search(str(last.content)):
            reply = AIMessage(content="", tool_calls=[{
                "name": "lookup_order", "args": {"order_id": order.group(1)},
                "id": f"call_{turn}_{order.group(1)}"}])
        else:
            reply = AIMessage(content=f"Thanks, noted (turn {turn}): {last.content}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def chat_graph(checkpointer: Any) -> Any:
    """A one-node chat graph on ``MessagesState``, compiled with ``checkpointer``."""
    model = FakeChatModel()
    builder = StateGraph(MessagesState)
    builder.add_node("chat", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_edge(START, "chat")
    return builder.compile(checkpointer=checkpointer)


class Workspace(NamedTuple):
    """An example's own data directory and the keyring file in it."""

    path: Path
    keyring: Keyring
    removed: bool

    def describe(self) -> str:
        return f"data: {self.path} ({'old run removed, ' if self.removed else ''}starting clean)"


def example_workspace(name: str) -> Workspace:
    """``./.securesaver-examples/<name>/``, emptied, with a new ``keyring.json`` (mode 0600).

    Examples start clean on every run: data kept from one run to the next would need that
    run's keyring. Only this example's own directory is removed.
    """
    where = Path.cwd() / EXAMPLES_DIR / name
    removed = where.exists()
    if removed:
        shutil.rmtree(where)
    where.mkdir(parents=True)
    Keyring.generate().save(where / "keyring.json")     # what `securesaver keygen --out` does
    return Workspace(where, Keyring.from_file(where / "keyring.json"), removed)
