"""Keyring files and env, master-key rotation, data-key rotation."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_securesaver import (
    ConfigurationError,
    Keyring,
    KeyringRequired,
    SecureSaver,
    TamperedDataError,
)
from langgraph_securesaver.crypto import token_key_version
from langgraph_securesaver.demo import build_chat_graph
from langgraph_securesaver.tenancy import inner_thread_id


def _cfg(thread: str, tenant: str) -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


def _say(saver: SecureSaver, tenant: str, thread: str, text: str) -> None:
    build_chat_graph(saver).invoke({"messages": [HumanMessage(text)]}, _cfg(thread, tenant))


def _texts(saver: SecureSaver, tenant: str, thread: str) -> list[str]:
    tup = saver.get_tuple(_cfg(thread, tenant))
    return [m.content for m in tup.checkpoint["channel_values"]["messages"]]


def test_keyring_file_roundtrip_and_mode(tmp_path: Path) -> None:
    ring = Keyring.generate()
    ring.add_version()
    path = ring.save(tmp_path / "keys" / "keyring.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = Keyring.from_file(path)
    assert loaded.versions() == ["1", "2"] and loaded.current_version == "2"
    wrapped = ring.wrap("acme", b"k" * 32, b"ctx")
    assert loaded.unwrap("acme", wrapped, b"ctx") == b"k" * 32
    with pytest.raises(TamperedDataError):
        loaded.unwrap("globex", wrapped, b"ctx")
    assert "masters" not in repr(loaded) and "=" not in repr(loaded).split("versions")[0]


def test_keyring_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import base64
    k1, k2 = (base64.urlsafe_b64encode(bytes([i]) * 32).decode() for i in (1, 2))
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", k1)
    assert Keyring.from_env().versions() == ["1"]
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", f"1:{k1},2:{k2}")
    assert Keyring.from_env().current_version == "2"
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", "not-base64!")
    with pytest.raises(ConfigurationError):
        Keyring.from_env()


def test_no_keyring_names_keygen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SECURESAVER_MASTER_KEY", raising=False)
    with pytest.raises(KeyringRequired, match="securesaver keygen"):
        SecureSaver(InMemorySaver(), redaction=None)


def test_env_keyring_used_when_none_given(monkeypatch: pytest.MonkeyPatch) -> None:
    import base64
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", base64.urlsafe_b64encode(b"x" * 32).decode())
    saver = SecureSaver(InMemorySaver(), redaction=None)
    _say(saver, "acme", "t", "hello")
    assert "hello" in _texts(saver, "acme", "t")


def test_master_rotation_old_data_reads_new_data_uses_new_version(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        _say(saver, "acme", "t", "before rotation")
    ring.add_version()
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        assert "before rotation" in _texts(saver, "acme", "t")
        _say(saver, "acme", "t", "after rotation")
        _say(saver, "globex", "t", "new tenant")
        rows = {(r.tenant, r.master_version) for t in ("acme", "globex")
                for r in saver.registry.load_key_rows(t)}
        assert rows == {("acme", "1"), ("globex", "2")}
        assert saver.master_versions_in_use() == {"1": 2, "2": 2}
        # a keyring holding only the new version cannot read data keys still under v1
        only_new = Keyring({"2": ring._masters["2"]})
        with pytest.raises(TamperedDataError):
            SecureSaver(saver.inner, keyring=only_new, registry=saver.registry,
                        redaction=None).get_tuple(_cfg("t", "acme"))
        assert saver.rewrap_keys() == 2
        assert saver.master_versions_in_use() == {"2": 4}
        ring.retire_version("1")
        after = SecureSaver(saver.inner, keyring=ring, registry=saver.registry, redaction=None)
        assert {"before rotation", "after rotation"} <= set(_texts(after, "acme", "t"))
        assert [e.kind for e in saver.registry.list_events(kind="keys_rewrapped")] == [
            "keys_rewrapped"]


def test_data_key_rotation_tokens_name_the_new_key() -> None:
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    _say(saver, "acme", "t", "old key")
    assert saver.rotate_data_key("acme") == 2
    _say(saver, "acme", "t", "new key")
    raw = saver.inner.get_tuple({"configurable": {"thread_id": inner_thread_id("acme", "t"),
                                                  "checkpoint_ns": ""}})
    assert token_key_version(raw.checkpoint["channel_values"]["messages"]) == 2
    first = list(saver.inner.list({"configurable": {"thread_id": inner_thread_id("acme", "t")}}))[-1]
    assert {token_key_version(v) for v in first.checkpoint["channel_values"].values()} == {1}
    assert {"old key", "new key"} <= set(_texts(saver, "acme", "t"))


def test_a_rotation_by_another_process_is_picked_up(tmp_path: Path) -> None:
    """Two savers on one database stand for two processes with their own key caches."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as a, \
            SecureSaver.from_url(url, keyring=ring, redaction=None) as b:
        _say(a, "acme", "t", "first")
        assert "first" in _texts(b, "acme", "t")      # b caches acme's keys (v1)
        a.rotate_data_key("acme")
        _say(a, "acme", "t", "second")                # sealed under data key v2
        assert "second" in _texts(b, "acme", "t")     # b reloads on the unknown version
        b.keys.ttl = 0                                # b's cache expires: it seals with v2 too
        _say(b, "acme", "t", "third")
        raw = b.inner.get_tuple({"configurable": {"thread_id": inner_thread_id("acme", "t"),
                                                  "checkpoint_ns": ""}})
        assert token_key_version(raw.checkpoint["channel_values"]["messages"]) == 2
