"""Idempotency store costs on SQLite (a file) and PostgreSQL (if reachable).

* cached hit: ``execute`` on a completed key (one SELECT, decrypt, deserialize) - target <= 1 ms
* first execution: claim + complete of a new key (SELECT miss, INSERT claim, UPDATE complete,
  result sealed) around a no-op effect
* decorator hit: ``@idempotent`` helper called inside a running graph node on a completed key
  (adds run-context lookup and key derivation to the cached hit)

Run: ``python benchmarks/idempotency_bench.py`` (PostgreSQL from SECURESAVER_TEST_PG, default
postgresql://postgres@127.0.0.1:5432/test). Takes well under a minute.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import ToolMessage

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import IdempotencyStore, KeyScope, idempotent

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
RESULT = ToolMessage(content="email sent to ada@example.com (message id 1f0e)",
                     tool_call_id="call_1", name="send_email")


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def summary(samples: list[float]) -> str:
    samples = sorted(samples)
    p95 = samples[int(len(samples) * 0.95) - 1]
    return f"median {statistics.median(samples):7.3f} ms   p95 {p95:7.3f} ms   (n={len(samples)})"


@contextmanager
def postgres_url() -> Iterator[str | None]:
    try:
        import psycopg
        with psycopg.connect(PG_URL, connect_timeout=3, autocommit=True) as conn:
            schema = "bench_" + uuid.uuid4().hex[:10]
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except Exception as exc:  # no server: report and skip
        print(f"PostgreSQL not reachable ({exc}); skipping it")
        yield None
        return
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def bench(label: str, url: str) -> None:
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        store = IdempotencyStore.for_saver(saver)
        store.setup()
        store.tenant_keys("acme")

        def new_scope() -> KeyScope:
            return KeyScope("acme", "thread-1", "k" + uuid.uuid4().hex, "tool", "send_email")

        for _ in range(50):  # warm up pools and caches
            store.execute(new_scope(), lambda c: RESULT)
        first = timed(lambda: store.execute(new_scope(), lambda c: RESULT), 400)
        hot = new_scope()
        store.execute(hot, lambda c: RESULT)
        hits = timed(lambda: store.execute(hot, lambda c: RESULT), 2000)
        decorator_hits = _decorator_hits(saver)
    print(f"{label:10s} first execution (claim+complete): {summary(first)}")
    print(f"{label:10s} cached hit (store.execute):       {summary(hits)}")
    print(f"{label:10s} cached hit (@idempotent in node):  {summary(decorator_hits)}")


def _decorator_hits(saver: SecureSaver) -> list[float]:
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    class S(TypedDict, total=False):
        n: int

    samples: list[float] = []

    @idempotent
    def effect(x: int) -> str:
        return "done"

    def node(state: S) -> S:
        effect(1)  # first call executes, the rest are hits on the same task key
        for _ in range(1000):
            t0 = time.perf_counter()
            effect(1)
            samples.append((time.perf_counter() - t0) * 1000)
        return {"n": 1}

    g = StateGraph(S)
    g.add_node("node", node)
    g.add_edge(START, "node")
    g.compile(checkpointer=saver).invoke(
        {"n": 0}, {"configurable": {"thread_id": "bench", "tenant_id": "acme"}},
        durability="sync")
    return samples


def main() -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")
    with tempfile.TemporaryDirectory() as tmp:
        bench("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}")
    with postgres_url() as url:
        if url is not None:
            bench("postgres", url)


if __name__ == "__main__":
    main()
