"""Noisy neighbour: a victim tenant's turn latency while a hostile tenant on the same process
(a) writes many-part messages (500 and 2,000 parts of 2 KB), (b) sends 6 concurrent writes of
~200 K characters each (every one under the budget), (c) writes a value of 100,000 strings,
(d) reads back a checkpoint of 1,000,000 short strings again and again, (e) floods refused
cross-tenant reads of one target, (f) sprays refused reads over a new made-up target each
time -- each phase against the victim alone, interleaved, async, default settings
(redaction on, the default budget, scheduler and worker pool). Then (``--legit``) a
legitimate ~310 K-character search result of the victim beside 8 concurrent writes of a
loaded neighbour: stored in full, redacted, never refused?

Also: 16 concurrent async conversations on PostgreSQL (``--concurrent-backends
postgres,sqlite`` for SQLite too), SecureSaver (redaction on) against the raw async saver,
throughput ratio (``--concurrent``), once with a new e-mail address in every turn and once in
every fifth (``--pii-every``, the mix of benchmarks/saver_overhead.py).

    python benchmarks/noisy_neighbour.py [--rounds 2] [--victim-turns 200] [--backends sqlite,postgres]
                                         [--concurrent 16] [--turns 12] [--pii-every 1,5]
                                         [--concurrent-backends postgres,sqlite]
                                         [--only 500,denial]

Targets: victim median <= 1.5x and p95 <= 2x alone; no stored value holds a WITHHELD marker;
<= 10 access_denied rows per 8 s of flood or spray, counts exact; the legitimate write stored
in full with no refusal; 16 conversations >= 0.6x raw throughput. The load average is printed with the figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import string
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver, tenant_scope

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fake_agent import build_chat_graph

try:  # absent before the worker pool existed (the script also runs against older builds)
    from langgraph_securesaver.redaction.pool import shared_pool
except ImportError:  # pragma: no cover
    shared_pool = None  # type: ignore[assignment]

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
WITHHELD = "<WITHHELD:masked>"
MD: Any = {"source": "input", "step": -1, "parents": {}}
PREBUILT = 10  # hostile payloads built before a phase (more than one phase's writes)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    import psycopg
    schema = "nn_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@asynccontextmanager
async def secure(backend: str, workdir: Path) -> AsyncIterator[SecureSaver]:
    if backend == "sqlite":
        url = f"sqlite:///{workdir / (uuid.uuid4().hex + '.db')}"
        async with SecureSaver.afrom_url(url, keyring=Keyring.generate()) as saver:
            yield saver
        return
    async with pg_schema() as url, SecureSaver.afrom_url(url, keyring=Keyring.generate()) as saver:
        yield saver


def filler(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(string.ascii_lowercase + "     ", k=n))


#: 2,000-character blocks of random words the hostile parts are cut from. The hostile tenant's
#: messages are built by its client, not by the serving process: building 1-4 MB of random
#: text here, on the event loop the victim shares, costs seconds and would be measured as
#: the saver's doing. So the text is made once, before any phase; each part is a block of it
#: and an e-mail address of its own (every part is a new string: no cache answers it).
_BLOCKS: list[str] = []


def blocks(rng: random.Random) -> list[str]:
    if not _BLOCKS:
        _BLOCKS.extend(filler(rng, 2000) for _ in range(512))
    return _BLOCKS


def parts_message(rng: random.Random, count: int) -> HumanMessage:
    pool = blocks(rng)
    return HumanMessage(content=[
        {"type": "text", "text": f"{rng.choice(pool)} mail p{rng.random()}@example.com"}
        for _ in range(count)])


def search_result(rng: random.Random, records: int = 200) -> str:
    """A JSON tool output of ``records`` records (~1 K characters each) with an e-mail and a
    phone number each: 200 records ~205 K characters, 300 ~310 K."""
    import json
    pool = blocks(rng)
    salt = rng.randrange(10**6)
    return json.dumps([{"id": i, "email": f"person.{salt}.{i}@example.com",
                        "phone": f"+1 415 555 {1000 + i % 9000:04d}",
                        "snippet": rng.choice(pool)[:950]} for i in range(records)])


def big_write(rng: random.Random) -> dict[str, Any]:
    from langchain_core.messages import ToolMessage
    return {"messages": [ToolMessage(search_result(rng), tool_call_id="call-1")]}


def many_strings(rng: random.Random, count: int = 100_000) -> list[str]:
    salt = rng.randrange(10**6)
    return [f"row {salt}-{i} call 415-555-{i % 10000:04d}" for i in range(count)]


class Victim:
    """Turns of the victim's conversations, back to back, with their latencies.

    A turn costs more as its conversation grows, so every measurement is a fresh
    conversation of the same number of turns: alone and beside a hostile tenant, the victim
    runs turns 1..N of a new thread, and the two medians compare like with like."""

    def __init__(self, saver: SecureSaver) -> None:
        self.saver = saver
        self.graph = build_chat_graph(saver)
        self.turn = 0

    async def run(self, turns: int) -> list[float]:
        latencies: list[float] = []
        thread = "victim-" + uuid.uuid4().hex[:8]
        cfg = {"configurable": {"thread_id": thread, "tenant_id": "victim"}}
        for _ in range(turns):
            self.turn += 1
            text = f"turn {self.turn}: my mail is v{self.turn % 7}@example.org, thanks"
            start = time.perf_counter()
            await self.graph.ainvoke({"messages": [HumanMessage(text)]}, cfg)
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.002)
        return latencies


async def hostile_writes(saver: SecureSaver, make: Callable[[random.Random], dict[str, Any]],
                         stop: asyncio.Event, out: dict[str, Any]) -> None:
    rng = random.Random(uuid.uuid4().int)
    # built before the victim's first turn (this runs before the phase's first await): a
    # client builds its payload, the serving process does not
    ready = [make(rng) for _ in range(PREBUILT)]
    n = 0
    while not stop.is_set():
        n += 1
        cp = empty_checkpoint()
        cp["channel_values"] = ready.pop() if ready else make(rng)
        cp["channel_versions"] = dict.fromkeys(cp["channel_values"], 1)
        cfg = {"configurable": {"thread_id": f"mallory-{uuid.uuid4().hex}", "tenant_id": "mallory",
                                "checkpoint_ns": ""}}
        start = time.perf_counter()
        try:
            await saver.aput(cfg, cp, MD, dict.fromkeys(cp["channel_values"], 1))
            outcome = "stored"
        except Exception as exc:  # the refusal is an outcome too
            outcome = type(exc).__name__
        out.setdefault("durations", []).append(time.perf_counter() - start)
        out.setdefault("outcomes", []).append(outcome)
        if outcome == "stored" and n <= 2:  # read back after the phase (reads are not measured)
            out.setdefault("stored", []).append(cfg)


async def deny_flood(saver: SecureSaver, stop: asyncio.Event, out: dict[str, Any],
                     spray: bool = False) -> None:
    """Refused cross-tenant reads of the victim, or (``spray``) of a new made-up tenant each
    time."""
    with tenant_scope("mallory"):
        while not stop.is_set():
            target = f"made-up-{uuid.uuid4().hex[:12]}" if spray else "victim"
            cfg = {"configurable": {"thread_id": "t-victim", "tenant_id": target}}
            try:
                await saver.aget_tuple(cfg)
            except AccessDenied:
                out["raised"] = out.get("raised", 0) + 1


_BIG_READ: dict[str, Any] = {}


async def hostile_reads(saver: SecureSaver, stop: asyncio.Event, out: dict[str, Any]) -> None:
    """A checkpoint of 1,000,000 short strings (stored once, for free: the pre-filter passes
    them), read back again and again."""
    cfg = {"configurable": {"thread_id": "mallory-big", "tenant_id": "mallory",
                            "checkpoint_ns": ""}}
    if id(saver) not in _BIG_READ:
        cp = empty_checkpoint()
        cp["channel_values"] = {"rows": [f"r{i % 1000}" for i in range(1_000_000)]}
        cp["channel_versions"] = {"rows": 1}
        await saver.aput(cfg, cp, MD, {"rows": 1})
        _BIG_READ[id(saver)] = cfg
    while not stop.is_set():
        start = time.perf_counter()
        await saver.aget_tuple(cfg)
        out.setdefault("durations", []).append(time.perf_counter() - start)
        out.setdefault("outcomes", []).append("read")


async def disturbed(victim: Victim, turns: int, min_seconds: float,
                    hostile: Callable[[asyncio.Event, dict[str, Any]], list[Awaitable[None]]]
                    ) -> tuple[list[float], dict[str, Any], float]:
    """The victim's ``turns`` beside the hostile tasks, which run for at least
    ``min_seconds``; returns the latencies, what the hostile tasks recorded and how long
    they ran."""
    stop = asyncio.Event()
    out: dict[str, Any] = {}
    tasks = [asyncio.ensure_future(h) for h in hostile(stop, out)]
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    latencies = await victim.run(turns)
    left = min_seconds - (time.perf_counter() - started)
    if left > 0:
        await asyncio.sleep(left)
    stop.set()
    await asyncio.gather(*tasks)
    ran = time.perf_counter() - started
    for cfg in out.pop("stored", []):
        tup = await victim.saver.aget_tuple(cfg)
        text = repr(tup.checkpoint["channel_values"]) if tup else ""
        out.setdefault("withheld", []).append(text.count(WITHHELD))
    return latencies, out, ran


def denial_rows(saver: SecureSaver, since: float) -> tuple[int, int]:
    saver.registry.dispose()  # flushes the pending summaries (the engine reconnects)
    rows = [e for e in saver.registry.list_events(kind="access_denied") if e.at >= since]
    return len(rows), sum(int(e.detail.get("count", 1)) for e in rows)


async def run_backend(backend: str, rounds: int, turns: int, workdir: Path,
                      only: str = "") -> dict[str, dict[str, list[Any]]]:
    scenarios: dict[str, Callable[[SecureSaver], Callable[[asyncio.Event, dict[str, Any]],
                                                          list[Awaitable[None]]]]] = {
        "500 parts x 2 KB": lambda s: lambda stop, out: [hostile_writes(
            s, lambda r: {"messages": [parts_message(r, 500)]}, stop, out)],
        "2,000 parts x 2 KB": lambda s: lambda stop, out: [hostile_writes(
            s, lambda r: {"messages": [parts_message(r, 2000)]}, stop, out)],
        "6 concurrent 200 K writes": lambda s: lambda stop, out: [
            hostile_writes(s, big_write, stop, out) for _ in range(6)],
        "denial flood (2 tasks)": lambda s: lambda stop, out: [deny_flood(s, stop, out),
                                                              deny_flood(s, stop, out)],
        "denial spray (made-up targets)": lambda s: lambda stop, out: [
            deny_flood(s, stop, out, spray=True), deny_flood(s, stop, out, spray=True)],
        "100,000 strings": lambda s: lambda stop, out: [hostile_writes(
            s, lambda r: {"rows": many_strings(r)}, stop, out)],
        "1,000,000-string read back": lambda s: lambda stop, out: [
            hostile_reads(s, stop, out)],
    }
    if only:
        scenarios = {k: v for k, v in scenarios.items()
                     if any(word in k for word in only.split(","))}
    results: dict[str, dict[str, list[Any]]] = {}
    blocks(random.Random(0))
    async with secure(backend, workdir) as saver:
        victim = Victim(saver)
        await victim.run(20)  # warm up
        for r in range(rounds):
            for name, make in scenarios.items():
                # alternate which comes first, so that drift on the machine cancels out
                alone_first = r % 2 == 0
                if alone_first:
                    alone = await victim.run(turns)
                since = time.time()
                lat, out, ran = await disturbed(victim, turns,
                                                8.0 if name.startswith("denial") else 0.0,
                                                make(saver))
                if not alone_first:
                    alone = await victim.run(turns)
                res = results.setdefault(name, {"alone": [], "with": [], "hostile": [],
                                                "withheld": [], "rows": [], "outcomes": []})
                res["alone"].extend(alone)
                res["with"].extend(lat)
                res["hostile"].extend(out.get("durations", []))
                res["outcomes"].extend(out.get("outcomes", []))
                res["withheld"].extend(out.get("withheld", []))
                if name.startswith("denial"):
                    rows, total = await asyncio.to_thread(denial_rows, saver, since)
                    res["rows"].append((rows, total, out.get("raised", 0), ran))
            print(f"  [{backend}] round {r + 1}/{rounds} done; {load()}", flush=True)
    print(f"\n{backend} (async), {rounds} rounds, {turns} victim turns per phase; {load()}")
    print(f"{'hostile':24} {'alone med/p95 ms':>18} {'with med/p95 ms':>17} {'x med':>6} "
          f"{'x p95':>6} {'hostile write max s':>20}  notes")
    for name, res in results.items():
        a_med, a_p95 = statistics.median(res["alone"]), pct(res["alone"], 0.95)
        w_med, w_p95 = statistics.median(res["with"]), pct(res["with"], 0.95)
        hmax = max(res["hostile"]) if res["hostile"] else float("nan")
        notes = ""
        if res["outcomes"]:
            kinds = {o: res["outcomes"].count(o) for o in set(res["outcomes"])}
            slowest = {o: round(max(d for d, k in zip(res["hostile"], res["outcomes"],
                                                      strict=True) if k == o), 2)
                       for o in kinds}
            notes = (f"writes {kinds}, slowest {slowest} s; withheld parts "
                     f"{res['withheld']}")
        if res["rows"]:
            notes = "; ".join(f"{rows} rows in {ran:.1f} s, count {total} = raised {raised}: "
                              f"{'exact' if total == raised else 'MISMATCH'}"
                              for rows, total, raised, ran in res["rows"])
        print(f"{name:24} {a_med * 1e3:8.1f}/{a_p95 * 1e3:<8.1f} {w_med * 1e3:8.1f}/"
              f"{w_p95 * 1e3:<8.1f} {w_med / a_med:6.2f} {w_p95 / a_p95:6.2f} "
              f"{hmax:20.2f}  {notes}")
    return results


def readme_rows(by_backend: dict[str, dict[str, dict[str, list[Any]]]]) -> None:
    """The docs/benchmarks.md table: one row per hostile phase, backends as ``a / b``."""
    names = list(by_backend)
    print(f"\n| hostile tenant | victim median x alone | victim p95 x alone | hostile write, max "
          f"| rows per 8 s of flood |   ({' / '.join(names)})")
    print("| --- | --- | --- | --- | --- |")
    phases = list(next(iter(by_backend.values()))) if by_backend else []
    for name in phases:
        cells: list[list[str]] = [[], [], [], []]
        for backend in names:
            res = by_backend[backend][name]
            a_med, a_p95 = statistics.median(res["alone"]), pct(res["alone"], 0.95)
            w_med, w_p95 = statistics.median(res["with"]), pct(res["with"], 0.95)
            cells[0].append(f"{w_med / a_med:.2f}")
            cells[1].append(f"{w_p95 / a_p95:.2f}")
            cells[2].append(f"{max(res['hostile']):.1f} s" if res["hostile"] else "—")
            cells[3].append(", ".join(f"{rows * 8 / ran:.1f} (count {total} = {raised})"
                                      for rows, total, raised, ran in res["rows"]) or "—")
        print(f"| {name} | " + " | ".join(" / ".join(c) for c in cells) + " |")


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (every process: this one, the redaction
    workers, the database server), from /proc/stat; nan where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except OSError:  # pragma: no cover - not Linux
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def chat_line(i: int, t: int, pii_every: int) -> str:
    """Turn ``t`` of conversation ``i``: a new e-mail address every ``pii_every`` turns."""
    if t % pii_every == pii_every - 1:
        return f"conversation {i} turn {t}: reach me at c{i}.t{t}@example.com"
    return f"conversation {i} turn {t}: please summarise the previous answer in one line"


async def conversations(make_saver: Callable[[], Any], n: int, turns: int,
                        pii_every: int = 1) -> tuple[float, float, float]:
    """Turns per second of ``n`` concurrent conversations on one saver, and the busy CPU
    milliseconds per turn of the machine (all processes) and of this process (the one GIL
    every conversation of the process shares)."""
    async with make_saver() as saver:
        graph = build_chat_graph(saver)

        async def talk(i: int) -> None:
            cfg = {"configurable": {"thread_id": f"c{i}", "tenant_id": f"tenant-{i % 4}"}}
            for t in range(turns):
                await graph.ainvoke({"messages": [HumanMessage(chat_line(i, t, pii_every))]},
                                    cfg)

        await talk(999)  # warm up
        start, busy, own = time.perf_counter(), machine_busy(), time.process_time()
        await asyncio.gather(*(talk(i) for i in range(n)))
        done = n * turns
        return (done / (time.perf_counter() - start), (machine_busy() - busy) * 1e3 / done,
                (time.process_time() - own) * 1e3 / done)


async def run_concurrent(n: int, turns: int, rounds: int, pii_every: int,
                         backend: str = "postgres", workdir: Path | None = None) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from langgraph_securesaver.storage.backends import libpq_url

    @asynccontextmanager
    async def database() -> AsyncIterator[str]:
        if backend == "sqlite":
            assert workdir is not None
            yield f"sqlite:///{workdir / (uuid.uuid4().hex + '.db')}"
            return
        async with pg_schema() as url:
            yield url

    @asynccontextmanager
    async def raw() -> AsyncIterator[Any]:
        async with database() as url:
            if backend == "sqlite":
                async with AsyncSqliteSaver.from_conn_string(url[len("sqlite:///"):]) as saver:
                    await saver.setup()
                    yield saver
                return
            async with AsyncPostgresSaver.from_conn_string(libpq_url(url)) as saver:
                await saver.setup()
                yield saver

    @asynccontextmanager
    async def wrapped() -> AsyncIterator[Any]:
        async with database() as url, SecureSaver.afrom_url(
                url, keyring=Keyring.generate()) as saver:
            yield saver

    @asynccontextmanager
    async def sealed_only() -> AsyncIterator[Any]:
        async with database() as url, SecureSaver.afrom_url(
                url, keyring=Keyring.generate(), redaction=None) as saver:
            yield saver

    raws, secures, seals = [], [], []
    for _ in range(rounds):
        raws.append(await conversations(raw, n, turns, pii_every))
        secures.append(await conversations(wrapped, n, turns, pii_every))
        seals.append(await conversations(sealed_only, n, turns, pii_every))
    r, s = statistics.median(t[0] for t in raws), statistics.median(t[0] for t in secures)
    rc, sc = statistics.median(t[1] for t in raws), statistics.median(t[1] for t in secures)
    rp, sp = statistics.median(t[2] for t in raws), statistics.median(t[2] for t in secures)
    where = "SQLite" if backend == "sqlite" else "PostgreSQL"
    print(f"\n{n} concurrent async conversations on {where}, {turns} turns each, a new "
          f"e-mail address every {pii_every} turn(s), {rounds} rounds: raw {r:.1f} turns/s, "
          f"SecureSaver (redaction on) {s:.1f} turns/s = {s / r:.2f}x; machine CPU per turn "
          f"(every process) raw {rc:.1f} ms, SecureSaver {sc:.1f} ms = {sc / rc:.2f}x; "
          f"serving process CPU per turn raw {rp:.1f} ms, SecureSaver {sp:.1f} ms; {load()}")
    e = statistics.median(t[0] for t in seals)
    ep = statistics.median(t[2] for t in seals)
    print(f"  the same with encryption only (redaction=None): {e:.1f} turns/s = {e / r:.2f}x; "
          f"serving process CPU per turn {ep:.1f} ms")


async def legit_beside_load(backend: str, workdir: Path, neighbours: int = 8) -> bool:
    """The victim's legitimate ~310 K-character search result, written while a loaded
    neighbour sends ``neighbours`` concurrent writes (each under half the budget): stored in
    full (read back equal), redacted in storage, never refused? Prints the outcome."""
    from langchain_core.messages import ToolMessage
    rng = random.Random(7)
    blocks(rng)
    doc = search_result(rng, 300)
    async with secure(backend, workdir) as saver:
        stop = asyncio.Event()
        out: dict[str, Any] = {}
        loud = [asyncio.ensure_future(hostile_writes(saver, big_write, stop, out))
                for _ in range(neighbours)]
        await asyncio.sleep(0.2)
        cfg = {"configurable": {"thread_id": "legit", "tenant_id": "victim",
                                "checkpoint_ns": ""}}
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": [ToolMessage(doc, tool_call_id="search-1")]}
        cp["channel_versions"] = {"messages": 1}
        start = time.perf_counter()
        try:
            await saver.aput(cfg, cp, MD, {"messages": 1})
            outcome = "stored"
        except Exception as exc:  # a refusal is the failure measured here
            outcome = f"refused ({type(exc).__name__})"
        took = time.perf_counter() - start
        stop.set()
        await asyncio.gather(*loud)
        tup = await saver.aget_tuple(cfg)
        whole = tup is not None and tup.checkpoint["channel_values"]["messages"][0].content == doc
    ok = outcome == "stored" and whole
    print(f"\n[{backend}] legitimate {len(doc):,}-character write beside {neighbours} concurrent "
          f"neighbour writes: {outcome} in {took:.1f} s, read back "
          f"{'in full' if whole else 'NOT in full'}; neighbour writes "
          f"{ {o: out.get('outcomes', []).count(o) for o in set(out.get('outcomes', []))} }; "
          f"{load()}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--victim-turns", type=int, default=200,
                        help="victim turns per phase (a fresh conversation each time)")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--concurrent-backends", default="postgres",
                        help="where the concurrent conversations run (comma-separated: "
                             "postgres, sqlite)")
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--pii-every", default="1,5",
                        help="the concurrent conversations carry a new e-mail address every N "
                             "turns; one comparison per N (1: every turn, 5: the per-turn "
                             "benchmark's mix)")
    parser.add_argument("--only", default="",
                        help="run only the phases whose names hold one of these words "
                             "(comma-separated: 500, 2,000, 200 K, denial, spray, 100,000, "
                             "1,000,000)")
    parser.add_argument("--legit", action="store_true",
                        help="also write a legitimate 310 K search result beside a loaded "
                             "neighbour (stored in full?)")
    args = parser.parse_args()
    started = time.perf_counter()
    print(load())
    if shared_pool is not None:
        pool = shared_pool()
        print(f"redaction workers: {pool.size} (ready: {pool.wait_ready()})")
    by_backend: dict[str, dict[str, dict[str, list[Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in [b for b in args.backends.split(",") if b]:
            by_backend[backend] = asyncio.run(run_backend(backend, args.rounds, args.victim_turns,
                                                          Path(tmp), args.only))
            if args.legit:
                asyncio.run(legit_beside_load(backend, Path(tmp)))
    if args.concurrent:
        with tempfile.TemporaryDirectory() as tmp:
            for backend in [b for b in args.concurrent_backends.split(",") if b]:
                for every in [int(e) for e in args.pii_every.split(",") if e]:
                    asyncio.run(run_concurrent(args.concurrent, args.turns,
                                               max(1, args.rounds), max(1, every), backend,
                                               Path(tmp)))
    readme_rows(by_backend)
    print(f"\n{time.perf_counter() - started:.0f} s in all; {load()}")


if __name__ == "__main__":
    main()
