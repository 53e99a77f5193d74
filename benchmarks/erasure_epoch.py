"""The erasure epoch: rewrapping every live thread key under a new master version.

Fills ``securesaver_thread_keys`` with N wrapped keys (as N threads would), then times
``ThreadKeyStore.rewrap`` -- what ``rotate-keys --retire-old`` does before it destroys the old
master version -- and the cold first key read of a thread (one registry SELECT + unwrap).

    python benchmarks/erasure_epoch.py [--rows 100000,1000000] [--backends sqlite,postgres]
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from langgraph_securesaver import Keyring
from langgraph_securesaver.keys.crypto import KeyManager
from langgraph_securesaver.keys.tokens import THREAD, thread_key_context
from langgraph_securesaver.registry.core import Registry
from langgraph_securesaver.registry.schema import thread_keys
from langgraph_securesaver.registry.thread_keys import ThreadKeyStore

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def fill(registry: Registry, ring: Keyring, n: int) -> float:
    database = registry.database_id()
    started = time.perf_counter()
    batch = []
    now = time.time()
    with registry.begin() as conn:
        for i in range(n):
            tenant, thread = f"tenant{i % 50}", f"thread-{i}"
            w = ring.wrap(tenant, secrets.token_bytes(32),
                          thread_key_context(database, tenant, thread))
            batch.append({"tenant": tenant, "thread_id": thread, "master_version":
                          w.master_version, "wrapped": w.blob, "created_at": now})
            if len(batch) == 5000:
                conn.execute(thread_keys.insert(), batch)
                batch = []
        if batch:
            conn.execute(thread_keys.insert(), batch)
    return time.perf_counter() - started


def run(url: str, n: int) -> None:
    ring = Keyring.generate()
    registry = Registry(url)
    registry.setup()
    keys = KeyManager(ring, registry)
    store = ThreadKeyStore(keys, registry)
    fill_s = fill(registry, ring, n)
    cold = []
    for i in range(0, min(n, 200)):
        t0 = time.perf_counter()
        store.key(f"tenant{i % 50}", THREAD, f"thread-{i}", False)
        cold.append(time.perf_counter() - t0)
    new = []
    for i in range(0, 200):   # a new thread's first write: miss, create, re-read
        t0 = time.perf_counter()
        store.key(f"tenant{i % 50}", THREAD, f"new-thread-{i}", True)
        new.append(time.perf_counter() - t0)
    n += len(new)
    ring.add_version()
    t0 = time.perf_counter()
    done = store.rewrap(ring.current_version)
    rewrap_s = time.perf_counter() - t0
    assert done == n
    with registry.begin() as conn:
        left = conn.execute(sa.select(sa.func.count()).select_from(thread_keys).where(
            thread_keys.c.master_version != ring.current_version)).scalar()
    assert left == 0
    cold.sort()
    new.sort()
    print(f"{registry.dialect:10s} rows={n:>9,}  fill {fill_s:7.1f} s  rewrap {rewrap_s:7.1f} s "
          f"({n / rewrap_s:,.0f} rows/s)  cold key read p50 {cold[len(cold) // 2] * 1e3:.2f} ms "
          f"p95 {cold[int(len(cold) * 0.95)] * 1e3:.2f} ms  new thread key p50 "
          f"{new[len(new) // 2] * 1e3:.2f} ms p95 {new[int(len(new) * 0.95)] * 1e3:.2f} ms")
    registry.dispose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    for n in (int(x) for x in args.rows.split(",")):
        for backend in args.backends.split(","):
            if backend == "sqlite":
                with tempfile.TemporaryDirectory() as tmp:
                    run(f"sqlite:///{Path(tmp) / 'keys.db'}", n)
            else:
                schema = f"bench_epoch_{secrets.token_hex(4)}"
                engine = sa.create_engine(PG_URL.replace("postgresql://",
                                                         "postgresql+psycopg://"))
                with engine.begin() as conn:
                    conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
                try:
                    run(f"{PG_URL}?options=-csearch_path%3D{schema}", n)
                finally:
                    with engine.begin() as conn:
                        conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
                    engine.dispose()


if __name__ == "__main__":
    main()
