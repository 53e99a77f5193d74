"""Writer processes, destroyer windows and the read-back check shared by the key-lifecycle
tests (tests/test_key_lifecycle.py, tests/test_lifecycle_stress.py) and
benchmarks/lifecycle_stress.py.

The invariant checked: a turn that returned stays readable until it is deleted on purpose. A
turn is *protected* when it started after the end of the last deliberate deletion that could
have reached its thread; every protected turn must read back, and no thread may fail to read
(a turn stored under a destroyed key would).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WRITER = [sys.executable, "-m", "tests.scripts.lifecycle_writer"]
CLI = [sys.executable, "-m", "langgraph_securesaver.cli"]
LEASE_WORKER = [sys.executable, str(ROOT / "tests" / "idem_scripts" / "lease_worker.py")]
RECOVER_GRAPH = "tests.idem_scripts.lease_graph:factory"


def env() -> dict[str, str]:
    """The subprocesses import this checkout's package."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@dataclass
class Turn:
    thread: str
    text: str
    start: float
    end: float


@dataclass
class Writers:
    """Writer processes (each with its own saver and caches) and their logs."""

    stop: Path
    logs: list[Path] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, **spec: Any) -> None:
        log = self.stop.parent / f"writer-{len(self.logs)}.log"
        spec = {"out": str(log), "stop": str(self.stop), **spec}
        self.logs.append(log)
        self.procs.append(subprocess.Popen([*WRITER, json.dumps(spec)], cwd=ROOT, env=env(),
                                           stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE))

    def lines(self) -> list[str]:
        return [line for p in self.logs if p.exists()
                for line in p.read_text(encoding="utf-8").splitlines()]

    def ok(self) -> list[Turn]:
        out = []
        for line in self.lines():
            if line.startswith("ok "):
                _ok, thread, rest = line.split(" ", 2)
                text, start, end = rest.rsplit(" ", 2)
                out.append(Turn(thread, text, float(start), float(end)))
        return out

    def failed(self) -> list[str]:
        return [line for line in self.lines() if line.startswith("fail ")]

    def gone(self) -> int:
        return sum(line.startswith("gone ") for line in self.lines())

    def wait_for(self, turns: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ok()) < turns:
            assert time.monotonic() < deadline, f"the writers never got going: {self.failed()}"
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"a writer died: {p.stderr.read().decode()[-2000:]}"
                                         if p.stderr else "a writer died")
            time.sleep(0.1)

    def finish(self) -> None:
        self.stop.touch()
        for p in self.procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def kill(self) -> None:
        self.stop.touch()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@dataclass
class Deletions:
    """When deliberate deletions ran: (threads or None for any thread, start, end)."""

    windows: list[tuple[frozenset[str] | None, float, float]] = field(default_factory=list)

    def add(self, threads: Iterable[str] | None, start: float, end: float) -> None:
        self.windows.append((None if threads is None else frozenset(threads), start, end))

    def last_end(self, thread: str) -> float:
        return max((end for ths, _s, end in self.windows if ths is None or thread in ths),
                   default=0.0)


def protected(turns: Iterable[Turn], deletions: Deletions) -> list[Turn]:
    """Turns no deliberate deletion may have removed: started after the last one of their
    thread ended."""
    return [t for t in turns if t.start > deletions.last_end(t.thread)]


def check_readback(url: str, keyring_path: Path, tenant_turns: dict[str, list[Turn]],
                   deletions: Deletions) -> int:
    """Open every thread a writer wrote (every checkpoint of it), and find every protected turn
    in its thread's latest state. Returns the protected turns found."""
    from langgraph_securesaver import Keyring, SecureSaver
    from tests.fake_agent import build_chat_graph

    found = 0
    with SecureSaver.from_url(url, keyring=Keyring.from_file(keyring_path),
                              redaction=None) as saver:
        graph = build_chat_graph(saver)
        for tenant, turns in tenant_turns.items():
            by_thread: dict[str, set[str]] = {}
            for t in turns:
                by_thread.setdefault(t.thread, set())
            for t in protected(turns, deletions):
                by_thread[t.thread].add(t.text)
            for thread, texts in sorted(by_thread.items()):
                config = {"configurable": {"thread_id": thread, "tenant_id": tenant}}
                for tup in saver.list(config):   # every checkpoint opens, not only the head
                    assert tup.checkpoint["channel_values"] is not None
                values = graph.get_state(config).values
                have = {str(m.content) for m in values.get("messages", [])}
                missing = sorted(texts - have)
                assert not missing, (tenant, thread, missing[:5], len(missing))
                found += len(texts)
    return found


def scan_verify(url: str, keyring_path: Path) -> dict[str, Any]:
    """`securesaver scan --verify` once the writers are done: must exit 0; its JSON report.
    Run through :func:`cli_here` (a check after the fact, with a saver of its own)."""
    done = cli_here("scan", "--url", url, "--keyring", str(keyring_path), "--verify",
                    "--format", "json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def cli_here(*args: str) -> subprocess.CompletedProcess[str]:
    """The `securesaver` command run in this process (typer's runner), for the checks made
    after every writer and destroyer process has stopped: the command opens a saver of its
    own, with empty caches, as a process of its own would, without the cost of starting
    one (the package's imports). The destroyers beside writers stay subprocesses (``cli``)."""
    from typer.testing import CliRunner

    from langgraph_securesaver.cli.main import app
    result = CliRunner().invoke(app, list(args), catch_exceptions=True)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["securesaver", *args], result.exit_code,
                                       result.stdout, stderr)


def cli(*args: str, timeout: float = 300,
        env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**env(), **(env_extra or {})}, timeout=timeout)


def _recovered(url: str, keyring_path: Path, thread: str) -> bool:
    """The stalled thread's latest checkpoint ends with its receipt (the run finished)."""
    from langgraph_securesaver import Keyring, SecureSaver
    config: Any = {"configurable": {"thread_id": thread, "tenant_id": "acme"}}
    with SecureSaver.from_url(url, keyring=Keyring.from_file(keyring_path),
                              redaction=None) as saver:
        got = saver.get_tuple(config)
    messages = got.checkpoint["channel_values"].get("messages", []) if got else []
    return bool(messages) and messages[-1].content == "receipt sent"


# --- one round of the multi-process stress test ---------------------------------------------
@dataclass
class RoundReport:
    """What one stress round did and found (benchmarks/lifecycle_stress.py prints these)."""

    round: int
    seconds: float = 0.0
    turns_ok: int = 0
    turns_refused: int = 0          # KeyGoneError: nothing stored, the writer retried
    protected_checked: int = 0
    threads_deleted: int = 0        # delete_thread + forget_subject
    threads_pruned: int = 0
    rotation_killed: bool = False
    recovered: int = 0              # stalled threads `securesaver recover` finished
    recovered_beside: int = 0       # ... by the sweep that ran beside the destroyers
    recover_sweeps: int = 0         # sweeps it took (a sweep whose write met KeyGoneError retries)
    master_version: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def new_keyring(url: str, path: Path) -> Path:
    from langgraph_securesaver import Keyring, SecureSaver
    from langgraph_securesaver.retention import RetentionPolicy
    ring = Keyring.generate()
    ring.save(path)
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        # the stress's writers prune every thread after 2 s; the tenant of the stalled runs
        # that `recover` resumes keeps its threads (nothing deletes them on purpose)
        saver.set_tenant_retention("acme", RetentionPolicy())
    return path


def stress_round(url: str, ring_path: Path, workdir: Path, number: int, seed: int,
                 deletions: Deletions, history: dict[str, list[Turn]]) -> RoundReport:
    """Writer processes with their own savers (one sync, one async, one writing for a subject)
    keep writing while this process and `securesaver` subprocesses run, in a random order:
    `rotate-keys --reencrypt` SIGKILLed at a random point and rerun with `--retire-old`,
    `prune --active-grace 0s` (every thread has `max_age` 2 s), `delete_thread` of a random
    thread, `forget_subject`, and `securesaver recover` resuming a thread whose worker died
    in an idempotent tool (its tool runs on while the later steps do). Then the writers write
    on alone, stop, and the last `rotate-keys --reencrypt --retire-old` must retire every
    older master version; every turn of every round so far that no deliberate deletion could
    reach must read back, the recovered thread must end with its receipt after exactly one
    charge, and `scan --verify` must be clean with one master version in use."""
    import random
    import signal

    from langgraph_securesaver import Keyring, SecureSaver, tenant_scope

    rng = random.Random(seed)
    # re-encryption rewrites the tables of SQLite and PostgreSQL savers; on MySQL a rotation
    # rewraps the data keys only (docs/savers.md)
    reencrypt = () if url.startswith("mysql") else ("--reencrypt",)
    started = time.monotonic()
    report = RoundReport(number)
    workdir.mkdir(parents=True, exist_ok=True)
    writers = Writers(workdir / "stop")
    prefix = f"r{number}-"
    pool = [f"{prefix}t{i}" for i in range(8)]
    base = {"url": url, "keyring": str(ring_path), "prefix": prefix, "max_age": 2,
            "shuffle": True, "seed": seed, "pace": 0.05}
    writers.start(**base, tenant="ten0", threads=pool, new_every=5, mode="sync")
    writers.start(**base, tenant="ten1", threads=pool, new_every=5, mode="async")
    writers.start(**{**base, "prefix": prefix + "s-"}, tenant="ten0",
                  threads=[f"{prefix}s-a", f"{prefix}s-b"], mode="async",
                  subject=f"subject-{number}")
    stalled = f"{prefix}stalled"
    lease_env = {**env(), "LEASE_DOWNSTREAM": str(workdir / "downstream.db")}
    dead = subprocess.run([*LEASE_WORKER, "run", url, str(ring_path), stalled], cwd=ROOT,
                          env={**lease_env, "LEASE_CRASH": "tool"}, capture_output=True,
                          text=True, timeout=300)
    assert dead.returncode == 1, dead.stderr[-2000:]    # died in the tool: a stalled thread
    from tests.idem_scripts.scenario import Downstream
    downstream = Downstream(lease_env["LEASE_DOWNSTREAM"])
    assert downstream.rows("SELECT count(*) FROM effects WHERE label = ?",
                           f"tool_started:{stalled}") == [(1,)], dead.stderr[-2000:]
    recoverers: list[subprocess.Popen[str]] = []
    said: list[str] = []        # what the recoverers printed

    def rotate_killed() -> None:
        proc = subprocess.Popen([*CLI, "rotate-keys", "--url", url, "--keyring", str(ring_path),
                                 *reencrypt, "--batch-size", "5", "--format", "json"],
                                cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=rng.uniform(0.2, 3.0))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            report.rotation_killed = True
        again = cli("rotate-keys", "--url", url, "--keyring", str(ring_path), *reencrypt,
                    "--retire-old", "--format", "json")
        assert again.returncode in (0, 1), again.stdout[-2000:] + again.stderr[-2000:]

    def prune() -> None:
        start = time.time()
        done = cli("prune", "--url", url, "--keyring", str(ring_path), "--active-grace", "0s",
                   "--json")
        deletions.add(None, start, time.time())
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        report.threads_pruned += len(json.loads(done.stdout)["deleted"])

    def delete_one() -> None:
        thread = rng.choice(pool)
        tenant = rng.choice(["ten0", "ten1"])
        with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path),
                                  redaction=None) as saver, tenant_scope(tenant):
            start = time.time()
            saver.delete_thread(thread)
            deletions.add([thread], start, time.time())
        report.threads_deleted += 1

    def forget() -> None:
        with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path),
                                  redaction=None) as saver:
            start = time.time()
            done = saver.forget_subject(f"subject-{number}", tenants=["ten0"],
                                        requested_by="stress")
            deletions.add([f"{prefix}s-a", f"{prefix}s-b"], start, time.time())
        report.threads_deleted += done.threads.get("ten0", 0)

    def recover() -> None:     # runs on beside the later steps; its tool takes 0-3 s
        recoverers.append(subprocess.Popen(
            [*CLI, "recover", "--url", url, "--keyring", str(ring_path), "--graph",
             RECOVER_GRAPH, "--json"], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env={**lease_env, "LEASE_TOOL_SECONDS": f"{rng.uniform(0.0, 3.0):.2f}"}))

    try:
        writers.wait_for(12)
        steps = [rotate_killed, prune, delete_one, delete_one, forget, prune]
        rng.shuffle(steps)
        steps.insert(rng.randrange(len(steps)), recover)    # never last: others run beside it
        for step in steps:
            step()
            time.sleep(rng.uniform(0.0, 1.0))
        writers.wait_for(len(writers.ok()) + 15)   # after every destroyer: must all read back
    finally:
        writers.finish()
        for proc in recoverers:
            out, err = proc.communicate(timeout=300)
            said.append(out[-2000:] + err[-2000:])
    assert writers.failed() == [], writers.failed()[:5]
    (background,) = recoverers
    if background.returncode == 0:      # the sweep beside the destroyers resumed the thread
        assert json.loads(said[0].split("\n}", 1)[0] + "}")["resumed"] == 1, said[0]
        report.recovered_beside = 1
    else:   # only a retryable refusal may make it fail; a later sweep finishes the thread
        assert background.returncode == 1 and "KeyGoneError" in said[0], said[0]
    report.recover_sweeps = 1
    while not _recovered(url, ring_path, stalled):
        assert report.recover_sweeps < 3, (stalled, said)
        again = cli("recover", "--url", url, "--keyring", str(ring_path), "--graph",
                    RECOVER_GRAPH, "--json", env_extra={"LEASE_DOWNSTREAM": lease_env[
                        "LEASE_DOWNSTREAM"]})
        said.append(again.stdout[-2000:] + again.stderr[-2000:])
        assert again.returncode in (0, 1), said[-1]
        report.recover_sweeps += 1
    report.recovered = 1
    keys = downstream.rows("SELECT DISTINCT key FROM requests WHERE service = 'charge'")
    assert len(keys) == 1, keys     # every attempt at the charge carried one idempotency key
    final = cli_here("rotate-keys", "--url", url, "--keyring", str(ring_path), *reencrypt,
                     "--retire-old", "--format", "json")     # every writer has stopped
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    ring = Keyring.from_file(ring_path)
    assert ring.versions() == [ring.current_version], ring.versions()
    for tenant in ("ten0", "ten1"):
        history.setdefault(tenant, []).extend(
            t for t in writers.ok() if t.text.startswith(f"{tenant} "))
    report.turns_ok = len(writers.ok())
    report.turns_refused = writers.gone()
    report.protected_checked = check_readback(url, ring_path, history, deletions)
    scan = scan_verify(url, ring_path)
    assert set(scan["master_versions_in_use"]) == {ring.current_version}, scan
    assert not scan.get("problems"), scan.get("problems")
    report.master_version = ring.current_version
    report.seconds = round(time.monotonic() - started, 1)
    return report
