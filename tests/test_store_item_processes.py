"""Store item keys beside other processes (docs/key-lifecycle.md, "a turn that returned stays
readable until it is deleted on purpose"): deleting an item destroys its key, and the other
processes of the deployment hold that key in their caches.

Three real processes share one database, each with its own saver, store and key caches:

* **in turn, with kill points** -- the driver sends each operation to a random process and
  checks the result against a model of the store after every step, read from another random
  process. Now and then it SIGKILLs the process in the middle of an operation (the outcome
  of that operation is then either the old or the new state) and starts a fresh one. A put
  that returned always reads back as written, in every process, until something deletes or
  overwrites it; a delete that returned leaves the item absent. After every step an older
  sealed copy of a live item (any stored copy of it seen before) is written back into the
  inner store by hand, as a database writer would: every process refuses it
  (``TamperedDataError``), and once the current copy is back it reads as before -- also
  after a put killed between its inner write and its confirmation.
* **at once** -- every process runs random puts, deletes and gets on the same few items for a
  few hundred operations; no put or delete fails, and afterwards every process reads every
  item without error and all of them read the same.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

from langgraph_securesaver import Keyring
from tests.store_item_workers import serve

KEYS = ["a", "b", "c", "d"]
STEPS = 120
KILL_EVERY = 12       # on average, one step in this many kills its process mid-operation
_CTX = multiprocessing.get_context("spawn")
_GONE = object()      # an interrupted delete may leave the row without its key


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent.db'}"
    return str(request.getfixturevalue("pg_url"))


class _Worker:
    def __init__(self, url: str, ring: str) -> None:
        self.conn, child = _CTX.Pipe()
        self.proc: BaseProcess = _CTX.Process(target=serve, args=(url, ring, child),
                                              daemon=True)
        self.proc.start()
        child.close()
        assert self.call_raw() == ("ready", None)

    def call_raw(self) -> Any:
        if not self.conn.poll(120):
            raise AssertionError("a store process did not answer in 120 s")
        return self.conn.recv()

    def call(self, *cmd: Any) -> tuple[str, Any]:
        self.conn.send(cmd)
        return self.call_raw()   # type: ignore[no-any-return]

    def kill_during(self, *cmd: Any, rng: random.Random) -> None:
        self.conn.send(cmd)
        if rng.random() < 0.7:     # usually inside the operation, sometimes before it starts
            self.conn.poll(rng.uniform(0.0, 0.03))
        assert self.proc.pid is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(30)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.conn.send(("stop",))
            self.proc.join(30)


def _read(worker: _Worker, key: str) -> Any:
    status, value = worker.call("get", key)
    if status == "error":   # a row left without its key (an interrupted delete)
        assert value.startswith("ItemChangedError: "), value
        return _GONE
    return value


def test_puts_and_deletes_in_turn_with_kill_points(url: str, tmp_path: Path) -> None:
    ring = str(Keyring.generate().save(tmp_path / "keyring.json"))
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    workers = [_Worker(url, ring) for _ in range(3)]
    #: key -> the states the store may be in (one, unless an operation was interrupted)
    model: dict[str, set[Any]] = {k: {None} for k in KEYS}
    #: key -> every stored copy of it seen while it was live (what a writer could put back)
    history: dict[str, list[Any]] = {k: [] for k in KEYS}
    kills = 0
    try:
        for step in range(STEPS):
            key, n = rng.choice(KEYS), rng.randrange(len(workers))
            worker = workers[n]
            value = {"step": step}
            op = "put" if rng.random() < 0.6 else "delete"
            new = _freeze(value) if op == "put" else None
            cmd = (op, key, value) if op == "put" else (op, key)
            if rng.randrange(KILL_EVERY) == 0:
                worker.kill_during(*cmd, rng=rng)
                kills += 1
                workers[n] = _Worker(url, ring)
                # interrupted: old or new; a delete killed between destroying the key and
                # deleting the row leaves a row without a key (its reads say so)
                model[key] = model[key] | {new} | ({_GONE} if op == "delete" else set())
            else:
                status, detail = worker.call(*cmd)
                assert status == "ok", f"step {step}: {op} {key} failed: {detail}"
                model[key] = {new}
            for check in KEYS:
                reader = rng.choice(workers)
                got = _read(reader, check)
                got = got if got is _GONE else _freeze(got)
                assert got in model[check], (
                    f"step {step}: {check} reads {got!r}, expected one of {model[check]!r}")
                model[check] = {got}   # what is stored now (interrupted ops settled)
            _roll_back_one(workers, model, history, rng, step)
        for check in KEYS:             # every process agrees
            seen = {_freeze_or_gone(_read(w, check)) for w in workers}
            assert len(seen) == 1 and seen <= model[check], (check, seen, model[check])
        assert kills > 0
    finally:
        for w in workers:
            w.stop()


def _roll_back_one(workers: list[_Worker], model: dict[str, set[Any]],
                   history: dict[str, list[Any]], rng: random.Random, step: int) -> None:
    """Record the stored copy of every live item; put an older copy of one of them back:
    every process refuses it; then the current copy back: it reads as the model says."""
    live = []
    for key in KEYS:
        (state,) = model[key]
        if state is None or state is _GONE:
            continue
        status, current = rng.choice(workers).call("raw", key)
        assert status == "ok" and current is not None, (step, key, current)
        if current not in history[key]:
            history[key].append(current)
        older = [copy for copy in history[key] if copy != current]
        if older:
            live.append((key, current, rng.choice(older)))
    if not live:
        return
    key, current, older = rng.choice(live)
    assert rng.choice(workers).call("putback", key, older)[0] == "ok"
    for w in workers:
        status, detail = w.call("get", key)
        assert status == "error" and detail.split(":")[0] in _REFUSED, (
            f"step {step}: an older copy of live item {key} was served: {detail!r}")
    assert rng.choice(workers).call("putback", key, current)[0] == "ok"
    got = _read(rng.choice(workers), key)
    assert got is not _GONE and _freeze(got) in model[key], (
        f"step {step}: {key} reads {got!r} once its current copy is back, "
        f"expected {model[key]!r}")


#: how SecureStore refuses a copy that is not the item's current version
_REFUSED = {"ItemChangedError", "TamperedDataError"}


def test_puts_deletes_and_gets_at_once(url: str, tmp_path: Path) -> None:
    ring = str(Keyring.generate().save(tmp_path / "keyring.json"))
    workers = [_Worker(url, ring) for _ in range(3)]
    try:
        for i, w in enumerate(workers):
            w.conn.send(("loop", 150, KEYS[:2], 1000 + i))
        results = [w.call_raw() for w in workers]
        transient = 0
        for status, errors in results:
            assert status == "ok", errors
            assert errors["put"] == [] and errors["delete"] == [], errors
            assert all(e.startswith("ItemChangedError: ") for e in errors["get"]), errors["get"]
            transient += len(errors["get"])
        for key in KEYS[:2]:
            seen = {_freeze_or_gone(_read(w, key)) for w in workers}
            assert len(seen) == 1 and _GONE not in seen, (key, seen, transient)
    finally:
        for w in workers:
            w.stop()


def _freeze(value: Any) -> Any:
    return None if value is None else tuple(sorted(value.items()))


def _freeze_or_gone(value: Any) -> Any:
    return value if value is _GONE else _freeze(value)
