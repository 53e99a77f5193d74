"""Recovery never steals a live run, whatever the clocks say; the dead-letter cap holds.

Every scenario runs in separate processes on the default settings of ``securesaver recover``
(``recover_main``): a worker runs ``agent -> tools (idempotent charge_card) -> agent ->
send_receipt`` with a scripted model that gives every AIMessage and tool call a fresh id, and
recoverer processes sweep meanwhile. Every effect is counted in a downstream SQLite file
shared by all processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.idempotency import dead_letters_of, recovery_state

from .idem_scripts.scenario import Downstream

WORKER = Path(__file__).parent / "idem_scripts" / "lease_worker.py"
THREAD = "order-7"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Setup:
    def __init__(self, tmp: Path, url: str) -> None:
        self.tmp, self.url = tmp, url
        self.keyring = tmp / "keyring.json"
        Keyring.generate().save(self.keyring)
        self.ds_path = str(tmp / "downstream.db")
        self.ds = Downstream(self.ds_path)
        self.poison = tmp / "poison.flag"

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                "LEASE_DOWNSTREAM": self.ds_path, "LEASE_POISON": str(self.poison), **extra}

    def spawn(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(WORKER), args[0], self.url,
                                 str(self.keyring), *args[1:]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env(**env))

    def sweeps(self, n: int, **env: str) -> list[dict[str, Any]]:
        """``n`` sweeps one after the other in one recoverer process."""
        proc = self.spawn("sweep", LEASE_SWEEPS=str(n), **env)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        return [dict(json.loads(line)) for line in out.strip().splitlines()[-n:]]

    def sweep(self, **env: str) -> dict[str, Any]:
        return self.sweeps(1, **env)[0]

    def count(self, label: str) -> int:
        return int(self.ds.rows("SELECT count(*) FROM effects WHERE label = ?",
                                f"{label}:{THREAD}")[0][0])

    def pids(self, label: str) -> set[int]:
        return {r[0] for r in self.ds.rows("SELECT pid FROM effects WHERE label = ?",
                                           f"{label}:{THREAD}")}

    def charges(self) -> tuple[int, int]:
        """(requests the payment API received, distinct idempotency keys among them)"""
        rows = self.ds.rows("SELECT key FROM requests WHERE service = 'charge'")
        return len(rows), len({r[0] for r in rows})

    def saver(self) -> SecureSaver:
        return SecureSaver.from_url(self.url, keyring=Keyring.load(str(self.keyring)),
                                    redaction=None)


@pytest.fixture(params=BACKENDS)
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> Setup:
    url = (f"sqlite:///{tmp_path / 'cp.db'}" if request.param == "sqlite"
           else str(request.getfixturevalue("pg_url")))
    return Setup(tmp_path, url)


def wait_until(predicate: Any, timeout: float = 60.0, proc: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited early: {proc.communicate()[1][-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


@pytest.mark.parametrize(("skew", "tool_seconds", "mark", "recoverer"), [
    pytest.param("-600", "4", "before", {}, id="1a-worker-clock-10min-behind"),
    pytest.param("0", "6", "node", {"older": "2s"}, id="1b-long-tool-small-older-than"),
    pytest.param("3600", "4", "before", {"async": "1"}, id="worker-clock-1h-ahead-async"),
])
def test_a_live_run_is_never_resumed(setup: Setup, skew: str, tool_seconds: str, mark: str,
                                     recoverer: dict[str, str]) -> None:
    gate = setup.tmp / "gate"
    worker = setup.spawn("run", THREAD, LEASE_SKEW=skew, LEASE_TOOL_SECONDS=tool_seconds,
                         LEASE_MARK=mark, LEASE_TOOL_GATE=str(gate))
    wait_until(lambda: setup.count("tool_started") == 1, proc=worker)
    if "older" in recoverer:  # let the run's recorded activity get older than --older-than
        time.sleep(2.5)
    stop = setup.tmp / "stop"
    env = {"LEASE_ASYNC": recoverer.get("async", "0")}
    if "older" in recoverer:
        env["LEASE_OLDER_THAN"] = recoverer["older"]
    sweepers = [setup.spawn("sweep", str(stop), **env) for _ in range(2)]

    def swept_while_live() -> bool:  # each recoverer finished a sweep during the tool
        return all(Path(f"{stop}.{p.pid}.sweeps").exists() for p in sweepers)

    wait_until(swept_while_live, proc=worker)
    gate.touch()  # the tool (still running in the worker) returns
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    stop.touch()
    reports = []
    for proc in sweepers:
        o, e = proc.communicate(timeout=120)
        assert proc.returncode == 0, e
        reports.append(json.loads(o.strip().splitlines()[-1]))
    # both recoverers swept while the run was live, and found it held
    assert all(r["busy"] >= 1 for r in reports), reports
    assert all(r["resumed"] == [] and r["failed"] == [] for r in reports), reports
    # every downstream effect exactly once, all by the worker
    assert setup.charges() == (1, 1)
    assert setup.count("model") == 2 and setup.count("receipt") == 1
    assert setup.pids("model") == setup.pids("receipt") == {worker.pid}
    with setup.saver() as saver:
        assert recovery_state(saver, "acme", THREAD)["state"] == "done"  # type: ignore[index]


def test_a_crashed_run_with_its_clock_an_hour_ahead_is_resumed_at_the_first_sweep(
        setup: Setup) -> None:
    worker = setup.spawn("run", THREAD, LEASE_SKEW="3600", LEASE_CRASH="agent")
    worker.communicate(timeout=120)
    assert worker.returncode == 1  # died in the model call after the charge
    assert setup.charges() == (1, 1) and setup.count("receipt") == 0
    report, again = setup.sweeps(2)
    assert report["resumed"] == [["acme", THREAD]], report
    assert again["resumed"] == [] and again["examined"] == 0  # resumed once, then done
    assert setup.charges() == (1, 1)  # the charge is not made again
    assert setup.count("receipt") == 1


def test_a_killed_recoverers_thread_is_resumed_by_the_next_sweep(setup: Setup) -> None:
    worker = setup.spawn("run", THREAD, LEASE_CRASH="tool")
    worker.communicate(timeout=120)
    assert worker.returncode == 1 and setup.charges() == (0, 0)
    first = setup.spawn("sweep", LEASE_TOOL_SECONDS="120")  # the resume hangs in the tool
    wait_until(lambda: first.pid in setup.pids("tool_started"), proc=first)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    report = setup.sweep()  # the killed recoverer's lease has no live holder any more
    assert report["resumed"] == [["acme", THREAD]], report
    assert setup.charges() == (1, 1)
    assert setup.count("model") == 2 and setup.count("receipt") == 1


def test_opting_in_from_a_resumed_node_keeps_the_attempt_count(setup: Setup) -> None:
    setup.poison.touch()  # send_receipt calls mark_recoverable() and raises
    worker = setup.spawn("run", THREAD, LEASE_MARK="node")
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 1 and "receipt service is down" in err
    reports = setup.sweeps(5)
    assert [len(r["failed"]) for r in reports] == [1, 1, 0, 0, 0], reports
    assert [len(r["dead_lettered"]) for r in reports] == [0, 0, 1, 0, 0], reports
    assert setup.count("receipt_failed") == 4  # the worker's run and 3 attempts (default)
    assert setup.charges() == (1, 1) and setup.count("model") == 2
    with setup.saver() as saver:
        state = recovery_state(saver, "acme", THREAD)
        assert state is not None and (state["state"], state["attempts"]) == ("dead", 3)
        (letter,) = dead_letters_of(saver, tenant="acme")
        assert letter.thread_id == THREAD and letter.attempts == 3
    # the operator lists the dead letters and re-arms the thread once it can succeed
    listed = CliRunner().invoke(app, ["recover", "--url", setup.url, "--keyring",
                                      str(setup.keyring), "--dead-letters", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [d["thread_id"] for d in json.loads(listed.stdout)["dead_letters"]] == [THREAD]
    setup.poison.unlink()
    rearm = CliRunner().invoke(app, ["recover", "--url", setup.url, "--keyring",
                                     str(setup.keyring), "--dead-letters", "--tenant", "acme",
                                     "--rearm", THREAD, "--json"])
    assert rearm.exit_code == 0 and json.loads(rearm.stdout)["rearmed"] is True, rearm.output
    assert setup.sweep()["resumed"] == [["acme", THREAD]]
    assert setup.count("receipt") == 1 and setup.charges() == (1, 1)
