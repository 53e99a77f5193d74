"""AwsKmsKeyProvider against a real KMS HTTP endpoint (moto's server, started by the suite,
reached through boto3's usual configuration): roundtrip, tenancy, encryption context,
rotation and retirement, shredding, outage, leaks and the number of KMS calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import SecureSaver, TamperedDataError
from langgraph_securesaver.errors import ConfigurationError, KeyProviderUnavailable
from langgraph_securesaver.keys.aws_kms import AwsKmsKeyProvider, encryption_context
from langgraph_securesaver.keys.crypto import wrap_context
from langgraph_securesaver.keys.keyring import WrappedKey
from langgraph_securesaver.keys.material import SecretBytes
from tests.fake_agent import build_chat_graph

from .provider_helpers import cfg as _cfg
from .provider_helpers import open_saver as _saver
from .provider_helpers import say as _say
from .provider_helpers import texts as _texts
from .secrecy_helpers import Secrets, capture, leaks

KEY = bytes(range(32))


def _key_state(key_id: str) -> str:
    return str(boto3.client("kms").describe_key(KeyId=key_id)["KeyMetadata"]["KeyState"])


def test_roundtrip_through_saver_by_url(tmp_path: Path, kms_alias: str) -> None:
    url = f"aws-kms://{kms_alias}?region=us-east-1"
    with _saver(tmp_path, url) as saver:
        assert isinstance(saver.keyring, AwsKmsKeyProvider)
        _say(saver, "acme", "t1", "the launch code is 8812")
        assert "the launch code is 8812" in _texts(saver, "acme", "t1")
    assert b"launch code" not in (tmp_path / "agent.db").read_bytes()  # (4 digits can occur in any hex)
    with _saver(tmp_path, url) as again:      # a new process: keys unwrapped by KMS again
        assert "the launch code is 8812" in _texts(again, "acme", "t1")


def test_wrong_tenant_and_wrong_context_are_tamper(kms_alias: str) -> None:
    provider = AwsKmsKeyProvider(kms_alias)
    ctx = wrap_context("acme", "data", 1, "db")
    wrapped = provider.wrap("acme", KEY, ctx)
    assert SecretBytes(provider.unwrap("acme", wrapped, ctx)) == SecretBytes(KEY)
    with pytest.raises(TamperedDataError):
        provider.unwrap("globex", wrapped, wrap_context("globex", "data", 1, "db"))
    with pytest.raises(TamperedDataError):
        provider.unwrap("acme", wrapped, wrap_context("acme", "data", 2, "db"))
    with pytest.raises(TamperedDataError):   # a flipped byte
        provider.unwrap("acme", WrappedKey(wrapped.master_version,
                                           wrapped.blob[:-1] + bytes([wrapped.blob[-1] ^ 1])),
                        ctx)
    other = boto3.client("kms").create_key()["KeyMetadata"]["KeyId"]
    # a row naming another KMS key: AWS says IncorrectKeyException (tamper), moto says
    # AccessDeniedException (a permission problem, KeyProviderUnavailable): refused either way
    with pytest.raises((TamperedDataError, KeyProviderUnavailable)):
        provider.unwrap("acme", WrappedKey(other, wrapped.blob), ctx)


def test_encryption_context_names_tenant_and_purpose() -> None:
    ctx = encryption_context("acme", wrap_context("acme", "index", 3, "db"))
    assert ctx["securesaver:tenant"] == "acme"
    assert ctx["securesaver:purpose"] == "index/3"
    assert ctx["securesaver:context"]


def test_another_tenants_key_rows_are_refused(tmp_path: Path, kms_alias: str) -> None:
    """Copy acme's wrapped data key into globex's row: KMS refuses (context is the tenant)."""
    with _saver(tmp_path, kms_alias and AwsKmsKeyProvider(kms_alias)) as saver:
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


def test_rotation_to_a_new_kms_key_and_retirement(tmp_path: Path, kms_alias: str) -> None:
    provider = AwsKmsKeyProvider(kms_alias)
    old_key = provider.current_version
    with _saver(tmp_path, provider) as saver:
        _say(saver, "acme", "t", "before rotation")
        backup = saver.registry.load_key_rows("acme")     # a backup of the key rows
        report = saver.rotate_keys(retire_old=True)
        new_key = provider.current_version
        assert new_key != old_key and report.master_version == new_key
        assert boto3.client("kms").describe_key(KeyId=kms_alias)["KeyMetadata"][
            "KeyId"] == new_key
        assert {r.master_version for r in saver.registry.load_key_rows("acme")} == {new_key}
        assert report.retired == [old_key]
        assert _key_state(old_key) == "Enabled"     # retiring stops using it, nothing more
        saver.destroy_master_key(old_key)           # destroying is explicit, by name
        assert _key_state(old_key) == "PendingDeletion"
        saver.keys.forget()
        assert "before rotation" in _texts(saver, "acme", "t")
        _say(saver, "acme", "t", "after rotation")
    # The backup's rows now depend on a key pending deletion: AWS KMS refuses Decrypt under
    # it (KMSInvalidStateException) and destroys it after the window. moto records the state
    # but still decrypts, so what is asserted here is the state KMS enforces.
    assert {r.master_version for r in backup} == {old_key}
    assert _key_state(old_key) == "PendingDeletion"


def test_shred_tenant_schedules_old_keys_for_deletion(tmp_path: Path, kms_alias: str) -> None:
    provider = AwsKmsKeyProvider(kms_alias)
    first = provider.current_version
    with _saver(tmp_path, provider) as saver:
        _say(saver, "acme", "t", "acme keeps this")
        _say(saver, "globex", "t", "globex is erased")
        globex_rows = saver.registry.load_key_rows("globex")
        saver.shred_tenant("globex", requested_by="dpo")
        assert provider.current_version != first
        assert _key_state(first) == "PendingDeletion"
        saver.keys.forget()
        assert "acme keeps this" in _texts(saver, "acme", "t")
        assert "globex" not in saver.registry.tenants()
    # every key the shredded tenant's rows (and backups of them) used is pending deletion
    # (see the rotation test: AWS refuses Decrypt in that state, moto does not enforce it)
    assert {r.master_version for r in globex_rows} == {first}


def test_outage_warm_continue_cold_fail_closed_nothing_lost(
        tmp_path: Path, kms_alias: str, kms_endpoint: Any) -> None:
    with _saver(tmp_path, AwsKmsKeyProvider(kms_alias)) as saver:
        _say(saver, "warm", "t", "turn 1")
        _say(saver, "cold", "t", "cold turn 1")
        saver.keys.forget("cold")                        # not in the cache any more
        kms_endpoint.stop()                              # KMS goes away mid-run
        for i in range(2, 6):
            _say(saver, "warm", "t", f"turn {i}")        # cached keys: no KMS call
        with pytest.raises(KeyProviderUnavailable):
            _texts(saver, "cold", "t")
        with pytest.raises(KeyProviderUnavailable):
            _say(saver, "new-tenant", "t", "no keys yet")
        kms_endpoint.start()                             # back on the same port
        assert _texts(saver, "warm", "t")[::2] == [f"turn {i}" for i in range(1, 6)]
        assert "cold turn 1" in _texts(saver, "cold", "t")
        assert "new-tenant" not in saver.registry.tenants_with_keys()
        _say(saver, "new-tenant", "t", "now it works")


def test_cold_start_during_outage_is_not_a_tamper_error(
        tmp_path: Path, kms_alias: str, kms_endpoint: Any) -> None:
    with _saver(tmp_path, AwsKmsKeyProvider(kms_alias)) as saver:
        _say(saver, "acme", "t", "hello")
    kms_endpoint.stop()
    with pytest.raises(KeyProviderUnavailable):
        with _saver(tmp_path, f"aws-kms://{kms_alias}") as cold:
            _texts(cold, "acme", "t")


def test_bad_credentials_are_unavailable_not_tamper(
        kms_alias: str, monkeypatch: pytest.MonkeyPatch) -> None:
    provider = AwsKmsKeyProvider(kms_alias)
    wrapped = provider.wrap("acme", KEY, b"ctx")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(KeyProviderUnavailable):
        AwsKmsKeyProvider(kms_alias).unwrap("acme", wrapped, b"ctx")


def test_failures_reveal_no_data_key(kms_alias: str, kms_endpoint: Any) -> None:
    provider = AwsKmsKeyProvider(kms_alias)
    held = SecretBytes(KEY)
    secrets = Secrets()
    secrets.add_key("data key", KEY)
    ok = provider.wrap("acme", held, b"ctx")
    tamper = capture(lambda: provider.unwrap("acme", ok, b"other"))
    assert isinstance(tamper, TamperedDataError)
    assert leaks(tamper, secrets) == []
    kms_endpoint.stop()
    down_wrap = capture(lambda: provider.wrap("acme", held, b"ctx"))
    down_unwrap = capture(lambda: provider.unwrap("acme", ok, b"ctx"))
    for exc in (down_wrap, down_unwrap):
        assert isinstance(exc, KeyProviderUnavailable)
        assert leaks(exc, secrets) == []
    assert "SecretBytes" not in repr(provider) and KEY.hex() not in repr(provider)


def test_kms_calls_per_1000_turns_of_10_tenants(
        tmp_path: Path, kms_alias: str, kms_endpoint: Any) -> None:
    """Counted at the endpoint: one Decrypt per tenant key row per cache lifetime (three rows
    per tenant: the data key, the index key and the key-encryption key of its threads), plus
    the registry MAC key -- however many threads the tenants open (ten each here: a thread's
    own key is wrapped locally under the tenant's KEK, never by the provider)."""
    calls: list[str] = []
    provider = AwsKmsKeyProvider(kms_alias)
    provider._client.meta.events.register(      # the client's own view, cross-checked
        "before-call.kms.*", lambda model, **_: calls.append(model.name))
    kms_endpoint.reset()
    tenants = [f"tenant-{i}" for i in range(10)]
    with _saver(tmp_path, provider) as saver:
        for turn in range(100):
            for tenant in tenants:
                _say(saver, tenant, f"t{turn % 10}", f"turn {turn}")
        rows = sum(len(saver.registry.load_key_rows(t)) for t in tenants)
        threads = saver.keys.threads.versions_in_use()
    seen = dict(kms_endpoint.counts)
    assert rows == 30 and sum(threads.values()) == 100
    assert seen.get("Decrypt", 0) <= rows + 1
    assert seen.get("Encrypt", 0) <= rows + 1
    assert sum(seen.values()) <= 2 * rows + 5   # + DescribeKey and the database tag
    assert sorted(calls) == sorted(
        name for name, n in seen.items() for _ in range(n))


def test_url_refuses_credentials_and_unknown_options() -> None:
    with pytest.raises(ConfigurationError, match="no credentials"):
        AwsKmsKeyProvider.from_url("aws-kms://AKIA:secret@alias/x")
    with pytest.raises(ConfigurationError, match="unknown option"):
        AwsKmsKeyProvider.from_url("aws-kms://alias/x?endpoint=http://evil")
    with pytest.raises(ConfigurationError, match="unknown key provider scheme"):
        with SecureSaver.from_url("sqlite://", keyring="vault://x"):
            pass


def test_cli_rotate_keys_with_kms_url(tmp_path: Path, kms_alias: str) -> None:
    from typer.testing import CliRunner

    from langgraph_securesaver.cli.main import app
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    provider_url = f"aws-kms://{kms_alias}"
    with _saver(tmp_path, provider_url) as saver:
        _say(saver, "acme", "t", "rotate me")
        first = saver.keyring.current_version
    result = CliRunner().invoke(app, ["rotate-keys", "--url", url, "--keyring", provider_url])
    assert result.exit_code == 0, result.output
    with _saver(tmp_path, provider_url) as saver:
        assert saver.keyring.current_version != first
        assert "rotate me" in _texts(saver, "acme", "t")


def test_server_reads_provider_from_env(
        kms_alias: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from langgraph_securesaver.server.saver import ServerSettings
    monkeypatch.setenv("SECURESAVER_URL", f"sqlite:///{tmp_path / 'srv.db'}")
    monkeypatch.setenv("SECURESAVER_KEY_PROVIDER", f"aws-kms://{kms_alias}?region=us-east-1")
    monkeypatch.delenv("SECURESAVER_MASTER_KEY", raising=False)
    settings = ServerSettings.from_env()
    assert isinstance(settings.keyring, AwsKmsKeyProvider)


def test_shred_refused_when_the_kms_key_serves_another_database(
        tmp_path: Path, kms_alias: str) -> None:
    """Shredding schedules the deletion of KMS keys: refused while another database's rows
    depend on them (each database tags the KMS key it uses)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with _saver(tmp_path / "b", AwsKmsKeyProvider(kms_alias)) as other:
        _say(other, "acme", "t", "database b")
    provider = AwsKmsKeyProvider(kms_alias)
    with _saver(tmp_path / "a", provider) as saver:
        _say(saver, "globex", "t", "database a")
        assert len(provider.other_databases(saver.services.database_id())) == 1
        with pytest.raises(ConfigurationError, match="other database"):
            saver.shred_tenant("globex")
        first = provider.current_version
        assert _key_state(first) == "Enabled"
        report = saver.rotate_keys(retire_old=True)
        assert report.retired == [] and "other database" in " ".join(report.problems)
        assert _key_state(first) == "Enabled"       # rotated, but the old key is kept
        assert provider.current_version != first
    with _saver(tmp_path / "b", AwsKmsKeyProvider(kms_alias)) as other:
        assert "database b" in _texts(other, "acme", "t")


async def test_async_roundtrip(tmp_path: Path, kms_alias: str) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    async with SecureSaver.afrom_url(url, keyring=f"aws-kms://{kms_alias}",
                                     redaction=None) as saver:
        graph = build_chat_graph(saver)
        await graph.ainvoke({"messages": [HumanMessage("async secret 4411")]},
                            _cfg("t", "acme"))
        tup = await saver.aget_tuple(_cfg("t", "acme"))
        assert tup is not None
        assert "async secret 4411" in [m.content for m in
                                       tup.checkpoint["channel_values"]["messages"]]
    assert b"secret 4411" not in (tmp_path / "agent.db").read_bytes()
