"""Idempotency store costs on SQLite (a file) and PostgreSQL (if reachable).

* cached hit: ``execute`` on a completed key (one SELECT, decrypt, deserialize) - target <= 1 ms
* first execution: claim + complete of a new key (SELECT miss, INSERT claim, UPDATE complete,
  result sealed) around a no-op effect
* decorator hit: ``@idempotent`` helper called inside a running graph node on a completed key
  (adds run-context lookup and key derivation to the cached hit)
* crash-to-answer: the issue's scenario with the DEFAULT policy (email + charge in one
  AIMessage, the process killed inside the charge); the time from the crashed process's exit
  to the resumed run's answer, (a) in a fresh process (``python crash_run.py resume``:
  interpreter start, imports, opening the saver, the resume) and (b) in a process that is
  already running (just ``graph.invoke(None, config)``) - target < 5 s. The interpreter
  start + imports alone are reported too, so (a) minus that is the resume's own cost.

Run: ``python benchmarks/idempotency_bench.py`` (PostgreSQL from SECURESAVER_TEST_PG, default
postgresql://postgres@127.0.0.1:5432/test). Takes well under a minute.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CRASH_SCRIPT = ROOT / "tests" / "idem_scripts" / "crash_run.py"
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


def _script(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(CRASH_SCRIPT), *args], capture_output=True,
                          text=True, timeout=300, env=env)
    return time.perf_counter() - t0, done


def _crash(url: str, tmp: Path, mode: str, durability: str) -> None:
    Keyring.generate().save(tmp / "keyring.json")
    _, crashed = _script("crash", url, str(tmp / "keyring.json"), str(tmp / "ds.db"), mode,
                         durability)
    if crashed.returncode != 1:
        raise RuntimeError(f"the crash run did not crash: {crashed.stderr[-2000:]}")


def _check(messages: list[dict[str, Any]], ds_path: Path) -> None:
    from tests.idem_scripts.scenario import Downstream
    ds = Downstream(str(ds_path))
    emails = len(ds.rows("SELECT 1 FROM emails"))
    charges = len(ds.rows("SELECT 1 FROM charges"))
    keys = {k for (k,) in ds.rows("SELECT key FROM requests WHERE service='charge'")}
    if (emails, charges, len(keys), messages[-1]["content"]) != (1, 1, 1, "done"):
        raise RuntimeError(f"not exactly once: {emails} emails, {charges} charges, "
                           f"{len(keys)} charge keys")


def crash_to_answer(label: str, make_url: Callable[[Path], Any], runs: int = 3) -> None:
    """Seconds from the crashed process's exit to the resumed run's answer, default policy."""
    from langchain_core.messages import BaseMessage

    from tests.idem_scripts.scenario import Downstream, build_graph
    config = {"configurable": {"thread_id": "order-1", "tenant_id": "acme"}}
    fresh: dict[str, list[float]] = {"sync": [], "async": []}
    running: list[float] = []
    for _ in range(runs):
        for how, mode, durability in (("sync", "decorator", "sync"),
                                      ("async", "wrapper", "async")):
            with tempfile.TemporaryDirectory() as d, make_url(Path(d)) as url:
                tmp = Path(d)
                _crash(url, tmp, mode, durability)
                took, done = _script("resume", url, str(tmp / "keyring.json"),
                                     str(tmp / "ds.db"), mode, durability, how)
                if done.returncode != 0:
                    raise RuntimeError(done.stderr[-2000:])
                _check(json.loads(done.stdout.strip().splitlines()[-1]), tmp / "ds.db")
                fresh[how].append(took)
        with tempfile.TemporaryDirectory() as d, make_url(Path(d)) as url:
            tmp = Path(d)
            _crash(url, tmp, "decorator", "sync")
            ring = Keyring.from_file(tmp / "keyring.json")
            with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
                graph = build_graph(saver, Downstream(str(tmp / "ds.db")), mode="decorator")
                t0 = time.perf_counter()
                out = graph.invoke(None, config, durability="sync")
                running.append(time.perf_counter() - t0)
            msgs: list[BaseMessage] = out["messages"]
            _check([{"content": m.content} for m in msgs], tmp / "ds.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    starts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import langgraph_securesaver.idempotency, "
                        "langgraph.prebuilt, tests.idem_scripts.scenario"], check=True,
                       env=env, cwd=ROOT, timeout=300)
        starts.append(time.perf_counter() - t0)
    startup = statistics.median(starts)

    def fmt(xs: list[float]) -> str:
        return f"median {statistics.median(xs):5.2f} s  max {max(xs):5.2f} s  (n={len(xs)})"
    print(f"{label:10s} crash-to-answer, new process, sync resume:  {fmt(fresh['sync'])}")
    print(f"{label:10s} crash-to-answer, new process, async resume: {fmt(fresh['async'])}")
    print(f"{label:10s} crash-to-answer, running process (invoke):  {fmt(running)}")
    print(f"{label:10s}   of which interpreter start + imports in a new process: "
          f"{startup:5.2f} s (median)")


@contextmanager
def _sqlite_url(tmp: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp / 'checkpoints.db'}"


@contextmanager
def _pg_url(tmp: Path) -> Iterator[str]:
    with postgres_url() as url:
        if url is None:
            raise RuntimeError("PostgreSQL not reachable")
        yield url


def main() -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")
    with tempfile.TemporaryDirectory() as tmp:
        bench("sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}")
    with postgres_url() as url:
        pg = url is not None
        if url is not None:
            bench("postgres", url)
    crash_to_answer("sqlite", _sqlite_url)
    if pg:
        crash_to_answer("postgres", _pg_url)


if __name__ == "__main__":
    main()
