"""SecureStore: sealed values bound to (database, tenant, namespace, key), tenant-prefixed
namespaces, blind-index filters, bad input -- attacked on InMemoryStore, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from langgraph_securesaver import (
    AccessDenied,
    ConfigurationError,
    Keyring,
    SecureSaver,
    SecureStore,
    TamperedDataError,
    TenantRequired,
    tenant_scope,
)
from langgraph_securesaver.store import secure_pair
from langgraph_securesaver.store.codec import SEALED_KEY, VERSION_KEY


def _raw_items(store: SecureStore) -> list[Any]:
    """Every inner item, read past SecureStore (what an attacker with the database has)."""
    return list(store.inner.search((), limit=10_000))


def _raw_put(store: SecureStore, namespace: tuple[str, ...], key: str, value: Any) -> None:
    store.inner.batch([PutOp(namespace, key, value)])


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path, keyring: Keyring
          ) -> Iterator[SecureStore]:
    if request.param == "memory":
        yield SecureStore(InMemoryStore(), keyring=keyring, default_tenant="acme",
                          redaction=None)
        return
    url = (f"sqlite:///{tmp_path / 'agent.db'}" if request.param == "sqlite"
           else request.getfixturevalue("pg_url"))
    with SecureStore.from_url(url, keyring=keyring, default_tenant="acme",
                              redaction=None) as s:
        yield s


def test_round_trip_and_only_ciphertext_stored(store: SecureStore) -> None:
    value = {"name": "Zebulon Quartzfield", "likes": ["tea"], "n": 3}
    store.put(("users", "u1"), "prefs", value)
    item = store.get(("users", "u1"), "prefs")
    assert item is not None and item.value == value
    assert item.namespace == ("users", "u1") and item.key == "prefs"
    raw = _raw_items(store)
    assert len(raw) == 1
    assert raw[0].value[VERSION_KEY].startswith("1:")    # the item's first version
    assert set(raw[0].value) - {SEALED_KEY, VERSION_KEY} == {
        k for k in raw[0].value if k.startswith("ssbi_")}
    assert "Zebulon" not in json.dumps(raw[0].value) and "tea" not in json.dumps(raw[0].value)
    assert raw[0].namespace[0] != "users"  # tenant prefix, invisible to the caller


@pytest.mark.parametrize("move", ["key", "namespace", "tenant"])
def test_copied_value_is_refused(store: SecureStore, move: str) -> None:
    store.put(("users", "u1"), "prefs", {"secret": "A"})
    with tenant_scope("globex"):
        store.put(("users", "u1"), "other", {"secret": "B"})
    raw = {(tuple(i.namespace), i.key): i for i in _raw_items(store)}
    (src,) = [i for (ns, k), i in raw.items() if k == "prefs"]
    ns = tuple(src.namespace)
    if move == "key":
        target: tuple[tuple[str, ...], str] = (ns, "stolen")
        reader: tuple[str | None, tuple[str, ...], str] = (None, ("users", "u1"), "stolen")
    elif move == "namespace":
        target = ((ns[0], "users", "u2"), "prefs")
        reader = (None, ("users", "u2"), "prefs")
    else:
        (other,) = [i for (n, k), i in raw.items() if k == "other"]
        target = (tuple(other.namespace), "prefs")
        reader = ("globex", ("users", "u1"), "prefs")
    _raw_put(store, target[0], target[1], src.value)
    tenant, rns, rkey = reader
    with tenant_scope(tenant or "acme"), pytest.raises(TamperedDataError):
        store.get(rns, rkey)
    with tenant_scope(tenant or "acme"), pytest.raises(TamperedDataError):
        store.search(("users",))


def test_value_copied_to_another_database_is_refused(tmp_path: Path, keyring: Keyring) -> None:
    """Same keyring, same tenant, same namespace and key: another database's value is refused
    (the database id is bound in)."""
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'a.db'}", keyring=keyring,
                              default_tenant="acme", redaction=None) as a:
        a.put(("m",), "k", {"v": "from a"})
        (stolen,) = _raw_items(a)
        tenant_keys = a.saver.keys.keys_for("acme", create=False)
        assert tenant_keys is not None
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'b.db'}", keyring=keyring,
                              default_tenant="acme", redaction=None) as b:
        # give b the same tenant keys row set as a would need: copy a's registry rows is the
        # strongest attacker; here b has its own keys, so also check a's own keys refuse it
        b.put(("m",), "k", {"v": "from b"})
        _raw_put(b, tuple(stolen.namespace), stolen.key, stolen.value)
        with pytest.raises(TamperedDataError):
            b.get(("m",), "k")
    # the whole database file copied (registry with it) still opens: same database id
    import shutil
    shutil.copy(tmp_path / "a.db", tmp_path / "a-copy.db")
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'a-copy.db'}", keyring=keyring,
                              default_tenant="acme", redaction=None) as copy:
        item = copy.get(("m",), "k")
        assert item is not None and item.value == {"v": "from a"}


def test_database_id_is_in_the_binding(store: SecureStore) -> None:
    """Opening with another database id (what a row moved between databases that share the
    registry's keys meets) fails: the id is part of the associated data."""
    from langgraph_securesaver.store.codec import item_aad, open_item
    store.put(("m",), "k", {"v": 1})
    (raw,) = _raw_items(store)
    keys = store.saver.keys.keys_for("acme", create=False)
    assert keys is not None
    db = store.saver.services.database_id()
    assert open_item(keys, item_aad(db, "acme", ("m",), "k"), raw.value)[0] == {"v": 1}
    with pytest.raises(TamperedDataError):
        open_item(keys, item_aad("another-database", "acme", ("m",), "k"), raw.value)


@pytest.mark.parametrize("value", [
    {"plain": "injected"},
    {SEALED_KEY: "not a token"},
    {SEALED_KEY: 12},
    {SEALED_KEY: "ss1.AAAA", "extra": 1},
])
def test_plain_or_forged_rows_are_refused(store: SecureStore, value: Any) -> None:
    store.put(("m",), "real", {"v": 1})
    (raw,) = _raw_items(store)
    _raw_put(store, tuple(raw.namespace), "forged", value)
    with pytest.raises(TamperedDataError):
        store.get(("m",), "forged")


def test_altered_blind_entry_is_refused(store: SecureStore) -> None:
    store.put(("m",), "k", {"color": "red"})
    (raw,) = _raw_items(store)
    changed = dict(raw.value)
    name = next(k for k in changed if k.startswith("ssbi_"))
    changed[name] = "0" * 32
    _raw_put(store, tuple(raw.namespace), "k", changed)
    with pytest.raises(TamperedDataError):
        store.get(("m",), "k")
    changed.pop(name)
    _raw_put(store, tuple(raw.namespace), "k", changed)
    with pytest.raises(TamperedDataError):
        store.get(("m",), "k")


def test_tenants_see_only_their_items(store: SecureStore) -> None:
    store.put(("users", "u1"), "a", {"who": "acme"})
    with tenant_scope("globex"):
        store.put(("users", "u1"), "a", {"who": "globex"})
        store.put(("globex-only",), "b", {"who": "globex"})
        assert store.get(("users", "u1"), "a").value == {"who": "globex"}  # type: ignore[union-attr]
        assert sorted(store.list_namespaces()) == [("globex-only",), ("users", "u1")]
    assert store.get(("users", "u1"), "a").value == {"who": "acme"}  # type: ignore[union-attr]
    assert [i.value for i in store.search(())] == [{"who": "acme"}]
    assert store.list_namespaces() == [("users", "u1")]
    assert store.list_namespaces(suffix=("u1",)) == [("users", "u1")]
    assert store.list_namespaces(prefix=("globex-only",)) == []
    assert store.get(("globex-only",), "b") is None
    store.delete(("globex-only",), "b")  # a delete of another tenant's key touches nothing
    with tenant_scope("globex"):
        assert store.get(("globex-only",), "b") is not None
    with tenant_scope("nobody"):
        assert store.search(()) == [] and store.list_namespaces() == []


def test_no_tenant_is_refused(keyring: Keyring) -> None:
    store = SecureStore(InMemoryStore(), keyring=keyring, redaction=None)
    with pytest.raises(TenantRequired):
        store.put(("m",), "k", {"v": 1})
    with pytest.raises(TenantRequired):
        store.search(())


def test_filters_through_the_blind_index(store: SecureStore) -> None:
    docs = {"a": {"color": "red", "n": 1, "ok": True, "tags": {"x": 1}},
            "b": {"color": "blue", "n": 2.0, "ok": False, "tags": {"x": 2}},
            "c": {"color": "red", "n": 3, "ok": True, "tags": {"x": 1}}}
    for k, v in docs.items():
        store.put(("d",), k, v)
    keys = lambda **f: sorted(i.key for i in store.search(("d",), filter=f))  # noqa: E731
    assert keys(color="red") == ["a", "c"]
    assert keys(color="red", n=3) == ["c"]
    assert keys(n=2) == ["b"]          # 2 and 2.0 are one JSON number
    assert keys(ok=True) == ["a", "c"]
    assert keys(n={"$gt": 1}) == ["b", "c"]
    assert keys(color={"$ne": "red"}) == ["b"]
    assert keys(tags={"x": 1}) == ["a", "c"]
    assert keys(color="green") == []
    assert len(store.search(("d",), filter={"color": "red"}, limit=1)) == 1
    assert len(store.search(("d",), filter={"n": {"$gte": 1}}, limit=2, offset=2)) == 1
    # the inner store sees digests only: the same filter as another tenant finds nothing
    with tenant_scope("globex"):
        assert store.search(("d",), filter={"color": "red"}) == []


def test_bad_input_is_refused_before_anything_is_written(store: SecureStore) -> None:
    deep: Any = "x"
    for _ in range(150):
        deep = {"d": deep}
    with pytest.raises(ConfigurationError):
        store.put(("m",), "deep", {"v": deep})
    with pytest.raises(ConfigurationError):
        store.put(("m",), "big", {"v": "x" * (9 * 1024 * 1024)})
    with pytest.raises(ConfigurationError):
        store.put(("m",), "obj", {"v": object()})
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp(("ok",), "k", {"v": 1}), PutOp(("a.b",), "k", {"v": 1})])
    assert _raw_items(store) == []
    hostile = {"v": "\x00\ud800 <PERSON:" + "0" * 32 + "> ' OR 1=1 --", "k": "\u202e"}
    store.put(("m",), "hostile", hostile)
    assert store.get(("m",), "hostile").value == hostile  # type: ignore[union-attr]


def test_batch_order_and_results_like_the_inner_store(store: SecureStore) -> None:
    store.put(("b",), "k1", {"v": 1})
    results = store.batch([GetOp(("b",), "k1"), PutOp(("b",), "k2", {"v": 2}),
                           SearchOp(("b",)), GetOp(("b",), "missing")])
    assert results[0].value == {"v": 1} and results[1] is None  # type: ignore[union-attr]
    assert isinstance(results[2], list) and results[3] is None
    assert store.get(("b",), "k2").value == {"v": 2}  # type: ignore[union-attr]


def test_async_paths(store: SecureStore, request: pytest.FixtureRequest) -> None:
    if request.node.callspec.params["store"] != "memory":
        pytest.skip("the sync inner stores' abatch runs on a thread (covered in the async "
                    "store tests below)")

    async def run() -> None:
        await store.aput(("a",), "k", {"color": "red"})
        assert (await store.aget(("a",), "k")).value == {"color": "red"}  # type: ignore[union-attr]
        assert [i.key for i in await store.asearch(("a",), filter={"color": "red"})] == ["k"]
        assert await store.alist_namespaces() == [("a",)]
        await store.adelete(("a",), "k")
        assert await store.aget(("a",), "k") is None
    asyncio.run(run())


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_async_from_url(backend: str, tmp_path: Path, keyring: Keyring,
                        request: pytest.FixtureRequest) -> None:
    url = (f"sqlite:///{tmp_path / 'a.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))

    async def run() -> None:
        async with SecureStore.afrom_url(url, keyring=keyring, default_tenant="acme",
                                         redaction=None) as store:
            await store.aput(("a",), "k", {"color": "red"})
            with tenant_scope("globex"):
                assert await store.aget(("a",), "k") is None
            item = await store.aget(("a",), "k")
            assert item is not None and item.value == {"color": "red"}
            found = await store.asearch(("a",), filter={"color": "red"})
            assert [i.key for i in found] == ["k"]
            raw = await store.inner.asearch((), limit=10)
            assert "red" not in json.dumps([r.value for r in raw])
    asyncio.run(run())


def test_saver_and_store_on_one_database(tmp_path: Path, keyring: Keyring) -> None:
    url = f"sqlite:///{tmp_path / 'one.db'}"
    with secure_pair(url, keyring=keyring, default_tenant="acme", redaction=None) as (
            saver, store):
        assert isinstance(saver, SecureSaver) and store.saver is saver
        store.put(("m",), "k", {"v": 1})
        assert store.saver.services.database_id() == saver.services.database_id()
    import sqlite3
    tables = {r[0] for r in sqlite3.connect(tmp_path / "one.db").execute(
        "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"store", "checkpoints", "securesaver_meta"} <= tables


def test_constructor_refusals(keyring: Keyring) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    with pytest.raises(ConfigurationError):
        SecureStore(InMemoryStore(index={"dims": 2, "embed": lambda t: [[1.0, 0.0]] * len(t)}),
                    keyring=keyring)
    with pytest.raises(ConfigurationError):
        SecureStore({}, keyring=keyring)  # type: ignore[arg-type]
    saver = SecureSaver(InMemorySaver(), keyring=keyring, redaction=None)
    with pytest.raises(ConfigurationError):
        SecureStore(InMemoryStore(), saver=saver, keyring=keyring)
    inner = SecureStore(InMemoryStore(), saver=saver)
    with pytest.raises(ConfigurationError):
        SecureStore(inner, saver=saver)


def test_scope_denial_is_recorded(keyring: Keyring) -> None:
    store = SecureStore(InMemoryStore(), keyring=keyring, redaction=None)
    store.setup()  # (a denial as the very first registry call of a process deadlocks: a
    # registry bug outside the store, reported separately)
    with tenant_scope("acme"), pytest.raises(AccessDenied):
        store.purge_tenant_items("globex")


def test_ttl_is_the_inner_stores(tmp_path: Path, keyring: Keyring) -> None:
    """ttl= and the TTLConfig reach the inner store; its sweep deletes expired items; a store
    without TTL support refuses ttl= as LangGraph's BaseStore does."""
    import time

    ttl = {"default_ttl": None, "refresh_on_read": False}
    with SecureStore.from_url(f"sqlite:///{tmp_path / 't.db'}", keyring=keyring,
                              default_tenant="acme", redaction=None, ttl=ttl) as store:
        assert store.supports_ttl and store.ttl_config == ttl
        store.put(("m",), "short", {"v": 1}, ttl=1 / 60)   # minutes
        store.put(("m",), "kept", {"v": 2})
        time.sleep(2.5)  # SQLite keeps expiry times in whole seconds
        assert store.sweep_ttl() == 1
        assert store.get(("m",), "short") is None
        assert store.get(("m",), "kept") is not None
    plain = SecureStore(InMemoryStore(), keyring=keyring, default_tenant="acme",
                        redaction=None)
    assert not plain.supports_ttl
    with pytest.raises(NotImplementedError):
        plain.put(("m",), "k", {"v": 1}, ttl=5)


def test_redacted_values_restored_for_the_owner_only(tmp_path: Path, keyring: Keyring) -> None:
    """Default settings: PII is tokenized before sealing, the original comes back on read,
    and another tenant's same namespace/key never yields it."""
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'r.db'}", keyring=keyring,
                              default_tenant="acme") as store:
        value = {"text": "write to jane.roe@example.com or call +1 415 555 0142"}
        store.put(("m",), "k", value)
        assert store.get(("m",), "k").value == value  # type: ignore[union-attr]
        (raw,) = _raw_items(store)
        keys = store.saver.keys.keys_for("acme", create=False)
        from langgraph_securesaver.store.codec import item_aad, open_item
        sealed_value, _ = open_item(keys, item_aad(store.saver.services.database_id(), "acme",
                                                   ("m",), "k"), raw.value)
        assert "jane.roe@example.com" not in json.dumps(sealed_value)   # tokenized inside
        with tenant_scope("globex"):
            assert store.get(("m",), "k") is None
            store.put(("m",), "k", {"text": "globex's own"})
        assert store.get(("m",), "k").value == value  # type: ignore[union-attr]


def _reference_aad(*parts: str) -> bytes:
    """The v1 associated-data encoding, written out here independently of the library."""
    out = b"securesaver/aad/v1"
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        out += len(raw).to_bytes(4, "big") + raw
    return out


@pytest.mark.parametrize("vectors", [None, {"text": [0.5, -1.0]}])
def test_sealed_format_is_stable(store: SecureStore, vectors: Any) -> None:
    """The envelope keeps its v1 layout and binding: what the store seals opens with a
    reference decoder (stdlib base64, the AAD written out here), and an envelope built by
    hand in the v1 layout (other JSON spacing, escaped text) opens through the store."""
    import base64
    import hashlib

    from langgraph_securesaver.store import codec
    namespace, key = ("m", "caf\u00e9"), "k"
    value = {"text": "h\u00e9llo <b>", "kind": "k1", "n": 3, "deep": {"x": [1, 2.5]}}
    store.put(namespace, key, value)
    (raw,) = _raw_items(store)
    keys = store.saver.keys.keys_for("acme", create=False)
    assert keys is not None
    db = store.saver.services.database_id()
    blind = {k: v for k, v in raw.value.items() if k.startswith("ssbi_")}
    assert len(blind) == 3  # text, kind, n: the top-level scalars
    # the kind, the tenant and the item id first: the item's own key is named by them
    item = "securestore:" + hashlib.sha256(_reference_aad("2", *namespace, key)[
        len(_reference_aad()):]).hexdigest()[:40]
    version = raw.value[VERSION_KEY]
    assert version.startswith("1:")
    reference = _reference_aad("si", "acme", item, db, "2", *namespace, key) \
        + _reference_aad("store-version", version) \
        + _reference_aad("store-blind", *(p for k in sorted(blind) for p in (k, blind[k])))
    sealed = codec.seal_item(keys, codec.item_aad(db, "acme", namespace, key),
                             codec.dump_json(value), vectors, blind, version=version)
    token = base64.urlsafe_b64decode(sealed[SEALED_KEY][len("ss1."):])
    plain = keys.open(token, reference)
    size = int.from_bytes(plain[1:5], "big")
    assert plain[0] == 1 and json.loads(plain[5 + size:]) == value
    assert (json.loads(plain[5:5 + size]) if size else {}).keys() == (vectors or {}).keys()

    head = json.dumps({"text": codec.pack_vector([1.0])}).encode() if vectors else b""
    body = json.dumps(value, ensure_ascii=True, indent=1).encode()   # another writer's JSON
    by_hand = keys.seal(b"\x01" + len(head).to_bytes(4, "big") + head + body, reference)
    envelope = {SEALED_KEY: "ss1." + base64.urlsafe_b64encode(by_hand).decode(),
                VERSION_KEY: version, **blind}
    _raw_put(store, tuple(raw.namespace), key, envelope)
    assert store.get(namespace, key).value == value  # type: ignore[union-attr]
    assert codec.open_item(keys, codec.item_aad(db, "acme", namespace, key), envelope)[0] \
        == value
    with pytest.raises(TamperedDataError):   # the binding still holds for it
        codec.open_item(keys, codec.item_aad(db, "acme", namespace, "other"), envelope)
    for other in ("2" + version[1:], ""):     # and so does the version's
        changed = {**envelope, VERSION_KEY: other} if other else {
            k: v for k, v in envelope.items() if k != VERSION_KEY}
        with pytest.raises(TamperedDataError):
            codec.open_item(keys, codec.item_aad(db, "acme", namespace, key), changed)


def test_escaped_tokens_are_restored(tmp_path: Path, keyring: Keyring) -> None:
    """A sealed value whose JSON writes a PII token's ``<`` escaped (``\\u003c``) still has
    its originals restored: the check that skips the vault lookup for token-free values
    reads escapes too."""
    import base64

    from langgraph_securesaver.store import codec
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'e.db'}", keyring=keyring,
                              default_tenant="acme") as store:
        value = {"text": "mail jane.roe@example.com", "n": 1}
        store.put(("m",), "k", value)
        (raw,) = _raw_items(store)
        keys = store.saver.keys.keys_for("acme", create=False)
        assert keys is not None
        aad = codec.item_aad(store.saver.services.database_id(), "acme", ("m",), "k")
        tokenized, _ = codec.open_item(keys, aad, raw.value)
        assert "<" in tokenized["text"] and "jane.roe" not in tokenized["text"]
        escaped = json.dumps(tokenized).replace("<", "\\u003c").encode()
        assert b"<" not in escaped
        blind = {k: v for k, v in raw.value.items() if k.startswith("ssbi_")}
        from langgraph_securesaver.storage.store_format import sealed_aad
        version = raw.value[VERSION_KEY]
        token = keys.seal(b"\x01" + bytes(4) + escaped, sealed_aad(aad, blind, version))
        _raw_put(store, tuple(raw.namespace), "k", {
            SEALED_KEY: "ss1." + base64.urlsafe_b64encode(token).decode(),
            VERSION_KEY: version, **blind})
        assert store.get(("m",), "k").value == value  # type: ignore[union-attr]
        assert store.search(("m",))[0].value == value


def test_prefilter_memo_holds_only_text_without_candidates(tmp_path: Path,
                                                          keyring: Keyring) -> None:
    """Short strings the redactor's pre-filter clears are remembered; a string that may hold
    PII never is, and a label seen clean before does not clear a different value."""
    from langgraph_securesaver.redaction import view
    view._CLEAN.clear()   # bounded: once full (other tests of this process), nothing is added
    assert view.may_have_pii("kind-of-label") is False
    assert "kind-of-label" in view._CLEAN
    assert view.may_have_pii("kind-of-label") is False
    assert view.may_have_pii("call +1 415 555 0142") is True
    assert "call +1 415 555 0142" not in view._CLEAN
    assert view.may_have_pii("a word " * 50) is False
    assert "a word " * 50 not in view._CLEAN      # longer text is scanned every time
    with SecureStore.from_url(f"sqlite:///{tmp_path / 'p.db'}", keyring=keyring,
                              default_tenant="acme") as store:
        store.put(("m",), "a", {"kind": "label"})
        store.put(("m",), "b", {"kind": "jane.roe@example.com"})
        stored = json.dumps([i.value for i in _raw_items(store)])
        assert "jane.roe" not in stored
        assert store.get(("m",), "b").value == {"kind": "jane.roe@example.com"}  # type: ignore[union-attr]
