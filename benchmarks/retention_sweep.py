"""Retention sweep throughput on PostgreSQL.

Builds N threads with 10 checkpoints (and one pending write) each directly in the tables (bulk
SQL; the sweep never decrypts, so the content does not matter), half of them expired, then
times a sweep that deletes the expired half (threads/s, with receipts) and a sweep with
nothing expired.

    python benchmarks/retention_sweep.py [--threads 100000] [--checkpoints 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

import psycopg

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.registry import integrity as mac
from langgraph_securesaver.tenancy import thread_prefix

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

FILL_THREADS = """
INSERT INTO securesaver_threads (tenant, thread_id, created_at, last_activity, idle_ttl,
    max_age, strategy, legal_hold, policy_source, expires_at, state)
SELECT 'acme', 'thread-' || i, %(t0)s,
       CASE WHEN i %% 2 = 0 THEN %(t0)s ELSE %(future)s - 3600 END, 3600, NULL, 'delete',
       false, 'default', CASE WHEN i %% 2 = 0 THEN %(t0)s + 3600 ELSE %(future)s END, 'active'
FROM generate_series(1, %(n)s) AS i
"""


def mac_rows(saver: SecureSaver) -> None:
    """Give the bulk-inserted thread rows their registry MACs (the sweep refuses rows
    without them), as touch_thread would have."""
    import sqlalchemy as sa

    from langgraph_securesaver.registry.core import threads
    integ = saver.registry.integrity
    integ.require()
    with saver.registry.engine.begin() as conn:
        rows = conn.execute(sa.select(threads)).mappings().all()
        conn.execute(threads.update().where(
            threads.c.tenant == sa.bindparam("b_t"), threads.c.thread_id == sa.bindparam("b_th")
        ).values(policy_mac=sa.bindparam("b_p"), activity_mac=sa.bindparam("b_a")), [
            {"b_t": r["tenant"], "b_th": r["thread_id"],
             "b_p": integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(r)),
             "b_a": integ.mac(mac.THREAD_ACTIVITY, *mac.thread_activity_parts(r))}
            for r in rows])
FILL_CHECKPOINTS = """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type,
    checkpoint, metadata)
SELECT %(prefix)s || 'thread-' || i, '', 'cp-' || lpad(j::text, 4, '0'), NULL, NULL,
       jsonb_build_object('v', 4, 'id', 'cp-' || lpad(j::text, 4, '0'),
                          'ts', '2020-01-01T00:00:00+00:00', 'channel_versions', '{}'::jsonb,
                          'versions_seen', '{}'::jsonb, 'channel_values', '{}'::jsonb),
       '{"source": "loop", "step": 1}'::jsonb
FROM generate_series(1, %(n)s) AS i, generate_series(1, %(c)s) AS j
"""
FILL_WRITES = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
    type, blob, task_path)
SELECT %(prefix)s || 'thread-' || i, '', 'cp-' || lpad(%(c)s::text, 4, '0'), 'task', 0,
       'messages', 'bytes', '\\x00'::bytea, ''
FROM generate_series(1, %(n)s) AS i
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=10)
    args = parser.parse_args()
    schema = "bench_ret_" + uuid.uuid4().hex[:8]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    try:
        with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
            now = time.time()
            start = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as conn:
                params = {"n": args.threads, "c": args.checkpoints, "t0": now - 7200,
                          "past": now - 60, "future": now + 86400, "prefix": thread_prefix("acme")}
                conn.execute(FILL_THREADS, params)
                conn.execute(FILL_CHECKPOINTS, params)
                conn.execute(FILL_WRITES, params)
            mac_rows(saver)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("ANALYZE")
            print(f"built {args.threads} threads x {args.checkpoints} checkpoints "
                  f"in {time.perf_counter() - start:.1f}s")
            start = time.perf_counter()
            report = saver.prune_expired(now=now, batch=200)
            took = time.perf_counter() - start
            print(f"sweep, half expired: {len(report.deleted)} threads deleted in {took:.1f}s "
                  f"= {len(report.deleted) / took:.0f} threads/s "
                  f"({len(report.deleted) * args.checkpoints / took:.0f} checkpoints/s), "
                  f"{len(report.errors)} errors, {len(saver.receipts())} receipts")
            timings = []
            for _ in range(5):
                start = time.perf_counter()
                idle = saver.prune_expired(now=now)
                timings.append(time.perf_counter() - start)
            remaining = len(saver.registry.list_threads())
            print(f"sweep, nothing expired over {remaining} threads: "
                  f"median {sorted(timings)[2] * 1000:.1f} ms (target < 100 ms); "
                  f"deleted {len(idle.deleted)}")
            ok = sorted(timings)[2] < 0.1 and len(report.deleted) == args.threads // 2
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
