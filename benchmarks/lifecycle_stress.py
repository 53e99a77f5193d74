"""The key-lifecycle stress test, many rounds (issue 39): writer processes with their own savers
keep writing while other processes rotate keys (SIGKILLed at random points, rerun with
--retire-old), prune, delete threads, forget a subject and `securesaver recover` a stalled
thread; after each round every turn that
returned (and was not deleted on purpose since) must read back, `scan --verify` must be clean
and one master version in use. Prints one line per round and a summary; ``--json`` writes them.

    python benchmarks/lifecycle_stress.py [--rounds 20] [--backend sqlite|postgres|both]
        [--pg-url postgresql://postgres@127.0.0.1:5432/test] [--json out.json]

A round takes 30-60 s on a quiet 2-core machine; a failed check stops the run with the
assertion that failed (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.lifecycle_helpers import Deletions, new_keyring, stress_round  # noqa: E402


def pg_schema_url(base: str) -> tuple[str, str]:
    import psycopg
    schema = f"lifecycle_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}", schema


def drop_schema(base: str, schema: str) -> None:
    import psycopg
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run(backend: str, rounds: int, pg_url: str, workdir: Path) -> list[dict]:
    schema = None
    if backend == "sqlite":
        url = f"sqlite:///{workdir / 'agent.db'}"
    else:
        url, schema = pg_schema_url(pg_url)
    try:
        ring_path = new_keyring(url, workdir / "keyring.json")
        deletions, history = Deletions(), {}  # type: ignore[var-annotated]
        out = []
        for number in range(rounds):
            report = stress_round(url, ring_path, workdir / f"round{number}", number,
                                  seed=number, deletions=deletions, history=history)
            row = {"backend": backend, **report.as_dict()}
            out.append(row)
            print(json.dumps(row), flush=True)
        return out
    finally:
        if schema is not None:
            drop_schema(pg_url, schema)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    rows: list[dict] = []
    started = time.monotonic()
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix=f"lifecycle-{backend}-") as tmp:
            rows += run(backend, args.rounds, args.pg_url, Path(tmp))
    for backend in backends:
        mine = [r for r in rows if r["backend"] == backend]
        print(f"{backend}: {len(mine)} rounds, all checks passed; turns returned "
              f"{sum(r['turns_ok'] for r in mine)}, refused before storing (KeyGoneError, "
              f"retried) {sum(r['turns_refused'] for r in mine)}, threads deleted "
              f"{sum(r['threads_deleted'] for r in mine)}, pruned "
              f"{sum(r['threads_pruned'] for r in mine)}, rotations SIGKILLed "
              f"{sum(r['rotation_killed'] for r in mine)}, stalled threads recovered "
              f"{sum(r['recovered'] for r in mine)} in {sum(r['recover_sweeps'] for r in mine)} "
              f"sweeps, protected turns read back "
              f"{mine[-1]['protected_checked'] if mine else 0}, lost turns 0")
    print(f"total {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
