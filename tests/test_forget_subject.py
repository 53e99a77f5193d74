"""No preimage after erasure, one person forgotten, and ``delete_for_runs`` erasing the
threads it empties.

The attacker of these tests holds a copy of the storage and the live keyring: they open every
conversation, read every live row and the raw SQLite files (database + WAL), and enumerate
candidate values (phone numbers), computing each one's HMAC token under the tenant's live
index key. Before the erasure that confirms the value (its vault entry is live, by design);
after it, nothing confirms it: the conversation holds a random token, and the only link
(the entry's lookup HMAC) left with the entry."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver
from langgraph_securesaver.crypto import ENTRY, THREAD
from langgraph_securesaver.demo import build_chat_graph
from langgraph_securesaver.pii_vault import pii_vault
from langgraph_securesaver.redaction import VaultEntry, make_token
from langgraph_securesaver.registry import normalize_url
from langgraph_securesaver.tenancy import tenant_scope
from tests.test_erasure import Sealed, _opens, _raw_bytes

PHONE = "+1 415 555 0142"
PHONE_NORMAL = "+14155550142"
OTHER_PHONE = "+1 415 555 0177"      # another person's: stays
SUBJECT_MAIL = "dana.subject@example.com"
SUBJECT_PHONE = "+1 212 555 0123"
OTHER_MAIL = "erin.stays@example.com"


def _cfg(thread: str, tenant: str = "acme") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant}}


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path | None]:
    if request.param == "sqlite":
        db = tmp_path / "agent.db"
        return f"sqlite:///{db}", db
    return request.getfixturevalue("pg_url"), None


@contextmanager
def _saver(url: str, ring: Path, **options: Any) -> Iterator[SecureSaver]:
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring), **options) as saver:
        yield saver


def _say(saver: SecureSaver, thread: str, text: str, tenant: str = "acme") -> None:
    build_chat_graph(saver).invoke({"messages": [HumanMessage(text)]}, _cfg(thread, tenant))


def _live_rows(url: str) -> str:
    """Every live row of every table, as text (what SQL access to the copy shows)."""
    engine = sa.create_engine(normalize_url(url))
    out: list[str] = []
    try:
        with engine.connect() as conn:
            for table in sa.inspect(conn).get_table_names():
                for row in conn.execute(sa.text(f'SELECT * FROM "{table}"')):
                    out.append(repr(tuple(row)))
    finally:
        engine.dispose()
    return "\n".join(out)


def _conversation(url: str, ring: Path, threads: list[tuple[str, str]]) -> str:
    """Every checkpoint and pending write of ``threads``, opened with the live keyring but not
    restored (the tokens as stored)."""
    out: list[str] = []
    with _saver(url, ring, redaction=None) as saver:
        for tenant, thread in threads:
            for tup in saver.list(_cfg(thread, tenant)):
                out.append(repr(tup.checkpoint["channel_values"]))
                out.append(repr(tup.metadata))
                out.append(repr(tup.pending_writes))
    return "\n".join(out)


def _confirmed(url: str, ring: Path, db: Path | None, tenant: str, kind: str,
               candidates: list[str], threads: list[tuple[str, str]]) -> list[str]:
    """The candidates a keyring holder confirms by comparing HMAC tokens with what the
    storage holds (conversations opened, live rows, raw SQLite files)."""
    seen = _conversation(url, ring, threads) + _live_rows(url)
    raw = _raw_bytes(url, db) if db is not None else b""
    with _saver(url, ring, redaction=None) as saver:
        key = saver.services.pii.token_key(saver.services.tenant_keys(tenant))
    found = []
    for value in candidates:
        token = make_token(key, kind, value)
        if token in seen or token.encode() in raw:
            found.append(value)
    return found


def _candidates() -> list[str]:
    return [f"+1415555{n:04d}" for n in range(100, 200)]


def test_forget_pii_leaves_no_preimage_of_a_phone_number(
        store: tuple[str, Path | None], tmp_path: Path) -> None:
    url, db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    threads = [("acme", "t1"), ("acme", "t2")]
    with _saver(url, ring) as saver:
        _say(saver, "t1", f"call me at {PHONE}")
        _say(saver, "t1", f"again: {PHONE}, or {OTHER_PHONE}")
        _say(saver, "t2", f"my number is {PHONE}")
        _say(saver, "g1", f"my number is {PHONE}", tenant="globex")
        keys = saver.services.tenant_keys("acme")
        token = saver.services.pii.public_token(keys, "PHONE_NUMBER", PHONE)
        # one value, one token per tenant while it lives: in both threads, on every turn
        assert token is not None
        assert saver.services.pii.public_token(keys, "PHONE_NUMBER", "+1 (415) 555-0142") == token
        with saver.services.registry.begin() as conn:
            refs = conn.exec_driver_sql(
                "SELECT thread_id FROM securesaver_pii_refs WHERE tenant = 'acme' AND token = "
                + ("?" if db is not None else "%s"), (token,)).scalars().all()
        assert sorted(refs) == ["t1", "t2"]
        other_tenant = saver.services.pii.public_token(
            saver.services.tenant_keys("globex"), "PHONE_NUMBER", PHONE)
        assert other_tenant is not None and other_tenant != token
        # ... and not the HMAC of the value
        assert token != make_token(saver.services.pii.token_key(keys), "PHONE_NUMBER", PHONE)
        # the owner reads the value back
        state = build_chat_graph(saver).get_state(_cfg("t1"))
        assert PHONE in str(state.values["messages"])
    stored = _conversation(url, ring, threads)
    assert stored.count(token) >= 3 and PHONE not in stored and PHONE_NORMAL not in stored
    # before the erasure the key holder confirms it (the live entry links it, by design)
    assert PHONE_NORMAL in _confirmed(url, ring, db, "acme", "PHONE_NUMBER", _candidates(),
                                      threads)

    with _saver(url, ring) as saver:
        assert saver.forget_pii("acme", PHONE_NORMAL, requested_by="dpo") == 1
    # after: the erased number is confirmed by nothing (table, conversation, raw SQLite
    # byte; PostgreSQL's dead tuple of the row keeps its lookup until VACUUM reclaims it,
    # see docs/erasure.md);
    # the other person's number, still live, still is (the enumeration works)
    assert _confirmed(url, ring, db, "acme", "PHONE_NUMBER", _candidates(), threads) == [
        "+14155550177"]
    with _saver(url, ring) as saver:
        messages = str(build_chat_graph(saver).get_state(_cfg("t1")).values["messages"])
        assert PHONE not in messages and token in messages and "555 0177" in messages
        # the other tenant's copy of the same number is not erased
        g1 = str(build_chat_graph(saver).get_state(_cfg("g1", "globex")).values["messages"])
        assert PHONE in g1
        # a new mention after the erasure is a new entry, with a new token
        _say(saver, "t3", f"new chat, {PHONE}")
        again = saver.services.pii.public_token(saver.services.tenant_keys("acme"), "PHONE_NUMBER",
                                                PHONE)
        assert again is not None and again != token
        assert saver.vault.lookup(saver.services.tenant_keys("acme"), [token]) == {}


def test_concurrent_writers_of_one_new_value_converge_on_one_token(
        store: tuple[str, Path | None], tmp_path: Path) -> None:
    """Two savers (two processes' caches and connections) both find a new value missing and
    create its entry at the same moment: the unique lookup index keeps one, both get it."""
    url, _db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _saver(url, ring) as a, _saver(url, ring) as b:
        keys_a, keys_b = a.services.tenant_keys("acme"), b.services.tenant_keys("acme")
        key = a.services.pii.token_key(keys_a)
        both_missing = threading.Barrier(2, timeout=60)
        for vault in (a.vault, b.vault):
            create = vault._create_entries

            def racing(keys: Any, entries: Any, *rest: Any, create: Any = create) -> Any:
                both_missing.wait()   # each saw the value missing before either inserts
                return create(keys, entries, *rest)
            vault._create_entries = racing  # type: ignore[method-assign]
        got: dict[str, str] = {}
        errors: list[BaseException] = []

        def resolve(name: str, saver: SecureSaver, keys: Any) -> None:
            entry = VaultEntry(make_token(key, "EMAIL_ADDRESS", "race@example.com"),
                               "EMAIL_ADDRESS", "race@example.com")
            try:
                got[name] = saver.vault.resolve(keys, [entry])[entry.token].token
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=resolve, args=(n, s, k))
                   for n, s, k in (("a", a, keys_a), ("b", b, keys_b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and got["a"] == got["b"]
        with a.services.registry.begin() as conn:
            rows = conn.execute(sa.select(pii_vault.c.token).where(
                pii_vault.c.tenant == "acme")).scalars().all()
            keys_left = conn.exec_driver_sql(
                "SELECT token FROM securesaver_pii_keys WHERE tenant = 'acme'").scalars().all()
        assert rows == [got["a"]] and keys_left == [got["a"]]   # the loser's key is gone
        assert b.vault.lookup(keys_b, [got["a"]]) == {got["a"]: "race@example.com"}
        assert a.vault.lookup(keys_a, [got["a"]]) == {got["a"]: "race@example.com"}


def test_older_hmac_tokens_keep_restoring_and_are_erased_by_value(tmp_path: Path) -> None:
    from langgraph_securesaver.pii_vault import _aad
    url = f"sqlite:///{tmp_path / 'old.db'}"
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _saver(url, ring) as saver:
        keys = saver.services.tenant_keys("acme")
        old = make_token(saver.services.pii.token_key(keys), "EMAIL_ADDRESS", "old@example.com")
        with saver.services.registry.begin() as conn:   # a row as older versions wrote it
            conn.execute(pii_vault.insert().values(
                tenant="acme", token=old, kind="EMAIL_ADDRESS", created_at=0.0,
                sealed=keys.seal(b"old@example.com", _aad("acme", old))))
        assert saver.vault.lookup(keys, [old]) == {old: "old@example.com"}
        assert saver.forget_pii("acme", "OLD@example.com") == 1
        assert saver.vault.lookup(keys, [old]) == {}


def _write_subject(url: str, ring: Path) -> None:
    with _saver(url, ring) as saver:
        _say(saver, "a1", f"I am Dana, {SUBJECT_MAIL}, phone {SUBJECT_PHONE}")
        _say(saver, "a1", f"cc {OTHER_MAIL}")
        _say(saver, "a2", f"Dana again: {SUBJECT_MAIL}")
        _say(saver, "g1", f"Dana at globex: {SUBJECT_PHONE}", tenant="globex")
        _say(saver, "g2", f"{SUBJECT_MAIL} and {OTHER_MAIL}", tenant="globex")
        _say(saver, "h1", f"initech keeps {SUBJECT_MAIL}", tenant="initech")


SUBJECT_THREADS = [("acme", "a1"), ("acme", "a2"), ("globex", "g1"), ("globex", "g2")]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_forget_subject_across_tenants_leaves_nothing_of_them(
        mode: str, store: tuple[str, Path | None], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    sealed = Sealed()
    sealed.install(monkeypatch)
    _write_subject(url, ring)
    with _saver(url, ring) as saver:
        tokens = {t: {saver.services.pii.public_token(saver.services.tenant_keys(t), kind, v)
                      for kind, v in (("EMAIL_ADDRESS", SUBJECT_MAIL),
                                      ("PHONE_NUMBER", SUBJECT_PHONE))} - {None}
                  for t in ("acme", "globex", "initech")}
        assert len(tokens["acme"]) == 2 and len(tokens["globex"]) == 2
        identifiers = [SUBJECT_MAIL.upper(), "+12125550123", "Dana", "customer-991"]
        with tenant_scope("acme"), pytest.raises(AccessDenied):   # a tenant erases its own only
            saver.forget_subject(identifiers, tenants=["acme", "globex"])
        if mode == "sync":
            erased = saver.forget_subject(identifiers, tenants=["acme", "globex"],
                                          requested_by="dpo")
        else:
            erased = asyncio.run(saver.aforget_subject(identifiers, tenants=["acme", "globex"],
                                                       requested_by="dpo"))
        assert erased == {"acme": 2, "globex": 2}
        receipts = [r for r in saver.receipts() if r.reason == "forget_subject"]
        assert len(receipts) == 1
        detail = receipts[0].detail
        assert detail["values_erased"] == {"acme": 2, "globex": 2}
        assert detail["threads"] == {"acme": 2, "globex": 2}
        assert SUBJECT_MAIL not in repr(receipts[0]) and "2125550123" not in repr(receipts[0])
    doomed = sealed.of(lambda tenant, scope: scope is not None and scope[0] == ENTRY
                       and scope[2] in tokens.get(tenant, set()) and tenant != "initech")
    assert doomed
    # every sealed copy of the subject's values: none opens with the live keyring
    assert _opens(url, ring, doomed) == 0
    if db is not None:   # SQLite: nothing of them left in the files to carve
        raw = _raw_bytes(url, db)
        assert [s for s in doomed if s[2] in raw] == []
        assert SUBJECT_MAIL.encode() not in raw
    # no enumeration confirms them (the e-mail and the phone, under every kind)
    for tenant in ("acme", "globex"):
        assert _confirmed(url, ring, db, tenant, "EMAIL_ADDRESS", [SUBJECT_MAIL],
                          SUBJECT_THREADS) == []
        assert _confirmed(url, ring, db, tenant, "PHONE_NUMBER", [SUBJECT_PHONE],
                          SUBJECT_THREADS) == []
    with _saver(url, ring) as saver:
        graph = build_chat_graph(saver)
        for tenant, thread in SUBJECT_THREADS:
            text = str(graph.get_state(_cfg(thread, tenant)).values["messages"])
            assert SUBJECT_MAIL not in text and SUBJECT_PHONE not in text
        # other subjects, and the tenant not named, untouched
        assert OTHER_MAIL in str(graph.get_state(_cfg("a1")).values["messages"])
        assert OTHER_MAIL in str(graph.get_state(_cfg("g2", "globex")).values["messages"])
        assert SUBJECT_MAIL in str(graph.get_state(_cfg("h1", "initech")).values["messages"])
    live = [s for s in sealed.tokens if s[0] == "initech"]
    assert live and _opens(url, ring, live) == len(live)


def test_forget_subject_with_a_writer_running_does_not_bring_erased_tokens_back(
        store: tuple[str, Path | None], tmp_path: Path) -> None:
    """A writer keeps writing the subject's e-mail in another thread during the erasure: the
    tokens stored before the erasure never open again; what the writer stores afterwards is a
    new mention under a new token (and a second erasure removes it)."""
    url, _db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    _write_subject(url, ring)
    stop = threading.Event()
    errors: list[BaseException] = []
    with _saver(url, ring) as writer_saver, _saver(url, ring) as admin:
        before = admin.services.pii.public_token(admin.services.tenant_keys("acme"), "EMAIL_ADDRESS",
                                                 SUBJECT_MAIL)
        assert before is not None

        def writer() -> None:
            graph = build_chat_graph(writer_saver)
            n = 0
            try:
                while not stop.is_set() and n < 40:
                    graph.invoke({"messages": [HumanMessage(f"turn {n}: {SUBJECT_MAIL}")]},
                                 _cfg("busy"))
                    n += 1
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            admin.forget_subject([SUBJECT_MAIL], tenants=["acme"], requested_by="dpo")
        finally:
            stop.set()
            thread.join()
        assert not errors
        keys = admin.services.tenant_keys("acme")
        assert admin.vault.lookup(keys, [before]) == {}
        after = admin.services.pii.public_token(keys, "EMAIL_ADDRESS", SUBJECT_MAIL)
        assert after != before
        # the older conversations never get the value back
        graph = build_chat_graph(admin)
        assert SUBJECT_MAIL not in str(graph.get_state(_cfg("a2")).values["messages"])
        admin.forget_subject([SUBJECT_MAIL], tenants=["acme"], requested_by="dpo")
        assert SUBJECT_MAIL not in str(graph.get_state(_cfg("busy")).values["messages"])
        assert admin.services.pii.public_token(keys, "EMAIL_ADDRESS", SUBJECT_MAIL) is None


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_delete_for_runs_that_empties_a_thread_destroys_its_key(
        mode: str, store: tuple[str, Path | None], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    sealed = Sealed()
    sealed.install(monkeypatch)
    with _saver(url, ring) as saver:
        graph = build_chat_graph(saver)
        graph.invoke({"messages": [HumanMessage(f"only run, {SUBJECT_MAIL}")]},
                     {**_cfg("solo"), "metadata": {"run_id": "11111111-1111-4111-8111-111111111111"}})
        graph.invoke({"messages": [HumanMessage("first run")]},
                     {**_cfg("kept"), "metadata": {"run_id": "22222222-2222-4222-8222-222222222222"}})
        graph.invoke({"messages": [HumanMessage("second run")]},
                     {**_cfg("kept"), "metadata": {"run_id": "33333333-3333-4333-8333-333333333333"}})
        runs = ["11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"]
        with tenant_scope("acme"):
            if mode == "sync":
                saver.delete_for_runs(runs)
            else:
                asyncio.run(saver.adelete_for_runs(runs))
        assert saver.get_tuple(_cfg("solo")) is None
        assert saver.get_tuple(_cfg("kept")) is not None
        with saver.services.registry.begin() as conn:
            keyed = conn.exec_driver_sql(
                "SELECT thread_id FROM securesaver_thread_keys WHERE tenant = 'acme'"
            ).scalars().all()
        assert sorted(keyed) == ["kept"]
        receipts = saver.receipts(tenant="acme", thread_id="solo")
        assert [r.reason for r in receipts] == ["delete_for_runs"]
        assert saver.receipts(tenant="acme", thread_id="kept") == []
        assert saver.pii_inventory("acme").get(("acme", "solo")) is None
    doomed = sealed.of(lambda tenant, scope: scope is not None and scope[0] == THREAD
                       and scope[2] == "solo")
    assert doomed and _opens(url, ring, doomed) == 0
    if db is not None:
        raw = _raw_bytes(url, db)
        assert [s for s in doomed if s[2] in raw] == []
    kept = sealed.of(lambda tenant, scope: scope is not None and scope[0] == THREAD
                     and scope[2] == "kept")
    assert kept and _opens(url, ring, kept) > 0
