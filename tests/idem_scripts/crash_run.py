"""Run (phase "crash") or resume (phase "resume") the email + charge scenario.

Usage: python crash_run.py PHASE CHECKPOINT_DB KEYRING_FILE DOWNSTREAM_DB MODE DURABILITY

"crash" starts a new run on thread "order-1" and dies with os._exit(1) inside charge_card,
after the payment API got the request. "resume" continues the thread in a new process and
prints the final messages as JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver
from tests.idem_scripts.scenario import Downstream, build_graph

LEASE = 1.0
CONFIG = {"configurable": {"thread_id": "order-1", "tenant_id": "acme"}}


def main() -> None:
    phase, db, keyring, downstream, mode, durability = sys.argv[1:7]
    logging.basicConfig(level=logging.WARNING)
    ring = Keyring.from_file(keyring)
    ds = Downstream(downstream)
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=ring, redaction=None) as saver:
        graph = build_graph(saver, ds, mode=mode, crash_during_charge=(phase == "crash"),
                            lease=LEASE)
        if phase == "crash":
            graph.invoke({"messages": [HumanMessage("pay order 1")]}, CONFIG,
                         durability=durability)
            print("NOT REACHED")
            sys.exit(3)
        if mode == "wrapper":  # exercise the async path of the wrapper on resume
            out = asyncio.run(_aresume(saver, ds, mode, durability))
        else:
            out = graph.invoke(None, CONFIG, durability=durability)
        print(json.dumps([
            {"type": m.type, "content": m.content, "name": getattr(m, "name", None),
             "replayed": bool((getattr(m, "response_metadata", None) or {}).get(
                 "securesaver_replayed"))}
            for m in out["messages"]]))


async def _aresume(saver: SecureSaver, ds: Downstream, mode: str, durability: str) -> dict:
    graph = build_graph(saver, ds, mode=mode, lease=LEASE)
    # a sync inner saver under ainvoke: SecureSaver runs it in worker threads
    return await graph.ainvoke(None, CONFIG, durability=durability)


if __name__ == "__main__":
    main()
