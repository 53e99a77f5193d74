"""The production recipe: FastAPI on async PostgreSQL with SecureSaver and SecureStore.

Shows: ``asecure_pair(url, keyring=...)`` opened once in the app's lifespan (an
``AsyncPostgresSaver`` and an ``AsyncPostgresStore`` on one psycopg pool each, both set up,
sharing keys, registry and redactor); a FastAPI dependency that authenticates the bearer token
and returns the caller's tenant; handlers that run inside ``tenant_scope(tenant)`` and never
take a tenant from the request body; LangChain's ``create_agent`` with a refund tool made
idempotent (a retried request refunds once: the payment provider receives the same
idempotency key); per-tenant memories in the SecureStore (an e-mail in them is redacted before
encryption); and the pruner run as cron runs it, with nothing on stderr:

    */10 * * * * securesaver prune --url "$SECURESAVER_URL" --json >> /var/log/prune.json

(``$SECURESAVER_MASTER_KEY`` in cron's environment, or ``--keyring /path/keyring.json``.)

Run:  python examples/fastapi_postgres.py --demo
          drives the app in-process with FastAPI's TestClient and exits; its own schema
          ``securesaver_fastapi`` on postgresql://postgres@127.0.0.1:5432/test (dropped and
          recreated) and a fresh keyring in ./.securesaver-examples/fastapi_postgres/
      SECURESAVER_URL=postgresql://... SECURESAVER_MASTER_KEY=... \\
          uvicorn --app-dir examples fastapi_postgres:app
      curl -H 'Authorization: Bearer token-acme' -H 'Content-Type: application/json' \\
          -d '{"text": "please refund order ACME-1"}' localhost:8000/threads/t1/messages
"""

import json
import os
import re
import subprocess
import sys
import uuid
from contextlib import asynccontextmanager
from typing import Annotated

from _fake_model import example_workspace
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import BaseModel

from langgraph_securesaver import AccessDenied, Keyring, tenant_scope
from langgraph_securesaver.idempotency import IdempotentToolCalls, current_idempotency_key
from langgraph_securesaver.store import asecure_pair

# -- authentication: your identity provider maps a token to a user of one tenant -------------
TOKENS = {"token-acme": "acme", "token-globex": "globex"}


def current_tenant(authorization: Annotated[str, Header()] = "") -> str:
    """The authenticated caller's tenant (401 without a valid token)."""
    tenant = TOKENS.get(authorization.removeprefix("Bearer "))
    if tenant is None:
        raise HTTPException(401, "unauthenticated")
    return tenant


Tenant = Annotated[str, Depends(current_tenant)]


# -- the agent: a refund tool the payment provider deduplicates by idempotency key -----------
PAYMENTS: dict[str, str] = {}       # the provider's records: idempotency key -> order
ATTEMPTS: list[str] = []            # every key the provider was called with
FAIL_ONCE = ["timeout"]             # the first call times out after the provider acted


@tool
def issue_refund(order_id: str) -> str:
    """Refund an order."""
    key = current_idempotency_key()     # stable across retries of this tool call
    ATTEMPTS.append(key)
    PAYMENTS.setdefault(key, order_id)  # what a provider does with an Idempotency-Key header
    if FAIL_ONCE:
        FAIL_ONCE.pop()
        raise ConnectionError("payment provider timed out")
    return f"refunded {order_id}"


class IdempotentTools(AgentMiddleware):
    """Every tool call of the agent goes through IdempotentToolCalls (its store: the saver)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = IdempotentToolCalls()

    def wrap_tool_call(self, request, handler):
        return self.calls.wrap(request, handler)

    async def awrap_tool_call(self, request, handler):
        return await self.calls.awrap(request, handler)


class RefundModel(BaseChatModel):
    """Replace by your model: asks for a refund when one is requested, else acknowledges."""

    @property
    def _llm_type(self) -> str:
        return "refund-script"

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        last = messages[-1]
        order = re.search(r"refund order (\S+)", str(last.content))
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"done: {last.content}")
        elif order:
            reply = AIMessage(content="", tool_calls=[{
                "name": "issue_refund", "args": {"order_id": order.group(1)},
                "id": f"call_refund_{order.group(1)}"}])
        else:
            reply = AIMessage(content=f"noted: {last.content}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


# -- the app ---------------------------------------------------------------------------------
SETTINGS = {"url": os.environ.get("SECURESAVER_URL", ""), "keyring": None}


@asynccontextmanager
async def lifespan(app: FastAPI):
    keyring = SETTINGS["keyring"] or Keyring.from_env()     # SECURESAVER_MASTER_KEY
    async with asecure_pair(SETTINGS["url"], keyring=keyring) as (saver, store):
        app.state.saver, app.state.store = saver, store
        app.state.agent = create_agent(RefundModel(), tools=[issue_refund],
                                       middleware=[IdempotentTools()],
                                       checkpointer=saver, store=store)
        yield


app = FastAPI(lifespan=lifespan)


class Message(BaseModel):
    text: str


class Memory(BaseModel):
    text: str


@app.post("/threads/{thread_id}/messages")
async def post_message(thread_id: str, message: Message, tenant: Tenant, request: Request):
    with tenant_scope(tenant):          # every saver and store call acts for this tenant
        try:
            out = await request.app.state.agent.ainvoke(
                {"messages": [("user", message.text)]}, {"configurable": {"thread_id": thread_id}})
        except ConnectionError as exc:  # the run stopped at its last checkpoint
            raise HTTPException(503, f"try again: {exc}") from None
    return {"reply": out["messages"][-1].content}


@app.post("/threads/{thread_id}/retry")
async def retry(thread_id: str, tenant: Tenant, request: Request):
    """Resume a run that failed half-way (what a client's retry, or a recoverer, does)."""
    with tenant_scope(tenant):
        out = await request.app.state.agent.ainvoke(
            None, {"configurable": {"thread_id": thread_id}})
    return {"reply": out["messages"][-1].content}


@app.get("/threads/{thread_id}")
async def get_thread(thread_id: str, tenant: Tenant, request: Request):
    with tenant_scope(tenant):
        try:
            state = await request.app.state.agent.aget_state(
                {"configurable": {"thread_id": thread_id}})
        except AccessDenied:            # a thread id of another tenant is simply not found
            raise HTTPException(404, "no such thread") from None
    return {"messages": [m.content for m in state.values.get("messages", [])]}


@app.post("/memories")
async def remember(memory: Memory, tenant: Tenant, request: Request):
    with tenant_scope(tenant):
        await request.app.state.store.aput(("memories",), uuid.uuid4().hex, {"text": memory.text})
    return {"ok": True}


@app.get("/memories")
async def memories(tenant: Tenant, request: Request):
    with tenant_scope(tenant):
        items = await request.app.state.store.asearch(("memories",))
    return {"memories": [item.value["text"] for item in items]}


# -- the demo run ----------------------------------------------------------------------------
SERVER = "postgresql://postgres@127.0.0.1:5432/test"
SCHEMA = os.environ.get("SECURESAVER_EXAMPLE_SCHEMA", "securesaver_fastapi")


def fresh_schema() -> str:
    import psycopg
    from psycopg import sql
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(SCHEMA)))
    print(f"schema: {SCHEMA} (starting clean)")
    return f"{SERVER}?options=-csearch_path%3D{SCHEMA}"


def stored_in_clear(url: str, needle: str) -> bool:
    """Whether any row of any table of the schema holds ``needle`` as text."""
    import psycopg
    with psycopg.connect(url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (SCHEMA,))]
        return any(conn.execute(f'SELECT 1 FROM "{t}" AS r WHERE r::text LIKE %s LIMIT 1',
                                (f"%{needle}%",)).fetchone() for t in tables)


def run_pruner_as_cron_does(url: str, keyring_file: str) -> None:
    """``securesaver prune --json`` in a subprocess: exit code, stdout JSON, empty stderr."""
    done = subprocess.run([sys.executable, "-m", "langgraph_securesaver.cli", "prune",
                           "--url", url, "--keyring", keyring_file, "--json"],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    print("pruner exit code:", done.returncode, "threads deleted:", len(report["deleted"]),
          "stderr bytes:", len(done.stderr))


def demo() -> None:
    from fastapi.testclient import TestClient
    workspace = example_workspace("fastapi_postgres")     # a fresh dir and keyring.json in it
    print(workspace.describe())
    SETTINGS.update(url=fresh_schema(), keyring=workspace.keyring)
    acme = {"Authorization": "Bearer token-acme"}
    globex = {"Authorization": "Bearer token-globex"}
    email = "li.wei@example.com"
    with TestClient(app) as client:
        print("no token:", client.post("/threads/t1/messages", json={"text": "hi"}).status_code)
        print("acme:", client.post("/threads/t1/messages", json={"text": "hello"},
                                   headers=acme).json()["reply"])
        first = client.post("/threads/t1/messages", json={"text": "please refund order A-17"},
                            headers=acme)
        print("refund, first try:", first.status_code)
        print("refund, retried:", client.post("/threads/t1/retry", headers=acme).json()["reply"])
        # the same thread id names globex's own (empty) thread, never acme's
        print("globex reads t1:", client.get("/threads/t1", headers=globex).json())
        client.post("/memories", json={"text": f"invoices to {email}"}, headers=acme)
        print("acme memories:", client.get("/memories", headers=acme).json()["memories"])
        print("globex memories:", client.get("/memories", headers=globex).json()["memories"])
    print("provider calls:", len(ATTEMPTS), "refunds made:", len(PAYMENTS))
    print("e-mail stored in clear:", stored_in_clear(SETTINGS["url"], email))
    run_pruner_as_cron_does(SETTINGS["url"], str(workspace.path / "keyring.json"))


if __name__ == "__main__":
    if "--demo" in sys.argv:
        demo()
    else:
        import uvicorn
        SETTINGS["url"] = SETTINGS["url"] or sys.exit("set SECURESAVER_URL")
        uvicorn.run(app, host="127.0.0.1", port=8000)
