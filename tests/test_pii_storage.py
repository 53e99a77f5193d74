"""Redaction as the saver applies it: tokens in storage, originals for the owning tenant,
a crash-resume that gets the real email back, inventory and erasure."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.tenancy import ThreadRef, inner_thread_id, tenant_scope
from tests.fake_agent import build_chat_graph

ROOT = Path(__file__).resolve().parents[1]
EMAIL = "li.na@example.com"
CN_ID = "11010519491231002X"          # valid checksum, real birth date
CN_MOBILE = "+86 138-1234-5678"
CARD = "4111 1111 1111 1111"
SECRET = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"
TEXT = f"我的邮箱是{EMAIL}，身份证{CN_ID}，手机{CN_MOBILE}，卡号{CARD}，key {SECRET}"


def _cfg(thread: str, tenant: str = "acme") -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


@pytest.fixture(scope="module")
def redactor():
    from langgraph_securesaver.redaction import Redactor
    return Redactor()


@pytest.fixture
def saver(tmp_path: Path, redactor):
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}", keyring=Keyring.generate(),
                              redaction=redactor) as s:
        yield s


def _stored_messages(saver: SecureSaver, thread: str, tenant: str = "acme") -> list:
    """What a key holder reading the database directly sees (decrypted, not restored)."""
    raw = saver.inner.get_tuple({"configurable": {"thread_id": inner_thread_id(tenant, thread),
                                                  "checkpoint_ns": ""}})
    ref = ThreadRef(tenant, thread)
    keys = saver.keys.require(tenant)
    version = raw.checkpoint["channel_versions"]["messages"]
    token = raw.checkpoint["channel_values"]["messages"]
    return saver.codec.load(keys.open(token, saver.codec.channel_aad(ref, "messages", version)))


def test_pii_is_tokenized_in_storage_and_restored_for_the_tenant(saver: SecureSaver) -> None:
    build_chat_graph(saver).invoke({"messages": [HumanMessage(TEXT)]}, _cfg("t"))
    stored = " ".join(str(m.content) for m in _stored_messages(saver, "t"))
    for value in (EMAIL, CN_ID, "1234-5678", CARD, SECRET):
        assert value not in stored
    assert "<EMAIL_ADDRESS:" in stored and "<CN_RESIDENT_ID:" in stored
    assert "<API_SECRET:masked>" in stored
    restored = saver.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"][0].content
    assert EMAIL in restored and CN_ID in restored
    assert SECRET not in restored  # secrets are irreversible by default
    inventory = saver.pii_inventory("acme")[("acme", "t")]
    assert inventory["EMAIL_ADDRESS"] == 1 and inventory["CN_RESIDENT_ID"] == 1


async def test_async_path_redacts_and_restores(tmp_path: Path, redactor) -> None:
    async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'a.db'}", keyring=Keyring.generate(),
                                     redaction=redactor) as saver:
        await build_chat_graph(saver).ainvoke({"messages": [HumanMessage(TEXT)]}, _cfg("t"))
        tup = await saver.aget_tuple(_cfg("t"))
        assert EMAIL in tup.checkpoint["channel_values"]["messages"][0].content
        listed = [t async for t in saver.alist(_cfg("t"), limit=1)]
        assert EMAIL in listed[0].checkpoint["channel_values"]["messages"][0].content


def test_tool_call_arguments_are_tokenized_and_restored(saver: SecureSaver) -> None:
    message = AIMessage("", id="ai-1", tool_calls=[{"name": "send", "id": "call-1",
                                                    "args": {"to": EMAIL}}])
    cfg = _cfg("t")
    graph = build_chat_graph(saver)
    graph.update_state(cfg, {"messages": [message]})
    stored = _stored_messages(saver, "t")[-1]
    assert stored.tool_calls[0]["args"]["to"].startswith("<EMAIL_ADDRESS:")
    assert stored.id == "ai-1" and stored.tool_calls[0]["id"] == "call-1"
    state = graph.get_state(cfg).values["messages"][-1]
    assert state.tool_calls[0]["args"]["to"] == EMAIL
    assert message.tool_calls[0]["args"]["to"] == EMAIL  # the caller's object is untouched


def test_crash_inside_a_tool_then_resume_gets_the_real_email(tmp_path: Path) -> None:
    ring = tmp_path / "keyring.json"
    Keyring.generate().save(ring)
    db, out = tmp_path / "agent.db", tmp_path / "received.txt"
    script = [sys.executable, "-m", "tests.scripts.pii_resume", str(db), str(ring), str(out)]
    first = subprocess.run([*script, "start"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 17, first.stderr
    assert not out.exists()
    second = subprocess.run([*script, "resume"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr
    assert out.read_text(encoding="utf-8") == "zhang.wei+vip@example.cn"
    assert b"zhang.wei" not in b"".join(p.read_bytes() for p in tmp_path.glob("agent.db*"))


def test_forget_pii_by_value_and_by_kind(saver: SecureSaver) -> None:
    graph = build_chat_graph(saver)
    graph.invoke({"messages": [HumanMessage(TEXT)]}, _cfg("t"))
    assert saver.forget_pii("acme", EMAIL, requested_by="dpo") == 1
    content = saver.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"][0].content
    assert EMAIL not in content and "<EMAIL_ADDRESS:" in content and CN_ID in content
    assert saver.forget_pii("acme", kind="CN_RESIDENT_ID") == 1
    content = saver.get_tuple(_cfg("t")).checkpoint["channel_values"]["messages"][0].content
    assert CN_ID not in content and "<CN_RESIDENT_ID:" in content
    assert "EMAIL_ADDRESS" not in saver.pii_inventory("acme")[("acme", "t")]
    assert [e.kind for e in saver.registry.list_events(kind="pii_forgotten")] == [
        "pii_forgotten", "pii_forgotten"]
    assert saver.forget_pii("globex", EMAIL) == 0


def test_deleting_a_thread_deletes_its_vault_entries(saver: SecureSaver) -> None:
    graph = build_chat_graph(saver)
    graph.invoke({"messages": [HumanMessage(f"mail {EMAIL}")]}, _cfg("a"))
    graph.invoke({"messages": [HumanMessage(f"mail {EMAIL} and id {CN_ID}")]}, _cfg("b"))
    with tenant_scope("acme"):
        saver.delete_thread("b")
    assert ("acme", "b") not in saver.pii_inventory("acme")
    assert saver.vault.tokens_of_kind("acme", "CN_RESIDENT_ID") == []
    # the email is still used by thread a, so its value stays
    assert EMAIL in saver.get_tuple(_cfg("a")).checkpoint["channel_values"]["messages"][0].content
    receipt = saver.receipts(thread_id="b")[0]
    assert receipt.detail["pii_values"] == 1


def test_tokens_are_per_tenant(saver: SecureSaver) -> None:
    graph = build_chat_graph(saver)
    graph.invoke({"messages": [HumanMessage(f"mail {EMAIL}")]}, _cfg("t", "acme"))
    graph.invoke({"messages": [HumanMessage(f"mail {EMAIL}")]}, _cfg("t", "globex"))
    acme = str(_stored_messages(saver, "t", "acme")[0].content)
    globex = str(_stored_messages(saver, "t", "globex")[0].content)
    assert acme != globex and "<EMAIL_ADDRESS:" in acme and "<EMAIL_ADDRESS:" in globex


def test_restore_with_known_originals_matches_the_two_pass_restore(redactor) -> None:
    """The saver restores in one walk from tokens found in the bytes; same result."""
    key = b"t" * 32
    messages = [HumanMessage(TEXT, id="h1"),
                AIMessage("", id="a1", tool_calls=[{"name": "send", "id": "c1",
                                                    "args": {"to": EMAIL, "body": CN_ID}}]),
                HumanMessage("no personal data here", id="h2")]
    redacted, entries = redactor.redact_value(messages, channel="messages", token_key=key)
    vault = {e.token: e.value for e in entries}
    vault.pop(next(t for t, v in vault.items() if v == CN_ID))  # one value was erased

    def lookup(tokens):
        return {t: vault[t] for t in tokens if t in vault}

    two_pass = redactor.restore_value(redacted, lookup)
    one_pass = redactor.restore_value(redacted, lookup, originals=vault)
    assert [m.model_dump() for m in one_pass] == [m.model_dump() for m in two_pass]
    assert EMAIL in one_pass[0].content and CN_ID not in one_pass[0].content
    assert one_pass[1].tool_calls[0]["args"]["to"] == EMAIL
    assert one_pass[2] is redacted[2]  # untouched messages are shared, not copied


def test_concurrent_stores_of_the_same_new_pii_write_it_once_and_each_returns_committed(
        tmp_path: Path) -> None:
    """LangGraph runs a step's put and put_writes side by side with the same new tokens: one
    vault write, and no call returns before the rows are committed (or after the other
    writer failed without writing them itself)."""
    import threading
    import time as _time

    import sqlalchemy as sa

    from langgraph_securesaver.redaction import VaultEntry
    from langgraph_securesaver.registry.pii_vault import pii_refs, pii_vault

    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'v.db'}",
                              keyring=Keyring.generate(), redaction=None) as saver:
        keys = saver.services.tenant_keys("acme")
        vault = saver.vault
        # the redactor's HMAC tokens, resolved to their entries' public tokens (which stores
        # the originals); store() then records the thread's references
        entries = list(vault.resolve(keys, [
            VaultEntry(f"<EMAIL_ADDRESS:{i:032x}>", "EMAIL_ADDRESS", f"p{i}@example.com")
            for i in range(3)]).values())
        assert all(e.token != f"<EMAIL_ADDRESS:{i:032x}>" for i, e in enumerate(entries))
        writes: list[int] = []
        real_write = vault._write
        fail_first = {"on": False}

        def slow_write(k, thread_id, es):
            writes.append(len(es))
            _time.sleep(0.2)  # the other callers arrive while this one is writing
            if fail_first["on"]:
                fail_first["on"] = False
                raise RuntimeError("disk full")
            return real_write(k, thread_id, es)

        vault._write = slow_write  # type: ignore[method-assign]

        def committed(thread: str) -> int:
            with vault.registry.begin() as conn:
                return conn.execute(sa.select(sa.func.count()).select_from(pii_refs).where(
                    pii_refs.c.thread_id == thread)).scalar_one()

        results: dict[int, int] = {}
        errors: list[BaseException] = []

        def call(i: int, thread: str) -> None:
            try:
                vault.store(keys, thread, entries)
                results[i] = committed(thread)  # what this caller can rely on on return
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(i, "t1")) for i in range(3)]
        for t in threads:
            t.start()
            _time.sleep(0.02)
        for t in threads:
            t.join()
        assert not errors
        assert writes == [3]  # one write for the three calls
        assert results == {0: 3, 1: 3, 2: 3}

        writes.clear()
        results.clear()
        fail_first["on"] = True
        threads = [threading.Thread(target=call, args=(i, "t2")) for i in range(2)]
        for t in threads:
            t.start()
            _time.sleep(0.02)
        for t in threads:
            t.join()
        assert len(errors) == 1 and "disk full" in str(errors[0])  # the writer's own error
        assert writes == [3, 3]  # the waiter wrote the rows itself
        assert results == {1: 3}
        with vault.registry.begin() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(pii_vault)).scalar_one() == 3


def test_an_erasure_in_another_process_stops_every_restore_at_once_and_writes_soon(
        database, redactor) -> None:
    """Two savers on one database (two processes' caches). After one erases a value, the
    other never restores it again, not even on its very next read; its writes of the same
    value right after store nothing in clear (within WRITE_EPOCH_REUSE they may keep the
    erased token), and once that time has passed a new mention gets a new entry that
    restores, never the erased token."""
    from langgraph_securesaver.registry.pii_vault import WRITE_EPOCH_REUSE
    url, _raw = database
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=redactor) as worker, \
            SecureSaver.from_url(url, keyring=ring, redaction=redactor) as dpo:
        graph = build_chat_graph(worker)
        graph.invoke({"messages": [HumanMessage(f"mail {EMAIL}")]}, _cfg("t"))
        assert EMAIL in str(graph.get_state(_cfg("t")).values["messages"])  # cached in worker
        old = str(_stored_messages(worker, "t"))
        assert dpo.forget_pii("acme", EMAIL, requested_by="dpo") == 1
        # the very next read in the worker: no restore from its memory
        assert EMAIL not in str(graph.get_state(_cfg("t")).values["messages"])
        # a write right after: the erased token, never the value
        worker.put_writes(graph.get_state(_cfg("t")).config,
                          [("messages", [HumanMessage(f"again {EMAIL}")])], "task-1")
        graph.invoke({"messages": [HumanMessage(f"and {EMAIL}")]}, _cfg("t2"))
        for thread in ("t", "t2"):
            assert EMAIL not in str(_stored_messages(worker, thread))
        time.sleep(2 * WRITE_EPOCH_REUSE)
        graph.invoke({"messages": [HumanMessage(f"later {EMAIL}")]}, _cfg("t3"))
        later = graph.get_state(_cfg("t3")).values["messages"]
        assert f"later {EMAIL}" in str(later)            # a new entry: restored
        assert EMAIL not in str(graph.get_state(_cfg("t")).values["messages"])
        assert all(token not in str(_stored_messages(worker, "t3"))
                   for token in re.findall(r"<EMAIL_ADDRESS:[0-9a-f]{32}>", old))
