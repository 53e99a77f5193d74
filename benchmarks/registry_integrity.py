"""Cost of the registry's tamper evidence: appending receipts/events (chain head lock + MACs)
and `events --verify`, on SQLite and PostgreSQL.

    python benchmarks/registry_integrity.py [--pg URL] [--rows 300]

Prints rows/s for record_event and add_receipt (one transaction each, as the pruner writes
them) and for add_receipts in batches of 50, and the verify rate. Run it with an older
checkout on PYTHONPATH for a before/after ratio (`verify` is skipped there).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from langgraph_securesaver import Keyring, SecureSaver


def bench(url: str, rows: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        reg = saver.registry
        reg.record_event("warmup", tenant="acme")
        t = time.perf_counter()
        for i in range(rows):
            reg.record_event("bench", tenant=f"t{i % 4}", n=i)
        out["record_event/s"] = rows / (time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(rows):
            reg.add_receipt(tenant=f"t{i % 4}", thread_id=f"th-{i}", action="deleted",
                            reason="bench", detail={"checkpoints": 3})
        out["add_receipt/s"] = rows / (time.perf_counter() - t)
        if hasattr(reg, "add_receipts"):
            t = time.perf_counter()
            for b in range(0, rows, 50):
                reg.add_receipts([{"tenant": f"t{i % 4}", "thread_id": f"bt-{i}",
                                   "action": "deleted", "reason": "bench"}
                                  for i in range(b, min(rows, b + 50))])
            out["add_receipts(batch 50)/s"] = rows / (time.perf_counter() - t)
        if hasattr(reg, "verify_integrity"):
            t = time.perf_counter()
            report = reg.verify_integrity()
            total = sum(report.checked.values())
            out["verify rows/s"] = total / (time.perf_counter() - t)
            assert report.ok, report.problems
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pg", default=None)
    parser.add_argument("--rows", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls = [("sqlite", f"sqlite:///{Path(tmp) / 'b.db'}")]
        if args.pg:
            urls.append(("postgres", args.pg))
        for name, url in urls:
            for key, value in bench(url, args.rows).items():
                print(f"{name:8} {key:26} {value:9.0f}")


if __name__ == "__main__":
    main()
