"""Every way stored data can be forged or moved must raise TamperedDataError."""

from __future__ import annotations

import shutil
import sqlite3
import uuid
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.keys.crypto import is_token
from langgraph_securesaver.tenancy import inner_thread_id
from tests.fake_agent import build_chat_graph


def _cfg(thread: str, tenant: str = "acme") -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


@pytest.fixture(scope="module")
def seeded(module_key_provider: object, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[Path, object]:
    """Two tenants, two threads each, two turns each: written once per key provider."""
    db = tmp_path_factory.mktemp("tamper-seed") / "db.sqlite"
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=module_key_provider,
                              redaction=None) as s:
        graph = build_chat_graph(s)
        for tenant in ("acme", "globex"):
            for thread in ("t1", "t2"):
                for text in ("first message", "second message"):
                    graph.invoke({"messages": [HumanMessage(f"{tenant}/{thread}: {text}")]},
                                 _cfg(thread, tenant))
    return db, module_key_provider


@pytest.fixture
def saver(tmp_path: Path, seeded: tuple[Path, object]):
    """Over each key provider (Keyring, AWS KMS, PKCS#11): tampering is caught the same way.
    Each test attacks its own copy of the seeded database, through a new saver."""
    db, provider = seeded
    for part in db.parent.glob(db.name + "*"):
        shutil.copy(part, tmp_path / part.name)
    with SecureSaver.from_url(f"sqlite:///{tmp_path / db.name}", keyring=provider,
                              redaction=None) as s:
        yield s


def _raw(saver: SecureSaver, thread: str, tenant: str = "acme", checkpoint_id: str | None = None):
    conf = {"thread_id": inner_thread_id(tenant, thread), "checkpoint_ns": ""}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return saver.inner.get_tuple({"configurable": conf})


def _attacker(saver: SecureSaver):
    """The raw saver with LangGraph's default serializer: writes anything an attacker likes."""
    import copy

    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    raw = copy.copy(saver.inner)
    raw.serde = JsonPlusSerializer()
    return raw


def _rewrite(saver: SecureSaver, tup, channel_values=None, metadata=None) -> None:
    """Write a modified row back through the raw saver (an attacker with DB write access)."""
    checkpoint = dict(tup.checkpoint)
    if channel_values is not None:
        checkpoint["channel_values"] = channel_values
    conf = dict(tup.config["configurable"])
    parent = tup.parent_config["configurable"]["checkpoint_id"] if tup.parent_config else None
    conf["checkpoint_id"] = parent
    _attacker(saver).put({"configurable": conf}, checkpoint, metadata or tup.metadata,
                         dict(checkpoint["channel_versions"]))


def test_untouched_data_reads(saver: SecureSaver) -> None:
    tup = saver.get_tuple(_cfg("t1"))
    assert "acme/t1: second message" in [m.content for m in tup.checkpoint["channel_values"]["messages"]]


def test_flipped_byte_in_database_file(saver: SecureSaver, tmp_path: Path) -> None:
    tup = _raw(saver, "t1")
    token = tup.checkpoint["channel_values"]["messages"]
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    (blob,) = conn.execute("SELECT checkpoint FROM checkpoints WHERE checkpoint_id = ?",
                           (tup.checkpoint["id"],)).fetchone()
    at = blob.find(token) + len(token) // 2
    assert at > len(token) // 2
    flipped = blob[:at] + bytes([blob[at] ^ 0x01]) + blob[at + 1:]
    conn.execute("UPDATE checkpoints SET checkpoint = ? WHERE checkpoint_id = ?",
                 (flipped, tup.checkpoint["id"]))
    conn.commit()
    conn.close()
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1"))


def test_ciphertext_swapped_between_threads(saver: SecureSaver) -> None:
    victim, other = _raw(saver, "t1"), _raw(saver, "t2")
    values = dict(victim.checkpoint["channel_values"])
    values["messages"] = other.checkpoint["channel_values"]["messages"]
    _rewrite(saver, victim, values)
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1"))


def test_ciphertext_swapped_between_tenants_same_thread_id(saver: SecureSaver) -> None:
    victim, other = _raw(saver, "t1", "acme"), _raw(saver, "t1", "globex")
    values = dict(victim.checkpoint["channel_values"])
    values["messages"] = other.checkpoint["channel_values"]["messages"]
    _rewrite(saver, victim, values)
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1", "acme"))


def test_ciphertext_swapped_between_checkpoints_of_one_thread(saver: SecureSaver) -> None:
    latest = _raw(saver, "t1")
    older = _raw(saver, "t1", checkpoint_id=latest.parent_config["configurable"]["checkpoint_id"])
    assert older.checkpoint["channel_versions"]["messages"] != latest.checkpoint["channel_versions"]["messages"]
    values = dict(latest.checkpoint["channel_values"])
    values["messages"] = older.checkpoint["channel_values"]["messages"]
    _rewrite(saver, latest, values)
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1"))


def test_sealed_metadata_swapped_between_checkpoints(saver: SecureSaver) -> None:
    latest = _raw(saver, "t1")
    older = _raw(saver, "t1", checkpoint_id=latest.parent_config["configurable"]["checkpoint_id"])
    _rewrite(saver, latest, metadata=older.metadata)
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1"))


def test_rolled_back_channel_version_is_detected(saver: SecureSaver) -> None:
    """Replacing a value *and* its version with an older pair is caught by the manifest."""
    latest = _raw(saver, "t1")
    older = _raw(saver, "t1", checkpoint_id=latest.parent_config["configurable"]["checkpoint_id"])
    checkpoint = dict(latest.checkpoint)
    checkpoint["channel_versions"] = dict(older.checkpoint["channel_versions"])
    checkpoint["channel_values"] = dict(older.checkpoint["channel_values"])
    conf = dict(latest.config["configurable"])
    conf["checkpoint_id"] = older.config["configurable"]["checkpoint_id"]
    saver.inner.put({"configurable": conf}, checkpoint, latest.metadata,
                    dict(checkpoint["channel_versions"]))
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1"))


def test_injected_plaintext_channel_value(saver: SecureSaver) -> None:
    victim = _raw(saver, "t1")
    values = dict(victim.checkpoint["channel_values"])
    values["turns"] = 42
    _rewrite(saver, victim, values)
    with pytest.raises(TamperedDataError, match="plain value"):
        saver.get_tuple(_cfg("t1"))


def test_injected_plaintext_metadata_and_added_clear_key(saver: SecureSaver) -> None:
    victim = _raw(saver, "t1")
    _rewrite(saver, victim, metadata={"source": "loop", "step": 1, "parents": {}})
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1"))
    victim = _raw(saver, "t2")
    _rewrite(saver, victim, metadata={**victim.metadata, "source": "update"})
    with pytest.raises(TamperedDataError, match="altered"):
        saver.get_tuple(_cfg("t2"))


def test_injected_plaintext_pending_write(saver: SecureSaver) -> None:
    tup = _raw(saver, "t1")
    saver.inner.put_writes(tup.config, [("messages", "plain text write")], str(uuid.uuid4()))
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1"))


def test_write_swapped_between_tasks(saver: SecureSaver) -> None:
    tup = saver.get_tuple(_cfg("t1"))
    saver.put_writes(tup.config, [("turns", 7)], "task-a")
    raw = _raw(saver, "t1")
    token = next(w[2] for w in raw.pending_writes if w[0] == "task-a")
    assert is_token(token)
    saver.inner.put_writes(raw.config, [("turns", token)], "task-b")
    with pytest.raises(TamperedDataError):
        saver.get_tuple(_cfg("t1"))


def test_wrong_keyring_cannot_read(saver: SecureSaver) -> None:
    other = SecureSaver(saver.inner, keyring=Keyring.generate(), registry=saver.registry,
                        redaction=None)
    with pytest.raises(TamperedDataError):
        other.get_tuple(_cfg("t1"))


def test_list_stops_at_tampered_row(saver: SecureSaver) -> None:
    victim = _raw(saver, "t2")
    values = dict(victim.checkpoint["channel_values"])
    values["messages"] = b"SS\x01" + b"\x00" * 40
    _rewrite(saver, victim, values)
    with pytest.raises(TamperedDataError):
        list(saver.list(_cfg("t2")))


def test_legacy_pending_sends_are_sealed_and_restored(saver: SecureSaver) -> None:
    from langgraph.types import Send
    tup = saver.get_tuple(_cfg("t1"))
    checkpoint = {**tup.checkpoint, "id": str(uuid.uuid4()),
                  "pending_sends": [Send("node", {"email": "sends.marker@example.org"})]}
    saved = saver.put(tup.config, checkpoint, {"source": "loop", "step": 9, "parents": {}}, {})
    raw = saver.inner.get_tuple({"configurable": {
        "thread_id": inner_thread_id("acme", "t1"), "checkpoint_ns": "",
        "checkpoint_id": saved["configurable"]["checkpoint_id"]}})
    assert not raw.checkpoint.get("pending_sends")
    back = saver.get_tuple(saved)
    assert back.checkpoint["pending_sends"][0].arg == {"email": "sends.marker@example.org"}
    _rewrite(saver, raw)  # unchanged rewrite still reads
    assert saver.get_tuple(saved) is not None
    injected = {**raw.checkpoint, "pending_sends": [Send("node", {"x": 1})]}
    _rewrite(saver, raw._replace(checkpoint=injected))
    with pytest.raises(TamperedDataError, match=r"pending sends|extension type"):
        saver.get_tuple(saved)


def test_flipped_byte_in_clear_metadata_json_is_tampered_data(saver: SecureSaver,
                                                              tmp_path: Path) -> None:
    """The inner saver parses SQLite's clear metadata itself (json.loads): a byte that breaks
    it is the one documented error, naming the row, and nothing is rewritten."""
    tup = _raw(saver, "t1")
    cid = tup.checkpoint["id"]
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    (metadata,) = conn.execute("SELECT metadata FROM checkpoints WHERE checkpoint_id = ?",
                               (cid,)).fetchone()
    broken = bytes(metadata)
    broken = broken[:1] + b"\xff" + broken[2:]
    conn.execute("UPDATE checkpoints SET metadata = ? WHERE checkpoint_id = ?", (broken, cid))
    conn.commit()
    with pytest.raises(TamperedDataError) as refused:
        saver.get_tuple(_cfg("t1"))
    message = str(refused.value)
    assert "checkpoints row" in message and "metadata" in message and cid in message
    assert "acme/t1" not in message
    with pytest.raises(TamperedDataError):
        list(saver.list(_cfg("t1")))
    assert saver.get_tuple(_cfg("t2")) is not None      # other threads keep working
    (after,) = conn.execute("SELECT metadata FROM checkpoints WHERE checkpoint_id = ?",
                            (cid,)).fetchone()
    conn.close()
    assert after == broken                                # nothing rewritten
    from langgraph_securesaver.audit.scan import scan
    report = scan(saver, keyring=saver.keyring, verify=True)
    assert "undecodable_row" in report.by_kind()
