"""LangChain's agent (``create_agent``) with memory in a SecureStore beside its SecureSaver.

Shows: ``secure_pair(url)`` (a saver and a store on one SQLite file, sharing keys, registry
and redactor) and LangChain's ``create_agent(model, tools, checkpointer=saver, store=store)``.
A scripted model (no network) has the agent remember a fact about the user in one thread and
recall it in another; a second tenant recalls nothing; the database file holds none of the
fact, and the e-mail address in it reaches the embedder only as a redaction token. By default
every run starts clean under ./.securesaver-examples/react_agent_store/; given DB_PATH, the
database and its keyring beside it (DB_PATH.keyring.json) are kept, and a second run recalls
both runs' facts.

Run:  python examples/react_agent_store.py [DB_PATH]
"""

import hashlib
import sys
import uuid
from pathlib import Path
from typing import Annotated

from _fake_model import example_workspace
from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.prebuilt import InjectedStore
from langgraph.store.base import BaseStore

from langgraph_securesaver import Keyring, tenant_scope
from langgraph_securesaver.store import secure_pair

FACT = "prefers invoices by e-mail to mo.rahimi@example.net, never on Fridays"
EMBEDDED: list[str] = []        # what the embedding function was shown


def embed(texts: list[str]) -> list[list[float]]:
    """A toy offline embedding (use a real model in production)."""
    EMBEDDED.extend(texts)
    vectors = []
    for text in texts:
        words = text.lower().split()
        vec = [0.0] * 32
        for w in words:
            vec[hashlib.sha256(w.encode()).digest()[0] % 32] += 1.0
        vectors.append(vec)
    return vectors


@tool
def remember(fact: str, store: Annotated[BaseStore, InjectedStore()]) -> str:
    """Remember a fact about the user."""
    store.put(("memories",), uuid.uuid4().hex, {"text": fact})
    return "remembered"


@tool
def recall(query: str, store: Annotated[BaseStore, InjectedStore()]) -> str:
    """Recall what is known about the user."""
    hits = store.search(("memories",), query=query, limit=3)
    return "; ".join(h.value["text"] for h in hits) or "nothing remembered"


class MemoryModel(BaseChatModel):
    """Scripted: calls the tool the user's message asks for, then repeats its answer."""

    @property
    def _llm_type(self) -> str:
        return "memory-script"

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"({last.name}) {last.content}")
        elif str(last.content).startswith("remember:"):
            reply = AIMessage(content="", tool_calls=[{
                "name": "remember", "args": {"fact": str(last.content)[9:].strip()},
                "id": "call_remember"}])
        else:
            reply = AIMessage(content="", tool_calls=[{
                "name": "recall", "args": {"query": "invoices"}, "id": "call_recall"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def main(db: str | None = None) -> None:
    if db is None:
        workspace = example_workspace("react_agent_store")  # a fresh dir and keyring.json
        print(workspace.describe())
        db = str(workspace.path / "memory.db")
        ring_path = workspace.path / "keyring.json"
    else:
        ring_path = Path(db + ".keyring.json")
        if not ring_path.exists():
            Keyring.generate().save(ring_path)
    index = {"dims": 32, "embed": embed, "fields": ["text"]}
    with secure_pair(f"sqlite:///{db}", keyring=Keyring.from_file(ring_path),
                     index=index) as (saver, store):
        agent = create_agent(MemoryModel(), tools=[remember, recall], checkpointer=saver,
                             store=store)

        def ask(tenant: str, thread: str, text: str) -> str:
            with tenant_scope(tenant):
                out = agent.invoke({"messages": [("user", text)]},
                                   {"configurable": {"thread_id": thread}})
            return str(out["messages"][-1].content)

        print("acme:", ask("acme", f"t-{uuid.uuid4().hex[:8]}", f"remember: {FACT}"))
        print("acme, another thread:", ask("acme", f"t-{uuid.uuid4().hex[:8]}",
                                           "what do you know about my invoices?"))
        print("globex:", ask("globex", "t-1", "what do you know about my invoices?"))
    on_disk = b"".join(p.read_bytes() for p in Path(db).parent.glob(Path(db).name + "*")
                       if not p.name.endswith(".json"))
    print("fact on disk:", FACT.encode() in on_disk or b"mo.rahimi" in on_disk)
    print("e-mail shown to the embedder:", any("mo.rahimi" in t for t in EMBEDDED))


if __name__ == "__main__":
    main(*sys.argv[1:])
