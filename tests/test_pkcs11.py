"""Pkcs11KeyProvider against a real PKCS#11 module: SoftHSM2 with a token initialised by the
suite (see ``softhsm`` in conftest). Roundtrip, tenancy, AES-GCM binding, rotation and
destroyed keys, shredding, outages (token removed, module missing), the PIN, leaks, thread
safety and the number of token operations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import SecureSaver, TamperedDataError
from langgraph_securesaver.errors import ConfigurationError, KeyProviderUnavailable
from langgraph_securesaver.keys.crypto import wrap_context
from langgraph_securesaver.keys.keyring import WrappedKey
from langgraph_securesaver.keys.material import SecretBytes
from langgraph_securesaver.keys.pkcs11_provider import Pkcs11KeyProvider
from tests.fake_agent import build_chat_graph

from .hsm_helpers import PIN_TOKEN, PIN_VAR, TOKEN, spy_counts, spy_path
from .provider_helpers import cfg as _cfg
from .provider_helpers import open_saver as _saver
from .provider_helpers import say as _say
from .provider_helpers import texts as _texts
from .secrecy_helpers import Secrets, capture, leaks

KEY = bytes(range(32))


def _labels(hsm: Any, token: str = TOKEN) -> set[str]:
    """The labels of the secret keys in the token, read through a session of our own."""
    import pkcs11
    with _any_session(hsm.module, token) as s:
        return {obj.label for obj in s.get_objects(
            {pkcs11.Attribute.CLASS: pkcs11.ObjectClass.SECRET_KEY})}


class _any_session:
    """A session on a token this process is logged in to (login is per process)."""

    def __init__(self, module: str, token: str) -> None:
        import pkcs11
        self.session = pkcs11.lib(module).get_token(token_label=token).open(rw=True)

    def __enter__(self) -> Any:
        return self.session

    def __exit__(self, *exc: object) -> None:
        self.session.close()


def test_roundtrip_through_saver_by_url(tmp_path: Path, pkcs11_url: str) -> None:
    with _saver(tmp_path, pkcs11_url) as saver:
        assert isinstance(saver.keyring, Pkcs11KeyProvider)
        _say(saver, "acme", "t1", "the launch code is 8812")
        assert "the launch code is 8812" in _texts(saver, "acme", "t1")
    # the phrase, not its four digits alone: hex digests and base64 in the file hold any 4 digits
    assert b"launch code is 8812" not in (tmp_path / "agent.db").read_bytes()
    with _saver(tmp_path, pkcs11_url) as again:      # a new provider: unwrapped by the token
        assert "the launch code is 8812" in _texts(again, "acme", "t1")


def test_wrong_tenant_context_and_foreign_label_are_tamper(pkcs11_url: str) -> None:
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    ctx = wrap_context("acme", "data", 1, "db")
    wrapped = provider.wrap("acme", KEY, ctx)
    assert SecretBytes(provider.unwrap("acme", wrapped, ctx)) == SecretBytes(KEY)
    with pytest.raises(TamperedDataError):
        provider.unwrap("globex", wrapped, wrap_context("globex", "data", 1, "db"))
    with pytest.raises(TamperedDataError):
        provider.unwrap("acme", wrapped, wrap_context("acme", "data", 2, "db"))
    flipped = WrappedKey(wrapped.master_version,
                         wrapped.blob[:-1] + bytes([wrapped.blob[-1] ^ 1]))
    with pytest.raises(TamperedDataError):
        provider.unwrap("acme", flipped, ctx)
    with pytest.raises(TamperedDataError):      # truncated
        provider.unwrap("acme", WrappedKey(wrapped.master_version, wrapped.blob[:20]), ctx)
    with pytest.raises(TamperedDataError):      # a row naming a key outside the family
        provider.unwrap("acme", WrappedKey("some-other-key", wrapped.blob), ctx)
    with pytest.raises(TamperedDataError):      # a version of the family that does not exist
        provider.unwrap("acme", WrappedKey(provider.key_label + ".v9", wrapped.blob), ctx)
    # the token is still fine after all of that: tamper never marks it unavailable
    assert SecretBytes(provider.unwrap("acme", wrapped, ctx)) == SecretBytes(KEY)


def test_another_tenants_key_rows_are_refused(tmp_path: Path, pkcs11_url: str) -> None:
    with _saver(tmp_path, pkcs11_url) as saver:
        _say(saver, "acme", "t", "acme secret")
        _say(saver, "globex", "t", "globex secret")
        acme = {(r.purpose, r.version): r for r in saver.registry.load_key_rows("acme")}
        globex = saver.registry.load_key_rows("globex")
        forged = [type(r)(r.tenant, r.purpose, r.version, acme[(r.purpose, r.version)]
                          .master_version, acme[(r.purpose, r.version)].wrapped, r.created_at)
                  for r in globex]
        saver.registry.replace_key_rows(forged)
        saver.keys.forget()
        with pytest.raises(TamperedDataError):
            _texts(saver, "globex", "t")


def test_rotation_to_a_new_label_retirement_and_destroying_the_old_key(
        tmp_path: Path, pkcs11_url: str, softhsm: Any) -> None:
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    old = provider.current_version
    with _saver(tmp_path, provider) as saver:
        _say(saver, "acme", "t", "before rotation")
        backup = saver.registry.load_key_rows("acme")     # a backup of the key rows
        report = saver.rotate_keys(retire_old=True)
        new = provider.current_version
        assert new == f"{old}.v2" and report.master_version == new
        assert report.retired == [old]
        assert {r.master_version for r in saver.registry.load_key_rows("acme")} == {new}
        assert old in _labels(softhsm)          # retiring stops using it, nothing more
        saver.destroy_master_key(old)           # destroying is explicit, by name
        assert old not in _labels(softhsm) and new in _labels(softhsm)
        saver.keys.forget()
        assert "before rotation" in _texts(saver, "acme", "t")
        _say(saver, "acme", "t", "after rotation")
        # the backup's rows name the destroyed key: unreadable, as a tamper error
        saver.registry.replace_key_rows(backup)
        saver.keys.forget()
        with pytest.raises(TamperedDataError):
            _texts(saver, "acme", "t")
    # another process picks the new version up from the token
    assert Pkcs11KeyProvider.from_url(pkcs11_url).current_version == new


def test_shred_destroys_the_keys_the_shredded_tenant_used(
        tmp_path: Path, pkcs11_url: str, softhsm: Any) -> None:
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    first = provider.current_version
    with _saver(tmp_path, provider) as saver:
        _say(saver, "acme", "t", "acme keeps this")
        _say(saver, "globex", "t", "globex is erased")
        globex_rows = saver.registry.load_key_rows("globex")
        saver.shred_tenant("globex", requested_by="dpo")
        assert provider.current_version != first
        assert first not in _labels(softhsm)
        saver.keys.forget()
        assert "acme keeps this" in _texts(saver, "acme", "t")
        assert "globex" not in saver.registry.tenants()
    # a backup's copy of globex's key rows can never be unwrapped again
    for row in globex_rows:
        with pytest.raises(TamperedDataError):
            provider.unwrap("globex", WrappedKey(row.master_version, row.wrapped),
                            wrap_context("globex", row.purpose, row.version, "db"))


def test_token_removed_mid_run_warm_continue_cold_fail_closed_nothing_lost(
        tmp_path: Path, pkcs11_url: str, softhsm: Any) -> None:
    with _saver(tmp_path, pkcs11_url) as saver:
        _say(saver, "warm", "t", "turn 1")
        _say(saver, "cold", "t", "cold turn 1")
        saver.keys.forget("cold")                       # not in the cache any more
        softhsm.remove_token()                          # the HSM goes away mid-run
        try:
            for i in range(2, 6):
                _say(saver, "warm", "t", f"turn {i}")   # cached keys: no token call
            with pytest.raises(KeyProviderUnavailable):
                _texts(saver, "cold", "t")
            with pytest.raises(KeyProviderUnavailable):
                _say(saver, "new-tenant", "t", "no keys yet")
            with pytest.raises(KeyProviderUnavailable):   # a cold start meanwhile
                Pkcs11KeyProvider.from_url(pkcs11_url)
        finally:
            softhsm.restore_token()                     # back again
        assert _texts(saver, "warm", "t")[::2] == [f"turn {i}" for i in range(1, 6)]
        assert "cold turn 1" in _texts(saver, "cold", "t")
        assert "new-tenant" not in saver.registry.tenants_with_keys()
        _say(saver, "new-tenant", "t", "now it works")


def test_module_failing_mid_run_warm_continue_cold_fail_closed(
        tmp_path: Path, pkcs11_url: str, softhsm: Any) -> None:
    """The module cannot be initialized again after a failure (its storage unreadable):
    cached tenants keep working, cold ones fail closed, and the module recovers."""
    with _saver(tmp_path, pkcs11_url) as saver:
        _say(saver, "warm", "t", "turn 1")
        _say(saver, "cold", "t", "cold turn 1")
        saver.keys.forget("cold")
        softhsm.break_module()
        try:
            with pytest.raises(KeyProviderUnavailable):
                _texts(saver, "cold", "t")          # the failure: re-initialization fails
            with pytest.raises(KeyProviderUnavailable, match="could not be loaded or init"):
                _texts(saver, "cold", "t")
            _say(saver, "warm", "t", "turn 2")
        finally:
            softhsm.repair_module()
        assert _texts(saver, "warm", "t")[::2] == ["turn 1", "turn 2"]
        assert "cold turn 1" in _texts(saver, "cold", "t")


def test_module_that_cannot_be_loaded_is_unavailable(tmp_path: Path, softhsm: Any) -> None:
    with pytest.raises(KeyProviderUnavailable, match="could not be loaded"):
        Pkcs11KeyProvider.from_url(softhsm.url("k", module=str(tmp_path / "missing.so")))
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not a shared object")
    with pytest.raises(KeyProviderUnavailable, match="could not be loaded"):
        Pkcs11KeyProvider.from_url(softhsm.url("k", module=str(garbage)))


def test_wrong_key_label_is_a_configuration_error(softhsm: Any) -> None:
    with pytest.raises(ConfigurationError, match="no AES key labelled 'no-such-key'"):
        Pkcs11KeyProvider.from_url(softhsm.url("no-such-key"))
    with pytest.raises(KeyProviderUnavailable, match="not present"):
        Pkcs11KeyProvider.from_url(softhsm.url("k", token="no-such-token"))


def test_wrong_pin_is_typed_never_retried_and_never_shown(
        softhsm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the PIN test token, which nothing in this process logged in to yet."""
    wrong = "wrong-" + softhsm.pin[::-1]
    monkeypatch.setenv("WRONG_HSM_PIN", wrong)
    secrets = Secrets()
    secrets.add_text("right pin", softhsm.pin)
    secrets.add_text("wrong pin", wrong)
    url = softhsm.url("k", token=PIN_TOKEN, pin_var="WRONG_HSM_PIN")
    error = capture(lambda: Pkcs11KeyProvider.from_url(url))
    assert isinstance(error, KeyProviderUnavailable), error
    assert "refused the PIN in $WRONG_HSM_PIN" in str(error)
    assert leaks(error, secrets) == []
    again = capture(lambda: Pkcs11KeyProvider.from_url(url))   # not tried at the token again
    assert isinstance(again, KeyProviderUnavailable) and "not tried again" in str(again)
    assert leaks(again, secrets) == []
    # the right PIN logs in; a wrong PIN later is still refused (login is per process)
    created = Pkcs11KeyProvider.create(PIN_TOKEN, "k", module=softhsm.module, pin_env=PIN_VAR)
    assert created.calls["Login"] == 1
    later = capture(lambda: Pkcs11KeyProvider.from_url(url))
    assert isinstance(later, KeyProviderUnavailable), later
    assert leaks(later, secrets) == []
    for shown in (repr(created), str(created), repr(created.pins)):
        assert softhsm.pin not in shown


def test_pin_file_must_be_private(tmp_path: Path, softhsm: Any, pkcs11_url: str) -> None:
    label = pkcs11_url.split("/")[3].split("?")[0]
    pin_file = tmp_path / "pin"
    pin_file.write_text(softhsm.pin + "\n")
    pin_file.chmod(0o644)
    url = (f"pkcs11://{TOKEN}/{label}?module={softhsm.module}&pin-file={pin_file}")
    with pytest.raises(ConfigurationError, match="chmod 600") as caught:
        Pkcs11KeyProvider.from_url(url)
    assert softhsm.pin not in str(caught.value)
    pin_file.chmod(0o600)
    assert Pkcs11KeyProvider.from_url(url).current_version == label


def test_extractable_key_is_refused(softhsm: Any) -> None:
    import pkcs11
    with _any_session(softhsm.module, TOKEN) as s:
        s.generate_key(pkcs11.KeyType.AES, 256, label="extractable-key", store=True,
                       template={pkcs11.Attribute.EXTRACTABLE: True,
                                 pkcs11.Attribute.SENSITIVE: False,
                                 pkcs11.Attribute.PRIVATE: True})
    with pytest.raises(ConfigurationError, match="extractable"):
        Pkcs11KeyProvider.from_url(softhsm.url("extractable-key"))


def test_keys_the_provider_creates_never_leave_the_token(pkcs11_url: str) -> None:
    import pkcs11
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    provider.add_version()
    for label in provider.versions():
        with _any_session(provider.module, provider.token_label) as s:
            (key,) = s.get_objects({pkcs11.Attribute.LABEL: label})
            assert key[pkcs11.Attribute.EXTRACTABLE] is False
            assert key[pkcs11.Attribute.SENSITIVE] is True
            with pytest.raises(pkcs11.exceptions.AttributeSensitive):
                key[pkcs11.Attribute.VALUE]


def test_failures_reveal_no_data_key_nor_pin(pkcs11_url: str, softhsm: Any) -> None:
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    held = SecretBytes(KEY)
    secrets = Secrets()
    secrets.add_key("data key", KEY)
    secrets.add_text("pin", softhsm.pin)
    ok = provider.wrap("acme", held, b"ctx")
    tamper = capture(lambda: provider.unwrap("acme", ok, b"other"))
    assert isinstance(tamper, TamperedDataError)
    assert leaks(tamper, secrets) == []
    softhsm.remove_token()
    try:
        down_wrap = capture(lambda: provider.wrap("acme", held, b"ctx"))
        down_unwrap = capture(lambda: provider.unwrap("acme", ok, b"ctx"))
    finally:
        softhsm.restore_token()
    for exc in (down_wrap, down_unwrap):
        assert isinstance(exc, KeyProviderUnavailable), exc
        assert leaks(exc, secrets) == []
    assert "SecretBytes" not in repr(provider) and KEY.hex() not in repr(provider)
    assert SecretBytes(provider.unwrap("acme", ok, b"ctx")) == held


def test_token_calls_per_1000_turns_of_10_tenants(tmp_path: Path, pkcs11_url: str) -> None:
    """One Decrypt per tenant key row per cache lifetime (three rows per tenant: the data key,
    the index key and the KEK of its threads), plus the registry MAC key, however many threads
    (ten per tenant here: thread keys are wrapped locally); no token call on the per-turn path."""
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    provider.calls.clear()
    tenants = [f"tenant-{i}" for i in range(10)]
    with _saver(tmp_path, provider) as saver:
        for turn in range(100):
            for tenant in tenants:
                _say(saver, tenant, f"t{turn % 10}", f"turn {turn}")
        rows = sum(len(saver.registry.load_key_rows(t)) for t in tenants)
    seen = dict(provider.calls)
    assert rows == 30
    assert seen.get("Decrypt", 0) <= rows + 1
    assert seen.get("Encrypt", 0) <= rows + 1
    assert sum(seen.values()) <= 3 * rows + 10, seen   # + key lookups and the database record


def test_token_calls_counted_at_the_module(tmp_path: Path, softhsm: Any) -> None:
    """The same 1,000 turns in a process of their own whose module is OpenSC's pkcs11-spy in
    front of SoftHSM2: every call the module receives is logged and counted there."""
    spy = spy_path()
    if spy is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true requires pkcs11-spy (apt-get install opensc-pkcs11)")
        pytest.skip("pkcs11-spy is not installed (apt-get install opensc-pkcs11)")
    url = softhsm.new_key_url()
    log = tmp_path / "spy.log"     # holds PIN and keys as the spy logs them: test data only
    env = dict(os.environ, PKCS11SPY=softhsm.module, PKCS11SPY_OUTPUT=str(log))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent.parent),
                                         env.get("PYTHONPATH", "")])
    spied = url.replace(f"module={softhsm.module}", f"module={spy}")
    done = subprocess.run(
        [sys.executable, "-m", "tests.scripts.pkcs11_turns", f"sqlite:///{tmp_path / 'a.db'}",
         spied], capture_output=True, text=True, env=env, timeout=600,
        cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    at_module = spy_counts(log)
    log.unlink()
    rows = seen["rows"]
    assert rows == 30
    # each C_EncryptInit/C_DecryptInit starts one operation (C_Encrypt is called twice by
    # python-pkcs11: once for the length, once for the bytes)
    assert at_module["C_DecryptInit"] == seen["calls"]["Decrypt"] <= rows + 1
    assert seen["calls"]["Encrypt"] <= rows + 1
    # plus one key check (C_Encrypt) per adopted version each time the labels are read,
    # the first when the provider was built (before its counter was cleared)
    checks = seen["calls"].get("KeyCheck", 0) + 1
    assert at_module["C_EncryptInit"] == seen["calls"]["Encrypt"] + checks
    assert at_module.get("C_Login", 0) == 1 and at_module.get("C_OpenSession", 0) <= 4
    assert at_module.get("C_DestroyObject", 0) == 0


def test_sessions_are_pooled_and_thread_safe(pkcs11_url: str) -> None:
    provider = Pkcs11KeyProvider.from_url(pkcs11_url + "&max-sessions=2")
    wrapped = {t: provider.wrap(t, bytes([i]) * 32, wrap_context(t, "data", 1, "db"))
               for i, t in enumerate(f"t{i}" for i in range(8))}
    before = provider.calls["OpenSession"] + provider.calls["Login"]
    problems: list[BaseException] = []

    def worker(tenant: str) -> None:
        try:
            for _ in range(40):
                out = provider.unwrap(tenant, wrapped[tenant], wrap_context(tenant, "data", 1, "db"))
                assert out == bytes([int(tenant[1:])]) * 32
        except BaseException as exc:
            problems.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in wrapped]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    assert provider.calls["Decrypt"] >= 8 * 40
    # sessions are reused: at most the pool's size ever opened
    assert provider.calls["OpenSession"] + provider.calls["Login"] - before <= 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_worker_initializes_the_module_again(pkcs11_url: str) -> None:
    """A pre-forking server builds the provider in the parent; each worker unwraps. PKCS#11
    does not carry a module's state across fork (the standard has the child call
    C_Initialize; a network HSM's client connection would be shared otherwise), so the worker
    initializes and logs in again before its first call."""
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    ctx = wrap_context("acme", "data", 1, "db")
    wrapped = provider.wrap("acme", KEY, ctx)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                         # the worker
        try:
            before = provider.calls["Initialize"], provider.calls["Login"]
            ok = provider.unwrap("acme", wrapped, ctx) == KEY
            again = (provider.calls["Initialize"] - before[0],
                     provider.calls["Login"] - before[1])
            os.write(write, b"ok" if ok and again == (1, 1) else repr(again).encode())
        except BaseException as exc:
            os.write(write, type(exc).__name__.encode())
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 200)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"ok"
    assert provider.unwrap("acme", wrapped, ctx) == KEY   # the parent is unaffected


def test_url_refuses_pins_and_unknown_options(softhsm: Any) -> None:
    with pytest.raises(ConfigurationError, match="never carry the PIN"):
        Pkcs11KeyProvider.from_url(softhsm.url("k") + "&pin-value=1234")
    with pytest.raises(ConfigurationError, match="no PIN or user"):
        Pkcs11KeyProvider.from_url(f"pkcs11://user:1234@{TOKEN}/k?module={softhsm.module}"
                                   f"&pin-env={PIN_VAR}")
    with pytest.raises(ConfigurationError, match="unknown option"):
        Pkcs11KeyProvider.from_url(softhsm.url("k") + "&slot=0")
    with pytest.raises(ConfigurationError, match="module="):
        Pkcs11KeyProvider.from_url(f"pkcs11://{TOKEN}/k?pin-env={PIN_VAR}")
    with pytest.raises(ConfigurationError, match="exactly one"):
        Pkcs11KeyProvider.from_url(f"pkcs11://{TOKEN}/k?module={softhsm.module}")
    with pytest.raises(ConfigurationError, match="NOT_SET_ANYWHERE is not set"):
        Pkcs11KeyProvider.from_url(softhsm.url("k", pin_var="NOT_SET_ANYWHERE"))


def test_labels_in_the_url_are_percent_decoded(softhsm: Any) -> None:
    provider = Pkcs11KeyProvider.create(TOKEN, "key with space", module=softhsm.module,
                                        pin_env=PIN_VAR)
    again = Pkcs11KeyProvider.from_url(softhsm.url("key%20with%20space"))
    assert again.current_version == provider.current_version == "key with space"


def test_cli_keygen_and_rotate_keys_with_pkcs11_url(tmp_path: Path, softhsm: Any) -> None:
    from typer.testing import CliRunner

    from langgraph_securesaver.cli.main import app
    provider_url = softhsm.url("cli-key")
    made = CliRunner().invoke(app, ["keygen", "--keyring", provider_url])
    assert made.exit_code == 0, made.output
    assert "cli-key" in made.output and softhsm.pin not in made.output
    again = CliRunner().invoke(app, ["keygen", "--keyring", provider_url])
    assert again.exit_code != 0 and "already holds" in again.output
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with _saver(tmp_path, provider_url) as saver:
        _say(saver, "acme", "t", "rotate me")
        first = saver.keyring.current_version
    result = CliRunner().invoke(app, ["rotate-keys", "--url", url, "--keyring", provider_url])
    assert result.exit_code == 0, result.output
    with _saver(tmp_path, provider_url) as saver:
        assert saver.keyring.current_version == f"{first}.v2"
        assert "rotate me" in _texts(saver, "acme", "t")


def test_server_reads_provider_from_env(
        pkcs11_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from langgraph_securesaver.server.saver import ServerSettings
    monkeypatch.setenv("SECURESAVER_URL", f"sqlite:///{tmp_path / 'srv.db'}")
    monkeypatch.setenv("SECURESAVER_KEY_PROVIDER", pkcs11_url)
    monkeypatch.delenv("SECURESAVER_MASTER_KEY", raising=False)
    settings = ServerSettings.from_env()
    assert isinstance(settings.keyring, Pkcs11KeyProvider)


def test_shred_refused_when_the_key_serves_another_database(
        tmp_path: Path, pkcs11_url: str, softhsm: Any) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with _saver(tmp_path / "b", pkcs11_url) as other:
        _say(other, "acme", "t", "database b")
    provider = Pkcs11KeyProvider.from_url(pkcs11_url)
    with _saver(tmp_path / "a", provider) as saver:
        _say(saver, "globex", "t", "database a")
        others = provider.other_databases(saver.services.database_id())
        assert len(others) == 1
        with pytest.raises(ConfigurationError, match="other database"):
            saver.shred_tenant("globex")
        first = provider.current_version
        report = saver.rotate_keys(retire_old=True)
        assert report.retired == [] and "other database" in " ".join(report.problems)
        assert first in _labels(softhsm)          # rotated, but the old key is kept
        provider.forget_database(next(iter(others)))
        assert provider.other_databases(saver.services.database_id()) == {}
    with _saver(tmp_path / "b", pkcs11_url) as other:
        assert "database b" in _texts(other, "acme", "t")


async def test_async_roundtrip(tmp_path: Path, pkcs11_url: str) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    async with SecureSaver.afrom_url(url, keyring=pkcs11_url, redaction=None) as saver:
        graph = build_chat_graph(saver)
        await graph.ainvoke({"messages": [HumanMessage("async secret 4411")]},
                            _cfg("t", "acme"))
        tup = await saver.aget_tuple(_cfg("t", "acme"))
        assert tup is not None
        assert "async secret 4411" in [m.content for m in
                                       tup.checkpoint["channel_values"]["messages"]]
    assert b"secret 4411" not in (tmp_path / "agent.db").read_bytes()


def test_softhsm_is_this_runs_own(softhsm: Any) -> None:
    """The suite initialised its own token directory (not the machine's)."""
    assert os.environ["SOFTHSM2_CONF"] == str(softhsm.conf)
    assert shutil.which("softhsm2-util")
    assert set(softhsm.token_dirs) == {TOKEN, PIN_TOKEN}
