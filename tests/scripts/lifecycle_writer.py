"""An application process that keeps writing turns while other processes destroy, move and
retire its keys (tests/test_key_lifecycle.py, tests/test_lifecycle_stress.py).

    python -m tests.scripts.lifecycle_writer SPEC_JSON

SPEC_JSON: ``url``, ``keyring`` (a file, loaded ONCE at start, as an app does), ``tenant``,
``threads`` (thread ids, written round-robin; ``shuffle``: picked at random, ``seed``), ``new_every`` (every Nth turn goes to a new
thread ``<prefix>n<N>``: a new thread key each time; 0 for never), ``prefix``, ``out`` (the
log), ``stop`` (a file: stop when it exists), ``mode`` ("sync" or "async"), ``subject``
(optional: writes under ``subject_scope``), ``max_age`` (optional seconds: a
``RetentionPolicy(max_age=...)``), ``burst`` and ``gap`` (optional: after ``burst`` turns,
idle ``gap`` seconds with every key still cached), ``pace`` (optional seconds between
turns otherwise).

Every settings of the saver are the defaults, except redaction (off: not what is tested).
The log has one line per turn: ``ok <thread> <text> <start> <end>`` for a turn that returned
(wall-clock seconds), ``gone <thread> <start> <end>`` for a KeyGoneError (nothing stored;
retried as a new turn), ``fail <thread> <ExceptionType>: <message>`` for anything else.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

from langgraph_securesaver import KeyGoneError, Keyring, SecureSaver
from langgraph_securesaver.retention import RetentionPolicy
from tests.fake_agent import build_chat_graph


class Turns:
    """Which thread the next turn goes to, and the log of what happened."""

    def __init__(self, spec: dict[str, Any], log: Any) -> None:
        self.spec, self.log, self.n = spec, log, 0
        self.rng = random.Random(spec.get("seed", 0))

    def next(self) -> tuple[str, str, dict[str, Any]]:
        spec, n = self.spec, self.n
        self.n += 1
        every = int(spec.get("new_every") or 0)
        if every and n % every == 0:
            thread = f"{spec.get('prefix', '')}n{n}"
        elif spec.get("shuffle"):
            thread = self.rng.choice(spec["threads"])
        else:
            thread = spec["threads"][n % len(spec["threads"])]
        text = f"{spec['tenant']} {spec.get('prefix', '')}turn {n}"
        return thread, text, {"configurable": {"thread_id": thread,
                                               "tenant_id": spec["tenant"]}}

    def record(self, thread: str, text: str, start: float, exc: BaseException | None) -> None:
        end = time.time()
        if exc is None:
            self.log.write(f"ok {thread} {text} {start:.6f} {end:.6f}\n")
        elif isinstance(exc, KeyGoneError):
            self.log.write(f"gone {thread} {start:.6f} {end:.6f}\n")
        else:   # recorded, not hidden: the tests assert there are none
            msg = str(exc).replace("\n", " ")[:300]
            self.log.write(f"fail {thread} {type(exc).__name__}: {msg}\n")

    def pause(self) -> float:
        burst, gap = int(self.spec.get("burst") or 0), float(self.spec.get("gap") or 0)
        pace = float(self.spec.get("pace") or 0)
        return gap if burst and self.n % burst == 0 else pace

    def stopped(self) -> bool:
        return Path(self.spec["stop"]).exists()


def _saver_options(spec: dict[str, Any]) -> dict[str, Any]:
    opts: dict[str, Any] = {"keyring": Keyring.from_file(spec["keyring"]), "redaction": None}
    if spec.get("max_age"):
        opts["retention"] = RetentionPolicy(max_age=float(spec["max_age"]))
    return opts


def _scope(spec: dict[str, Any]) -> Any:
    if not spec.get("subject"):
        return nullcontext()
    from langgraph_securesaver import subject_scope
    return subject_scope(spec["subject"])


def run_sync(spec: dict[str, Any]) -> None:
    with SecureSaver.from_url(spec["url"], **_saver_options(spec)) as saver, \
            open(spec["out"], "a", buffering=1, encoding="utf-8") as log:
        graph = build_chat_graph(saver)
        turns = Turns(spec, log)
        log.write("started\n")
        while not turns.stopped():
            thread, text, config = turns.next()
            start, failed = time.time(), None
            try:
                with _scope(spec):
                    graph.invoke({"messages": [HumanMessage(text)]}, config)
            except Exception as exc:
                failed = exc
                time.sleep(0.05)
            turns.record(thread, text, start, failed)
            time.sleep(turns.pause())


async def run_async(spec: dict[str, Any]) -> None:
    async with SecureSaver.afrom_url(spec["url"], **_saver_options(spec)) as saver:
        graph = build_chat_graph(saver)
        with open(spec["out"], "a", buffering=1, encoding="utf-8") as log:
            turns = Turns(spec, log)
            log.write("started\n")
            while not turns.stopped():
                thread, text, config = turns.next()
                start, failed = time.time(), None
                try:
                    with _scope(spec):
                        await graph.ainvoke({"messages": [HumanMessage(text)]}, config)
                except Exception as exc:
                    failed = exc
                    await asyncio.sleep(0.05)
                turns.record(thread, text, start, failed)
                await asyncio.sleep(turns.pause())


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("mode") == "async":
        asyncio.run(run_async(spec))
    else:
        run_sync(spec)


if __name__ == "__main__":
    main()
