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

from langgraph_securesaver import AccessDenied, Keyring, TenantRequired, tenant_scope
from langgraph_securesaver.cli import app
from langgraph_securesaver.denials import flush_for
from langgraph_securesaver.server import (
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


GATED_GRAPH = '''
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
'''


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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    require_server()
    import httpx
    workdir = tmp_path_factory.mktemp("lgserver")
    shutil.copytree(EXAMPLE, workdir, dirs_exist_ok=True)
    # a test-only graph whose node waits for a gate file, to roll a run back while it runs
    (workdir / "gated.py").write_text(GATED_GRAPH, encoding="utf-8")
    config = json.loads((workdir / "langgraph.json").read_text(encoding="utf-8"))
    config["graphs"]["gated"] = "./gated.py:graph"
    (workdir / "langgraph.json").write_text(json.dumps(config), encoding="utf-8")
    db = workdir / "checkpoints.db"
    keyring_file = workdir / "keyring.json"
    Keyring.generate().save(keyring_file)
    port = _free_port()
    env = dict(os.environ)
    env.pop("SECURESAVER_MASTER_KEY", None)
    env.update({
        "SECURESAVER_URL": f"sqlite:///{db}",
        "SECURESAVER_KEYRING_FILE": str(keyring_file),
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "SS_TEST_GATE": str(workdir / "gate"),
    })
    log = workdir / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*_langgraph_cli(), "dev", "--host", "127.0.0.1", "--port", str(port),
             "--no-browser", "--no-reload", "--config", "langgraph.json"],
            cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
    srv = Server(workdir, db, keyring_file, f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 180   # a startup timeout, not a performance assertion
        while True:
            if proc.poll() is not None:
                pytest.fail("langgraph dev exited:\n" + log.read_text(errors="replace")[-4000:])
            try:
                if httpx.get(srv.url + "/ok", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("langgraph dev did not start:\n"
                            + log.read_text(errors="replace")[-4000:])
            time.sleep(0.5)
        yield srv
    finally:
        srv.stop()


async def _conversation(client: Any, text: str, refund_text: str, answer: str) -> dict[str, Any]:
    """One user's session: a turn with a tool call, state, history, an interrupt, a resume."""
    thread = await client.threads.create()
    tid = thread["thread_id"]
    first = await client.runs.wait(tid, "agent", input={"messages": [
        {"role": "user", "content": text}]})
    state = await client.threads.get_state(tid)
    history_before = await client.threads.get_history(tid)
    await client.runs.wait(tid, "agent", input={"messages": [
        {"role": "user", "content": refund_text}]})
    paused = await client.threads.get_state(tid)
    resumed = await client.runs.wait(tid, "agent", command={"resume": answer})
    final = await client.threads.get_state(tid)
    history = await client.threads.get_history(tid, limit=100)
    return {"tid": tid, "first": first, "state": state, "history_before": history_before,
            "paused": paused, "resumed": resumed, "final": final, "history": history}


async def _rollback(client: Any, gate: Path) -> dict[str, Any]:
    """A run rolled back while it runs (multitask_strategy="rollback")."""
    tid = (await client.threads.create())["thread_id"]
    doomed = await client.runs.create(tid, "gated", input={"messages": [
        {"role": "user", "content": "this run will be rolled back"}]})
    for _ in range(1200):   # wait (bounded) until the worker is inside the node
        if (await client.runs.get(tid, doomed["run_id"]))["status"] == "running":
            break
        await asyncio.sleep(0.05)
    kept = await client.runs.create(tid, "gated", input={"messages": [
        {"role": "user", "content": "this one stays"}]}, multitask_strategy="rollback")
    gate.touch()
    await client.runs.join(tid, kept["run_id"])
    state = await client.threads.get_state(tid)
    runs = await client.runs.list(tid)
    return {"tid": tid, "state": state, "runs": runs, "doomed": doomed["run_id"]}


async def _drive(url: str, gate: Path) -> dict[str, Any]:
    from langgraph_sdk import get_client
    alice = get_client(url=url, headers=ALICE)
    bob = get_client(url=url, headers=BOB)
    a, b = await asyncio.gather(
        _conversation(alice, ALICE_TEXT, ALICE_REFUND, "yes"),
        _conversation(bob, BOB_TEXT, BOB_REFUND, "no"))
    # copy and delete go through acopy_thread / adelete_thread under the caller's identity
    rollback = await _rollback(alice, gate)
    copied = await alice.threads.copy(a["tid"])
    copy_state = await alice.threads.get_state(copied["thread_id"])
    await alice.threads.delete(copied["thread_id"])
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
    return {"alice": a, "bob": b, "attack_error": attack_error, "attack_runs": attack_runs,
            "copied": copied["thread_id"], "copy_state": copy_state, "rollback": rollback}


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("content", "")) for m in messages]


def test_two_users_on_langgraph_server(server: Server) -> None:
    result = asyncio.run(_drive(server.url, server.workdir / "gate"))
    server.stop()   # flush and release the database before reading it
    a, b = result["alice"], result["bob"]

    # both conversations work: a tool call, state, history, an interrupt and its resume
    for conv, text, refund_text, outcome in ((a, ALICE_TEXT, ALICE_REFUND, "approved"),
                                             (b, BOB_TEXT, BOB_REFUND, "denied")):
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
    # neither user's state holds the other's words
    assert BOB_TEXT not in json.dumps(a["final"]["values"])
    assert ALICE_TEXT not in json.dumps(b["final"]["values"])

    # the checkpoint database holds none of their strings (SQLite file, WAL and SHM)
    raw = b"".join(p.read_bytes() for p in server.db.parent.glob(server.db.name + "*"))
    assert raw, "the checkpointer wrote to SECURESAVER_URL"
    for secret in [*SECRETS, ALICE_TEXT, BOB_TEXT]:
        for form in (secret, json.dumps(secret)[1:-1]):
            assert form.encode() not in raw, f"{secret!r} is readable in the checkpoint DB"

    # what the README says the server keeps outside the checkpointer, in clear
    outside = b"".join(p.read_bytes() for p in (server.workdir / ".langgraph_api").glob("*"))
    assert ALICE_TEXT.encode() in outside and BOB_TEXT.encode() in outside

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
    assert by_tenant["alice"]["threads"] == 2 and by_tenant["bob"]["threads"] == 1
    threads = {(t["tenant"], t["thread_id"]) for t in report["threads"]}
    assert threads == {("alice", a["tid"]), ("alice", rolled["tid"]), ("bob", b["tid"])}

    # the rolled-back run left nothing: its checkpoints were deleted as alice
    assert _texts(rolled["state"]["values"]["messages"]) == ["this one stays", "gated reply"]
    assert [r["status"] for r in rolled["runs"]] == ["success"]
    log = server.log.read_text(errors="replace")
    assert "Background worker failed" not in log and "TenantRequired" not in log, log[-3000:]

    # the copy had alice's conversation; its deletion left a receipt naming alice
    assert result["copy_state"]["values"]["messages"] == a["final"]["values"]["messages"]
    receipts = json.loads(runner.invoke(app, ["events", "--url", url, "--kind", "receipt",
                                              "--format", "json"]).output)
    assert [(r["tenant"], r["thread_id"], r["actor"]) for r in receipts] == [
        ("alice", result["copied"], "alice")]

    # a checkpointer read of alice's thread under bob's identity: refused, recorded
    asyncio.run(_direct_reads(server, a["tid"], rolled["tid"]))
    events = runner.invoke(app, ["events", "--url", url, "--kind", "access_denied",
                                 "--format", "json"])
    assert events.exit_code == 0, events.output
    denied = json.loads(events.output)
    pairs = [(e["tenant"], e["actor"]) for e in denied]
    assert pairs.count(("alice", "bob")) >= 2, denied   # the server run + the direct read


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
    from langgraph_securesaver.demo import build_chat_graph
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
    assert s.tenant_field == "identity"
    ring.save(tmp_path / "ring.json")
    monkeypatch.delenv("SECURESAVER_MASTER_KEY")
    monkeypatch.setenv("SECURESAVER_KEYRING_FILE", str(tmp_path / "ring.json"))
    monkeypatch.setenv("SECURESAVER_REDACTION", "off")
    monkeypatch.setenv("SECURESAVER_RETENTION_IDLE_TTL", "30d")
    monkeypatch.setenv("SECURESAVER_RETENTION_STRATEGY", "keep_latest")
    monkeypatch.setenv("SECURESAVER_TENANT_FIELD", "org_id")
    s = ServerSettings.from_env()
    assert not s.redaction and s.tenant_field == "org_id"
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
    from langgraph_securesaver import server as server_module
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
    from langgraph_securesaver.server import _RunTenants
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
