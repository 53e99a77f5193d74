"""Quick start: SecureSaver on SQLite in one file, no server, no network.

Shows: a keyring file, ``SecureSaver.from_url`` on SQLite, a graph compiled with it, a
conversation continued by a fresh saver on the same file (as after a restart), and that the
database file holds none of the conversation's words.

Run:  python examples/quickstart_sqlite.py
      (from any directory; its database and keyring go to
      ./.securesaver-examples/quickstart_sqlite/, removed and recreated on every run)
"""

from pathlib import Path

from _fake_model import FakeChatModel, example_workspace  # a model that needs no API key
from langchain_core.messages import HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_securesaver import Keyring, SecureSaver

model = FakeChatModel()


def build(checkpointer: SecureSaver):
    builder = StateGraph(MessagesState)
    builder.add_node("chat", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_edge(START, "chat")
    return builder.compile(checkpointer=checkpointer)


def main() -> None:
    workspace = example_workspace("quickstart_sqlite")   # a fresh dir and keyring.json in it
    print(workspace.describe())
    db = str(workspace.path / "quickstart.db")
    keyring = Keyring.from_file(workspace.path / "keyring.json")   # `securesaver keygen --out`
    config = {"configurable": {"thread_id": "t-1", "tenant_id": "acme"}}

    with SecureSaver.from_url(f"sqlite:///{db}", keyring=keyring) as saver:
        build(saver).invoke({"messages": [HumanMessage("my locker code is 4417-blue")]}, config)

    with SecureSaver.from_url(f"sqlite:///{db}", keyring=keyring) as saver:   # "restarted"
        state = build(saver).invoke({"messages": [HumanMessage("what did I tell you?")]}, config)
        print("messages in the thread:", len(state["messages"]))
        print("first message, decrypted:", state["messages"][0].content)

    on_disk = b"".join(p.read_bytes() for p in Path(db).parent.glob(Path(db).name + "*")
                       if not p.name.endswith(".json"))
    print("plaintext on disk:", b"4417-blue" in on_disk)


if __name__ == "__main__":
    main()
