"""Retention policies and a pruner on a schedule.

Shows: a default policy, a stricter tenant policy, a per-thread legal hold, and a pruner loop
that sweeps every few seconds in the background of an asyncio service (``aprune_expired``),
with deletion receipts afterwards. In production run the same sweep from cron or a
Kubernetes CronJob instead — several may run at once. It needs the keyring (it decrypts
nothing, but it verifies the MACs of the retention rows, so a forged expiry or a removed legal
hold is reported, never obeyed); without one it exits 2 and touches nothing:

    securesaver prune --url sqlite:///retention.db --keyring keyring.json --every 10m

The example pretends 40 days have passed (``clock``) so the sweep has something to do.

Run:  python examples/retention_pruner.py
      (from any directory; its database and keyring go to
      ./.securesaver-examples/retention_pruner/, removed and recreated on every run)
"""

import asyncio
import time

from _fake_model import chat_graph, example_workspace
from langchain_core.messages import HumanMessage

from langgraph_securesaver import RetentionPolicy, SecureSaver, tenant_scope

DAY = 86400.0


async def pruner(saver: SecureSaver, every: float, stop: asyncio.Event, clock=time.time) -> None:
    """Sweep every `every` seconds until `stop` is set (what `securesaver prune --every` does)."""
    while not stop.is_set():
        report = await saver.aprune_expired(now=clock())
        print(f"sweep: deleted {len(report.deleted)}, pruned to latest "
              f"{len(report.pruned_to_latest)}, held {len(report.held)}, "
              f"errors {len(report.errors)}")
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
        except asyncio.TimeoutError:
            pass


async def main() -> None:
    workspace = example_workspace("retention_pruner")   # a fresh dir and keyring.json in it
    print(workspace.describe())
    db = workspace.path / "retention.db"
    default = RetentionPolicy(idle_ttl="90d", max_age="1y")
    async with SecureSaver.afrom_url(f"sqlite:///{db}", keyring=workspace.keyring,
                                     retention=default) as saver:
        await saver.aset_tenant_retention("globex", RetentionPolicy(idle_ttl="30d"))
        graph = chat_graph(saver)
        for tenant, thread in (("acme", "a-1"), ("globex", "g-1"), ("globex", "g-2")):
            await graph.ainvoke({"messages": [HumanMessage(f"hello from {thread}")]},
                                {"configurable": {"thread_id": thread, "tenant_id": tenant}})
        with tenant_scope("globex"):
            await saver.aset_retention("g-2", legal_hold=True)    # never pruned

        stop = asyncio.Event()
        task = asyncio.create_task(pruner(saver, every=0.2, stop=stop,
                                          clock=lambda: time.time() + 40 * DAY))
        await asyncio.sleep(0.5)          # the service does its work; the pruner sweeps
        stop.set()
        await task

        for receipt in await saver.areceipts():
            print(f"receipt: {receipt.tenant}/{receipt.thread_id} {receipt.action} "
                  f"({receipt.reason})")
        for tenant in ("acme", "globex"):
            with tenant_scope(tenant):
                left = sorted({t.config["configurable"]["thread_id"]
                               async for t in saver.alist(None)})
            print(f"{tenant} keeps: {left}")


if __name__ == "__main__":
    asyncio.run(main())
