"""Rebuilding a 500-step DeltaChannel: SecureSaver's get_delta_channel_history vs the base walk.

One thread whose DeltaChannel got 500 writes and no snapshot (``snapshot_frequency`` above the
step count), so rebuilding its value walks all 500 ancestors. Timed, interleaved round by round
in this one process:

* ``raw fast path``  - the raw inner saver's own ``get_delta_channel_history`` (reference);
* ``before``         - SecureSaver through the base-class walk (one ``get_tuple`` per
                       ancestor: what SecureSaver did before it overrode the method);
* ``after``          - SecureSaver's override (paged inner listing, one authentication per
                       ancestor, PII restored once).

SecureSaver runs with its defaults (redaction on). Ratios in one run are what count; absolute
times are noisy, more so on a shared machine.

    python benchmarks/delta_history.py [--steps 500] [--rounds 5] [--backends memory,sqlite,postgres]
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from langgraph_securesaver import Keyring, SecureSaver

PG_URL = os.environ.get("SECURESAVER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _extend(state: Any, writes: list[Any]) -> list[Any]:
    out = list(state or [])
    for w in writes:
        out.extend(w)
    return out


class State(TypedDict):
    items: Annotated[list, DeltaChannel(_extend, snapshot_frequency=100_000)]
    count: Annotated[int, operator.add]


def build_thread(saver: BaseCheckpointSaver, steps: int) -> dict:
    """One run of ``steps`` supersteps, each appending one item; returns the latest config."""
    def add(state: State) -> dict[str, Any]:
        n = state.get("count", 0)
        return {"items": [f"step {n}: contact user{n}@example.com"], "count": 1}

    builder = StateGraph(State)
    builder.add_node("add", add)
    builder.add_edge(START, "add")
    builder.add_conditional_edges("add", lambda s: "add" if s["count"] < steps else "__end__")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "delta", "tenant_id": "acme"},
              "recursion_limit": steps + 10}
    graph.invoke({"items": [], "count": 0}, config)
    latest = saver.get_tuple({"configurable": config["configurable"]})
    assert latest is not None
    return latest.config


@contextmanager
def raw_and_secure(backend: str, workdir: Path) -> Iterator[tuple[BaseCheckpointSaver,
                                                                  SecureSaver]]:
    """A raw saver and a SecureSaver (defaults) over its own saver of the same kind."""
    if backend == "memory":
        yield InMemorySaver(), SecureSaver(InMemorySaver(), keyring=Keyring.generate())
        return
    if backend == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        from langgraph_securesaver.storage.backends import connect_sqlite
        conn = connect_sqlite(str(workdir / f"raw-{uuid.uuid4().hex}.db"))
        raw = SqliteSaver(conn)
        raw.setup()
        try:
            with SecureSaver.from_url(f"sqlite:///{workdir / f'ss-{uuid.uuid4().hex}.db'}",
                                      keyring=Keyring.generate()) as secure:
                yield raw, secure
        finally:
            conn.close()
        return
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg_pool import ConnectionPool

    from langgraph_securesaver.storage.backends import libpq_url, postgres_connection_kwargs
    schema = "bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    try:
        with ConnectionPool(libpq_url(url), kwargs=postgres_connection_kwargs(), min_size=1,
                            max_size=4) as pool:
            raw = PostgresSaver(pool)  # type: ignore[arg-type]
            raw.setup()
            with SecureSaver.from_url(url, keyring=Keyring.generate()) as secure:
                yield raw, secure
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run_backend(backend: str, steps: int, rounds: int, workdir: Path) -> dict[str, float]:
    with raw_and_secure(backend, workdir) as (raw, secure):
        raw_cfg, secure_cfg = build_thread(raw, steps), build_thread(secure, steps)
        variants: dict[str, Callable[[], Any]] = {
            "raw fast path": lambda: raw.get_delta_channel_history(
                config=raw_cfg, channels=["items"]),
            "before (base walk)": lambda: BaseCheckpointSaver.get_delta_channel_history(
                secure, config=secure_cfg, channels=["items"]),
            "after (override)": lambda: secure.get_delta_channel_history(
                config=secure_cfg, channels=["items"]),
        }
        # same answer from both SecureSaver paths, and all 500 writes back in clear
        after = variants["after (override)"]()
        assert after == variants["before (base walk)"]()
        assert len(after["items"]["writes"]) >= steps
        assert "user0@example.com" in repr(after)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                times[name].append(timed(fn))
        return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="memory,sqlite,postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            medians = run_backend(backend.strip(), args.steps, args.rounds, Path(tmp))
            base = medians["raw fast path"]
            before, after = medians["before (base walk)"], medians["after (override)"]
            print(f"\n{backend}: rebuild of a {args.steps}-step delta channel "
                  f"(median of {args.rounds})")
            for name, value in medians.items():
                print(f"  {name:<20} {value * 1000:9.1f} ms   {value / base:6.2f}x raw")
            print(f"  after is {before / after:.1f}x faster than before")


if __name__ == "__main__":
    main()
