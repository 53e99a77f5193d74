"""Run (phase "crash") or resume (phase "resume") the email + charge scenario.

Usage: python crash_run.py PHASE DB_URL KEYRING_FILE DOWNSTREAM_DB MODE DURABILITY [RESUME]

"crash" starts a new run on thread "order-1" and dies with os._exit(1) inside charge_card,
after the payment API got the request. "resume" continues the thread in a new process (RESUME
"sync": ``graph.invoke`` on ``SecureSaver.from_url``; "async": ``graph.ainvoke`` on
``SecureSaver.afrom_url``, an async inner saver) and prints the final messages as JSON.

Default policy everywhere. For the multi-host tests only: ``IDEM_HOST_ID`` makes this process
claim under another host id, ``IDEM_LEASE`` sets the lease of its claims.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import IdempotencyStore
from tests.idem_scripts.scenario import Downstream, build_graph

CONFIG = {"configurable": {"thread_id": "order-1", "tenant_id": "acme"}}


def _prepare(saver: SecureSaver) -> dict[str, Any]:
    host_id = os.environ.get("IDEM_HOST_ID")
    if host_id:
        IdempotencyStore.for_saver(saver, host_id=host_id)
    lease = os.environ.get("IDEM_LEASE")
    return {"lease": float(lease)} if lease else {}


def _dump(out: dict[str, Any]) -> None:
    print(json.dumps([
        {"type": m.type, "content": m.content, "name": getattr(m, "name", None),
         "replayed": bool((getattr(m, "response_metadata", None) or {}).get(
             "securesaver_replayed"))}
        for m in out["messages"]]))


def main() -> None:
    phase, url, keyring, downstream, mode, durability = sys.argv[1:7]
    resume = sys.argv[7] if len(sys.argv) > 7 else "sync"
    logging.basicConfig(level=logging.WARNING)
    ring = Keyring.from_file(keyring)
    ds = Downstream(downstream)
    if phase == "resume" and resume == "async":
        _dump(asyncio.run(_aresume(url, ring, ds, mode, durability)))
        return
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        options = _prepare(saver)
        graph = build_graph(saver, ds, mode=mode, crash_during_charge=(phase == "crash"),
                            **options)
        if phase == "crash":
            graph.invoke({"messages": [HumanMessage("pay order 1")]}, CONFIG,
                         durability=durability)
            print("NOT REACHED")
            sys.exit(3)
        _dump(graph.invoke(None, CONFIG, durability=durability))


async def _aresume(url: str, ring: Keyring, ds: Downstream, mode: str,
                   durability: str) -> dict[str, Any]:
    async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as saver:
        graph = build_graph(saver, ds, mode=mode, **_prepare(saver))
        return await graph.ainvoke(None, CONFIG, durability=durability)


if __name__ == "__main__":
    main()
