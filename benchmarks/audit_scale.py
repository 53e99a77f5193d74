"""Compliance answers and retention at scale on PostgreSQL.

Builds N threads x C checkpoints over T tenants directly in the tables with bulk SQL (the way
``retention_sweep.py`` does; neither the audit nor the pruner decrypts, so the content does not
matter, only its shape): per checkpoint a JSONB body with a timestamp, metadata carrying a
sealed-token-shaped value, one channel blob with a token header; one pending write per thread;
PII references for one thread in ten; registry rows with retention (half of the threads
expired, some on legal hold); audit events and older receipts. Then it times, each several
times (the machine is shared, so the spread is printed):

* ``securesaver audit --tenant T --format json`` and ``securesaver audit --format json`` as
  subprocesses (wall time including interpreter start, peak RSS of the child), and the same
  audits in-process (``audit_stream``, output to /dev/null);
* ``securesaver events --tenant T --since 30d --format json`` (subprocess and in-process);
* a full prune of the expired half (threads/s, with receipts), in-process.

The bulk build bypasses SecureSaver, so the audit summaries are then built the way
``setup()`` builds them for a database written by an older version (timed). With
``--neighbour`` every timing is taken twice: as the machine is, then with a CPU-bound
neighbour process (started by the benchmark: a busy loop per ``--neighbour`` process) running.
``--recount`` also times the audit over every raw row (what it read before the summaries).

    python benchmarks/audit_scale.py [--threads 100000] [--tenants 50] [--checkpoints 10]
                                     [--repeat 3] [--skip-audit] [--skip-prune]
    python benchmarks/audit_scale.py --url URL [--neighbour 1]   # time a --keep build again
    python benchmarks/audit_scale.py --neighbour 1 --skip-prune   # idle and with a neighbour
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.tenancy import thread_prefix

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
DAY = 86400.0

TOKEN = b"SS\x01" + (1).to_bytes(4, "big") + bytes(12) + bytes(range(40))

# every checkpoint's sealed metadata is a text token of key version 1 with its own nonce
# (md5 of the thread and step): a constant nonce would let the audit's grouping collapse
# what real rows keep apart
# thread i belongs to tenant (i % T); created 2 + (i % 365) days ago, one checkpoint a minute;
# even threads idle_ttl 1 day (expired), odd ones 400 days, one in 997 on legal hold
TENANTS_CTE = """
WITH tn AS (SELECT t.name, t.prefix, (t.ord - 1)::int AS k
            FROM unnest(%(names)s::text[], %(prefixes)s::text[]) WITH ORDINALITY
                 AS t(name, prefix, ord)),
th AS (SELECT i, tn.name AS tenant, tn.prefix || 'thread-' || i AS inner_id,
              %(now)s - (2 + i %% 365) * 86400.0 AS created
       FROM generate_series(1, %(n)s) AS i JOIN tn ON tn.k = i %% %(t)s)
"""
FILL_THREADS = TENANTS_CTE + """
INSERT INTO securesaver_threads (tenant, thread_id, created_at, last_activity, idle_ttl,
    max_age, strategy, legal_hold, policy_source, expires_at, state)
SELECT tenant, 'thread-' || i, created, created + %(c)s * 60, ttl, NULL, 'delete',
       i %% 997 = 0, 'default',
       CASE WHEN i %% 997 = 0 THEN NULL ELSE created + %(c)s * 60 + ttl END, 'active'
FROM (SELECT *, CASE WHEN i %% 2 = 0 THEN 86400.0 ELSE 400 * 86400.0 END AS ttl FROM th) x
"""
FILL_CHECKPOINTS = TENANTS_CTE + """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type,
    checkpoint, metadata)
SELECT inner_id, '', 'cp-' || lpad(j::text, 4, '0'), NULL, NULL,
       jsonb_build_object('v', 4, 'id', 'cp-' || lpad(j::text, 4, '0'),
           'ts', to_char(to_timestamp(created + j * 60) AT TIME ZONE 'UTC',
                         'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
           'channel_versions', jsonb_build_object('messages', lpad(j::text, 32, '0') || '.0'),
           'versions_seen', '{}'::jsonb, 'channel_values', '{}'::jsonb),
       jsonb_build_object('source', 'loop', 'step', j, '__securesaver__',
           'ss1.' || rtrim(translate(encode('\\x53530100000001'::bytea
               || decode(md5(inner_id || '/' || j), 'hex') || decode(repeat('ab', 17), 'hex'),
               'base64'), '+/', '-_'), '='))
FROM th, generate_series(1, %(c)s) AS j
"""
FILL_BLOBS = TENANTS_CTE + """
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT inner_id, '', 'messages', lpad(j::text, 32, '0') || '.0', 'bytes',
       %(token)s::bytea || decode(repeat('ab', 100 + j * 20), 'hex')
FROM th, generate_series(1, %(c)s) AS j
"""
FILL_WRITES = TENANTS_CTE + """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel,
    type, blob, task_path)
SELECT inner_id, '', 'cp-' || lpad(%(c)s::text, 4, '0'), 'task', 0, 'messages', 'bytes',
       %(token)s::bytea, ''
FROM th
"""
FILL_PII = TENANTS_CTE + """, refs AS (
    SELECT tenant, 'thread-' || i AS thread_id, kind,
           '<' || kind || ':' || md5(inner_id || kind) || '>' AS token, created
    FROM th, unnest(ARRAY['EMAIL_ADDRESS', 'PHONE_NUMBER']) AS kind WHERE i %% 10 = 3),
v AS (INSERT INTO securesaver_pii_vault (tenant, token, kind, sealed, created_at)
      SELECT tenant, token, kind, %(token)s::bytea, created FROM refs)
INSERT INTO securesaver_pii_refs (tenant, thread_id, token, kind, first_seen)
SELECT tenant, thread_id, token, kind, created FROM refs
"""
FILL_EVENTS = """
INSERT INTO securesaver_events (at, kind, tenant, thread_id, actor, detail)
SELECT %(now)s - (e %% 400) * 86400.0 - e %% 86400,
       (ARRAY['access_denied', 'retention_changed', 'keys_rewrapped', 'pii_forgotten'])[1 + e %% 4],
       (%(names)s::text[])[1 + e %% %(t)s], 'thread-' || e, 'svc', '{"operation": "get_tuple"}'
FROM generate_series(1, %(events)s) AS e
"""
FILL_RECEIPTS = """
INSERT INTO securesaver_receipts (receipt_id, tenant, thread_id, deleted_at, action, reason,
    requested_by, detail)
SELECT md5('r' || r), (%(names)s::text[])[1 + r %% %(t)s], 'gone-' || r,
       %(now)s - (1 + r %% 400) * 86400.0, 'deleted', 'retention:idle_ttl', 'pruner:old',
       '{"checkpoints": 10}'
FROM generate_series(1, %(receipts)s) AS r
"""


def mac_rows(saver: SecureSaver, conn: psycopg.Connection) -> None:
    """Give the bulk-inserted thread rows the registry MACs touch_thread would have written
    (the pruner refuses rows without them): computed here, written in one UPDATE."""
    from langgraph_securesaver.registry import integrity as mac
    integ = saver.registry.integrity
    integ.require()
    cols = ("tenant", "thread_id", "created_at", "last_activity", "idle_ttl", "max_age",
            "strategy", "legal_hold", "policy_source")
    cur = conn.execute(f"SELECT {', '.join(cols)} FROM securesaver_threads")
    tenants, ids, pmacs, amacs = [], [], [], []
    for values in cur:
        r = dict(zip(cols, values, strict=True))
        tenants.append(r["tenant"])
        ids.append(r["thread_id"])
        pmacs.append(integ.mac(mac.THREAD_POLICY, *mac.thread_policy_parts(r)))
        amacs.append(integ.mac(mac.THREAD_ACTIVITY, *mac.thread_activity_parts(r)))
    conn.execute("UPDATE securesaver_threads t SET policy_mac = m.p, activity_mac = m.a "
                 "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]) AS m(t, th, p, a) "
                 "WHERE t.tenant = m.t AND t.thread_id = m.th", (tenants, ids, pmacs, amacs))


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f} s"
    return (f"median {statistics.median(values):.2f} s (min {min(values):.2f}, "
            f"max {max(values):.2f}, n={len(values)})")


# the command run as a user runs it, reporting its own peak RSS on exit: VmHWM of its own
# memory map (getrusage's ru_maxrss, in the child or through os.wait4, keeps the high-water
# mark of the forked copy of this large process from before exec: it printed 192 MB)
_CLI_CHILD = """
import runpy, sys
sys.argv = ["securesaver", *sys.argv[1:]]
try:
    runpy.run_module("langgraph_securesaver.cli", run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as status:
        peak = [line.split()[1] for line in status if line.startswith("VmHWM:")]
    sys.stderr.write(f"\\nmaxrss_kb={peak[0] if peak else 'nan'}\\n")
"""


def _compiled_env() -> dict[str, str]:
    """An installed package runs from bytecode: compile ours once and let the children read it
    (a shell with PYTHONDONTWRITEBYTECODE=1 would otherwise recompile it on every command)."""
    import compileall
    from pathlib import Path

    import langgraph_securesaver
    compileall.compile_dir(str(Path(langgraph_securesaver.__file__).parent), quiet=1)
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


_ENV: dict[str, str] | None = None


def _cli(args: list[str]) -> tuple[float, float, int]:
    """Wall time, peak RSS (MB) and exit code of a `securesaver` subprocess."""
    global _ENV
    if _ENV is None:
        _ENV = _compiled_env()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CLI_CHILD, *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False, env=_ENV)
    took = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"securesaver {' '.join(args)} failed: {proc.stderr[-2000:]}")
    peak = [line for line in proc.stderr.splitlines() if line.startswith("maxrss_kb=")]
    return took, float(peak[-1].split("=", 1)[1]) / 1024 if peak else float("nan"), proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--receipts", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--skip-audit", action="store_true")
    parser.add_argument("--skip-prune", action="store_true")
    parser.add_argument("--neighbour", type=int, default=0, metavar="N",
                        help="Time everything again with N CPU-bound neighbour processes.")
    parser.add_argument("--recount", action="store_true",
                        help="Also time the audit that reads every raw row (in-process).")
    parser.add_argument("--compare", action="store_true",
                        help="Also time the previous code paths in the same run: the row walk "
                             "for one tenant, and one tenant pruned thread by thread.")
    parser.add_argument("--keep", action="store_true",
                        help="Keep the schema (and print its URL) instead of dropping it.")
    parser.add_argument("--url", help="Time the audits on a build kept with --keep (the "
                        "printed URL): nothing is built, pruned or dropped.")
    args = parser.parse_args()
    if args.url:
        return _reuse(args)
    schema = "bench_audit_" + uuid.uuid4().hex[:8]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    names = [f"tenant-{k:02d}" for k in range(args.tenants)]
    ok = True
    try:
        with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
            for name in names:
                saver.keys.keys_for(name, create=True)
            now = time.time()
            params = {"n": args.threads, "c": args.checkpoints, "t": args.tenants,
                      "now": now, "names": names,
                      "prefixes": [thread_prefix(n) for n in names], "token": TOKEN,
                      "events": args.events,
                      "receipts": args.receipts}
            start = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as conn:
                for sql in (FILL_THREADS, FILL_CHECKPOINTS, FILL_BLOBS, FILL_WRITES, FILL_PII,
                            FILL_EVENTS, FILL_RECEIPTS):
                    conn.execute(sql, params)
                mac_rows(saver, conn)
                conn.execute("ANALYZE")
            print(f"built {args.threads} threads x {args.checkpoints} checkpoints over "
                  f"{args.tenants} tenants ({args.events} events, {args.receipts} receipts) in "
                  f"{time.perf_counter() - start:.1f}s")
            _build_summaries(saver)
            _load("load average at start")
            one = names[len(names) // 2]
            if not args.skip_audit:
                ok &= _time_audits(saver, url, one, now, args.repeat)
                if args.recount:
                    _time_recount(saver, one, now)
                if args.neighbour:
                    with _neighbours(args.neighbour):
                        print(f"--- with {args.neighbour} CPU-bound neighbour process(es)")
                        _load("load average with the neighbour")
                        ok &= _time_audits(saver, url, one, now, args.repeat)
                        if args.recount:
                            _time_recount(saver, one, now)
                        _load("load average at the end of the neighbour phase")
            if args.compare:
                _time_previous(saver, names, one, now)
            if not args.skip_prune:
                ok &= _time_prune(saver, args, now)
    finally:
        if args.keep:
            print(f"kept: {url}")
        else:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return 0 if ok else 1


def _load(what: str) -> None:
    load = os.getloadavg()
    print(f"{what}: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores "
          "(shared machine)")


_BUSY = "while True:\n    pass\n"


@contextmanager
def _neighbours(n: int) -> Iterator[None]:
    """``n`` CPU-bound processes (a busy loop each) for the duration, stopped after."""
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(n)]
    try:
        time.sleep(1.0)
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def _build_summaries(saver: SecureSaver) -> None:
    """The bulk build bypassed SecureSaver: build the audit summaries as ``setup()`` does on a
    database written by an older version (forget that they were built, then set up)."""
    from langgraph_securesaver.audit import summaries
    with saver.registry.begin() as conn:
        conn.exec_driver_sql("DELETE FROM securesaver_meta WHERE key = 'summaries_built_at'")
    start = time.perf_counter()
    summaries.on_setup(saver)
    took = time.perf_counter() - start
    n = summaries.scope_size(saver.registry, None)
    print(f"audit summaries built by setup(): {n} threads in {took:.1f} s "
          f"({n / took:.0f} threads/s)")


def _time_recount(saver: SecureSaver, one: str, now: float) -> None:
    from langgraph_securesaver.audit.inventory import audit_stream
    with open(os.devnull, "w") as sink:
        start = time.perf_counter()
        audit_stream(saver, sink, tenant=one, now=now, source="recount")
        took_one = time.perf_counter() - start
        start = time.perf_counter()
        audit_stream(saver, sink, now=now, source="recount")
        took_all = time.perf_counter() - start
    print(f"audit --recount (every raw row, in-process): --tenant {took_one:.2f} s, "
          f"all {took_all:.2f} s")


def _reuse(args: argparse.Namespace) -> int:
    from langgraph_securesaver.keys.provider import NoKeys
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
          f"on {os.cpu_count()} cores")
    with SecureSaver.from_url(args.url, keyring=NoKeys(), redaction=None) as saver:
        names = saver.registry.tenants()
        one = names[len(names) // 2]
        ok = _time_audits(saver, args.url, one, time.time(), args.repeat)
        if args.neighbour:
            with _neighbours(args.neighbour):
                print(f"--- with {args.neighbour} CPU-bound neighbour process(es)")
                _load("load average with the neighbour")
                ok &= _time_audits(saver, args.url, one, time.time(), args.repeat)
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    return 0 if ok else 1


def _time_audits(saver: SecureSaver, url: str, one: str, now: float, repeat: int) -> bool:
    from langgraph_securesaver.audit.inventory import audit_stream
    from langgraph_securesaver.audit.trail import events
    runs: dict[str, list[float]] = {}
    rss: dict[str, list[float]] = {}
    commands = {
        "audit --tenant (CLI)": ["audit", "--url", url, "--tenant", one, "--format", "json"],
        "audit all (CLI)": ["audit", "--url", url, "--format", "json"],
        "audit all html (CLI)": ["audit", "--url", url, "--format", "html"],
        "events --tenant (CLI)": ["events", "--url", url, "--tenant", one, "--since", "30d",
                                  "--format", "json"],
    }
    for _ in range(repeat):
        now = time.time()     # (the summaries were refreshed after the build's clock)
        for label, cmd in commands.items():
            took, peak, _code = _cli(cmd)
            runs.setdefault(label, []).append(took)
            rss.setdefault(label, []).append(peak)
        with open(os.devnull, "w") as sink:
            start = time.perf_counter()
            audit_stream(saver, sink, tenant=one, now=now)
            runs.setdefault("audit --tenant (in-process)", []).append(
                time.perf_counter() - start)
            start = time.perf_counter()
            audit_stream(saver, sink, now=now)
            runs.setdefault("audit all (in-process)", []).append(time.perf_counter() - start)
        start = time.perf_counter()
        found = events(saver, tenant=one, since=now - 30 * DAY)
        runs.setdefault("events --tenant (in-process)", []).append(time.perf_counter() - start)
    for label, values in runs.items():
        extra = f", peak RSS {max(rss[label]):.0f} MB" if label in rss else ""
        print(f"{label}: {_spread(values)}{extra}")
    print(f"(events --tenant {one} --since 30d returned {len(found)} entries)")
    # the targets: at 100k threads audit --tenant < 1 s and audit all < 2 s; at 1M (and
    # anything past 100k) < 2 s and < 10 s
    from langgraph_securesaver.audit import summaries
    large = summaries.scope_size(saver.registry, None) > 100_000
    return (statistics.median(runs["audit --tenant (CLI)"]) < (2 if large else 1)
            and statistics.median(runs["audit all (CLI)"]) < (10 if large else 2)
            and statistics.median(runs["events --tenant (CLI)"]) < 0.5
            and max(max(v) for v in rss.values()) < 300)


def _time_previous(saver: SecureSaver, names: list[str], one: str, now: float) -> None:
    """The code paths this benchmark replaced, on the same data in the same run: the Python
    walk of every raw row (audit) and one transaction + receipt per thread (prune)."""
    from langgraph_securesaver.audit.inventory import _audit_walk, audit_stream
    from langgraph_securesaver.ops.pruner import Sweep
    start = time.perf_counter()
    _audit_walk(saver, saver.registry.tenants(), one, now, None)
    walk = time.perf_counter() - start
    with open(os.devnull, "w") as sink:
        start = time.perf_counter()
        audit_stream(saver, sink, tenant=one, now=now)
        sql = time.perf_counter() - start
    print(f"same run, audit --tenant in-process: row walk {walk:.2f} s, grouped SQL {sql:.2f} s "
          f"({walk / sql:.1f}x)")
    victim = names[0]
    per_thread = Sweep._batch
    Sweep._batch = lambda self, rows: [self._process_safely(r) for r in rows]  # type: ignore
    try:
        start = time.perf_counter()
        old = saver.prune_expired(now=now, tenant=victim, batch=100)
        took_old = time.perf_counter() - start
    finally:
        Sweep._batch = per_thread  # type: ignore[method-assign]
    victim2 = names[2]   # (odd tenants hold no expired threads)
    start = time.perf_counter()
    new = saver.prune_expired(now=now, tenant=victim2)
    took_new = time.perf_counter() - start
    old_rate, new_rate = len(old.deleted) / took_old, len(new.deleted) / took_new
    print(f"same run, prune one tenant: thread by thread {old_rate:.0f} threads/s "
          f"({len(old.deleted)} threads), batched {new_rate:.0f} threads/s "
          f"({len(new.deleted)} threads) = {new_rate / old_rate:.1f}x")


def _time_prune(saver: SecureSaver, args: argparse.Namespace, now: float) -> bool:
    expected = sum(1 for i in range(1, args.threads + 1) if i % 2 == 0 and i % 997
                   and (not args.compare or i % args.tenants not in (0, 2)))
    before = len(saver.receipts(since=now - 1))
    start = time.perf_counter()
    report = saver.prune_expired(now=now, batch=args.batch)
    took = time.perf_counter() - start
    rate = len(report.deleted) / took
    receipts = len(saver.receipts(since=now - 1)) - before
    print(f"prune: {len(report.deleted)} threads ({len(report.deleted) * args.checkpoints} "
          f"checkpoints) deleted in {took:.1f}s = {rate:.0f} threads/s, batch {args.batch}, "
          f"{len(report.errors)} errors, {receipts} new receipts (expected {expected})")
    return rate >= 2000 and len(report.deleted) == expected == receipts and report.ok


if __name__ == "__main__":
    sys.exit(main())
