"""The email + charge scenario shared by the in-process tests and the crash subprocesses.

* ``Downstream``: a fake email service (no deduplication: every call sends a mail) and a fake
  payment API that deduplicates by Idempotency-Key, both recording every request with its key
  in an SQLite file, so separate processes see the same history.
* ``ScriptedChatModel``: no network; the first turn asks for ``send_email`` and
  ``charge_card`` in ONE AIMessage, the turn after the tool results answers "done".
* ``build_graph``: agent -> ToolNode -> agent, with the tools made idempotent either by
  ``@idempotent`` under ``@tool`` ("decorator") or by ``IdempotentToolCalls`` ("wrapper"),
  or not at all ("plain", the control that shows the duplicate).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_securesaver.idempotency import (
    IdempotencyStore,
    IdempotentToolCalls,
    current_idempotency_key,
    idempotent,
)


class Downstream:
    """Fake external services over an SQLite file (safe across threads and processes)."""

    def __init__(self, path: str) -> None:
        self.path = path
        with self._conn() as conn:
            conn.executescript(
                """
                CREATE TABLE IF NOT EXISTS requests (
                    id INTEGER PRIMARY KEY AUTOINCREMENT, service TEXT, key TEXT, args TEXT,
                    pid INTEGER,
                    at REAL DEFAULT ((julianday('now') - 2440587.5) * 86400.0));
                CREATE TABLE IF NOT EXISTS emails (id INTEGER PRIMARY KEY AUTOINCREMENT,
                    key TEXT, recipient TEXT);
                CREATE TABLE IF NOT EXISTS charges (key TEXT PRIMARY KEY, amount INTEGER);
                CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT,
                    label TEXT, key TEXT, pid INTEGER);
                """)

    def _conn(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def send_email(self, key: str, recipient: str) -> str:
        with self._conn() as conn:
            conn.execute("INSERT INTO requests(service, key, args, pid) VALUES (?,?,?,?)",
                         ("email", key, recipient, os.getpid()))
            conn.execute("INSERT INTO emails(key, recipient) VALUES (?,?)", (key, recipient))
        return f"email sent to {recipient}"

    def charge(self, key: str, amount: int) -> str:
        with self._conn() as conn:
            conn.execute("INSERT INTO requests(service, key, args, pid) VALUES (?,?,?,?)",
                         ("charge", key, str(amount), os.getpid()))
            # the payment API deduplicates by Idempotency-Key
            conn.execute("INSERT OR IGNORE INTO charges(key, amount) VALUES (?,?)", (key, amount))
        return f"charged {amount}"

    def effect(self, label: str, key: str | None = None) -> int:
        with self._conn() as conn:
            conn.execute("INSERT INTO effects(label, key, pid) VALUES (?,?,?)",
                         (label, key, os.getpid()))
            return int(conn.execute("SELECT count(*) FROM effects WHERE label=?",
                                    (label,)).fetchone()[0])

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            return list(conn.execute(sql, args).fetchall())


class ScriptedChatModel(BaseChatModel):
    """Human message -> one AIMessage with two tool calls; tool results -> "done"."""

    recipient: str = "ada@example.com"
    amount: int = 4200

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, HumanMessage):
            turn = sum(isinstance(m, HumanMessage) for m in messages)
            msg = AIMessage(content="", tool_calls=[
                {"name": "send_email", "args": {"to": self.recipient}, "id": f"call_email_{turn}",
                 "type": "tool_call"},
                {"name": "charge_card", "args": {"amount": self.amount},
                 "id": f"call_charge_{turn}", "type": "tool_call"},
            ])
        elif isinstance(last, ToolMessage):
            msg = AIMessage(content="done")
        else:
            msg = AIMessage(content="?")
        return ChatResult(generations=[ChatGeneration(message=msg)])


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


def build_graph(saver: Any, downstream: Downstream, *, mode: str = "decorator",
                crash_during_charge: bool = False, **policy_options: Any) -> Any:
    """The compiled agent graph; ``crash_during_charge`` kills the process inside the charge
    after the payment API received it (and after the email's result was recorded).

    ``policy_options`` go to ``@idempotent`` / ``IdempotentToolCalls``; none by default (the
    headline scenario runs on the default policy)."""
    store = IdempotencyStore.for_saver(saver)

    def current_key() -> str:
        return "no-key" if mode == "plain" else current_idempotency_key()

    def charge_impl(amount: int) -> str:
        key = current_key()
        if crash_during_charge:
            def email_recorded() -> bool:
                if mode == "plain":
                    return bool(downstream.rows("SELECT 1 FROM emails"))
                return any(r.name == "send_email" and r.state == "completed"
                           for r in store.list_records(_tenant_of(saver)))
            wait_for(email_recorded)
            downstream.charge(key, amount)
            os._exit(1)  # the response never comes back
        return downstream.charge(key, amount)

    def email_impl(to: str) -> str:
        return downstream.send_email(current_key(), to)

    if mode == "decorator":
        @tool
        @idempotent(**policy_options)
        def send_email(to: str) -> str:
            """Send an email."""
            return email_impl(to)

        @tool
        @idempotent(**policy_options)
        def charge_card(amount: int) -> str:
            """Charge the card."""
            return charge_impl(amount)

        tool_node = ToolNode([send_email, charge_card])
    else:
        @tool
        def send_email(to: str) -> str:
            """Send an email."""
            return email_impl(to)

        @tool
        def charge_card(amount: int) -> str:
            """Charge the card."""
            return charge_impl(amount)

        if mode == "wrapper":
            wrapper = IdempotentToolCalls(**policy_options)
            tool_node = ToolNode([send_email, charge_card], wrap_tool_call=wrapper.wrap,
                                 awrap_tool_call=wrapper.awrap)
        else:  # "plain": no idempotency at all (the control)
            tool_node = ToolNode([send_email, charge_card])

    model = ScriptedChatModel()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", tool_node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


def _tenant_of(saver: Any) -> str:
    return str(saver.default_tenant or "acme")
