"""An async service on PostgreSQL: one SecureSaver shared by concurrent requests of two tenants.

Shows: ``SecureSaver.afrom_url`` (AsyncPostgresSaver on a psycopg pool, tables created on
first use), ``ainvoke`` from many concurrent tasks, per-request tenants, and an ``alist`` that
only ever sees the caller's tenant. Needs the ``postgres`` extra and a server.

Run:  python examples/async_postgres_service.py [POSTGRES_URL]
      Without a URL it uses its own schema ``securesaver_example`` on
      postgresql://postgres@127.0.0.1:5432/test (dropped and recreated on every run, with a
      fresh keyring in ./.securesaver-examples/async_postgres_service/). With a URL (or
      $SECURESAVER_URL) it uses that database and keeps what it wrote; the keyring is
      $SECURESAVER_MASTER_KEY or ./.securesaver-examples/async_postgres_service/keyring.json,
      created on the first run and reused afterwards.
"""

import asyncio
import os
import sys
from pathlib import Path

from _fake_model import FakeChatModel, example_workspace
from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_securesaver import Keyring, KeyringMismatch, SecureSaver, tenant_scope

model = FakeChatModel()   # needs no network or API key


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


SERVER = "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = os.environ.get("SECURESAVER_EXAMPLE_SCHEMA", "securesaver_example")
DATA = Path.cwd() / ".securesaver-examples" / "async_postgres_service"


async def fresh_schema() -> tuple[str, Keyring]:
    """The default: this example's own schema, dropped and recreated, and a new keyring."""
    import psycopg
    from psycopg import sql

    workspace = example_workspace("async_postgres_service")
    print(workspace.describe())
    async with await psycopg.AsyncConnection.connect(SERVER, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(SCHEMA)))
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    print(f"schema: {SCHEMA} (starting clean)")
    return f"{SERVER}?options=-csearch_path%3D{SCHEMA}", workspace.keyring


def kept_keyring() -> Keyring:
    """For a database of yours: the environment's keyring, or one kept beside the data."""
    if os.environ.get("SECURESAVER_MASTER_KEY"):
        return Keyring.from_env()
    path = DATA / "keyring.json"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        Keyring.generate().save(path)
    print(f"keyring: {path}")
    return Keyring.from_file(path)


async def main(url: str | None) -> None:
    if url is None:
        url, keyring = await fresh_schema()
    else:
        keyring = kept_keyring()
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
    given = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SECURESAVER_URL")
    try:
        asyncio.run(main(given))
    except KeyringMismatch as exc:          # a keyring that is not this database's
        sys.exit(f"error: {exc}")
