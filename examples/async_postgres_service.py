"""An async service on PostgreSQL: one SecureSaver shared by concurrent requests of two tenants.

Shows: ``SecureSaver.afrom_url`` (AsyncPostgresSaver on a psycopg pool, tables created on
first use), ``ainvoke`` from many concurrent tasks, per-request tenants, and an ``alist`` that
only ever sees the caller's tenant. Needs the ``postgres`` extra and a server.

Run:  SECURESAVER_MASTER_KEY=... python examples/async_postgres_service.py [POSTGRES_URL]
      (default URL: $SECURESAVER_URL or postgresql://postgres@127.0.0.1:5432/test; without
      SECURESAVER_MASTER_KEY a throw-away key is used and the data is unreadable afterwards)
"""

import asyncio
import os
import sys

from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_securesaver import Keyring, KeyringRequired, SecureSaver, tenant_scope
from langgraph_securesaver.demo import ScriptedChatModel

model = ScriptedChatModel()


async def chat(state: MessagesState) -> dict:
    return {"messages": [await model.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("chat", chat)
builder.add_edge(START, "chat")


async def handle_request(graph, tenant: str, thread: str, text: str) -> str:
    """What a web handler does: the tenant comes from the authenticated caller."""
    with tenant_scope(tenant):
        out = await graph.ainvoke({"messages": [HumanMessage(text)]},
                                  {"configurable": {"thread_id": thread}})
    return out["messages"][-1].content


async def main(url: str) -> None:
    try:
        keyring = Keyring.from_env()
    except KeyringRequired:
        print("SECURESAVER_MASTER_KEY is not set: using a throw-away key")
        keyring = Keyring.generate()
    async with SecureSaver.afrom_url(url, keyring=keyring) as saver:
        graph = builder.compile(checkpointer=saver)
        requests = [(tenant, f"ticket-{n}", f"{tenant} request {n}")
                    for tenant in ("acme", "globex") for n in range(5)]
        replies = await asyncio.gather(*(handle_request(graph, *r) for r in requests))
        print("replies:", len(replies))
        for tenant in ("acme", "globex"):
            with tenant_scope(tenant):
                threads = {t.config["configurable"]["thread_id"] async for t in saver.alist(None)}
            print(f"{tenant} sees {len(threads)} threads")


if __name__ == "__main__":
    default = os.environ.get("SECURESAVER_URL", "postgresql://postgres@127.0.0.1:5432/test")
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else default))
