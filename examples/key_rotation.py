"""Key rotation without downtime: a new master version, rewrapping, re-encryption, retirement.

Shows: ``keyring.add_version()`` + ``saver.rewrap_keys()`` (fast: data keys are re-sealed, no
data is rewritten), ``saver.master_versions_in_use()``, ``saver.rotate_data_key(tenant)`` for
new writes, and ``saver.rotate_keys(reencrypt=True, retire_old=True)``, which re-encrypts every
ciphertext still sealed under an older tenant data key (each thread's own key needs no
rewrite) and forgets master versions nothing uses. Old checkpoints stay
readable at every step. The same from the shell:

    securesaver rotate-keys --url sqlite:///rotation.db --keyring keyring.json \
        --reencrypt --retire-old

Run:  python examples/key_rotation.py
      (from any directory; its database and keyring go to
      ./.securesaver-examples/key_rotation/, removed and recreated on every run)
"""

from _fake_model import chat_graph, example_workspace
from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver


def main() -> None:
    workspace = example_workspace("key_rotation")   # a fresh dir and keyring.json in it
    print(workspace.describe())
    db = str(workspace.path / "rotation.db")
    ring_path = workspace.path / "keyring.json"
    keyring = Keyring.from_file(ring_path)
    config = {"configurable": {"thread_id": "t-1", "tenant_id": "acme"}}
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=keyring) as saver:
        graph = chat_graph(saver)
        graph.invoke({"messages": [HumanMessage("written under master v1")]}, config)
        print("in use:", saver.master_versions_in_use())

        keyring.add_version()                 # 1. new master version, old ones still unwrap
        keyring.persist()                     #    saved back to its file (mode 0600)
        saver.rewrap_keys()                   # 2. re-seal data keys under it
        print("after rewrap:", saver.master_versions_in_use())

        saver.rotate_data_key("acme")         # 3. new data-key version for new writes
        graph.invoke({"messages": [HumanMessage("written under data key v2")]}, config)

        report = saver.rotate_keys(reencrypt=True, retire_old=True)   # 4. all at once, online
        # each thread is sealed under its own key (wrapped by the tenant's key-encryption key):
        # those rows are current and need no rewrite; `reencrypt` rewrites only rows sealed
        # directly under an older tenant data key (thread_keys=False, or an older format)
        print("rows already under their thread's key:", report.reencrypt.already_current,
              "rewritten:", sum(report.reencrypt.rewritten.values()))
        print("retired master versions:", report.retired, "ok:", report.ok)
        state = graph.get_state(config)
        print("still readable:", [m.content for m in state.values["messages"]][::2])
    print("keyring versions now:", Keyring.from_file(ring_path).versions())


if __name__ == "__main__":
    main()
