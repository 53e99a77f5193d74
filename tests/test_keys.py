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
from langgraph_securesaver.keys.tokens import token_key_version
from langgraph_securesaver.tenancy import inner_thread_id
from tests.fake_agent import build_chat_graph


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
        # the registry MAC key row was wrapped under "1" with acme's keys; each tenant's KEK
        # (one per master version) and each thread's own key (under that KEK) under the
        # version current when the thread was first written
        assert saver.master_versions_in_use() == {"1": 5, "2": 4}
        # a keyring holding only the new version cannot read data keys still under v1
        only_new = Keyring({"2": ring._masters["2"]})
        with pytest.raises(TamperedDataError):
            SecureSaver(saver.inner, keyring=only_new, registry=saver.registry,
                        redaction=None).get_tuple(_cfg("t", "acme"))
        # 3 key rows + acme/t's own key (moved to acme's new KEK; the old KEK is deleted)
        assert saver.rewrap_keys() == 4
        assert saver.master_versions_in_use() == {"2": 9}
        assert [r.master_version for r in saver.registry.load_key_rows("acme")
                if r.purpose == "kek"] == ["2"]
        ring.retire_version("1")
        after = SecureSaver(saver.inner, keyring=ring, registry=saver.registry, redaction=None)
        assert {"before rotation", "after rotation"} <= set(_texts(after, "acme", "t"))
        assert [e.kind for e in saver.registry.list_events(kind="keys_rewrapped")] == [
            "keys_rewrapped"]


def test_data_key_rotation_tokens_name_the_new_key() -> None:
    """Tenant data-key versions (the format without per-thread keys)."""
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                        thread_keys=False)
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
    with SecureSaver.from_url(url, keyring=ring, redaction=None, thread_keys=False) as a, \
            SecureSaver.from_url(url, keyring=ring, redaction=None, thread_keys=False) as b:
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


# --- issue 11: structurally invalid keyrings, reloading the key source -----------------------
_MASTER = "A" * 43 + "="
_WITH_MASTER = '{"format": "securesaver-keyring/1", "masters": {"1": "' + _MASTER + '"}'


@pytest.mark.parametrize("document", [
    '{"format": "securesaver-keyring/1"}',                                   # no masters
    '{"format": "securesaver-keyring/1", "masters": {}}',
    '{"format": "securesaver-keyring/1", "masters": []}',
    '{"format": "securesaver-keyring/1", "masters": {"1": 7}}',
    '{"format": "securesaver-keyring/1", "masters": {"1": "not base64!"}}',
    _WITH_MASTER + ', "current": "9"}',
    _WITH_MASTER + ', "current": [1]}',
    _WITH_MASTER + ', "punctured": [1]}',
    _WITH_MASTER + ', "punctured": {"1": 5}}',
    _WITH_MASTER + ', "punctured": {"1": {"a": 5}}}',
    _WITH_MASTER + ', "databases": ["x"]}',
    '{"format": "other"}', "[]", "not json", "",
])
def test_a_malformed_keyring_file_is_a_clear_configuration_error(tmp_path: Path,
                                                                 document: str) -> None:
    from typer.testing import CliRunner

    from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401
    from langgraph_securesaver.cli.main import app
    path = tmp_path / "keyring.json"
    path.write_text(document)
    path.chmod(0o600)                      # refused for its contents, not its mode
    with pytest.raises(ConfigurationError):
        Keyring.from_file(path)
    db = tmp_path / "db.sqlite"
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate(), redaction=None) as s:
        _say(s, "acme", "t", "hi")
    before = db.read_bytes()
    for command in (["scan", "--verify"], ["rotate-keys"], ["shred-tenant", "acme", "--yes"],
                    ["audit"], ["prune"]):
        result = CliRunner().invoke(app, [*command, "--url", f"sqlite:///{db}", "--keyring",
                                          str(path)])
        assert result.exit_code == 2, (command, result.output)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.output and "keyring" in result.stderr
        assert not isinstance(result.exception, Exception) or isinstance(result.exception,
                                                                          SystemExit)
    assert db.read_bytes() == before and path.read_text() == document


def test_keyring_reload_follows_its_file_and_env(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    running = Keyring.from_file(path)
    assert running.reload() is False                      # unchanged: nothing to do
    operator = Keyring.from_file(path)
    operator.add_version()
    operator.persist()
    assert running.reload() is True and running.versions() == ["1", "2"]
    assert running.current_version == "2"
    operator.retire_version("1")
    operator.persist()
    assert running.reload() is True and running.versions() == ["2"]
    path.write_text("garbage")                            # a broken source is ignored
    assert running.reload() is False and running.versions() == ["2"]
    one = Keyring.generate()
    import base64
    first = one.env_value().reveal()
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", first)
    from_env = Keyring.from_env()
    assert from_env.reload() is False
    second = base64.urlsafe_b64encode(os.urandom(32)).decode()
    monkeypatch.setenv("SECURESAVER_MASTER_KEY", f"1:{first},2:{second}")
    assert from_env.reload() is True and from_env.versions() == ["1", "2"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_process_with_an_old_keyring_follows_a_master_rotation(tmp_path: Path,
                                                                 mode: str) -> None:
    """Two savers with their own Keyring objects (two processes): one rotates the master key,
    re-encrypts and retires the old version; the other keeps reading and writing."""
    import asyncio
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    path = Keyring.generate().save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=Keyring.from_file(path), redaction=None) as app, \
            SecureSaver.from_url(url, keyring=Keyring.from_file(path), redaction=None) as ops:
        _say(app, "acme", "t", "before")
        report = ops.rotate_keys(reencrypt=True, retire_old=True)
        assert report.ok and report.retired == ["1"], report.problems
        assert app.keyring.versions() == ["1"]            # the app has not looked yet
        app.keys.ttl = 0                                  # its cached keys are re-read ...
        if mode == "sync":
            assert "before" in _texts(app, "acme", "t")   # ... under master 2 and data key 2
            _say(app, "acme", "t", "after")
        else:
            async def run() -> None:
                graph = build_chat_graph(app)
                await graph.ainvoke({"messages": [HumanMessage("after")]}, _cfg("t", "acme"))
                tup = await app.aget_tuple(_cfg("t", "acme"))
                assert "before" in [m.content for m in tup.checkpoint["channel_values"][
                    "messages"]]
            asyncio.run(run())
        assert app.keyring.versions() == ["2"]            # it reloaded its keyring file
        assert "after" in _texts(ops, "acme", "t")


def test_reloads_are_rate_bounded_and_shared(tmp_path: Path) -> None:
    """A forged version cannot turn every read into a reload of the key source."""
    from langgraph_securesaver.keys.crypto import KeyManager
    path = Keyring.generate().save(tmp_path / "keyring.json")
    ring = Keyring.from_file(path)
    calls = {"n": 0}
    real = ring.reload

    def counting() -> bool:
        calls["n"] += 1
        return real()

    ring.reload = counting  # type: ignore[method-assign]
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}", keyring=ring,
                              redaction=None) as saver:
        _say(saver, "acme", "t", "hi")
        saver.keys = KeyManager(ring, saver.registry, reload_interval=3600.0)
        rows = saver.registry.load_key_rows("acme")
        forged = [type(r)(r.tenant, r.purpose, r.version, "99", r.wrapped, r.created_at)
                  for r in rows]
        for _ in range(50):
            with pytest.raises(TamperedDataError):
                saver.keys._unwrap("acme", forged)
        assert calls["n"] == 1
        keys = saver.keys.require("acme")
        reloads = {"n": 0}
        real_rows = saver.registry.load_key_rows

        def counting_rows(tenant: str) -> list:
            reloads["n"] += 1
            return real_rows(tenant)
        saver.registry.load_key_rows = counting_rows  # type: ignore[method-assign]
        saver.keys.store = saver.registry
        forged_token = b"SS\x01" + (77).to_bytes(4, "big") + os.urandom(40)
        for _ in range(50):
            with pytest.raises(TamperedDataError):
                keys.open(forged_token, b"aad")
        assert reloads["n"] == 1


def test_persisting_keeps_databases_other_processes_recorded(tmp_path: Path) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    operator = Keyring.from_file(path)                 # loaded before the app records its db
    app = Keyring.from_file(path)
    app.record_database("db-app", "sqlite:///app.db")
    assert Keyring.from_file(path).databases() == {"db-app": "sqlite:///app.db"}
    operator.add_version()
    operator.persist()                                 # must not drop the app's record
    assert Keyring.from_file(path).databases() == {"db-app": "sqlite:///app.db"}
    assert Keyring.from_file(path).versions() == ["1", "2"]
    assert operator.other_databases("db-ops") == {"db-app": "sqlite:///app.db"}


def test_gcm_nonces_are_unique_across_threads_and_never_shared_with_a_forked_child() -> None:
    import threading

    from langgraph_securesaver.keys import crypto

    seen: list[bytes] = []
    lock = threading.Lock()

    def draw() -> None:
        mine = [crypto._nonce() for _ in range(2_000)]
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8_000 and len(set(seen)) == 8_000
    assert all(len(n) == 12 for n in seen)
    if not hasattr(os, "fork"):
        return
    crypto._nonce()  # the pool now holds unused nonces a careless child would hand out again
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its next nonces, then leave without running atexit hooks
        os.close(read)
        os.write(write, b"".join(crypto._nonce() for _ in range(50)))
        os._exit(0)
    os.close(write)
    child = b""
    while chunk := os.read(read, 4096):
        child += chunk
    os.close(read)
    os.waitpid(pid, 0)
    parent = [crypto._nonce() for _ in range(50)]
    child_nonces = {child[i:i + 12] for i in range(0, len(child), 12)}
    assert len(child_nonces) == 50
    assert child_nonces.isdisjoint(parent)
