"""Per-operation latency of SecureStore vs the raw store it wraps: put, get, search.

Variants, interleaved round by round in this one process on one machine: the raw store,
SecureStore with encryption only (``redaction=None``), and SecureStore with default redaction.
Each round builds a fresh database per variant, puts N memories, gets each, and runs N/10
searches (namespace prefix + an equality filter, no embeddings). Printed: median per-op time
and the ratio to raw. Targets: <= 1.15x encryption-only, <= 1.5x with redaction.

    python benchmarks/store_overhead.py [--items 400] [--rounds 3] [--backends sqlite,postgres] [--cpu]
"""

from __future__ import annotations

import argparse
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

from langgraph.store.base import BaseStore

from langgraph_securesaver import Keyring, SecureStore
from langgraph_securesaver.storage.backends import SQLITE_FILE_PRAGMAS, libpq_url

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
VARIANTS = ("raw", "securestore", "securestore_redaction")
#: --cpu: this process's CPU time per operation instead of wall time (on a shared machine
#: the wall clock also counts other processes' turns; the database server's work is not in it)
CPU = False
TEXTS = [
    "prefers tea over coffee and works late on Tuesdays",
    "asked about the refund for order 5521 last week",
    "lives near the river, cycles to work, allergic to peanuts",
    "wants invoices in PDF, signed by the finance team",
]


@contextmanager
def sqlite_store(variant: str, workdir: Path) -> Iterator[BaseStore]:
    path = workdir / f"{variant}-{uuid.uuid4().hex}.db"
    if variant == "raw":
        from langgraph.store.sqlite import SqliteStore
        with SqliteStore.from_conn_string(str(path)) as store:
            for pragma in SQLITE_FILE_PRAGMAS:    # as SecureStore.from_url's file runs
                store.conn.execute(pragma)
            store.setup()
            yield store
        return
    options: dict[str, Any] = {} if variant.endswith("redaction") else {"redaction": None}
    with SecureStore.from_url(f"sqlite:///{path}", keyring=Keyring.generate(),
                              default_tenant="acme", **options) as store:
        yield store


@contextmanager
def postgres_store(variant: str, workdir: Path) -> Iterator[BaseStore]:
    import psycopg
    schema = "bench_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    url = f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    try:
        if variant == "raw":
            from langgraph.store.postgres import PostgresStore
            with PostgresStore.from_conn_string(libpq_url(url)) as store:
                store.setup()
                yield store
        else:
            options: dict[str, Any] = {} if variant.endswith("redaction") else {
                "redaction": None}
            with SecureStore.from_url(url, keyring=Keyring.generate(),
                                      default_tenant="acme", **options) as store:
                yield store
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def one_round(open_store: Callable[[str, Path], Any], variant: str, items: int,
              workdir: Path) -> dict[str, float]:
    """Seconds per operation for one fresh store."""
    with open_store(variant, workdir) as store:
        values = [{"text": TEXTS[i % len(TEXTS)], "kind": f"k{i % 10}", "n": i}
                  for i in range(items)]
        store.put(("warmup",), "w", {"text": "warm"})  # keys, connections, caches
        store.get(("warmup",), "w")
        clock = time.process_time if CPU else time.perf_counter
        t0 = clock()
        for i, value in enumerate(values):
            store.put(("memories", f"user-{i % 20}"), f"m{i}", value)
        t1 = clock()
        for i in range(items):
            store.get(("memories", f"user-{i % 20}"), f"m{i}")
        t2 = clock()
        searches = max(1, items // 10)
        for i in range(searches):
            store.search(("memories", f"user-{i % 20}"), filter={"kind": f"k{i % 10}"},
                         limit=10)
        t3 = clock()
    return {"put": (t1 - t0) / items, "get": (t2 - t1) / items, "search": (t3 - t2) / searches}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="sqlite")
    parser.add_argument("--cpu", action="store_true",
                        help="measure this process's CPU time instead of wall time")
    args = parser.parse_args(argv)
    global CPU
    CPU = args.cpu
    openers = {"sqlite": sqlite_store, "postgres": postgres_store}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for backend in args.backends.split(","):
            opener = openers[backend]
            one_round(opener, "securestore_redaction", 20, workdir)  # load the redactor once
            times: dict[str, dict[str, list[float]]] = {
                v: {"put": [], "get": [], "search": []} for v in VARIANTS}
            for _ in range(args.rounds):
                for variant in VARIANTS:           # interleaved: one of each per round
                    for op, sec in one_round(opener, variant, args.items, workdir).items():
                        times[variant][op].append(sec)
            clock = "CPU time" if CPU else "wall time"
            print(f"\n{backend}: {args.items} items, {args.rounds} rounds (median per op, "
                  f"{clock}; load average {os.getloadavg()[0]:.1f})")
            print(f"{'variant':24} {'put':>16} {'get':>16} {'search':>16}")
            raw = {op: statistics.median(v) for op, v in times["raw"].items()}
            for variant in VARIANTS:
                cells = []
                for op in ("put", "get", "search"):
                    med = statistics.median(times[variant][op])
                    cells.append(f"{med * 1e6:8.0f}us {med / raw[op]:5.2f}x")
                print(f"{variant:24} " + " ".join(f"{c:>16}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
