"""A long tool-heavy conversation on SQLite, one process per step (a restart between steps).

usage: budget_restart.py DB KEYRING OUT MODE [sync|async]
MODE "write": TURNS turns, each adding a large JSON tool output (default settings).
MODE "turn": a fresh process takes one more turn of the conversation; OUT gets the state.
MODE "hostile": a fresh process writes new content of the same size, in a new thread and by
editing the read-back messages in place; OUT gets what was stored, or "refused".
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.redaction import RedactionError

TURNS = 24
RECORDS = 500  # ~120 KB of JSON per tool output
THREAD = {"configurable": {"thread_id": "conv", "tenant_id": "acme"}}
WORDS = ("order shipped delayed refund invoice customer ticket escalated resolved pending "
         "warehouse priority contact address billing account").split()


def tool_output(turn: int, salt: str = "") -> str:
    """A CRM search result: records with names, e-mails, phone numbers and free-text notes."""
    rng = random.Random(f"{salt}{turn}")
    records = []
    for i in range(RECORDS):
        n = turn * 1000 + i
        records.append({
            "id": f"C{salt}{n:07d}", "name": f"Customer {n}",
            "email": f"customer.{salt}{n}@example.com",
            "phone": f"+1 415 555 {rng.randrange(1000, 9999)}",
            "note": " ".join(rng.choice(WORDS) for _ in range(14)) + f" ref {n * 7919}",
        })
    return json.dumps({"query": f"search {turn}", "results": records})


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build(saver: SecureSaver) -> Any:
    def tool(state: State) -> dict[str, Any]:
        turn = sum(1 for m in state["messages"] if m.type == "tool")
        return {"messages": [ToolMessage(tool_output(turn), tool_call_id=f"call-{turn}",
                                         id=f"tool-{turn}")]}

    builder = StateGraph(State)
    builder.add_node("tool", tool)
    builder.add_edge(START, "tool")
    return builder.compile(checkpointer=saver)


def state_of(tup: Any) -> list[dict[str, str]]:
    return [{"type": m.type, "id": m.id or "", "content": m.content}
            for m in tup.checkpoint["channel_values"]["messages"]]


def hostile_checkpoint(messages: list[Any]) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": messages}
    cp["channel_versions"] = {"messages": 1}
    return cp


def main() -> int:
    db, keyring, out, mode = sys.argv[1:5]
    flavour = sys.argv[5] if len(sys.argv) > 5 else "sync"
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.from_file(keyring)) as saver:
        graph = build(saver)
        if mode == "write":
            for turn in range(TURNS):
                graph.invoke({"messages": [HumanMessage(f"look up batch {turn}",
                                                        id=f"human-{turn}")]}, THREAD)
            return 0
        before = saver.get_tuple(THREAD) if flavour == "sync" else None
        result: dict[str, Any] = {}
        if mode == "turn":
            question = {"messages": [HumanMessage("and the next batch?", id="human-last")]}
            if flavour == "sync":
                graph.invoke(question, THREAD)
                after = saver.get_tuple(THREAD)
            else:
                async def turn() -> Any:
                    await graph.ainvoke(question, THREAD)
                    return await saver.aget_tuple(THREAD)
                after = asyncio.run(turn())
            result["state"] = state_of(after)
            result["before_id"] = before.checkpoint["id"] if before is not None else None
            result["after_id"] = after.checkpoint["id"]
        else:
            md: Any = {"source": "update", "step": 99, "parents": {}}
            fresh = {"configurable": {"thread_id": "fresh", "tenant_id": "acme",
                                      "checkpoint_ns": ""}}
            new = [ToolMessage(tool_output(t, salt="x"), tool_call_id=f"x-{t}", id=f"x-{t}")
                   for t in range(TURNS)]

            def edit(tup: Any) -> Any:  # the read-back messages, their content replaced
                msgs = tup.checkpoint["channel_values"]["messages"]
                for m in msgs:
                    if m.type == "tool":
                        m.content = tool_output(int(m.id.split("-")[1]), salt="y")
                return hostile_checkpoint(msgs)

            conv = {"configurable": {**THREAD["configurable"], "checkpoint_ns": ""}}
            # each attack on its own; OUT gets "refused" (RedactionError) or what was stored
            if flavour == "sync":
                for name, cfg, make in (("fresh", fresh, lambda: hostile_checkpoint(new)),
                                        ("edited", conv,
                                         lambda: edit(saver.get_tuple(conv)))):
                    try:
                        saver.put(cfg, make(), md, {"messages": 1})
                        result[name] = state_of(saver.get_tuple(cfg))
                    except RedactionError:
                        result[name] = "refused"
            else:
                async def attack() -> None:
                    try:
                        await saver.aput(fresh, hostile_checkpoint(new), md, {"messages": 1})
                        result["fresh"] = state_of(await saver.aget_tuple(fresh))
                    except RedactionError:
                        result["fresh"] = "refused"
                    try:
                        await saver.aput(conv, edit(await saver.aget_tuple(conv)), md,
                                         {"messages": 1})
                        result["edited"] = state_of(await saver.aget_tuple(conv))
                    except RedactionError:
                        result["edited"] = "refused"
                asyncio.run(attack())
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
