"""Deleted means unreadable: after each deletion path, every ciphertext of the deleted data
-- wherever a copy of it survives -- fails to open with the live keyring and the live
registry (its thread's or vault entry's key is gone); remnants are carved from the live
files (SQLite database + WAL) or the raw heap pages (PostgreSQL, ``pageinspect``). A backup
taken before the deletion stops opening once the next erasure epoch retired its master
version; live threads keep opening."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver, TamperedDataError
from langgraph_securesaver.keys.crypto import TenantKeys, aad_scope
from langgraph_securesaver.keys.tokens import ENTRY, THREAD
from langgraph_securesaver.registry.schema import normalize_url
from langgraph_securesaver.tenancy import tenant_scope
from tests.fake_agent import build_chat_graph

EMAIL_T1 = "alice.deleted@example.com"
EMAIL_T2 = "bob.forgotten@example.com"
BACKENDS = ["sqlite", "postgres"]
PATHS = ["delete_thread", "prune", "prune_expired", "forget_pii", "shred_tenant"]


def _cfg(thread: str, tenant: str = "acme") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


class Sealed:
    """Every ciphertext SecureSaver seals during the test, with its associated data."""

    def __init__(self) -> None:
        self.tokens: list[tuple[str, bytes, bytes]] = []   # (tenant, aad, token)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = TenantKeys.seal

        def seal(keys: TenantKeys, plaintext: bytes, aad: bytes, **kw: Any) -> bytes:
            token = original(keys, plaintext, aad, **kw)
            self.tokens.append((keys.tenant, aad, token))
            return token
        monkeypatch.setattr(TenantKeys, "seal", seal)

    def of(self, doomed: Callable[[str, Any], bool]) -> list[tuple[str, bytes, bytes]]:
        return [(t, a, tok) for t, a, tok in self.tokens if doomed(t, aad_scope(a))]


def _raw_bytes(url: str, db: Path | None) -> bytes:
    """What an attacker with a copy of the live storage holds: the SQLite files (database and
    WAL) as they are now, or every raw page of every relation of the PostgreSQL schema."""
    if db is not None:
        return b"".join(p.read_bytes() for p in (db, db.with_name(db.name + "-wal"))
                        if p.exists())
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pageinspect SCHEMA public")
            rels = conn.exec_driver_sql(
                "SELECT c.oid::regclass::text, c.relpages FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind "
                "IN ('r', 't', 'i') OR c.oid IN (SELECT reltoastrelid FROM pg_class c2 JOIN "
                "pg_namespace n2 ON n2.oid = c2.relnamespace WHERE n2.nspname = "
                "current_schema())").all()
            out = bytearray()
            for rel, _pages in rels:
                n = conn.exec_driver_sql(
                    f"SELECT pg_relation_size('{rel}') / 8192").scalar() or 0
                for page in range(int(n)):
                    out += conn.exec_driver_sql(
                        f"SELECT public.get_raw_page('{rel}', {page})").scalar()
            return bytes(out)
    finally:
        engine.dispose()


@contextmanager
def _saver(url: str, ring_path: Path, **options: Any) -> Iterator[SecureSaver]:
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring_path), **options) as saver:
        yield saver


def _opens(url: str, ring_path: Path, sealed: list[tuple[str, bytes, bytes]]) -> int:
    """How many of ``sealed`` open with the live keyring and the live registry."""
    opened = 0
    with _saver(url, ring_path, redaction=None) as saver:
        for tenant, aad, token in sealed:
            keys = saver.keys.keys_for(tenant, create=False)
            if keys is None:
                continue
            try:
                keys.open(token, aad)
                opened += 1
            except TamperedDataError:
                pass
    return opened


def _write_threads(url: str, ring_path: Path) -> None:
    with _saver(url, ring_path) as saver:
        graph = build_chat_graph(saver)
        graph.invoke({"messages": [HumanMessage(f"doomed thread, mail {EMAIL_T1}")]},
                     _cfg("t1"))
        graph.invoke({"messages": [HumanMessage("doomed thread, second turn")]}, _cfg("t1"))
        graph.invoke({"messages": [HumanMessage(f"live thread, mail {EMAIL_T2}")]},
                     _cfg("t2"))
        graph.invoke({"messages": [HumanMessage("other tenant, live")]}, _cfg("g1", "globex"))


def _delete(path: str, url: str, ring_path: Path) -> Callable[[str, Any], bool]:
    """Run one deletion path; returns which sealed values it deleted."""
    with _saver(url, ring_path) as saver:
        if path == "delete_thread":
            with tenant_scope("acme"):
                saver.delete_thread("t1")
        elif path == "prune":
            with tenant_scope("acme"):
                saver.prune(["t1"], strategy="delete")
        elif path == "prune_expired":
            with tenant_scope("acme"):
                saver.set_retention("t1", idle_ttl=60.0)
            report = saver.prune_expired(time.time() + 3600)
            assert report.deleted == [("acme", "t1")]
        elif path == "forget_pii":
            assert saver.forget_pii("acme", EMAIL_T2) == 1
        elif path == "shred_tenant":
            saver.shred_tenant("acme")
    if path == "forget_pii":
        return lambda tenant, scope: scope is not None and scope[0] == ENTRY and tenant == "acme" \
            and scope[2] in _tokens_of(EMAIL_T2)
    if path == "shred_tenant":
        return lambda tenant, scope: tenant == "acme"
    return lambda tenant, scope: tenant == "acme" and scope is not None and (
        (scope[0] == THREAD and scope[2] == "t1")
        or (scope[0] == ENTRY and scope[2] in _tokens_of(EMAIL_T1)))


_TOKENS: dict[str, set[str]] = {}


def _tokens_of(value: str) -> set[str]:
    return _TOKENS.get(value, set())


def _note_tokens(url: str) -> None:
    """The vault tokens of the two e-mails (read from the clear pii_refs rows)."""
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT thread_id, token FROM securesaver_pii_refs WHERE tenant = 'acme'").all()
    finally:
        engine.dispose()
    _TOKENS[EMAIL_T1] = {t for th, t in rows if th == "t1"}
    _TOKENS[EMAIL_T2] = {t for th, t in rows if th == "t2"}
    assert _TOKENS[EMAIL_T1] and _TOKENS[EMAIL_T2]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path | None]:
    if request.param == "sqlite":
        db = tmp_path / "agent.db"
        return f"sqlite:///{db}", db
    return request.getfixturevalue("pg_url"), None


@pytest.mark.parametrize("path", PATHS)
def test_no_remnant_of_deleted_data_opens_with_the_live_keyring(
        path: str, store: tuple[str, Path | None], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, db = store
    ring_path = Keyring.generate().save(tmp_path / "keyring.json")
    sealed = Sealed()
    sealed.install(monkeypatch)
    _write_threads(url, ring_path)
    _note_tokens(url)
    doomed_by = _delete(path, url, ring_path)
    doomed = sealed.of(doomed_by)
    survivors = [s for s in sealed.tokens if s not in doomed]
    assert doomed and survivors
    raw = _raw_bytes(url, db)
    carved = [s for s in doomed if s[2] in raw]
    # every ciphertext of the deleted data, carved from storage or not: none opens
    assert _opens(url, ring_path, doomed) == 0, f"{len(carved)} carved"
    if db is not None:   # SQLite: secure_delete + WAL truncation leave nothing to carve
        assert carved == []
    # what was not deleted still opens (the test can tell the two apart)
    live = [s for s in survivors if s[0] == "globex"]
    assert live and _opens(url, ring_path, live) == len(live)
    with _saver(url, ring_path, redaction=None) as saver:
        assert saver.get_tuple(_cfg("g1", "globex")) is not None
        if path in ("delete_thread", "prune", "prune_expired", "forget_pii"):
            assert saver.get_tuple(_cfg("t2")) is not None


def test_a_backup_from_before_the_deletion_stops_opening_after_the_next_epoch(
        store: tuple[str, Path | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    url, db = store
    ring_path = Keyring.generate().save(tmp_path / "keyring.json")
    sealed = Sealed()
    sealed.install(monkeypatch)
    _write_threads(url, ring_path)
    _note_tokens(url)
    backup = _backup(url, db, tmp_path, request)
    with _saver(url, ring_path) as saver:
        with tenant_scope("acme"):
            saver.delete_thread("t1")
        assert saver.forget_pii("acme", EMAIL_T2) == 1
        # before the epoch, the backup still opens with the keyring (the deleted keys'
        # copies in it are wrapped under master version 1)
        assert _backup_opens(backup, ring_path, sealed.tokens)
        # the receipt and the event say from which epoch on the erasure reaches backups
        assert saver.receipts(tenant="acme", thread_id="t1")[0].detail["erased_under"] == "1"
        assert saver.registry.list_events(kind="pii_forgotten")[0].detail["erased_under"] == "1"
        assert saver.erasure_epoch()["erasures_pending"] == 2    # the thread, the value
        from typer.testing import CliRunner

        from langgraph_securesaver.cli.main import app
        shown = CliRunner().invoke(app, ["audit", "--url", url, "--keyring", str(ring_path)])
        assert "erasure epoch pending: 2 erasure(s)" in shown.output, shown.output
        report = saver.rotate_keys(retire_old=True)
        assert report.ok and report.retired == ["1"]
        assert saver.erasure_epoch()["erasures_pending"] == 0
    assert Keyring.from_file(ring_path).versions() == ["2"]
    # the backup: nothing of the deleted thread or the erased value opens any more
    doomed = sealed.of(lambda tenant, scope: tenant == "acme" and scope is not None and (
        (scope[0] == THREAD and scope[2] == "t1") or (scope[0] == ENTRY and scope[2] in (
            _tokens_of(EMAIL_T1) | _tokens_of(EMAIL_T2)))))
    assert doomed and not _backup_opens(backup, ring_path, doomed)
    # the live database: every live thread still opens under the new master version
    with _saver(url, ring_path, redaction=None) as saver:
        t2 = saver.get_tuple(_cfg("t2"))
        assert t2 is not None and EMAIL_T2 not in str(t2.checkpoint["channel_values"])
        assert saver.get_tuple(_cfg("g1", "globex")) is not None
        assert saver.get_tuple(_cfg("t1")) is None


def _backup(url: str, db: Path | None, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A copy of the storage as a backup holds it: the SQLite files, or a PostgreSQL schema
    restored from ``pg_dump`` of the live one."""
    if db is not None:
        target = tmp_path / "backup" / db.name
        target.parent.mkdir()
        with sa.create_engine(normalize_url(url)).connect() as conn:   # a consistent file
            conn.exec_driver_sql("PRAGMA wal_checkpoint(FULL)")
        shutil.copy(db, target)
        return f"sqlite:///{target}"
    import subprocess

    from tests.conftest import PG_URL, drop_pg_schema, new_pg_schema, pg_url_in
    engine = sa.create_engine(normalize_url(url))
    with engine.connect() as conn:
        schema = str(conn.exec_driver_sql("SELECT current_schema()").scalar())
    engine.dispose()
    dump = subprocess.run(["pg_dump", "--no-owner", "-n", schema, PG_URL.split("?")[0]],
                          capture_output=True, text=True, check=True).stdout
    target = new_pg_schema()   # (created empty: the dump's CREATE SCHEMA is left out)
    request.addfinalizer(lambda: drop_pg_schema(target))
    restore = subprocess.run(["psql", "-q", "-v", "ON_ERROR_STOP=1", PG_URL.split("?")[0]],
                             input=dump.replace(f"CREATE SCHEMA {schema};", "").replace(
                                 schema, target), capture_output=True, text=True)
    assert restore.returncode == 0, restore.stderr[-2000:]
    return pg_url_in(target)


def _backup_opens(backup: str, ring_path: Path, sealed: list[tuple[str, bytes, bytes]]) -> bool:
    """Whether any of ``sealed`` opens from the backup with the keyring as it is now (the
    backup's own key rows, and the thread/vault keys in it)."""
    from langgraph_securesaver.keys.crypto import KeyManager
    from langgraph_securesaver.registry.core import Registry
    from langgraph_securesaver.registry.thread_keys import ThreadKeyStore
    registry = Registry(backup)
    try:
        keys = KeyManager(Keyring.from_file(ring_path), registry)
        keys.threads = ThreadKeyStore(keys, registry)
        for tenant, aad, token in sealed:
            try:
                tk = keys.keys_for(tenant, create=False)
                if tk is not None and tk.open(token, aad):
                    return True
            except TamperedDataError:
                continue
        return False
    finally:
        registry.dispose()
