"""An application process that keeps writing turns while the keys are rotated under it.

    python -m tests.scripts.rotation_writer URL KEYRING TENANT THREADS OUT STOPFILE [async]

It loads the keyring file ONCE at start (as an app does), then runs turns round-robin over
THREADS threads of TENANT until STOPFILE exists (``async``: through ``afrom_url`` and
``ainvoke``). Every committed turn is appended to OUT as ``ok <thread> <text>``; every failed
one as ``fail <thread> <ExceptionType>: <message>``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver
from tests.fake_agent import build_chat_graph


def _turn(n: int, tenant: str, threads: str) -> tuple[str, str, dict]:
    thread = f"t{n % int(threads)}"
    text = f"{tenant} live {n}"
    return thread, text, {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def run_sync(url: str, ring: Keyring, tenant: str, threads: str, out: str, stop: str) -> None:
    n = 0
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver, \
            open(out, "a", buffering=1, encoding="utf-8") as log:
        graph = build_chat_graph(saver)
        log.write("started\n")
        while not Path(stop).exists():
            thread, text, config = _turn(n, tenant, threads)
            try:
                graph.invoke({"messages": [HumanMessage(text)]}, config)
                log.write(f"ok {thread} {text}\n")
            except Exception as exc:  # recorded, not hidden: the test asserts there are none
                log.write(f"fail {thread} {type(exc).__name__}: {exc}\n")
                time.sleep(0.01)
            n += 1


async def run_async(url: str, ring: Keyring, tenant: str, threads: str, out: str,
                    stop: str) -> None:
    n = 0
    async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as saver:
        graph = build_chat_graph(saver)
        with open(out, "a", buffering=1, encoding="utf-8") as log:
            log.write("started\n")
            while not Path(stop).exists():
                thread, text, config = _turn(n, tenant, threads)
                try:
                    await graph.ainvoke({"messages": [HumanMessage(text)]}, config)
                    log.write(f"ok {thread} {text}\n")
                except Exception as exc:  # recorded, not hidden
                    log.write(f"fail {thread} {type(exc).__name__}: {exc}\n")
                    await asyncio.sleep(0.01)
                n += 1


def main() -> None:
    url, keyring, tenant, threads, out, stop = sys.argv[1:7]
    ring = Keyring.from_file(keyring)
    if sys.argv[7:8] == ["async"]:
        asyncio.run(run_async(url, ring, tenant, threads, out, stop))
    else:
        run_sync(url, ring, tenant, threads, out, stop)


if __name__ == "__main__":
    main()
