"""SecureStore items in the operations: ``audit`` and ``scan --verify`` count and check them,
``shred_tenant`` and ``forget_pii`` erase them -- checked by carving the SQLite file (free
pages and WAL included) with the live keyring, as someone holding a copy of both would."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureStore, tenant_scope
from langgraph_securesaver.audit.inventory import audit
from langgraph_securesaver.audit.scan import scan
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.keys.crypto import MAGIC
from langgraph_securesaver.keys.tokens import associated_data
from langgraph_securesaver.store import secure_pair
from langgraph_securesaver.tenancy import tenant_tag

from .graph_helpers import sqlite_files_bytes

EMAIL = "erase.me.q7@example.org"
PHONE = "+1 415 555 0187"
LABEL = "customer-zq81"     # a namespace label: clear text in the store table


def _fill(store: SecureStore) -> None:
    with tenant_scope("acme"):
        store.put(("users", LABEL), "contact", {"text": f"mail {EMAIL} or call {PHONE}"})
        store.put(("users", LABEL), "prefs", {"tea": "green", "kind": "pref"})
        store.put(("notes",), "n1", {"text": "no personal data here"}, ttl=1.0)
    with tenant_scope("globex"):
        store.put(("users", "g1"), "prefs", {"tea": "black"})


def _carve_for(data: bytes, keys: Any, token: str, value: str) -> bool:
    """Whether any byte window of ``data`` opens as the vault's sealed original of ``token``
    (header, nonce, ciphertext of ``value``, tag) under ``keys``."""
    size = 3 + 4 + 12 + len(value.encode()) + 16
    aad = associated_data("pii", keys.tenant, token)
    start = data.find(MAGIC)
    while start != -1:
        try:
            if keys.open(data[start:start + size], aad).decode() == value:
                return True
        except Exception:
            pass
        start = data.find(MAGIC, start + 1)
    return False


def test_audit_counts_store_items(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with secure_pair(f"sqlite:///{db}", keyring=Keyring.generate(),
                     ttl={"default_ttl": None}) as (saver, store):
        _fill(store)
        report = audit(saver, now=time.time() + 3600)   # the 1-minute TTL has passed
        assert report.store is not None
        by_tenant = {t["tenant"]: t for t in report.store["tenants"]}
        acme, globex = by_tenant["acme"], by_tenant["globex"]
        assert (acme["items"], acme["namespaces"], globex["items"]) == (3, 2, 1)
        assert acme["stored_bytes"] > 0 and acme["with_ttl"] == 1 and acme["expired"] == 1
        assert set(acme["pii"]) == {"EMAIL_ADDRESS", "PHONE_NUMBER"} and not globex["pii"]
        assert sum(acme["stored_bytes_by_age"].values()) == acme["stored_bytes"]
        assert any("past their TTL" in p for p in report.problems)
        assert "store" in report.as_dict()
        one = audit(saver, tenant="globex")
        assert [t["tenant"] for t in one.store["tenants"]] == ["globex"]   # type: ignore[index]
        # the CLI: the JSON report carries the store part; the table prints it
        runner = CliRunner()
        out = runner.invoke(app, ["audit", "--url", f"sqlite:///{db}", "--format", "json"])
        assert json.loads(out.stdout)["store"]["tenants"][0]["tenant"] == "acme"
        text = runner.invoke(app, ["audit", "--url", f"sqlite:///{db}"], env={"COLUMNS": "200"})
        assert "Store items" in text.stdout


def test_scan_verifies_every_store_item(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ring = Keyring.generate()
    with secure_pair(f"sqlite:///{db}", keyring=ring) as (saver, store):
        _fill(store)
        clean = scan(saver, keyring=ring, verify=True)
        assert clean.ok, clean.violations
        assert clean.rows["store"] == 4 and clean.verified >= 4
        conn = sqlite3.connect(db)
        tag = tenant_tag("acme")
        sealed = conn.execute("SELECT value FROM store WHERE prefix = ? AND key = 'prefs'",
                              (f"{tag}.users.{LABEL}",)).fetchone()[0]
        # a sealed value copied onto another item, a plain value, a clear email in a key
        conn.execute("UPDATE store SET value = ? WHERE key = 'contact'", (sealed,))
        conn.execute("INSERT INTO store (prefix, key, value) VALUES (?, 'x', ?)",
                     (f"{tag}.notes", json.dumps({"text": "plain"})))
        conn.execute("INSERT INTO store (prefix, key, value) VALUES (?, ?, ?)",
                     (f"{tag}.notes", f"about {EMAIL}", sealed))
        conn.commit()
        conn.close()
        report = scan(saver, keyring=ring, verify=True)
        kinds = {(v.kind, v.table) for v in report.violations}
        assert ("token_fails_authentication", "store") in kinds    # moved value
        assert ("plaintext_store_value", "store") in kinds         # plain value
        assert ("pii_in_clear_column", "store") in kinds           # email in a key
        assert all(EMAIL not in v.location + v.detail for v in report.violations)
        runner = CliRunner()
        out = runner.invoke(app, ["scan", "--url", f"sqlite:///{db}", "--format", "json"])
        assert out.exit_code == 1 and "plaintext_store_value" in out.stdout


def test_forget_pii_and_shred_leave_nothing_to_carve(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    ring = Keyring.generate()
    ring_path = tmp_path / "keyring.json"
    ring.save(ring_path)
    ring = Keyring.from_file(ring_path)
    with secure_pair(f"sqlite:///{db}", keyring=ring) as (saver, store):
        _fill(store)
        keys = saver.keys.keys_for("acme", create=False)
        token = saver.services.pii.public_token(keys, "EMAIL_ADDRESS", EMAIL)
        assert token is not None
        assert _carve_for(sqlite_files_bytes(db), keys, token, EMAIL)   # the control
        assert saver.forget_pii("acme", EMAIL) == 1
        with tenant_scope("acme"):
            text = store.get(("users", LABEL), "contact").value["text"]  # type: ignore[union-attr]
        assert EMAIL not in text and "<EMAIL_ADDRESS" in text and PHONE in text
        data = sqlite_files_bytes(db)
        assert EMAIL.encode() not in data
        assert not _carve_for(data, keys, token, EMAIL)   # not in a free page or the WAL
        assert LABEL.encode() in data                     # (the control for what follows)
        saver.shred_tenant("acme")                        # the saver's: the store rows go too
        data = sqlite_files_bytes(db)
        assert LABEL.encode() not in data                 # clear namespace labels: carved away
        assert tenant_tag("acme").encode() not in data
        assert saver.keys.keys_for("acme", create=False) is None
        with tenant_scope("acme"):
            assert store.search(()) == []
        with tenant_scope("globex"):
            assert store.get(("users", "g1"), "prefs").value == {  # type: ignore[union-attr]
                "tea": "black"}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_store_shred_covers_items_on_every_backend(backend: str, tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    ring = Keyring.generate()
    ring.save(tmp_path / "k.json")
    ring = Keyring.from_file(tmp_path / "k.json")
    url = (f"sqlite:///{tmp_path / 'b.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))
    with secure_pair(url, keyring=ring) as (saver, store):
        _fill(store)
        assert store.shred_tenant("acme") == 0    # the saver's shred already took them
        with tenant_scope("acme"):
            assert store.search(()) == [] and store.list_namespaces() == []
        assert [t for t in audit(saver).store["tenants"]   # type: ignore[index]
                if t["items"]] == [t for t in audit(saver).store["tenants"]  # type: ignore[index]
                                   if t["tenant"] == "globex"]


def test_concurrent_calls_on_a_pooled_async_postgres_store(pg_url: str) -> None:
    """Many concurrent one-op calls (async and from threads) on an AsyncPostgresStore with a
    pool and TTL refresh: they complete (each used to be its own inner batch, and PostgreSQL
    deadlocked a search's TTL refresh against a write), and every deleted item's PII
    originals leave the vault (deletes that arrive together share a vault transaction)."""
    from concurrent.futures import ThreadPoolExecutor

    from langgraph.store.postgres.aio import AsyncPostgresStore

    from langgraph_securesaver.storage.backends import libpq_url

    ttl = {"default_ttl": 10.0, "refresh_on_read": True}

    async def run() -> None:
        async with AsyncPostgresStore.from_conn_string(
                libpq_url(pg_url), pool_config={"min_size": 1, "max_size": 10},
                ttl=ttl) as inner:
            store = SecureStore(inner, keyring=Keyring.generate(), registry=pg_url,
                                default_tenant="acme")
            await store.asetup()
            ns = ("users", "u1")
            calls = []
            for i in range(40):
                value = {"text": f"write to person{i}@example.org"}
                calls += [store.aput(ns, f"k{i}", value), store.aget(ns, f"k{i}"),
                          store.asearch(("users",)), store.alist_namespaces(prefix=("users",)),
                          store.aput(ns, f"k{i}", value)]
            await asyncio.wait_for(asyncio.gather(*calls), timeout=120)
            loop = asyncio.get_running_loop()
            pool = ThreadPoolExecutor(max_workers=8)
            try:   # (a failure must not join threads that wait for this loop: no `with`)
                futures = [loop.run_in_executor(pool, store.search, ("users",))
                           for _ in range(20)]
                futures += [loop.run_in_executor(pool, store.get, ns, f"k{i}")
                            for i in range(20)]
                done = await asyncio.wait_for(asyncio.gather(*futures), timeout=120)
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
            assert all(r is not None for r in done)
            assert sum(sum(k.values()) for k in store.saver.vault.inventory("acme").values()) \
                == 40
            await asyncio.gather(*(store.adelete(ns, f"k{i}") for i in range(40)))
            assert store.saver.vault.inventory("acme") == {}
            assert await store.asearch(("users",)) == []
            store.saver.registry.dispose()

    asyncio.run(asyncio.wait_for(run(), timeout=300))


def test_concurrent_calls_on_an_async_sqlite_store_beside_its_registry(tmp_path: Path) -> None:
    """``afrom_url`` on a SQLite file (registry and vault in the same file, default settings):
    many concurrent reads and writes, half of them with PII for the vault, all complete.
    AsyncSqliteStore runs each batch as BEGIN, reads, writes; a registry or vault commit on
    SecureStore's own connection in between used to fail the batch with "database is locked"
    (the snapshot cannot become a writer) and surface it to every caller in that batch."""
    url = f"sqlite:///{tmp_path / 'busy.db'}"

    async def run() -> None:
        async with SecureStore.afrom_url(url, keyring=Keyring.generate(),
                                         default_tenant="acme") as store:
            for round_ in range(3):
                calls = []
                for i in range(60):
                    ns = ("users", f"u{i % 4}")
                    value = ({"text": f"mail person{i}.r{round_}@example.org"} if i % 2
                             else {"n": i})
                    calls += [store.aput(ns, f"k{i}", value), store.aget(ns, f"k{i}"),
                              store.asearch(("users",)),
                              store.alist_namespaces(prefix=("users",)),
                              store.adelete(ns, f"k{i - 1}")]
                await asyncio.wait_for(asyncio.gather(*calls), timeout=120)
            items = await store.asearch(("users",), limit=1000)
            assert {i.key for i in items} >= {"k59"}

    asyncio.run(run())
