"""A Starlette web app whose middleware sets the tenant from the authenticated identity.

Shows: the saver opened once in the app's lifespan (``SecureSaver.afrom_url``), a pure ASGI
middleware that authenticates the bearer token and runs the whole request inside
``tenant_scope(tenant)``, handlers that never pass a tenant themselves, and what happens when
a client tries to name another tenant (403, recorded in ``securesaver_events``). FastAPI is
Starlette underneath: ``app.add_middleware(TenantMiddleware)`` works the same way there.

Run:  python examples/starlette_app.py --demo     (drives the app in-process and exits; its
                                                  data goes to a fresh
                                                  ./.securesaver-examples/starlette_app_demo/)
      python examples/starlette_app.py            (serves on 127.0.0.1:8000; needs uvicorn;
                                                  keeps its data and keyring between runs in
                                                  ./.securesaver-examples/starlette_app/, or
                                                  uses $SECURESAVER_URL and
                                                  $SECURESAVER_MASTER_KEY)
      curl -H 'Authorization: Bearer token-acme' -d '{"text": "hi"}' localhost:8000/chat/t1
"""

import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from _fake_model import FakeChatModel, example_workspace
from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver, tenant_scope

TOKENS = {"token-acme": "acme", "token-globex": "globex"}   # your identity provider, really
# where the served app keeps its data (kept between runs, with its keyring beside it);
# --demo uses a fresh directory instead
DATA = Path.cwd() / ".securesaver-examples" / "starlette_app"
SETTINGS = {"url": os.environ.get("SECURESAVER_URL", f"sqlite:///{DATA / 'app.db'}"),
            "keyring": str(DATA / "keyring.json")}
model = FakeChatModel()   # needs no network or API key


class TenantMiddleware:
    """Authenticate, then run the request as the caller's tenant (401 without a valid token)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
        tenant = TOKENS.get(token)
        if tenant is None:
            return await JSONResponse({"error": "unauthenticated"}, 401)(scope, receive, send)
        with tenant_scope(tenant):          # every saver call in this request acts for `tenant`
            await self.app(scope, receive, send)


async def chat(request: Request) -> JSONResponse:
    body = await request.json()
    configurable = {"thread_id": request.path_params["thread_id"]}
    if "tenant_id" in body:                 # a client trying to choose its tenant
        configurable["tenant_id"] = body["tenant_id"]
    graph = request.app.state.graph
    try:
        out = await graph.ainvoke({"messages": [HumanMessage(body["text"])]},
                                  {"configurable": configurable})
    except AccessDenied:
        return JSONResponse({"error": "forbidden"}, 403)
    return JSONResponse({"reply": out["messages"][-1].content, "turns": len(out["messages"])})


async def threads(request: Request) -> JSONResponse:
    saver = request.app.state.saver
    ids = sorted({t.config["configurable"]["thread_id"] async for t in saver.alist(None)})
    return JSONResponse({"threads": ids})


@asynccontextmanager
async def lifespan(app: Starlette):
    if os.environ.get("SECURESAVER_MASTER_KEY"):
        keyring = Keyring.from_env()
    else:                                   # a local keyring file beside the database
        path = Path(SETTINGS["keyring"])
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            Keyring.generate().save(path)
        keyring = Keyring.from_file(path)
    async with SecureSaver.afrom_url(SETTINGS["url"], keyring=keyring) as saver:
        builder = StateGraph(MessagesState)
        builder.add_node("chat", lambda state: {"messages": [model.invoke(state["messages"])]})
        builder.add_edge(START, "chat")
        app.state.saver = saver
        app.state.graph = builder.compile(checkpointer=saver)
        yield


app = Starlette(routes=[Route("/chat/{thread_id}", chat, methods=["POST"]),
                        Route("/threads", threads)], lifespan=lifespan)
app.add_middleware(TenantMiddleware)


def demo() -> None:
    from starlette.testclient import TestClient
    workspace = example_workspace("starlette_app_demo")   # a fresh dir and keyring.json in it
    print(workspace.describe())
    SETTINGS.update(url=f"sqlite:///{workspace.path / 'app.db'}",
                    keyring=str(workspace.path / "keyring.json"))
    acme = {"Authorization": "Bearer token-acme"}
    globex = {"Authorization": "Bearer token-globex"}
    with TestClient(app) as client:
        print("no token:", client.post("/chat/t1", json={"text": "hi"}).status_code)
        print("acme:", client.post("/chat/t1", json={"text": "hello"}, headers=acme).json())
        print("acme again:", client.post("/chat/t1", json={"text": "more"}, headers=acme).json())
        print("globex, same thread id:",
              client.post("/chat/t1", json={"text": "hi"}, headers=globex).json())
        print("globex naming acme:", client.post(
            "/chat/t1", json={"text": "x", "tenant_id": "acme"}, headers=globex).status_code)
        print("acme threads:", client.get("/threads", headers=acme).json())
        denied = app.state.saver.events(kind="access_denied")
        print("denials recorded:", [(e.actor, e.tenant) for e in denied])


if __name__ == "__main__":
    if "--demo" in sys.argv:
        demo()
    else:
        import uvicorn
        uvicorn.run(app, host="127.0.0.1", port=8000)
