"""SecureSaver behind a real LangGraph Server (``langgraph dev``) with custom auth.

The server test starts ``langgraph dev`` on examples/langgraph_server (copied to a temporary
directory, loopback port, no browser, no reload) with the example's auth handler for two
users, drives it with langgraph_sdk, then inspects the checkpoint database. It needs the
``server`` extra (``langgraph-cli[inmem]``, pulled in by ``test``): without it the test is
skipped with the reason, except under CI=true, where it fails.

The unit tests below it exercise tenant resolution without a server.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver, TenantRequired, tenant_scope
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.ops.pruner import Sweep
from langgraph_securesaver.registry.denials import flush_for
from langgraph_securesaver.server.records import OPS_FILENAME, RecordsSealer, is_sealed
from langgraph_securesaver.server.saver import (
    AuthTenantSaver,
    ServerSettings,
    make_checkpointer,
    tenant_from_field,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "langgraph_server"
ALICE = {"Authorization": "Bearer token-alice"}
BOB = {"Authorization": "Bearer token-bob"}
ALICE_TEXT = "Hi, this is alice.w@example.com about order ACME-7781, it never arrived"
ALICE_REFUND = "Please refund order ACME-7781 to my card"
BOB_TEXT = "bob.k@example.org here: my order GLX-5512 is stuck in customs"
BOB_REFUND = "I want a refund for GLX-5512 and compensation"
SECRETS = ["alice.w@example.com", "never arrived", "refund order ACME-7781", "bob.k@example.org",
           "stuck in customs", "and compensation", "Refund approved.", "Refund denied.",
           "Approve this refund?"]


GATED_GRAPH = """
import os
import time
from pathlib import Path

from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph


def wait_for_gate(state):
    gate = Path(os.environ["SS_TEST_GATE"])
    while not gate.exists():
        time.sleep(0.05)
    return {"messages": [AIMessage(content="gated reply")]}


builder = StateGraph(MessagesState)
builder.add_node("wait", wait_for_gate)
builder.add_edge(START, "wait")
graph = builder.compile()
"""

# a graph whose output is only a count (does the server's thread record copy only that?)
PRIVATE_OUTPUT_GRAPH = """
from typing import TypedDict

from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph


class Output(TypedDict):
    turns: int


class State(MessagesState):
    turns: int


def answer(state):
    return {"messages": [AIMessage(content="noted")], "turns": len(state["messages"])}


builder = StateGraph(State, output_schema=Output)
builder.add_node("answer", answer)
builder.add_edge(START, "answer")
graph = builder.compile()
"""

# user strings that reach only the server's own records (metadata, store, assistants, crons)
THREAD_META = {"alice": "ALICE-TOPIC-passport-renewal", "bob": "BOB-TOPIC-divorce-papers"}
RUN_META = {"alice": "ALICE-RUNNOTE-vip-customer", "bob": "BOB-RUNNOTE-angry-caller"}
MEMORY = {"alice": "alice.w@example.com prefers ALICE-MEMORY-oolong tea",
          "bob": "bob.k@example.org is allergic to BOB-MEMORY-peanuts"}
ASSISTANT_SECRET = "ALICE-ASSISTANT-system-prompt-tone"
CRON_SECRET = "ALICE-CRON-weekly-statement"
CRON_FIRED = "ALICE-CRONFIRED-monthly-report"
PRIVATE_SECRET = "ALICE-PRIVATE-diagnosis-lupus"
SERVER_ONLY = [*THREAD_META.values(), *RUN_META.values(), *MEMORY.values(),
               ASSISTANT_SECRET, CRON_SECRET]
#: where the in-memory runtime's records hold user strings whatever the encryption handlers do
#: (docs/guides/langgraph-server.md): the thread's copy of its latest state, and the kwargs of
#: every run its worker has started (the worker writes its decrypted copy back into the record).
#: They are in clear only inside the sealed record file (server_records), never on disk.
NOT_COVERED = (re.compile(r"^threads\.\d+\.(values|interrupts)\."),
               re.compile(r"^runs\.\d+\.kwargs\.(input|config|command|context)\."))
#: what the checkpoint database, the store and every file the server wrote (the sealed record
#: file included) must hold none of
ALL_SECRETS = [*SECRETS, ALICE_TEXT, BOB_TEXT, *SERVER_ONLY, PRIVATE_SECRET, CRON_FIRED,
               "this run will be rolled back", "alice is still typing"]


def _server_missing() -> str | None:
    import importlib.util
    for module in ("langgraph_api", "langgraph_cli", "langgraph_runtime_inmem", "langgraph_sdk"):
        if importlib.util.find_spec(module) is None:
            return (f"LangGraph Server is not installed ({module}): "
                    "pip install 'langgraph-securesaver[server]'")
    return None


def require_server() -> None:
    reason = _server_missing()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true requires the server extra: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _langgraph_cli() -> list[str]:
    exe = Path(sys.executable).with_name("langgraph")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("langgraph")
    if found:
        return [found]
    return [sys.executable, "-c", "from langgraph_cli.cli import cli; cli()"]


class Server:
    def __init__(self, workdir: Path, db: Path, keyring_file: Path, url: str,
                 proc: subprocess.Popen[bytes], log: Path) -> None:
        self.workdir, self.db, self.keyring_file, self.url = workdir, db, keyring_file, url
        self.proc, self.log = proc, log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _launch(workdir: Path, log_name: str) -> Server:
    """``langgraph dev`` on the example in ``workdir`` (loopback, offline, no reload)."""
    db = workdir / "checkpoints.db"
    keyring_file = workdir / "keyring.json"
    port = _free_port()
    env = dict(os.environ)
    env.pop("SECURESAVER_MASTER_KEY", None)
    env.pop("LANGGRAPH_ENCRYPTION", None)   # the example's langgraph.json sets it
    env.update({
        "SECURESAVER_URL": f"sqlite:///{db}",
        "SECURESAVER_KEYRING_FILE": str(keyring_file),
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "SS_TEST_GATE": str(workdir / "gate"),
    })
    log = workdir / log_name
    argv = [*_langgraph_cli(), "dev", "--host", "127.0.0.1", "--port", str(port),
            "--no-browser", "--no-reload", "--config", "langgraph.json"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    return Server(workdir, db, keyring_file, f"http://127.0.0.1:{port}", proc, log)


def _start(workdir: Path, log_name: str = "server.log") -> Server:
    """``langgraph dev`` on ``workdir``, once it answers."""
    import httpx
    srv = _launch(workdir, log_name)
    proc, log = srv.proc, srv.log
    deadline = time.monotonic() + 180   # a startup timeout, not a performance assertion
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail("langgraph dev exited:\n" + log.read_text(errors="replace")[-4000:])
            try:
                if httpx.get(srv.url + "/ok", timeout=2).status_code == 200:
                    return srv
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("langgraph dev did not start:\n"
                            + log.read_text(errors="replace")[-4000:])
            time.sleep(0.5)
    except BaseException:
        srv.stop()
        raise


def _start_refused(workdir: Path, log_name: str) -> str:
    """``langgraph dev`` on ``workdir`` must exit without ever answering: returns its log."""
    import httpx
    srv = _launch(workdir, log_name)
    deadline = time.monotonic() + 180   # a startup timeout, not a performance assertion
    try:
        while srv.proc.poll() is None:
            try:
                answered = httpx.get(srv.url + "/ok", timeout=2).status_code == 200
            except httpx.HTTPError:
                answered = False
            assert not answered, "the server started on an altered record file"
            assert time.monotonic() < deadline, "langgraph dev neither started nor exited"
            time.sleep(0.5)
    finally:
        srv.stop()
    assert srv.proc.returncode != 0
    return srv.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_server()
    workdir = tmp_path_factory.mktemp("lgserver")
    shutil.copytree(EXAMPLE, workdir, dirs_exist_ok=True)
    # test-only graphs: a node that waits for a gate file (to roll a run back while it runs)
    # and a graph whose output leaves the messages out of the thread record
    (workdir / "gated.py").write_text(GATED_GRAPH, encoding="utf-8")
    (workdir / "private.py").write_text(PRIVATE_OUTPUT_GRAPH, encoding="utf-8")
    config = json.loads((workdir / "langgraph.json").read_text(encoding="utf-8"))
    config["graphs"]["gated"] = "./gated.py:graph"
    config["graphs"]["private"] = "./private.py:graph"
    (workdir / "langgraph.json").write_text(json.dumps(config), encoding="utf-8")
    Keyring.generate().save(workdir / "keyring.json")
    return workdir


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[Server]:
    srv = _start(workdir)
    try:
        yield srv
    finally:
        srv.stop()


async def _conversation(client: Any, who: str, text: str, refund_text: str,
                        answer: str) -> dict[str, Any]:
    """One user's session: a turn with a tool call, state, history, an interrupt, a resume."""
    thread = await client.threads.create(metadata={"topic": THREAD_META[who]})
    tid = thread["thread_id"]
    first = await client.runs.wait(tid, "agent", input={"messages": [
        {"role": "user", "content": text}]}, metadata={"note": RUN_META[who]})
    state = await client.threads.get_state(tid)
    history_before = await client.threads.get_history(tid)
    await client.runs.wait(tid, "agent", input={"messages": [
        {"role": "user", "content": refund_text}]})
    paused = await client.threads.get_state(tid)
    resumed = await client.runs.wait(tid, "agent", command={"resume": answer})
    final = await client.threads.get_state(tid)
    history = await client.threads.get_history(tid, limit=100)
    record = await client.threads.get(tid)
    runs = await client.runs.list(tid)
    return {"tid": tid, "first": first, "state": state, "history_before": history_before,
            "paused": paused, "resumed": resumed, "final": final, "history": history,
            "record": record, "runs": runs}


async def _memories(client: Any, other: Any, who: str) -> dict[str, Any]:
    """Store items through the server's store API (SecureStore, the user's tenant)."""
    await client.store.put_item(["memories"], "profile", {"text": MEMORY[who], "kind": "pref"})
    own = await client.store.get_item(["memories"], "profile")
    found = await client.store.search_items(["memories"])
    filtered = await client.store.search_items(["memories"], filter={"kind": "pref"})
    return {"own": own, "found": found, "filtered": filtered}


async def _wait_running(client: Any, tid: str, run_id: str) -> None:
    for _ in range(1200):   # bounded wait until the worker is inside the node
        if (await client.runs.get(tid, run_id))["status"] == "running":
            return
        await asyncio.sleep(0.05)


async def _rollback(client: Any, other: Any, gate: Path) -> dict[str, Any]:
    """A run rolled back while it runs (multitask_strategy="rollback"); before that, another
    user tries to cancel-with-rollback it (the owner filter must stop them)."""
    tid = (await client.threads.create())["thread_id"]
    doomed = await client.runs.create(tid, "gated", input={"messages": [
        {"role": "user", "content": "this run will be rolled back"}]})
    await _wait_running(client, tid, doomed["run_id"])
    foreign_cancel = None
    try:
        await other.runs.cancel(tid, doomed["run_id"], action="rollback")
    except Exception as exc:  # the SDK raises the server's 404
        foreign_cancel = exc
    status_after_foreign = (await client.runs.get(tid, doomed["run_id"]))["status"]
    kept = await client.runs.create(tid, "gated", input={"messages": [
        {"role": "user", "content": "this one stays"}]}, multitask_strategy="rollback")
    gate.touch()
    await client.runs.join(tid, kept["run_id"])
    state = await client.threads.get_state(tid)
    runs = await client.runs.list(tid)
    return {"tid": tid, "state": state, "runs": runs, "doomed": doomed["run_id"],
            "foreign_cancel": foreign_cancel, "status_after_foreign": status_after_foreign}


async def _drive(url: str, gate: Path) -> dict[str, Any]:
    from langgraph_sdk import get_client
    alice = get_client(url=url, headers=ALICE)
    bob = get_client(url=url, headers=BOB)
    # a cron that fires within the minute: its run is created by the scheduler, with no user,
    # from the sealed payload
    cron_tid = (await alice.threads.create())["thread_id"]
    firing = await alice.crons.create_for_thread(
        cron_tid, "agent", schedule="* * * * *",
        input={"messages": [{"role": "user", "content": CRON_FIRED}]})
    a, b = await asyncio.gather(
        _conversation(alice, "alice", ALICE_TEXT, ALICE_REFUND, "yes"),
        _conversation(bob, "bob", BOB_TEXT, BOB_REFUND, "no"))
    mem_a, mem_b = await asyncio.gather(_memories(alice, bob, "alice"),
                                        _memories(bob, alice, "bob"))
    # an assistant and a cron (far in the future: it never fires) with alice's words
    assistant = await alice.assistants.create(
        "agent", config={"configurable": {"tone": ASSISTANT_SECRET}},
        metadata={"purpose": ASSISTANT_SECRET}, name="alice-assistant")
    cron = await alice.crons.create_for_thread(
        a["tid"], "agent", schedule="0 0 1 1 *",
        input={"messages": [{"role": "user", "content": CRON_SECRET}]})
    crons = {"alice": await alice.crons.search(), "bob": await bob.crons.search()}
    assistants_bob = await bob.assistants.search(graph_id="agent")
    # copy and delete go through acopy_thread / adelete_thread under the caller's identity
    rollback = await _rollback(alice, bob, gate)
    copied = await alice.threads.copy(a["tid"])
    copy_state = await alice.threads.get_state(copied["thread_id"])
    await alice.threads.delete(copied["thread_id"])
    # a graph whose output leaves the messages out of the thread record
    private_tid = (await alice.threads.create())["thread_id"]
    private_out = await alice.runs.wait(private_tid, "private", input={"messages": [
        {"role": "user", "content": PRIVATE_SECRET}]})
    private_state = await alice.threads.get_state(private_tid)
    private_record = await alice.threads.get(private_tid)
    # bob names alice's tenant in his run config: the checkpointer refuses it
    attack_thread = (await bob.threads.create())["thread_id"]
    attack_error = None
    try:
        await bob.runs.wait(attack_thread, "agent", input={"messages": [
            {"role": "user", "content": "show me alice's conversation"}]},
            config={"configurable": {"tenant_id": "alice"}})
    except Exception as exc:  # the SDK raises the run's error
        attack_error = exc
    attack_runs = await bob.runs.list(attack_thread)
    cron_runs: list[dict[str, Any]] = []
    for _ in range(1500):   # bounded: the scheduler fires at the next minute
        cron_runs = await alice.runs.list(cron_tid)
        if any(r["status"] == "success" for r in cron_runs):
            break
        await asyncio.sleep(0.1)
    await alice.crons.delete(firing["cron_id"])
    cron_state = await alice.threads.get_state(cron_tid)
    bob_reads: dict[str, Any] = {
        "memory": await bob.store.get_item(["memories"], "profile"),
        "threads": [t["thread_id"] for t in await bob.threads.search(limit=100)]}
    return {"alice": a, "bob": b, "attack_error": attack_error, "attack_runs": attack_runs,
            "copied": copied["thread_id"], "copy_state": copy_state, "rollback": rollback,
            "mem_a": mem_a, "mem_b": mem_b, "assistant": assistant, "cron": cron,
            "crons": crons, "assistants_bob": assistants_bob, "bob_reads": bob_reads,
            "firing": {"tid": cron_tid, "cron": firing, "runs": cron_runs,
                       "state": cron_state},
            "private": {"tid": private_tid, "out": private_out, "state": private_state,
                        "record": private_record}}


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content", "")) for m in messages]


def _records_script(workdir: Path, mode: str, stdin: str = "") -> Any:
    """tests/scripts/server_records.py on the server's record file, in its own process (it
    opens the sealed file with the server's keys)."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.scripts.server_records", mode,
         str(workdir / ".langgraph_api" / ".langgraph_ops.pckl")],
        input=stdin, capture_output=True, text=True, timeout=300, cwd=workdir,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(workdir)]),
             "SECURESAVER_URL": f"sqlite:///{workdir / 'checkpoints.db'}",
             "SECURESAVER_KEYRING_FILE": str(workdir / "keyring.json")})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _forms(secret: str) -> list[bytes]:
    return [secret.encode(), json.dumps(secret)[1:-1].encode()]


def test_two_users_on_langgraph_server(server: Server) -> None:
    result = asyncio.run(_drive(server.url, server.workdir / "gate"))
    server.stop()   # flush and release the database before reading it
    a, b = result["alice"], result["bob"]

    # both conversations work: a tool call, state, history, an interrupt and its resume
    for conv, text, refund_text, outcome, who in (
            (a, ALICE_TEXT, ALICE_REFUND, "approved", "alice"),
            (b, BOB_TEXT, BOB_REFUND, "denied", "bob")):
        first_msgs = conv["first"]["messages"]
        assert _texts(first_msgs)[0] == text
        assert any(m.get("tool_calls") for m in first_msgs), "the model calls the order tool"
        assert [m["type"] for m in first_msgs][-2:] == ["tool", "ai"]
        assert "shipped yesterday" in first_msgs[-1]["content"]
        assert _texts(conv["state"]["values"]["messages"])[0] == text
        assert len(conv["history_before"]) >= 2
        assert conv["paused"]["next"] == ["refund"]
        interrupts = [i for task in conv["paused"]["tasks"] for i in task["interrupts"]]
        assert interrupts and interrupts[0]["value"] == {"question": "Approve this refund?"}
        assert conv["resumed"]["refund"] == outcome
        final_texts = _texts(conv["final"]["values"]["messages"])
        assert final_texts[0] == text and refund_text in final_texts
        assert final_texts[-1] == f"Refund {outcome}."
        assert conv["final"]["next"] == []
        assert len(conv["history"]) > len(conv["history_before"])
        # the server's own records decrypt for their owner (thread and run metadata)
        assert conv["record"]["metadata"]["topic"] == THREAD_META[who]
        assert conv["record"]["metadata"]["owner"] == who
        notes = [r["metadata"].get("note") for r in conv["runs"]]
        assert RUN_META[who] in notes
    # neither user's state holds the other's words
    assert BOB_TEXT not in json.dumps(a["final"]["values"])
    assert ALICE_TEXT not in json.dumps(b["final"]["values"])

    # store memories: each user reads and searches their own, never the other's
    for mem, who in ((result["mem_a"], "alice"), (result["mem_b"], "bob")):
        assert mem["own"]["value"] == {"text": MEMORY[who], "kind": "pref"}
        assert [i["value"]["text"] for i in mem["found"]["items"]] == [MEMORY[who]]
        assert [i["value"]["text"] for i in mem["filtered"]["items"]] == [MEMORY[who]]
    assert result["bob_reads"]["memory"]["value"]["text"] == MEMORY["bob"]
    assert a["tid"] not in result["bob_reads"]["threads"]
    # the assistant and the cron decrypt for alice and are invisible to bob
    assistant = result["assistant"]
    assert assistant["metadata"]["purpose"] == ASSISTANT_SECRET
    assert assistant["config"]["configurable"]["tone"] == ASSISTANT_SECRET
    assert assistant["assistant_id"] not in [x["assistant_id"] for x in result["assistants_bob"]]
    firing = result["firing"]
    assert {c["cron_id"] for c in result["crons"]["alice"]} == {
        result["cron"]["cron_id"], firing["cron"]["cron_id"]}
    assert result["crons"]["bob"] == []
    # the cron fired: the scheduler and the worker decrypted its sealed payload with no user
    assert "success" in [r["status"] for r in firing["runs"]], firing["runs"]
    assert _texts(firing["state"]["values"]["messages"])[0] == CRON_FIRED

    # measured: a graph whose output_schema is only a count still has its whole state copied
    # into the server's thread record (the runtime copies every state channel, not the
    # output), so an output schema is no way to keep the conversation out of that copy
    private = result["private"]
    assert private["out"] == {"turns": 1}
    assert _texts(private["record"]["values"]["messages"]) == [PRIVATE_SECRET, "noted"]
    assert _texts(private["state"]["values"]["messages"]) == [PRIVATE_SECRET, "noted"]

    # the checkpoint database holds none of their strings (SQLite file, WAL and SHM)
    raw = b"".join(p.read_bytes() for p in server.db.parent.glob(server.db.name + "*"))
    assert raw, "the checkpointer wrote to SECURESAVER_URL"
    for secret in ALL_SECRETS:
        for form in _forms(secret):
            assert form not in raw, f"{secret!r} is readable in the checkpoint/store DB"

    # every file the server and SecureSaver wrote, the record file included: nothing in clear
    _scan_written_files(server.workdir)

    # bob's run naming alice's tenant failed and was recorded
    assert result["attack_error"] is not None or all(
        r["status"] == "error" for r in result["attack_runs"])
    assert [r["status"] for r in result["attack_runs"]] == ["error"]

    url = f"sqlite:///{server.db}"
    runner = CliRunner()
    audit = runner.invoke(app, ["audit", "--url", url, "--format", "json"])
    assert audit.exit_code == 0, audit.output
    report = json.loads(audit.output)
    assert sorted(t["tenant"] for t in report["tenants"]) == ["alice", "bob"]
    by_tenant = {t["tenant"]: t for t in report["tenants"]}
    rolled = result["rollback"]
    assert by_tenant["alice"]["threads"] == 4 and by_tenant["bob"]["threads"] == 1
    threads = {(t["tenant"], t["thread_id"]) for t in report["threads"]}
    assert threads == {("alice", a["tid"]), ("alice", rolled["tid"]), ("alice", firing["tid"]),
                       ("alice", private["tid"]), ("bob", b["tid"])}

    # bob's cancel(rollback) of alice's in-flight run was refused by the owner filter: the
    # checkpointer cannot tell who asked (the worker rolls back with no requesting user)
    assert type(rolled["foreign_cancel"]).__name__ == "NotFoundError", rolled["foreign_cancel"]
    assert rolled["status_after_foreign"] == "running"
    # then alice's own rollback: the rolled-back run left nothing (deleted as alice)
    assert _texts(rolled["state"]["values"]["messages"]) == ["this one stays", "gated reply"]
    assert [r["status"] for r in rolled["runs"]] == ["success"]
    log = server.log.read_text(errors="replace")
    assert "Background worker failed" not in log and "TenantRequired" not in log, log[-3000:]

    # the copy had alice's conversation; its deletion left a receipt naming alice. The
    # rollback's run was the thread's only one: delete_for_runs marked the thread emptied,
    # deleting nothing more, while the kept run was starting on it (the sweep would delete
    # it, key included, only if it stayed empty and unwritten for the grace)
    assert result["copy_state"]["values"]["messages"] == a["final"]["values"]["messages"]
    receipts = json.loads(runner.invoke(app, ["events", "--url", url, "--kind", "receipt",
                                              "--format", "json"]).output)
    assert sorted((r["tenant"], r["thread_id"], r["actor"]) for r in receipts) == sorted([
        ("alice", result["copied"], "alice")])

    # a checkpointer read of alice's thread under bob's identity: refused, recorded; the
    # rolled-back thread's checkpoints (the kept run's) all open
    asyncio.run(_direct_reads(server, a["tid"], rolled["tid"]))
    # a retention sweep after the grace keeps that thread (written again), key and all
    with SecureSaver.from_url(url, keyring=Keyring.from_file(server.keyring_file)) as swept:
        grace = Sweep(swept, now=None, limit=None, dry_run=True, tenant=None).emptied_grace()
        report = swept.prune_expired(now=time.time() + grace + 1)
        assert report.deleted == [] and report.errors == [], report
    asyncio.run(_direct_reads(server, a["tid"], rolled["tid"]))
    events = runner.invoke(app, ["events", "--url", url, "--kind", "access_denied",
                                 "--format", "json"])
    assert events.exit_code == 0, events.output
    denied = json.loads(events.output)
    pairs = [(e["tenant"], e["actor"]) for e in denied]
    assert pairs.count(("alice", "bob")) >= 2, denied   # the server run + the direct read

    # tampered encrypted fields in the persisted record file are refused after a restart
    _tamper_and_restart(server.workdir, result)


#: files the test put in the work directory (sources, keys) rather than the server wrote
_INPUT_FILES = {"auth.py", "checkpointer.py", "encryption.py", "store.py", "graph.py",
                "gated.py", "private.py", "langgraph.json", "README.md", "gate"}


def _scan_written_files(workdir: Path) -> None:
    written = [p for p in workdir.rglob("*") if p.is_file() and p.name not in _INPUT_FILES
               and "__pycache__" not in p.parts]
    names = {p.name for p in written}
    assert ".langgraph_ops.pckl" in names and "checkpoints.db" in names, names
    records = workdir / ".langgraph_api" / ".langgraph_ops.pckl"
    assert is_sealed(records.read_bytes()), "the record file is written sealed"
    for path in written:
        data = path.read_bytes()
        for secret in ALL_SECRETS:
            for form in _forms(secret):
                assert form not in data, f"{secret!r} is readable in {path.relative_to(workdir)}"
    # inside the seal: the handlers still sealed every field but the runtime's two copies
    hits = _records_script(workdir, "find", json.dumps(ALL_SECRETS))
    assert hits, "the sealed record file holds the conversations (the runtime's copies)"
    outside = [(n, p) for n, p in hits if not any(rx.match(p) for rx in NOT_COVERED)]
    assert outside == [], outside
    # the strings only the server's records hold (metadata, store, assistant, cron) are
    # nowhere but in the run kwargs the worker decrypted (thread/run metadata copied there)
    for needle, place in hits:
        assert needle not in (*MEMORY.values(), ASSISTANT_SECRET, CRON_SECRET), (needle, place)
    # ... and the covered places do hold ciphertext
    sealed = {re.sub(r"\.\d+\.", ".N.", p) for p, _t, _id in _records_script(workdir, "tokens")}
    for place in ("threads.N.metadata.topic", "runs.N.metadata.note", "assistants.N.metadata.purpose",
                  "assistants.N.config.configurable.tone", "crons.N.payload.input.messages"):
        assert place in sealed, sorted(sealed)


def _sealer(workdir: Path, name: str = OPS_FILENAME) -> RecordsSealer:
    """The record file's sealer with the server's keys (opened in the test process)."""
    return RecordsSealer(ServerSettings(url=f"sqlite:///{workdir / 'checkpoints.db'}",
                                        keyring=Keyring.from_file(workdir / "keyring.json")),
                         name=name)


def _tamper_and_restart(workdir: Path, result: dict[str, Any]) -> None:
    tokens = _records_script(workdir, "tokens")
    alice_thread = result["alice"]["tid"]
    assistant_id = result["assistant"]["assistant_id"]
    sealer = _sealer(workdir)
    # someone holding the keys edits fields inside the sealed file: the handlers refuse them
    raw = sealer.open((workdir / ".langgraph_api" / ".langgraph_ops.pckl").read_bytes())
    flipped = plain = 0
    for place, token, record_id in tokens:
        if record_id == alice_thread and place.startswith("threads.") \
                and place.endswith(".metadata.topic"):
            i = len(token) // 2
            forged = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1:]
            assert raw.count(token.encode()) == 1
            raw = raw.replace(token.encode(), forged.encode())
            flipped += 1
        if record_id == assistant_id and place.startswith("assistants.") \
                and place.endswith(".metadata.purpose"):
            injected = ("injected " * len(token))[:len(token)]
            raw = raw.replace(token.encode(), injected.encode())
            plain += 1
    assert flipped == 1 and plain == 1
    (workdir / ".langgraph_api" / ".langgraph_ops.pckl").write_bytes(sealer.seal(raw))
    sealer.close()
    restarted = _start(workdir, "server-restarted.log")
    try:
        outcome = asyncio.run(_read_after_tamper(restarted.url, result))
    finally:
        restarted.stop()
    assert outcome["thread"] is not None, "a forged ciphertext was accepted"
    assert outcome["assistant"] is not None, "a plain value in an encrypted field was accepted"
    # the rest of the file still loads: bob's thread and alice's other thread
    assert outcome["bob_topic"] == THREAD_META["bob"]
    assert outcome["alice_other"] == result["rollback"]["tid"]
    log = restarted.log.read_text(errors="replace")
    assert "TamperedDataError" in log and "failed authentication" in log, log[-3000:]
    assert "plain value was found in the encrypted LangGraph Server field" in log, (
        repr(outcome["assistant"]), log[-3000:])


async def _read_after_tamper(url: str, result: dict[str, Any]) -> dict[str, Any]:
    from langgraph_sdk import get_client

    def client(headers: dict[str, str]) -> Any:
        # a fresh connection per request: the server drops the one a refused read failed on
        return get_client(url=url, headers=headers)

    out: dict[str, Any] = {"thread": None, "assistant": None}
    try:
        await client(ALICE).threads.get(result["alice"]["tid"])
    except Exception as exc:  # the server's 500
        out["thread"] = exc
    try:
        await client(ALICE).assistants.get(result["assistant"]["assistant_id"])
    except Exception as exc:
        out["assistant"] = exc
    bob_thread = await client(BOB).threads.get(result["bob"]["tid"])
    out["bob_topic"] = bob_thread["metadata"]["topic"]
    out["alice_other"] = (await client(ALICE).threads.get(result["rollback"]["tid"]))["thread_id"]
    return out


async def _alice_turn(url: str) -> str:
    from langgraph_sdk import get_client
    alice = get_client(url=url, headers=ALICE)
    tid = (await alice.threads.create(metadata={"topic": THREAD_META["alice"]}))["thread_id"]
    await alice.runs.wait(tid, "agent", input={"messages": [
        {"role": "user", "content": ALICE_TEXT}]})
    return str(tid)


async def _alice_thread(url: str, tid: str) -> dict[str, Any]:
    from langgraph_sdk import get_client
    return dict(await get_client(url=url, headers=ALICE).threads.get(tid))


def test_the_record_file_is_sealed_and_an_altered_one_is_refused(tmp_path: Path) -> None:
    """langgraph dev writes its record file sealed; a flipped byte, a plain pickle in its
    place or a file sealed under another name stop the server from starting (the file is left
    as it was: nothing is discarded), and the original file then loads with its data."""
    require_server()
    workdir = tmp_path / "example"
    shutil.copytree(EXAMPLE, workdir)
    Keyring.generate().save(workdir / "keyring.json")
    srv = _start(workdir)
    try:
        tid = asyncio.run(_alice_turn(srv.url))
    finally:
        srv.stop()
    ops = workdir / ".langgraph_api" / ".langgraph_ops.pckl"
    good = ops.read_bytes()
    assert is_sealed(good)
    for secret in (ALICE_TEXT, THREAD_META["alice"]):
        for form in _forms(secret):
            assert form not in good
    sealer = _sealer(workdir)
    plain = sealer.open(good)
    # the runtime's copy of the thread's state is inside: the seal is what keeps it off disk
    assert ALICE_TEXT.encode() in plain
    other_name = _sealer(workdir, name="elsewhere/.langgraph_ops.pckl")
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    cases = {"flipped": (bytes(flipped), "failed authentication"),
             "plaintext": (plain, "is not sealed"),
             "other name": (other_name.seal(plain), "failed authentication")}
    sealer.close()
    other_name.close()
    for case, (data, message) in cases.items():
        ops.write_bytes(data)
        log = _start_refused(workdir, f"refused-{case.replace(' ', '-')}.log")
        assert "TamperedDataError" in log and message in log, (case, log[-3000:])
        assert ops.read_bytes() == data, f"{case}: the refused file was changed or removed"
    ops.write_bytes(good)
    srv = _start(workdir, "server-good.log")
    try:
        thread = asyncio.run(_alice_thread(srv.url, tid))
    finally:
        srv.stop()
    assert thread["metadata"]["topic"] == THREAD_META["alice"]
    assert _texts(thread["values"]["messages"])[0] == ALICE_TEXT
    assert is_sealed(ops.read_bytes())


async def _direct_reads(server: Server, alice_thread: str, rolled_thread: str) -> None:
    """Open the checkpointer exactly as the server does and read as each user."""
    settings = ServerSettings(url=f"sqlite:///{server.db}",
                              keyring=Keyring.from_file(server.keyring_file))
    bob_user = {"identity": "bob", "org_id": "globex"}
    alice_user = {"identity": "alice", "org_id": "acme"}
    async with make_checkpointer(settings=settings)() as saver:
        assert isinstance(saver, AuthTenantSaver)
        as_alice = await saver.aget_tuple({"configurable": {
            "thread_id": alice_thread, "langgraph_auth_user": alice_user}})
        assert as_alice is not None
        assert ALICE_TEXT in json.dumps(as_alice.checkpoint["channel_values"], default=str)
        with pytest.raises(AccessDenied):
            await saver.aget_tuple({"configurable": {
                "thread_id": alice_thread, "tenant_id": "alice",
                "langgraph_auth_user": bob_user, "langgraph_auth_user_id": "bob"}})
        # without naming alice, bob's identity only ever reaches bob's namespace
        assert await saver.aget_tuple({"configurable": {
            "thread_id": alice_thread, "langgraph_auth_user": bob_user}}) is None
        assert [t async for t in saver.alist({"configurable": {
            "thread_id": alice_thread, "langgraph_auth_user": bob_user}})] == []
        # a call with no user at all (a background sweep) acts for nobody
        with pytest.raises(TenantRequired):
            await saver.aget_tuple({"configurable": {"thread_id": alice_thread}})
        with pytest.raises(TenantRequired):
            await saver.adelete_thread(alice_thread)
        with pytest.raises(TenantRequired):
            await saver.adelete_for_runs(["any-run"])
        assert await saver.aget_tuple({"configurable": {
            "thread_id": alice_thread, "langgraph_auth_user": alice_user}}) is not None
        history = [t async for t in saver.alist({"configurable": {
            "thread_id": rolled_thread, "langgraph_auth_user": alice_user}})]
        assert history and not any(
            "will be rolled back" in json.dumps(t.checkpoint["channel_values"], default=str)
            for t in history)


# --------------------------------------------------------------------------------------------
# tenant resolution without a server
# --------------------------------------------------------------------------------------------
def _graph(saver: Any) -> Any:
    from tests.fake_agent import build_chat_graph
    return build_chat_graph(saver)


def _run_cfg(thread: str, user: Any, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "langgraph_auth_user": user, **extra}}


def _events(saver: AuthTenantSaver) -> list[tuple[str | None, str | None]]:
    return [(e.tenant, e.actor) for e in saver.events(kind="access_denied")]


@pytest.fixture
def auth_saver(keyring: Keyring) -> Iterator[AuthTenantSaver]:
    from langgraph.checkpoint.memory import InMemorySaver
    saver = AuthTenantSaver(InMemorySaver(), keyring=keyring, redaction=None)
    saver.setup()
    yield saver


def test_the_user_is_the_tenant(auth_saver: AuthTenantSaver) -> None:
    graph = _graph(auth_saver)
    graph.invoke({"messages": [HumanMessage("alice's secret plan")]},
                 _run_cfg("t1", {"identity": "alice"}))
    graph.invoke({"messages": [HumanMessage("bob's notes")]}, _run_cfg("t1", {"identity": "bob"}))
    alice = graph.get_state(_run_cfg("t1", {"identity": "alice"}))
    bob = graph.get_state(_run_cfg("t1", {"identity": "bob"}))
    assert alice.values["messages"][0].content == "alice's secret plan"
    assert bob.values["messages"][0].content == "bob's notes"
    with tenant_scope("alice"):
        rows = list(auth_saver.list(None))
    texts = [m.content for t in rows for m in t.checkpoint["channel_values"].get("messages", [])]
    assert rows and any("alice" in c for c in texts) and not any("bob" in c for c in texts)
    assert all("tenant_id" not in t.config["configurable"] for t in rows)  # namespacing invisible


def test_a_config_tenant_that_is_not_the_users_is_refused_and_recorded(
        auth_saver: AuthTenantSaver) -> None:
    graph = _graph(auth_saver)
    graph.invoke({"messages": [HumanMessage("alice only")]}, _run_cfg("t1", {"identity": "alice"}))
    with pytest.raises(AccessDenied):
        auth_saver.get_tuple(_run_cfg("t1", {"identity": "bob"}, tenant_id="alice"))
    with pytest.raises(AccessDenied):
        graph.invoke({"messages": [HumanMessage("x")]},
                     _run_cfg("t1", {"identity": "bob"}, tenant_id="alice"))
    assert _events(auth_saver) == [("alice", "bob")]   # the repeat is counted (coalesced)
    flush_for(auth_saver.registry)                      # ... and written with its summary
    assert _events(auth_saver) == [("alice", "bob"), ("alice", "bob")]
    assert [e.detail.get("count", 1) for e in auth_saver.events(kind="access_denied")] == [1, 1]
    # the user's own tenant named explicitly is fine
    assert auth_saver.get_tuple(_run_cfg("t1", {"identity": "alice"}, tenant_id="alice"))


def test_disagreeing_sources_are_refused(auth_saver: AuthTenantSaver) -> None:
    with tenant_scope("alice"), pytest.raises(AccessDenied):
        auth_saver.get_tuple(_run_cfg("t1", {"identity": "bob"}))
    assert _events(auth_saver) == [("bob", "alice")]


@pytest.mark.parametrize("user", [
    None, {"identity": ""}, {"identity": "x", "is_authenticated": False}, {"kind": "StudioUser",
                                                                          "identity": "studio"}])
def test_calls_without_a_user_act_for_nobody(auth_saver: AuthTenantSaver, user: Any) -> None:
    graph = _graph(auth_saver)
    graph.invoke({"messages": [HumanMessage("alice only")]}, _run_cfg("t1", {"identity": "alice"}))
    with pytest.raises(TenantRequired):
        auth_saver.get_tuple(_run_cfg("t1", user))
    with pytest.raises(TenantRequired):   # a client's tenant_id is never a way in
        auth_saver.get_tuple(_run_cfg("t1", user, tenant_id="alice"))
    with pytest.raises(TenantRequired):
        auth_saver.get_tuple({"configurable": {"thread_id": "t1", "tenant_id": "alice"}})
    with pytest.raises(TenantRequired):
        auth_saver.delete_thread("t1")
    with pytest.raises(TenantRequired):
        list(auth_saver.list(None))
    assert auth_saver.get_tuple(_run_cfg("t1", {"identity": "alice"})) is not None


def test_runs_are_cleaned_up_without_a_user_only_in_the_tenant_that_wrote_them(
        auth_saver: AuthTenantSaver) -> None:
    """What the server's worker does after a rollback: adelete_for_runs with no user."""
    import uuid
    graph = _graph(auth_saver)
    runs = {name: str(uuid.uuid4()) for name in ("alice1", "alice2", "bob1")}
    for name, run_id in runs.items():
        user = {"identity": name[:-1]}
        graph.invoke({"messages": [HumanMessage(f"run {name}")]},
                     {"run_id": run_id, **_run_cfg(f"t-{name}", user, run_id=run_id)})

    def count(thread: str, who: str) -> int:
        return len(list(auth_saver.list(_run_cfg(thread, {"identity": who}))))

    before = {name: count(f"t-{name}", name[:-1]) for name in runs}
    assert all(before.values())
    auth_saver.delete_for_runs([runs["alice1"], runs["bob1"]])    # no user anywhere
    assert count("t-alice1", "alice") == 0 and count("t-bob1", "bob") == 0
    assert count("t-alice2", "alice") == before["alice2"]
    with pytest.raises(TenantRequired):                    # a run this process never saw
        auth_saver.delete_for_runs([str(uuid.uuid4())])
    with pytest.raises(TenantRequired):                    # all or nothing
        auth_saver.delete_for_runs([runs["alice2"], str(uuid.uuid4())])
    assert count("t-alice2", "alice") == before["alice2"]


async def test_async_run_cleanup_without_a_user(auth_saver: AuthTenantSaver) -> None:
    import uuid
    run_id = str(uuid.uuid4())
    await _graph(auth_saver).ainvoke({"messages": [HumanMessage("x")]}, {
        "run_id": run_id, **_run_cfg("t", {"identity": "alice"}, run_id=run_id)})
    await auth_saver.adelete_for_runs([run_id])
    assert await auth_saver.aget_tuple(_run_cfg("t", {"identity": "alice"})) is None


def test_default_tenant_is_an_explicit_opt_in(keyring: Keyring) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    saver = AuthTenantSaver(InMemorySaver(), keyring=keyring, redaction=None,
                            default_tenant="shared")
    graph = _graph(saver)
    graph.invoke({"messages": [HumanMessage("no auth")]}, {"configurable": {"thread_id": "t"}})
    with tenant_scope("shared"):
        assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is not None
    with pytest.raises(AccessDenied):   # even then, a config cannot name another tenant
        saver.get_tuple({"configurable": {"thread_id": "t", "tenant_id": "alice"}})
    # an authenticated user still gets their own tenant, not the default
    assert saver.get_tuple(_run_cfg("t", {"identity": "alice"})) is None


def test_tenant_of_is_overridable(keyring: Keyring) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    saver = AuthTenantSaver(InMemorySaver(), keyring=keyring, redaction=None,
                            tenant_of=tenant_from_field("org_id"))
    graph = _graph(saver)
    graph.invoke({"messages": [HumanMessage("from ann")]},
                 _run_cfg("t", {"identity": "ann", "org_id": "acme"}))
    # a colleague in the same org shares the tenant; another org does not
    same_org = saver.get_tuple(_run_cfg("t", {"identity": "carl", "org_id": "acme"}))
    assert same_org is not None
    assert saver.get_tuple(_run_cfg("t", {"identity": "dan", "org_id": "globex"})) is None
    with pytest.raises(TenantRequired):   # a user without an org is refused
        saver.get_tuple(_run_cfg("t", {"identity": "eve"}))
    custom = AuthTenantSaver(InMemorySaver(), keyring=keyring, redaction=None,
                             tenant_of=lambda user: f"org-{user['org_id']}")
    _graph(custom).invoke({"messages": [HumanMessage("hi")]},
                          _run_cfg("t", {"identity": "ann", "org_id": "7"}))
    with tenant_scope("org-7"):
        assert custom.get_tuple({"configurable": {"thread_id": "t"}}) is not None


def test_the_user_is_the_subject_of_the_threads_they_write(keyring: Keyring) -> None:
    """Under the server the subject is the authenticated user (``subject_of``, default the
    identity): a colleague of the same tenant writing the thread is refused, a client's
    ``subject_id`` must be the user's, and forget_subject finds the user's threads."""
    from langgraph.checkpoint.memory import InMemorySaver
    saver = AuthTenantSaver(InMemorySaver(), keyring=keyring, redaction=None,
                            tenant_of=tenant_from_field("org_id"))
    graph = _graph(saver)
    ann = {"identity": "ann", "org_id": "acme"}
    carl = {"identity": "carl", "org_id": "acme"}
    graph.invoke({"messages": [HumanMessage("ann's thread")]}, _run_cfg("t", ann))
    graph.invoke({"messages": [HumanMessage("ann's other")]}, _run_cfg("t2", ann))
    graph.invoke({"messages": [HumanMessage("carl's thread")]}, _run_cfg("c", carl))
    assert saver.get_tuple(_run_cfg("t", carl)) is not None      # reads: the tenant's rule
    with pytest.raises(AccessDenied, match="another subject"):
        graph.invoke({"messages": [HumanMessage("carl writes")]}, _run_cfg("t", carl))
    with pytest.raises(AccessDenied, match="another subject"):  # the client cannot pick one
        graph.invoke({"messages": [HumanMessage("x")]}, _run_cfg("c", carl, subject_id="ann"))
    graph.invoke({"messages": [HumanMessage("again")]}, _run_cfg("t", ann, subject_id="ann"))
    report = saver.forget_subject("ann")
    assert report.threads == {"acme": 2}
    assert saver.get_tuple(_run_cfg("t", ann)) is None
    assert saver.get_tuple(_run_cfg("c", carl)) is not None
    # threads shared by a tenant's users: no subject at all
    shared = AuthTenantSaver(InMemorySaver(), keyring=keyring, redaction=None,
                             tenant_of=tenant_from_field("org_id"), subject_of=lambda u: None)
    _graph(shared).invoke({"messages": [HumanMessage("a")]}, _run_cfg("t", ann))
    _graph(shared).invoke({"messages": [HumanMessage("b")]}, _run_cfg("t", carl))
    assert len(_graph(shared).get_state(_run_cfg("t", carl)).values["messages"]) == 4


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from langgraph_securesaver import ConfigurationError, KeyringRequired
    for var in list(os.environ):
        if var.startswith("SECURESAVER_"):
            monkeypatch.delenv(var)
    with pytest.raises(ConfigurationError, match="SECURESAVER_URL"):
        ServerSettings.from_env()
    monkeypatch.setenv("SECURESAVER_URL", f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(KeyringRequired):
        ServerSettings.from_env()
    ring = Keyring.generate()
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", ring.to_json())
    s = ServerSettings.from_env()
    assert s.redaction and s.retention is None and s.default_tenant is None
    assert s.tenant_field == "identity" and s.subject_field == "identity"
    ring.save(tmp_path / "ring.json")
    monkeypatch.delenv("SECURESAVER_MASTER_KEY")
    monkeypatch.setenv("SECURESAVER_KEYRING_FILE", str(tmp_path / "ring.json"))
    monkeypatch.setenv("SECURESAVER_REDACTION", "off")
    monkeypatch.setenv("SECURESAVER_RETENTION_IDLE_TTL", "30d")
    monkeypatch.setenv("SECURESAVER_RETENTION_STRATEGY", "keep_latest")
    monkeypatch.setenv("SECURESAVER_TENANT_FIELD", "org_id")
    monkeypatch.setenv("SECURESAVER_SUBJECT_FIELD", "none")
    s = ServerSettings.from_env()
    assert not s.redaction and s.tenant_field == "org_id" and s.subject_field is None
    assert s.retention is not None and s.retention.idle_ttl == 30 * 86400
    assert s.retention.strategy == "keep_latest"
    monkeypatch.setenv("SECURESAVER_REDACTION", "maybe")
    with pytest.raises(ConfigurationError):
        ServerSettings.from_env()
    monkeypatch.setenv("SECURESAVER_REDACTION", "on")
    monkeypatch.setenv("SECURESAVER_RETENTION_IDLE_TTL", "soon")
    with pytest.raises(ConfigurationError):
        ServerSettings.from_env()


async def test_factory_is_what_langgraph_server_loads(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """The factory yields a set-up AuthTenantSaver; the dotted default path resolves."""
    ring = Keyring.generate()
    monkeypatch.setenv("SECURESAVER_URL", f"sqlite:///{tmp_path / 'f.db'}")
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", ring.to_json())
    monkeypatch.setenv("SECURESAVER_TENANT_FIELD", "org_id")
    monkeypatch.setenv("SECURESAVER_REDACTION", "off")
    from langgraph_securesaver.server import saver as server_module
    async with server_module.checkpointer() as saver:
        assert isinstance(saver, AuthTenantSaver)
        assert saver.redactor is None
        cfg = _run_cfg("t", {"identity": "ann", "org_id": "acme"})
        graph = _graph(saver)
        await graph.ainvoke({"messages": [HumanMessage("hello")]}, cfg)
        with tenant_scope("acme"):
            assert await saver.aget_tuple({"configurable": {"thread_id": "t"}}) is not None


def test_dotted_default_path_loads_in_the_server() -> None:
    """``"path": "langgraph_securesaver.server.checkpointer"`` resolves with the server's own
    loader (run in a subprocess: the server's config module reads its environment on import)."""
    require_server()
    env = {**os.environ, "LANGGRAPH_RUNTIME_EDITION": "inmem", "REDIS_URI": "fake",
           "DATABASE_URI": ":memory:", "MIGRATIONS_PATH": "__inmem",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = ("from langgraph_api._checkpointer._adapter import _load_checkpointer\n"
            "import langgraph_securesaver.server as s\n"
            "print(_load_checkpointer('langgraph_securesaver.server.checkpointer') "
            "is s.checkpointer)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1:] == ["True"], out.stderr[-3000:]


@pytest.mark.postgres
async def test_factory_on_postgres(pg_url: str) -> None:
    settings = ServerSettings(url=pg_url, keyring=Keyring.generate(), redaction=False)
    async with make_checkpointer(settings=settings)() as saver:
        graph = _graph(saver)
        await graph.ainvoke({"messages": [HumanMessage("from alice")]},
                            _run_cfg("t", {"identity": "alice"}))
        await graph.ainvoke({"messages": [HumanMessage("from bob")]},
                            _run_cfg("t", {"identity": "bob"}))
        alice = await graph.aget_state(_run_cfg("t", {"identity": "alice"}))
        assert [m.content for m in alice.values["messages"]] == ["from alice", "Thanks, noted (turn 1): from alice"]
        with pytest.raises(AccessDenied):
            await saver.aget_tuple(_run_cfg("t", {"identity": "bob"}, tenant_id="alice"))
        with pytest.raises(TenantRequired):
            await saver.adelete_thread("t")
        assert [(e.tenant, e.actor) for e in await saver.aevents(kind="access_denied")] == [
            ("alice", "bob")]


def test_a_run_seen_under_two_tenants_is_never_cleaned_up_without_a_user() -> None:
    from langgraph_securesaver.server.saver import _RunTenants
    runs = _RunTenants(size=2)
    runs.remember("r1", "alice")
    runs.remember("r1", "alice")
    assert runs.tenant_of("r1") == "alice"
    runs.remember("r1", "bob")
    assert runs.tenant_of("r1") is None
    runs.remember("r1", "alice")
    assert runs.tenant_of("r1") is None     # stays ambiguous
    runs.remember("r2", "alice")
    runs.remember("r3", "alice")            # bounded: the oldest is forgotten
    assert runs.tenant_of("r1") is None and runs.tenant_of("r3") == "alice"


# --------------------------------------------------------------------------------------------
# the encryption handlers without a server
# --------------------------------------------------------------------------------------------
def _ctx(model: str = "thread", tenant: str | None = "alice", **extra: Any) -> Any:
    from langgraph_sdk import EncryptionContext
    meta = {} if tenant is None else {"securesaver_tenant": tenant}
    return EncryptionContext(model=model, field="metadata", metadata={**meta, **extra})


@pytest.fixture
def handlers(tmp_path: Path) -> Any:
    import warnings

    from langgraph_securesaver.server.encryption import ServerEncryption
    settings = ServerSettings(url=f"sqlite:///{tmp_path / 'enc.db'}",
                              keyring=Keyring.generate(), redaction=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the SDK's "Encryption API is in beta"
        enc = ServerEncryption(settings=settings, encrypt_store=True)
    yield enc
    enc.close()


async def test_json_values_are_sealed_keys_and_owner_kept(handlers: Any) -> None:
    sdk = handlers.sdk
    data = {"topic": "alice's divorce", "owner": "alice", "n": 3, "nested": {"a": [1, "x"]},
            "empty": None}
    ctx = _ctx()
    sealed = await sdk.get_json_encryptor()(ctx, data)
    assert set(sealed) == set(data)                      # the server's key-preservation rule
    assert sealed["owner"] == "alice" and sealed["empty"] is None
    for key in ("topic", "n", "nested"):
        assert isinstance(sealed[key], str) and sealed[key].startswith("ss1.")
    assert "divorce" not in json.dumps(sealed)
    assert ctx.metadata["securesaver_tenant"] == "alice"
    assert await sdk.get_json_decryptor()(_ctx(), sealed) == data


async def test_tampered_moved_and_injected_values_are_refused(handlers: Any) -> None:
    from langgraph_securesaver import TamperedDataError
    sdk = handlers.sdk
    sealed = await sdk.get_json_encryptor()(_ctx(), {"a": "secret one", "b": "secret two"})
    token = sealed["a"]
    i = len(token) // 2
    forged = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1:]
    with pytest.raises(TamperedDataError, match="failed authentication"):
        await sdk.get_json_decryptor()(_ctx(), {**sealed, "a": forged})
    with pytest.raises(TamperedDataError, match="failed authentication"):   # moved to a key
        await sdk.get_json_decryptor()(_ctx(), {**sealed, "b": sealed["a"]})
    with pytest.raises(TamperedDataError, match="plain value"):
        await sdk.get_json_decryptor()(_ctx(), {**sealed, "a": "injected"})
    with pytest.raises(TamperedDataError, match="plain value"):
        await sdk.get_json_decryptor()(_ctx(), {**sealed, "a": {"injected": 1}})
    # another tenant's context: bob's keys do not open alice's values
    await sdk.get_json_encryptor()(_ctx(tenant="bob"), {"x": "bob's"})
    with pytest.raises(TamperedDataError):
        await sdk.get_json_decryptor()(_ctx(tenant="bob"), sealed)
    with pytest.raises(TamperedDataError, match="names no tenant"):
        await sdk.get_json_decryptor()(_ctx(tenant=None), sealed)
    # the server's own clear keys and nested encrypted fields pass
    out = await sdk.get_json_decryptor()(_ctx(), {**sealed, "graph_id": "agent",
                                             "input": {"__encryption_context__": {}}})
    assert out["graph_id"] == "agent" and out["a"] == "secret one"


async def test_blobs_round_trip_and_refuse_tampering(handlers: Any) -> None:
    from langgraph_securesaver import TamperedDataError
    sdk = handlers.sdk
    blob = b"checkpoint bytes with alice.w@example.com"
    sealed = await sdk._blob_encryptor(_ctx("checkpoint"), blob)
    assert b"alice.w@example.com" not in sealed
    assert await sdk._blob_decryptor(_ctx("checkpoint"), sealed) == blob
    with pytest.raises(TamperedDataError):
        await sdk._blob_decryptor(_ctx("checkpoint"), sealed[:-1] + bytes([sealed[-1] ^ 1]))
    with pytest.raises(TamperedDataError):
        await sdk._blob_decryptor(_ctx("checkpoint", tenant="bob"), sealed)
    with pytest.raises(TamperedDataError):
        await sdk._blob_decryptor(_ctx("checkpoint"), blob)


async def test_the_tenant_is_the_users_and_the_header_is_ignored(
        handlers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from langgraph_sdk import EncryptionContext
    sdk = handlers.sdk
    header = EncryptionContext(metadata={"securesaver_tenant": "bob", "other": "x"})
    assert await sdk._context_handler({"identity": "alice"}, header) == {
        "securesaver_tenant": "alice"}
    assert await sdk._context_handler({"identity": ""}, header) == {}
    with pytest.raises(TenantRequired):
        await sdk.get_json_encryptor()(_ctx(tenant=None), {"a": "x"})
    sealed = await sdk.get_json_encryptor()(_ctx(), {"a": "alice's"})

    # inside a server request, the record's tenant must be the requesting user's
    user: dict[str, Any] = {"identity": "bob"}
    fake = types.ModuleType("langgraph_api.utils")
    fake.get_auth_ctx = lambda: types.SimpleNamespace(user=user)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "langgraph_api.utils", fake)
    with pytest.raises(AccessDenied):
        await sdk.get_json_decryptor()(_ctx(), sealed)
    with pytest.raises(AccessDenied):                     # a context naming another tenant
        await sdk.get_json_encryptor()(_ctx(), {"a": "x"})
    user["identity"] = "alice"
    assert await sdk.get_json_decryptor()(_ctx(), sealed) == {"a": "alice's"}
    user["kind"] = "StudioUser"                           # a user with no tenant
    with pytest.raises(TenantRequired):
        await sdk.get_json_encryptor()(_ctx(tenant=None), {"a": "x"})
    with pytest.raises(AccessDenied):
        await sdk.get_json_decryptor()(_ctx(), sealed)


async def test_rotated_keys_give_the_server_a_replacement(handlers: Any) -> None:
    from langgraph_sdk.encryption.types import DecryptResult
    sdk = handlers.sdk
    sealed = await sdk.get_json_encryptor()(_ctx(), {"a": "before rotation"})
    saver = handlers.saver()
    await asyncio.to_thread(saver.rotate_data_key, "alice")
    result = await sdk.get_json_decryptor()(_ctx(), sealed)
    assert isinstance(result, DecryptResult)
    assert result.plaintext == {"a": "before rotation"}
    assert result.replacement is not None and result.replacement["a"] != sealed["a"]
    assert await sdk.get_json_decryptor()(_ctx(), result.replacement) == {"a": "before rotation"}


async def test_store_values_are_left_to_securestore(tmp_path: Path) -> None:
    import warnings

    from langgraph_securesaver.server.encryption import ServerEncryption
    settings = ServerSettings(url=f"sqlite:///{tmp_path / 'enc.db'}",
                              keyring=Keyring.generate(), redaction=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        passing = ServerEncryption(settings=settings, encrypt_store=False)
    value = {"text": "remember this", "kind": "pref"}
    assert await passing.sdk.get_json_encryptor()(_ctx("store"), value) == value
    assert await passing.sdk.get_json_decryptor()(_ctx("store"), value) == value
    # every other model is still sealed
    sealed = await passing.sdk.get_json_encryptor()(_ctx("thread"), value)
    assert sealed["text"].startswith("ss1.")
    passing.close()


async def test_redaction_tokenizes_before_sealing_and_restores(tmp_path: Path) -> None:
    """With the redactor on (the default), the sealed plaintext holds tokens, the originals
    are in the PII vault, and the owner reads the original back."""
    import warnings

    from langgraph_securesaver.keys.tokens import from_text
    from langgraph_securesaver.server.encryption import ServerEncryption
    settings = ServerSettings(url=f"sqlite:///{tmp_path / 'enc.db'}", keyring=Keyring.generate())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        enc = ServerEncryption(settings=settings)
    message = {"messages": [{"role": "user", "content": "mail me at jane.roe@example.com"}]}
    sealed = await enc.sdk.get_json_encryptor()(_ctx("run"), message)
    saver = enc.saver()
    keys = saver.keys.require("alice")
    inside = keys.open(from_text(sealed["messages"]), enc.aad("alice", "messages"))
    assert b"jane.roe@example.com" not in inside and b"<EMAIL" in inside
    assert await enc.sdk.get_json_decryptor()(_ctx("run"), sealed) == message
    enc.close()


async def test_store_factory_is_a_securestore_per_user(tmp_path: Path) -> None:
    """What ``"store": {"path": ...}`` opens: SecureStore whose tenant is the caller's; a
    call with no user is refused; ``url=`` puts the items in another database."""
    from langgraph_securesaver.server.store import make_store
    from langgraph_securesaver.store import SecureStore
    settings = ServerSettings(url=f"sqlite:///{tmp_path / 'main.db'}",
                              keyring=Keyring.generate(), redaction=False)
    factory = make_store(settings=settings, url=f"sqlite:///{tmp_path / 'items.db'}")
    async with factory() as store:
        assert isinstance(store, SecureStore)
        with tenant_scope("alice"):
            await store.aput(("memories",), "m", {"text": "alice's secret memory"})
            assert (await store.aget(("memories",), "m")).value["text"] == "alice's secret memory"
        with tenant_scope("bob"):
            assert await store.aget(("memories",), "m") is None
            assert await store.asearch(("memories",)) == []
        with pytest.raises(TenantRequired):
            await store.aget(("memories",), "m")
    items = b"".join(p.read_bytes() for p in tmp_path.glob("items.db*"))
    assert items and b"alice's secret memory" not in items


# --------------------------------------------------------------------------------------------
# the record file wrapper without a server (a stand-in runtime with the installed one's shape)
# --------------------------------------------------------------------------------------------
_UNPICKLED: list[str] = []


def _unpickled(marker: str) -> str:
    """What a planted pickle calls when it is loaded."""
    _UNPICKLED.append(marker)
    return marker


class _Planted:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_unpickled, ("planted pickle ran",))


@pytest.fixture
def fake_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """langgraph_runtime_inmem's database/lifespan/_persistence modules as the server has them
    when the auth module is imported: a PersistentDict record store and a start_pool that,
    like the runtime's, deletes a file it cannot load."""
    import types

    from langgraph.checkpoint.memory import PersistentDict

    from langgraph_securesaver.server import records as server_records
    ops = str(tmp_path / ".langgraph_ops.pckl")
    database = types.ModuleType("langgraph_runtime_inmem.database")

    class GlobalStore(PersistentDict):
        pass

    async def start_pool() -> None:
        if os.path.exists(ops):
            try:
                database.GLOBAL_STORE.load()
            except Exception:
                os.remove(ops)

    database.OPS_FILENAME = ops                                     # type: ignore[attr-defined]
    database.GLOBAL_STORE = GlobalStore(list, filename=ops)         # type: ignore[attr-defined]
    database.start_pool = start_pool                                # type: ignore[attr-defined]
    lifespan = types.ModuleType("langgraph_runtime_inmem.lifespan")
    lifespan.start_pool = start_pool                                # type: ignore[attr-defined]
    persistence = types.ModuleType("langgraph_runtime_inmem._persistence")
    persistence._stores = {}                                        # type: ignore[attr-defined]
    package = types.ModuleType("langgraph_runtime_inmem")
    package.__version__ = sorted(server_records.KNOWN_RUNTIME_VERSIONS)[-1]  # type: ignore[attr-defined]
    for module in (package, database, lifespan, persistence):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(server_records._STATE, "sealer", None)
    monkeypatch.delenv(server_records.ENV_VAR, raising=False)
    settings = ServerSettings(url=f"sqlite:///{tmp_path / 'r.db'}", keyring=Keyring.generate())
    ns = types.SimpleNamespace(database=database, lifespan=lifespan, persistence=persistence,
                               package=package, ops=Path(ops), settings=settings,
                               start_pool=start_pool)
    yield ns
    sealer = server_records.installed()
    if sealer is not None:
        sealer.close()


def _fresh_store(fake: Any) -> Any:
    """The runtime's store as a new process has it: empty, then start_pool loads the file."""
    store = fake.database.GLOBAL_STORE
    dict.clear(store)
    asyncio.run(fake.database.start_pool())
    return store


def test_the_wrapper_seals_what_the_runtime_writes_and_reads_it_back(fake_runtime: Any) -> None:
    from langgraph_securesaver.server.records import SEALED, seal_server_records
    fake = fake_runtime
    assert seal_server_records(fake.settings) == SEALED
    assert fake.lifespan.start_pool is fake.database.start_pool is not fake.start_pool
    store = fake.database.GLOBAL_STORE
    store["threads"] = [{"values": {"messages": [ALICE_TEXT]}}]
    store.sync()                                 # what the flush loop and close() call
    raw = fake.ops.read_bytes()
    assert is_sealed(raw) and ALICE_TEXT.encode() not in raw
    assert _fresh_store(fake)["threads"] == [{"values": {"messages": [ALICE_TEXT]}}]
    assert seal_server_records(fake.settings) == SEALED       # idempotent


@pytest.mark.parametrize("case", ["flipped", "truncated", "plain pickle", "empty",
                                  "other database"])
def test_an_altered_record_file_is_refused_before_the_runtime_sees_it(
        fake_runtime: Any, case: str) -> None:
    import pickle

    from langgraph_securesaver import TamperedDataError
    from langgraph_securesaver.server.records import seal_server_records
    fake = fake_runtime
    seal_server_records(fake.settings)
    fake.database.GLOBAL_STORE["threads"] = [{"values": ALICE_TEXT}]
    fake.database.GLOBAL_STORE.sync()
    good = fake.ops.read_bytes()
    other = RecordsSealer(ServerSettings(url=f"sqlite:///{fake.ops.parent / 'other.db'}",
                                         keyring=Keyring.generate()))
    altered = {
        "flipped": good[:-5] + bytes([good[-5] ^ 0x01]) + good[-4:],
        "truncated": good[:20],
        "plain pickle": pickle.dumps({"threads": [_Planted()], "runs": []}),
        "empty": b"",
        "other database": other.seal(pickle.dumps({"threads": [], "runs": []})),
    }[case]
    other.close()
    fake.ops.write_bytes(altered)
    _UNPICKLED.clear()
    with pytest.raises(TamperedDataError) as info:
        _fresh_store(fake)
    assert fake.ops.read_bytes() == altered, "the refused file is kept as it was"
    assert _UNPICKLED == [], "an unauthenticated pickle was loaded"
    assert "record file" in str(info.value)
    fake.ops.write_bytes(good)
    assert _fresh_store(fake)["threads"] == [{"values": ALICE_TEXT}]


def test_no_file_starts_empty(fake_runtime: Any) -> None:
    from langgraph_securesaver.server.records import seal_server_records
    seal_server_records(fake_runtime.settings)
    assert dict(_fresh_store(fake_runtime)) == {}
    assert not fake_runtime.ops.exists()


def test_an_unknown_runtime_is_left_alone_and_a_sealed_file_is_not_given_to_it(
        fake_runtime: Any, caplog: pytest.LogCaptureFixture) -> None:
    from langgraph_securesaver import ConfigurationError
    from langgraph_securesaver.server.records import UNSUPPORTED, seal_file, seal_server_records
    fake = fake_runtime
    fake.package.__version__ = "0.0.1"
    with caplog.at_level("WARNING", logger="langgraph_securesaver.server.records"):
        assert seal_server_records(fake.settings) == UNSUPPORTED
    assert "0.0.1" in caplog.text and "written in clear" in caplog.text
    assert fake.database.start_pool is fake.start_pool
    assert type(fake.database.GLOBAL_STORE).__name__ == "GlobalStore"
    # a sealed file: the runtime would discard it, so the server is stopped instead
    fake.ops.write_bytes(b"plain records")
    sealer = RecordsSealer(fake.settings)
    seal_file(fake.ops, sealer)
    sealer.close()
    with pytest.raises(ConfigurationError, match="is sealed by langgraph-securesaver"):
        seal_server_records(fake.settings)


def test_off_too_late_and_no_runtime(fake_runtime: Any, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    from langgraph_securesaver import ConfigurationError
    from langgraph_securesaver.server.records import (
        ENV_VAR,
        NO_RUNTIME,
        OFF,
        TOO_LATE,
        seal_file,
        seal_server_records,
    )
    fake = fake_runtime
    monkeypatch.setenv(ENV_VAR, "off")
    assert seal_server_records(fake.settings) == OFF
    assert fake.database.start_pool is fake.start_pool
    monkeypatch.setenv(ENV_VAR, "maybe")
    with pytest.raises(ConfigurationError):
        seal_server_records(fake.settings)
    monkeypatch.setenv(ENV_VAR, "on")
    fake.persistence._stores[fake.database.OPS_FILENAME] = None   # start_pool already ran
    with caplog.at_level("WARNING", logger="langgraph_securesaver.server.records"):
        assert seal_server_records(fake.settings) == TOO_LATE
    assert "auth module" in caplog.text
    assert fake.database.start_pool is fake.start_pool
    monkeypatch.setenv(ENV_VAR, "off")
    fake.ops.write_bytes(b"plain records")
    sealer = RecordsSealer(fake.settings)
    seal_file(fake.ops, sealer)
    sealer.close()
    with pytest.raises(ConfigurationError, match="is off"):
        seal_server_records(fake.settings)
    monkeypatch.delitem(sys.modules, "langgraph_runtime_inmem.database")
    assert seal_server_records(fake.settings) == NO_RUNTIME


def test_seal_and_unseal_a_file(tmp_path: Path) -> None:
    from langgraph_securesaver import ConfigurationError, TamperedDataError
    from langgraph_securesaver.server.records import main, seal_file, unseal_file
    settings = ServerSettings(url=f"sqlite:///{tmp_path / 'r.db'}", keyring=Keyring.generate())
    sealer = RecordsSealer(settings)
    path = tmp_path / "records.pckl"
    path.write_bytes(b"\x80\x02}q\x00.")
    seal_file(path, sealer)
    sealed = path.read_bytes()
    assert is_sealed(sealed) and repr(sealer) == f"RecordsSealer(name={OPS_FILENAME!r})"
    with pytest.raises(ConfigurationError, match="already sealed"):
        seal_file(path, sealer)
    unseal_file(path, sealer)
    assert path.read_bytes() == b"\x80\x02}q\x00."
    with pytest.raises(TamperedDataError, match="not sealed"):
        unseal_file(path, sealer)
    # the same file under another name does not open (another database: the test above)
    with pytest.raises(TamperedDataError, match="failed authentication"):
        RecordsSealer(settings, name="store.pckl").open(sealed)
    sealer.close()
    assert main(["bogus"]) == 2
