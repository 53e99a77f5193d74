"""Key material never reaches an error reporter.

Every raising path of key loading (environment and file, each malformed shape), unwrapping
and registry key rows (missing, bogus, altered, wrong version) is driven; each exception is
formatted as error reporters do with locals (``traceback`` with ``capture_locals=True``,
``rich`` with ``show_locals=True``, ``logging`` with ``exc_info`` through a plain and a rich
handler) and the output is searched for every key in every printable form
(:mod:`tests.secrecy_helpers`). The search is attacked first: a key planted in a local, in
any form, must be found.

Cases take no secret through a closure: a closure's cells are locals of its frame, so a
secret held there would be the test's own leak. Secrets reach the code under test through
the environment, files and the database, as in production.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import secrets
import shutil
import sqlite3
from functools import partial
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from typer.testing import CliRunner

from langgraph_securesaver import ConfigurationError, Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.errors import SecureSaverError
from langgraph_securesaver.keys.crypto import row_context
from langgraph_securesaver.keys.keyring import WrappedKey
from langgraph_securesaver.keys.material import SecretBytes
from langgraph_securesaver.keys.tokens import ENTRY, KEK, THREAD, thread_key_context
from langgraph_securesaver.registry.integrity import RESERVED_TENANT
from tests.fake_agent import build_chat_graph

from .conftest import copy_database
from .secrecy_helpers import REPORTERS, Secrets, capture, chain, forms, leaks

ENV = "SECURESAVER_MASTER_KEY"
Seed = tuple[Path, Secrets]   # a seeded database's directory and secrets
FORMAT = "securesaver-keyring/1"


def _b64(key: bytes) -> str:
    return base64.urlsafe_b64encode(key).decode()


def _kek(master: bytes, tenant: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"securesaver/tenant-kek/v1\x00" + tenant.encode()).derive(master)


def _masters(n: int = 2) -> list[bytes]:
    return [secrets.token_bytes(32) for _ in range(n)]


def _secrets_of(masters: list[bytes], tenants: tuple[str, ...] = ("acme",)) -> Secrets:
    found = Secrets()
    for i, master in enumerate(masters):
        found.add_key(f"master{i + 1}", master)
        for tenant in (*tenants, RESERVED_TENANT):
            found.add_key(f"kek{i + 1}/{tenant.strip()}", _kek(master, tenant))
    return found


def _assert_no_leak(exc: BaseException, found: Secrets,
                    expected: type[BaseException] = SecureSaverError) -> None:
    assert isinstance(exc, expected), repr(exc)
    hits = leaks(exc, found)
    assert not hits, hits


# --------------------------------------------------------------------------------------------
# the search works: a planted key is found, in each form, by each reporter
# --------------------------------------------------------------------------------------------
def _planted_local(form: str) -> None:
    held = os.environ["SECRECY_PLANT"]              # the planted value, as a local
    if form == "raw":
        held = bytes.fromhex(held)                  # type: ignore[assignment]
    raise ConfigurationError("a failure with a key in a local")


def _planted_message() -> None:
    raise ConfigurationError(f"bad key {os.environ['SECRECY_PLANT']}")


@pytest.mark.parametrize("form", ["raw", "hex", "base64", "base64url"])
@pytest.mark.parametrize("reporter", ["traceback-capture_locals", "rich-show_locals"])
def test_the_search_finds_a_key_planted_in_a_local(form: str, reporter: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    key = secrets.token_bytes(32)
    shown = {"raw": key.hex(), "hex": key.hex(), "base64": base64.b64encode(key).decode(),
             "base64url": _b64(key)}[form]
    monkeypatch.setenv("SECRECY_PLANT", shown)
    found = Secrets()
    found.add_key("planted", key)
    exc = capture(partial(_planted_local, form))
    assert leaks(exc, found, [reporter]), "the search missed a planted key"
    # and a frame without it is clean (the search has no false positive on the rest)
    monkeypatch.setenv("SECRECY_PLANT", "nothing")
    assert not leaks(capture(partial(_planted_local, "hex")), found, [reporter])


@pytest.mark.parametrize("reporter", list(REPORTERS))
def test_the_search_finds_a_key_in_a_message_and_in_a_suppressed_context(
        reporter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    key = secrets.token_bytes(32)
    found = Secrets()
    found.add_key("planted", key)
    monkeypatch.setenv("SECRECY_PLANT", base64.b64encode(key).decode())
    assert leaks(capture(_planted_message), found, [reporter])

    def suppressed() -> None:
        try:
            _planted_local("raw")
        except ConfigurationError:
            raise ConfigurationError("clean message") from None

    monkeypatch.setenv("SECRECY_PLANT", key.hex())
    if reporter != "logging-exc_info":   # a plain log line shows no locals at all
        assert leaks(capture(suppressed), found, [reporter])


def test_forms_cover_truncated_reprs() -> None:
    key = secrets.token_bytes(32)
    shown = repr(key)[:60] + "..."                  # how a reporter cuts a long value
    assert any(f in shown for f in forms(key))
    assert any(f in _b64(key)[:30] for f in forms(key))


# --------------------------------------------------------------------------------------------
# keyring parsing: the environment variable
# --------------------------------------------------------------------------------------------
def _env_cases(k1: bytes, k2: bytes) -> dict[str, str]:
    b1, b2 = _b64(k1), _b64(k2)
    doc = {"format": FORMAT, "masters": {"1": b1, "2": b2}}
    return {
        "second version cut short": f"1:{b1},2:{b2[:30]}",
        "first version cut short": f"1:{b1[:30]},2:{b2}",
        "single key cut short": b1[:40],
        "a key too long": f"1:{b1},2:{_b64(k2 + b'xx')}",
        "bad base64": f"1:{b1},2:{b2[:20]}!!{b2[22:]}",
        "non-ascii": f"1:{b1},2:{b2[:20]}\u00e9{b2[21:]}",
        "duplicate version": f"1:{b1},1:{b2}",
        "empty version": f"1:{b1},:{b2}",
        "version too long": f"1:{b1},{'9' * 70}:{b2}",
        "version is a key": f"{b1}:{b2}",
        "json missing current": json.dumps({**doc, "current": "9"}),
        "json current not a string": json.dumps({**doc, "current": [b1]}),
        "json cut short": json.dumps(doc)[:-20],
        "json key and version swapped": json.dumps({"format": FORMAT, "masters": {b1: 1}}),
        "json masters a list": json.dumps({"format": FORMAT, "masters": [b1, b2]}),
        "json wrong format": json.dumps({**doc, "format": "other"}),
        "json short key": json.dumps({"format": FORMAT, "masters": {"1": b1, "2": b2[:25]}}),
        "json bad punctured": json.dumps({**doc, "punctured": {"1": {"acme": b2[:30]}}}),
        "json punctured not tenant strings": json.dumps({**doc, "punctured": {"1": {b1: 5}}}),
    }


_ENV_SHAPES = list(_env_cases(b"a" * 32, b"b" * 32))


@pytest.mark.parametrize("shape", _ENV_SHAPES)
def test_a_malformed_environment_keyring_leaks_nothing(shape: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    masters = _masters()
    value = _env_cases(*masters)[shape]
    found = _secrets_of(masters)
    found.add_text("env", value)
    monkeypatch.setenv(ENV, value)
    _assert_no_leak(capture(Keyring.from_env), found, ConfigurationError)
    # the same value where SecureSaver and the CLI pick it up themselves
    _assert_no_leak(capture(partial(SecureSaver, InMemorySaver())), found, ConfigurationError)
    for command in (["scan"], ["prune"], ["events", "--verify"]):
        result = CliRunner().invoke(_cli_app(), [*command, "--url", "sqlite:///:memory:"])
        assert not [n for _, n in found.needles() if n in result.output], result.output


def _cli_app() -> object:
    from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401 - registers the operations commands
    from langgraph_securesaver.cli.main import app
    return app


# --------------------------------------------------------------------------------------------
# keyring parsing: files
# --------------------------------------------------------------------------------------------
def _file_cases(k1: bytes, k2: bytes) -> dict[str, str | bytes]:
    b1, b2 = _b64(k1), _b64(k2)
    good = {"format": FORMAT, "masters": {"1": b1, "2": b2}}
    return {
        "bad json": json.dumps(good)[:-25],
        "not an object": json.dumps([b1, b2]),
        "wrong format": json.dumps({**good, "format": "securesaver-keyring/0"}),
        "no masters": json.dumps({"format": FORMAT, "keys": {"1": b1}}),
        "second version cut short": json.dumps({**good, "masters": {"1": b1, "2": b2[:30]}}),
        "short key": json.dumps({"format": FORMAT, "masters": {"1": b1[:40]}}),
        "long key": json.dumps({"format": FORMAT, "masters": {"1": b1, "2": _b64(k2 * 2)}}),
        "bad base64": json.dumps({"format": FORMAT, "masters": {"1": b1, "2": "**" + b2[2:]}}),
        "key not a string": json.dumps({"format": FORMAT, "masters": {"1": b1, "2": 7}}),
        "key and version swapped": json.dumps({"format": FORMAT, "masters": {b1: "1"}}),
        "missing current": json.dumps({**good, "current": "3"}),
        "current not a string": json.dumps({**good, "current": {"v": b1}}),
        "punctured not an object": json.dumps({**good, "punctured": [b1]}),
        "punctured short key": json.dumps({**good, "punctured": {"0": {"acme": b2[:24]}}}),
        "punctured not strings": json.dumps({**good, "punctured": {"0": {"acme": 5}}}),
        "databases not labels": json.dumps({**good, "databases": {"db": [b1]}}),
        "not utf-8": json.dumps(good).encode()[:-3] + b"\xff\xfe}",
    }


_FILE_SHAPES = list(_file_cases(b"a" * 32, b"b" * 32))


def _write_keyring_text(path: Path, document: str | bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(document if isinstance(document, bytes) else document.encode())


@pytest.mark.parametrize("shape", _FILE_SHAPES)
def test_a_malformed_keyring_file_leaks_nothing(shape: str, tmp_path: Path) -> None:
    masters = _masters()
    document = _file_cases(*masters)[shape]
    path = tmp_path / "keyring.json"
    _write_keyring_text(path, document)
    found = _secrets_of(masters)
    found.add_text("file", document if isinstance(document, str) else document.decode("latin-1"))
    _assert_no_leak(capture(partial(Keyring.from_file, path)), found, ConfigurationError)
    _assert_no_leak(capture(partial(Keyring.load, str(path))), found, ConfigurationError)
    result = CliRunner().invoke(_cli_app(), ["scan", "--url", "sqlite:///:memory:",
                                             "--keyring", str(path)])
    assert result.exit_code == 2, result.output
    assert not [n for _, n in found.needles() if n in result.output], result.output


def test_a_half_built_keyring_has_a_safe_repr(tmp_path: Path) -> None:
    """A reporter that formats locals calls repr() on the ``self`` of a refusing
    ``Keyring.__init__``; it must neither raise nor show a key."""
    masters = _masters()
    _KEYS_BY_NAME["m1"] = masters[0]
    try:
        exc = capture(_keyring_naming_a_missing_current)
    finally:
        _KEYS_BY_NAME.clear()
    assert isinstance(exc, ConfigurationError)
    selves = []
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "__init__" and "self" in tb.tb_frame.f_locals:
            selves.append(tb.tb_frame.f_locals["self"])
        tb = tb.tb_next
    assert selves, "the refusal did not come from Keyring.__init__"
    for half_built in selves:
        assert repr(half_built).startswith("Keyring(") and str(half_built) == repr(half_built)
    assert repr(Keyring.__new__(Keyring)).startswith("Keyring(")    # not even __init__ ran
    for reporter in REPORTERS.values():
        text = reporter(exc)
        assert "repr() failed" not in text and "AttributeError" not in text
    assert not leaks(exc, _secrets_of(masters))
    # the same shape from a file
    path = tmp_path / "keyring.json"
    _write_keyring_text(path, _file_cases(*masters)["missing current"])
    exc = capture(partial(Keyring.from_file, path))
    assert isinstance(exc, ConfigurationError) and "'3' is not in the keyring" in str(exc)
    for reporter in REPORTERS.values():
        assert "AttributeError" not in reporter(exc)


def _keyring_naming_a_missing_current() -> Keyring:
    return Keyring({"1": _KEYS_BY_NAME["m1"]}, current="9")


def test_a_keyring_built_from_bytes_keeps_none_in_a_refusing_frame() -> None:
    masters = _masters()
    found = _secrets_of(masters)
    _KEYS_BY_NAME["m1"], _KEYS_BY_NAME["m2"] = masters[0], masters[1][:20]
    try:
        exc = capture(_keyring_from_module_bytes)
    finally:
        _KEYS_BY_NAME.clear()
    _assert_no_leak(exc, found, ConfigurationError)


_KEYS_BY_NAME: dict[str, bytes] = {}


def _keyring_from_module_bytes() -> Keyring:
    return Keyring({"1": _KEYS_BY_NAME["m1"], "2": _KEYS_BY_NAME["m2"]})


# --------------------------------------------------------------------------------------------
# unwrapping and registry key rows
# --------------------------------------------------------------------------------------------
def _cfg(thread: str = "t1", tenant: str = "acme") -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


@pytest.fixture(scope="module")
def database_seed(tmp_path_factory: pytest.TempPathFactory) -> Seed:
    """``_build_database`` once for the module: its directory (database and keyring file) and
    its secrets. Each case tampers with its own copy (``_database``)."""
    directory = tmp_path_factory.mktemp("keys-seed")
    _url, _ring_path, found = _build_database(directory)
    return directory, found


def _database(tmp_path: Path, seed: Seed) -> tuple[str, Path, Secrets]:
    """A copy of the module's seeded database and keyring file in ``tmp_path``; the secrets
    of both (a copy)."""
    directory, found = seed
    copy_database(f"sqlite:///{directory / 'db.sqlite'}", f"sqlite:///{tmp_path / 'db.sqlite'}")
    shutil.copy(directory / "keyring.json", tmp_path / "keyring.json")
    return f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "keyring.json", copy.deepcopy(found)


def _build_database(tmp_path: Path) -> tuple[str, Path, Secrets]:
    """A SQLite database with tenant acme (data keys v1 and v2, index key), the registry
    MAC key, and a keyring file with two master versions; every key in the secrets."""
    masters = _masters()
    ring_path = tmp_path / "keyring.json"
    _write_keyring_text(ring_path, json.dumps(
        {"format": FORMAT, "current": "1", "masters": {"1": _b64(masters[0])}}))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    ring = Keyring.from_file(ring_path)
    with SecureSaver.from_url(url, keyring=ring) as saver:
        graph = build_chat_graph(saver)
        graph.invoke({"messages": [HumanMessage("hello ann@example.com")]}, _cfg())
        saver.rotate_data_key("acme")
        graph.invoke({"messages": [HumanMessage("second turn")]}, _cfg())
        saver.registry.record_event("test_marker")
        found = _secrets_of(masters)
        registry = saver.registry
        keks: dict[tuple[str, str], bytes] = {}
        for tenant in ("acme", RESERVED_TENANT):
            for row in registry.load_key_rows(tenant):
                raw = ring.unwrap(tenant, WrappedKey(row.master_version, row.wrapped),
                                  row_context(registry, tenant, row.purpose, row.version))
                found.add_key(f"{tenant.strip()}/{row.purpose}/v{row.version}", raw)
                if row.purpose == KEK:
                    keks[(tenant, row.master_version)] = raw
        assert keks, "the tenant's key-encryption key"
        # the per-thread and per-vault-entry data keys
        for scope, table, column in ((THREAD, "securesaver_thread_keys", "thread_id"),
                                     (ENTRY, "securesaver_pii_keys", "token")):
            with sqlite3.connect(tmp_path / "db.sqlite") as conn:
                rows = conn.execute(f"SELECT tenant, {column}, master_version, wrapped "
                                    f"FROM {table}").fetchall()
            assert rows, table
            for tenant, name, version, blob in rows:
                ctx = thread_key_context(registry.database_id(), tenant, name, scope)
                raw = AESGCM(keks[(tenant, version)]).decrypt(blob[:12], blob[12:], ctx)
                found.add_key(f"{tenant}/{scope}/{name}", raw)
        keys = saver.keys.require("acme")
        found.add_key("acme/pii-token-key", bytes.fromhex(keys.blind("pii-token-key")))
        del keys, raw
    # a thread in the older format: sealed under the tenant data key v2, not its own key
    with SecureSaver.from_url(url, keyring=ring, thread_keys=False) as saver:
        build_chat_graph(saver).invoke({"messages": [HumanMessage("older format")]},
                                       _cfg("t-tenant-key"))
    # the file gains a second master version (current "2") that no row uses yet
    _write_keyring_text(ring_path, json.dumps(
        {"format": FORMAT, "current": "1",
         "masters": {"1": _b64(masters[0]), "2": _b64(masters[1])},
         "databases": Keyring.from_file(ring_path).databases()}))
    return url, ring_path, found


def _sql(url: str, statement: str, *params: object) -> None:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        changed = conn.execute(statement, params).rowcount
    assert changed, statement


def _read(url: str, ring_path: Path, tenant: str = "acme", thread: str = "t1") -> object:
    ring = Keyring.from_file(ring_path)
    with SecureSaver.from_url(url, keyring=ring) as saver:
        return saver.get_tuple(_cfg(thread, tenant=tenant))


async def _aread(url: str, ring_path: Path) -> object:
    ring = Keyring.from_file(ring_path)
    async with SecureSaver.afrom_url(url, keyring=ring) as saver:
        return await saver.aget_tuple(_cfg())


def _read_with_another_keyring(url: str) -> object:
    with SecureSaver.from_url(url, keyring=Keyring.generate()) as saver:
        return saver.get_tuple(_cfg())


def _write_event(url: str, ring_path: Path) -> None:
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path)) as saver:
        saver.registry.record_event("after_tamper")


def _rewrap(url: str, ring_path: Path) -> int:
    ring = Keyring.from_file(ring_path)
    ring.add_version()
    with SecureSaver.from_url(url, keyring=ring) as saver:
        return saver.rewrap_keys()


def _where(purpose: str, version: int = 1, tenant: str = "acme") -> tuple[str, tuple]:
    return "tenant = ? AND purpose = ? AND version = ?", (tenant, purpose, version)


_FLIP = "UPDATE securesaver_tenant_keys SET wrapped = CAST(substr(wrapped, 1, 20) || " \
        "x'00' || substr(wrapped, 22) AS BLOB) WHERE "
_TAMPER: dict[str, tuple[str, tuple]] = {
    "missing": ("DELETE FROM securesaver_tenant_keys WHERE tenant = ?", ("acme",)),
    "bogus index row": (
        "INSERT INTO securesaver_tenant_keys VALUES (?, 'index', 2, '1', randomblob(60), 0)",
        ("acme",)),
    "bogus data row": (
        "INSERT INTO securesaver_tenant_keys VALUES (?, 'data', 3, '1', randomblob(60), 0)",
        ("acme",)),
    "altered index row": (_FLIP + _where("index")[0], _where("index")[1]),
    "altered data row v2": (_FLIP + _where("data", 2)[0], _where("data", 2)[1]),
    "index row holds text, not bytes": (
        "UPDATE securesaver_tenant_keys SET wrapped = 'plain text' WHERE " + _where("index")[0],
        _where("index")[1]),
    "index row names an unknown master version": (
        "UPDATE securesaver_tenant_keys SET master_version = '7' WHERE "
        + _where("index")[0], _where("index")[1]),
    "index row names the other master version": (
        "UPDATE securesaver_tenant_keys SET master_version = '2' WHERE "
        + _where("index")[0], _where("index")[1]),
    "index row moved to another version": (
        "UPDATE securesaver_tenant_keys SET version = 4 WHERE " + _where("index")[0],
        _where("index")[1]),
    "data row v2 deleted": (
        "DELETE FROM securesaver_tenant_keys WHERE " + _where("data", 2)[0],
        _where("data", 2)[1]),
    "data row v2 relabelled v1 of another tenant": (
        "UPDATE securesaver_tenant_keys SET tenant = 'globex' WHERE " + _where("data", 2)[0],
        _where("data", 2)[1]),
}
_THREAD_FLIP = "UPDATE securesaver_thread_keys SET wrapped = CAST(substr(wrapped, 1, 20) || " \
    "x'00' || substr(wrapped, 22) AS BLOB) WHERE tenant = 'acme' AND thread_id = 't1'"
_PII_FLIP = "UPDATE securesaver_pii_keys SET wrapped = CAST(substr(wrapped, 1, 20) || " \
    "x'00' || substr(wrapped, 22) AS BLOB) WHERE tenant = 'acme'"
#: tampered or missing per-thread / per-vault-entry key rows (thread t1 of acme)
_SCOPED_TAMPER: dict[str, tuple[str, tuple]] = {
    "thread key altered": (_THREAD_FLIP, ()),
    "thread key missing": (
        "DELETE FROM securesaver_thread_keys WHERE tenant = 'acme' AND thread_id = 't1'", ()),
    "thread key holds text, not bytes": (
        "UPDATE securesaver_thread_keys SET wrapped = 'plain text' WHERE tenant = 'acme'", ()),
    "thread key names an unknown master version": (
        "UPDATE securesaver_thread_keys SET master_version = '7' WHERE tenant = 'acme'", ()),
    "thread key names the other master version": (
        "UPDATE securesaver_thread_keys SET master_version = '2' WHERE tenant = 'acme'", ()),
    "thread key relabelled to another tenant": (
        "UPDATE securesaver_thread_keys SET tenant = 'globex' WHERE thread_id = 't1'", ()),
    "pii key altered": (_PII_FLIP, ()),
    "pii key holds text, not bytes": (
        "UPDATE securesaver_pii_keys SET wrapped = 'plain text' WHERE tenant = 'acme'", ()),
    "pii key names an unknown master version": (
        "UPDATE securesaver_pii_keys SET master_version = '7' WHERE tenant = 'acme'", ()),
}
_REGISTRY_TAMPER: dict[str, tuple[str, tuple]] = {
    "registry key altered": (_FLIP + "tenant = ?", (RESERVED_TENANT,)),
    "registry key unknown master version": (
        "UPDATE securesaver_tenant_keys SET master_version = '9' WHERE tenant = ?",
        (RESERVED_TENANT,)),
    "registry key missing": ("DELETE FROM securesaver_tenant_keys WHERE tenant = ?",
                             (RESERVED_TENANT,)),
}


@pytest.mark.parametrize("case", list(_TAMPER))
def test_tampered_tenant_key_rows_leak_nothing(case: str, tmp_path: Path,
                                               database_seed: Seed) -> None:
    url, ring_path, found = _database(tmp_path, database_seed)
    statement, params = _TAMPER[case]
    _sql(url, statement, *params)
    # t1 is sealed under its own key; the tenant data key v2 seals the older-format thread
    thread = "t-tenant-key" if case.startswith("data row v2") else "t1"
    _assert_no_leak(capture(partial(_read, url, ring_path, thread=thread)), found,
                    TamperedDataError)
    if case.startswith(("altered", "bogus", "index row")):
        _assert_no_leak(capture(partial(_rewrap, url, ring_path)), found, TamperedDataError)


@pytest.mark.parametrize("case", list(_SCOPED_TAMPER))
def test_tampered_thread_and_vault_entry_key_rows_leak_nothing(case: str, tmp_path: Path,
                                                               database_seed: Seed) -> None:
    url, ring_path, found = _database(tmp_path, database_seed)
    statement, params = _SCOPED_TAMPER[case]
    _sql(url, statement, *params)
    _assert_no_leak(capture(partial(_read, url, ring_path)), found, TamperedDataError)
    if not case.endswith(("missing", "another tenant")):   # the epoch's rewrap unwraps it
        _assert_no_leak(capture(partial(_rewrap, url, ring_path)), found, TamperedDataError)


def test_async_reads_of_tampered_thread_keys_leak_nothing(tmp_path: Path,
                                                          database_seed: Seed) -> None:
    import asyncio
    url, ring_path, found = _database(tmp_path, database_seed)
    _sql(url, _THREAD_FLIP)

    def run() -> object:
        return asyncio.run(_aread(url, ring_path))

    _assert_no_leak(capture(run), found, TamperedDataError)


def test_async_reads_of_tampered_key_rows_leak_nothing(tmp_path: Path,
                                                       database_seed: Seed) -> None:
    import asyncio
    url, ring_path, found = _database(tmp_path, database_seed)
    _sql(url, *_TAMPER["bogus index row"][:1], *_TAMPER["bogus index row"][1])

    def run() -> object:
        return asyncio.run(_aread(url, ring_path))

    exc = capture(run)
    _assert_no_leak(exc, found, TamperedDataError)


@pytest.mark.parametrize("case", list(_REGISTRY_TAMPER))
def test_tampered_registry_key_rows_leak_nothing(case: str, tmp_path: Path,
                                                 database_seed: Seed) -> None:
    url, ring_path, found = _database(tmp_path, database_seed)
    statement, params = _REGISTRY_TAMPER[case]
    _sql(url, statement, *params)
    _assert_no_leak(capture(partial(_write_event, url, ring_path)), found, TamperedDataError)


def test_another_keyring_leaks_nothing(tmp_path: Path, database_seed: Seed) -> None:
    url, _, found = _database(tmp_path, database_seed)
    _assert_no_leak(capture(partial(_read_with_another_keyring, url)), found, TamperedDataError)


def test_the_cli_on_tampered_key_rows_prints_no_key(tmp_path: Path,
                                                    database_seed: Seed) -> None:
    url, ring_path, found = _database(tmp_path, database_seed)
    _sql(url, *_TAMPER["bogus index row"][:1], *_TAMPER["bogus index row"][1])
    for command in (["scan", "--verify"], ["rotate-keys"], ["audit"]):
        result = CliRunner().invoke(_cli_app(), [*command, "--url", url, "--keyring",
                                                 str(ring_path)])
        assert not [n for _, n in found.needles() if n in result.output], (command,
                                                                          result.output)


def test_every_case_holds_keys_the_search_knows(tmp_path: Path,
                                                database_seed: Seed) -> None:
    """The database cases search for real keys: a local holding one is found."""
    _, _, found = _database(tmp_path, database_seed)
    assert {"acme/data/v1", "acme/data/v2", "acme/index/v1", "securesaver-registry/registry/v1",
            "acme/pii-token-key", "master1", "master2", "kek1/acme",
            f"acme/{THREAD}/t1"} <= set(found.keys)
    entry_keys = [n for n in found.keys if n.startswith(f"acme/{ENTRY}/")]
    assert entry_keys, "no vault-entry key in the search"
    for name in ("acme/index/v1", "securesaver-registry/registry/v1", f"acme/{THREAD}/t1",
                 entry_keys[0]):
        os.environ["SECRECY_PLANT"] = found.keys[name].hex()
        try:
            exc = capture(partial(_planted_local, "raw"))
        finally:
            del os.environ["SECRECY_PLANT"]
        assert leaks(exc, found, ["traceback-capture_locals"])




# --------------------------------------------------------------------------------------------
# the PII token key on the redaction path: every way a write or a read can fail inside
# redaction, tokenization or restoring, with the tenant's token key loaded from the database
# --------------------------------------------------------------------------------------------
def _deep(depth: int) -> object:
    value: object = "ann@example.com"
    for _ in range(depth):
        value = {"k": value}
    return value


def _cyclic() -> object:
    loop: list[object] = ["ann@example.com"]
    loop.append(loop)
    return loop


def _put_value(saver: SecureSaver, value: object) -> object:
    from langgraph.checkpoint.base import empty_checkpoint
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"v": value}
    checkpoint["channel_versions"] = {"v": 1}
    return saver.put(_cfg(), checkpoint, {"source": "input", "step": 1}, {"v": 1})


def _failing_redaction(url: str, ring_path: Path, case: str) -> object:
    """One operation on tenant acme that fails inside the PII layer (see _REDACTION_CASES)."""
    from langgraph_securesaver.redaction import RedactionPolicy, Redactor
    # small limits keep the failing stack short (a reporter formats every frame's locals)
    options = {"redaction": Redactor(RedactionPolicy(max_chars=1000, hard_max_chars=1000,
                                                      max_depth=6))} \
        if case in ("too long", "nested too deep") else {}
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path), **options) as saver:
        if case in ("nested too deep", "cyclic"):
            return _put_value(saver, _deep(10) if case == "nested too deep" else _cyclic())
        if case == "too long":
            return _put_value(saver, "ann@example.com " * 100)
        if case == "a message write":   # as a graph's put does (a graph's own frames are
            return _put_value(saver, [HumanMessage(   # many: they make the reports slow)
                "mail bob@example.org or 4111 1111 1111 1111")])
        if case == "a store put":
            from langgraph_securesaver import tenant_scope
            from langgraph_securesaver.store import SecureStore
            with SecureStore.from_url(url, keyring=Keyring.from_file(ring_path)) as store, \
                    tenant_scope("acme"):
                return store.put(("notes",), "n1", {"text": "mail bob@example.org"})
        if case == "forget_pii by value":
            return saver.forget_pii("acme", "bob@example.org")
        if case == "a read":
            return saver.get_tuple(_cfg())
        raise AssertionError(case)


async def _afailing_redaction(url: str, ring_path: Path) -> object:
    from langgraph.checkpoint.base import empty_checkpoint
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"v": [HumanMessage("mail bob@example.org")]}
    checkpoint["channel_versions"] = {"v": 1}
    async with SecureSaver.afrom_url(url, keyring=Keyring.from_file(ring_path)) as saver:
        return await saver.aput(_cfg(), checkpoint, {"source": "input", "step": 1}, {"v": 1})


def _boom(*_args: object, **_kwargs: object) -> object:
    raise RuntimeError("an unexpected failure inside the redaction path")


#: case -> what fails: a limit of the redactor (RedactionError), or a function of the path
#: replaced by one that raises (an unexpected bug there, in tokenizing, detecting, restoring)
_REDACTION_CASES: dict[str, str | None] = {
    "nested too deep": None,
    "cyclic": None,
    "too long": None,
    "a message write": "langgraph_securesaver.redaction.tokens.normalize_value",
    "a store put": "langgraph_securesaver.redaction.tokens.normalize_value",
    "forget_pii by value": "langgraph_securesaver.redaction.tokens.normalize_value",
    "a read": "langgraph_securesaver.redaction.readback.ReadBack.remember",
}


@pytest.mark.parametrize("case", list(_REDACTION_CASES))
def test_failures_inside_redaction_leak_no_token_key(case: str, tmp_path: Path,
                                                      database_seed: Seed,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url, ring_path, found = _database(tmp_path, database_seed)
    if case == "a message write":   # the detection half too: the analyzer itself fails
        exc = _patched_failure(monkeypatch, "langgraph_securesaver.redaction.detection."
                               "Detection._analyze", url, ring_path, case)
        _assert_token_key_safe(exc, found)
    target = _REDACTION_CASES[case]
    if target is None:
        exc = capture(partial(_failing_redaction, url, ring_path, case))
        assert type(exc).__name__ == "RedactionError", repr(exc)
    else:
        exc = _patched_failure(monkeypatch, target, url, ring_path, case)
    _assert_token_key_safe(exc, found)


def _patched_failure(monkeypatch: pytest.MonkeyPatch, target: str, url: str, ring_path: Path,
                     case: str) -> BaseException:
    with monkeypatch.context() as patch:
        patch.setattr(target, _boom)
        exc = capture(partial(_failing_redaction, url, ring_path, case))
    assert "an unexpected failure inside the redaction path" in str(exc), repr(exc)
    return exc


def _assert_token_key_safe(exc: BaseException, found: Secrets) -> None:
    """No key in any report, and the token key's frames were really on the failing path
    (the search looked where the key would be)."""
    hits = leaks(exc, found)
    assert not hits, hits
    names = set()
    for e in chain(exc):
        tb = e.__traceback__
        while tb is not None:
            names.add(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
    assert names & {"redact_value", "remember_read", "forget_pii", "make_token",
                    "_analyze", "walk"}, names


def test_an_async_failure_inside_redaction_leaks_no_token_key(
        tmp_path: Path, database_seed: Seed,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    url, ring_path, found = _database(tmp_path, database_seed)

    def run() -> object:
        return asyncio.run(_afailing_redaction(url, ring_path))

    monkeypatch.setattr("langgraph_securesaver.redaction.tokens.normalize_value", _boom)
    _assert_token_key_safe(capture(run), found)


def test_the_redactor_api_with_a_wrapped_key_keeps_it_out_of_its_frames(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``Redactor.redact_value``/``redact``/``make_token`` given a ``SecretBytes`` key: no
    frame below the caller's holds the raw key, whatever fails."""
    key = secrets.token_bytes(32)
    found = Secrets()
    found.add_key("token key", key)
    monkeypatch.setenv("SECRECY_TOKEN_KEY", key.hex())
    del key
    for call in (_redact_cyclic, _redact_deep):
        exc = capture(call)
        assert type(exc).__name__ == "RedactionError" and not leaks(exc, found)
    monkeypatch.setattr("langgraph_securesaver.redaction.tokens.normalize_value", _boom)
    for call in (_redact_text, _make_token):
        exc = capture(call)
        assert isinstance(exc, RuntimeError) and not leaks(exc, found)
    # the same failure with the key passed as bytes: the search finds it (the test attacks
    # itself: the frames it searched are the ones that would hold the key)
    assert leaks(capture(_make_token_raw), found, ["traceback-capture_locals"])


def _env_key() -> SecretBytes:
    return SecretBytes(bytes.fromhex(os.environ["SECRECY_TOKEN_KEY"]))


def _redact_cyclic() -> object:
    from langgraph_securesaver.redaction import Redactor
    return Redactor().redact_value(_cyclic(), channel="x", token_key=_env_key())


def _redact_deep() -> object:
    from langgraph_securesaver.redaction import RedactionPolicy, Redactor
    return Redactor(RedactionPolicy(max_depth=6)).redact_value(_deep(10), channel="x",
                                                               token_key=_env_key())


def _redact_text() -> object:
    from langgraph_securesaver.redaction import Redactor
    return Redactor().redact("ann@example.com", token_key=_env_key())


def _make_token() -> object:
    from langgraph_securesaver.redaction import make_token
    return make_token(_env_key(), "EMAIL_ADDRESS", "ann@example.com")


def _make_token_raw() -> object:
    from langgraph_securesaver.redaction import make_token
    return make_token(bytes.fromhex(os.environ["SECRECY_TOKEN_KEY"]), "EMAIL_ADDRESS", "x")
