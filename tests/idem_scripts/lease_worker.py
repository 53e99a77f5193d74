"""A worker or a recoverer process for the recovery-lease tests (graph: ``lease_graph.py``).

Usage:
    python lease_worker.py run URL KEYRING THREAD
        opt THREAD in (``mark_recoverable`` before ``invoke``, unless ``$LEASE_MARK=node``)
        and run one user turn with durability="sync". ``$LEASE_SKEW`` (seconds) shifts THIS
        process's clock: ``time.time`` and the ``datetime`` LangGraph stamps checkpoint
        ``ts`` with; the database clock is untouched.
    python lease_worker.py sweep URL KEYRING [STOP_FILE]
        recovery sweeps with ``recover_main`` on its default settings (what ``securesaver
        recover`` runs), until STOP_FILE exists (then one last sweep); without STOP_FILE one
        sweep. Prints the summed report as JSON. ``$LEASE_ASYNC=1`` sweeps through the async
        saver (``arecover_stalled``).
"""

from __future__ import annotations

import datetime as _datetime
import os
import sys
import time

_SKEW = float(os.environ.get("LEASE_SKEW", "0") or 0)
if _SKEW:  # before LangGraph is imported: it binds datetime at import time
    _real_time = time.time

    def _skewed_time() -> float:
        return _real_time() + _SKEW

    time.time = _skewed_time

    class _SkewedDatetime(_datetime.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def,override]
            return super().now(tz) + _datetime.timedelta(seconds=_SKEW)

        @classmethod
        def utcnow(cls):  # type: ignore[no-untyped-def,override]
            return super().utcnow() + _datetime.timedelta(seconds=_SKEW)

    _datetime.datetime = _SkewedDatetime  # type: ignore[misc]

import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

GRAPH = "tests.idem_scripts.lease_graph:factory"


def run(url: str, keyring: str, thread: str) -> None:
    from langchain_core.messages import HumanMessage

    from langgraph_securesaver import Keyring, SecureSaver
    from langgraph_securesaver.idempotency import mark_recoverable
    from tests.idem_scripts.lease_graph import build

    config = {"configurable": {"thread_id": thread, "tenant_id": "acme"}}
    with SecureSaver.from_url(url, keyring=Keyring.load(keyring), redaction=None) as saver:
        graph = build(saver)
        if os.environ.get("LEASE_MARK") != "node":
            mark_recoverable(config, saver=saver)  # the documented opt-in before invoke
        graph.invoke({"messages": [HumanMessage("charge me")]}, config, durability="sync")


def sweep(url: str, keyring: str, stop: str | None) -> None:
    from langgraph_securesaver.idempotency import recover_main

    if os.environ.get("LEASE_ASYNC") == "1":
        url = url.replace("sqlite:", "sqlite+aiosqlite:", 1).replace(
            "postgresql:", "postgresql+psycopg_async:", 1)
    total: dict[str, object] = {"sweeps": 0, "examined": 0, "resumed": [], "failed": [],
                                "dead_lettered": [], "finished": [], "yielded": [], "busy": 0,
                                "recent": 0, "pid": os.getpid()}
    count = int(os.environ.get("LEASE_SWEEPS", "1"))
    while True:
        count -= 1
        last = (stop is None and count <= 0) or (stop is not None and Path(stop).exists())
        options = {}
        if os.environ.get("LEASE_OLDER_THAN"):  # as `securesaver recover --older-than`
            from langgraph_securesaver.retention import parse_duration
            options["older_than"] = parse_duration(os.environ["LEASE_OLDER_THAN"])
        report = recover_main(url, GRAPH, keyring=keyring, redaction=None, **options)
        total["sweeps"] = int(total["sweeps"]) + 1  # type: ignore[call-overload]
        total["examined"] = int(total["examined"]) + report.examined  # type: ignore[call-overload]
        total["busy"] = int(total["busy"]) + report.skipped_busy  # type: ignore[call-overload]
        total["recent"] = int(total["recent"]) + report.skipped_recent  # type: ignore[call-overload]
        for name in ("resumed", "failed", "dead_lettered", "finished", "yielded"):
            total[name] += [list(x) for x in getattr(report, name, [])]  # type: ignore[operator]
        if stop is not None:  # progress for the test: one line per sweep
            with open(f"{stop}.{os.getpid()}.sweeps", "a") as fh:
                fh.write(f"{report.skipped_busy}\n")
        if stop is None:
            print(json.dumps(total), flush=True)  # one line per sweep
            total.update(sweeps=0, examined=0, resumed=[], failed=[], dead_lettered=[],
                         finished=[], yielded=[], busy=0, recent=0)
        if last:
            break
        time.sleep(0.2)
    if stop is not None:
        print(json.dumps(total))


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    mode, url, keyring = sys.argv[1:4]
    if mode == "run":
        run(url, keyring, sys.argv[4])
    else:
        sweep(url, keyring, sys.argv[4] if len(sys.argv) > 4 else None)


if __name__ == "__main__":
    main()
