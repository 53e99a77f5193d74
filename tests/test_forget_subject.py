"""No preimage after erasure, one person forgotten, and the threads ``delete_for_runs``
empties erased (by the retention sweep after their grace).

The attacker of these tests holds a copy of the storage and the live keyring: they open every
conversation, read every live row and the raw SQLite files (database + WAL), and enumerate
candidate values (phone numbers), computing each one's HMAC token under the tenant's live
index key. Before the erasure that confirms the value (its vault entry is live, by design);
after it, nothing confirms it: the conversation holds a random token, and the only link
(the entry's lookup HMAC) left with the entry."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver
from langgraph_securesaver.keys.tokens import ENTRY, THREAD
from langgraph_securesaver.ops.pruner import Sweep
from langgraph_securesaver.redaction import VaultEntry, make_token
from langgraph_securesaver.registry.pii_vault import pii_vault
from langgraph_securesaver.registry.schema import normalize_url
from langgraph_securesaver.tenancy import tenant_scope
from tests.fake_agent import build_chat_graph
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


def _live_rows(url: str, skip: tuple[str, ...] = ()) -> str:
    """Every live row of every table (but ``skip``), as text (what SQL access to the copy
    shows)."""
    engine = sa.create_engine(normalize_url(url))
    out: list[str] = []
    try:
        with engine.connect() as conn:
            for table in sa.inspect(conn).get_table_names():
                if table in skip:
                    continue
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
    from langgraph_securesaver.registry.pii_vault import _aad
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
def test_forget_subject_by_identifiers_across_tenants_leaves_nothing_of_them(
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
            saver.forget_subject(identifiers=identifiers, tenants=["acme", "globex"])
        if mode == "sync":
            erased = saver.forget_subject(identifiers=identifiers, tenants=["acme", "globex"],
                                          requested_by="dpo")
        else:
            erased = asyncio.run(saver.aforget_subject(
                identifiers=identifiers, tenants=["acme", "globex"], requested_by="dpo"))
        assert erased.pii_values == {"acme": 2, "globex": 2}
        assert erased.threads == {"acme": 0, "globex": 0}     # by value: no thread deleted
        receipts = [r for r in saver.receipts() if r.reason == "forget_subject"]
        assert len(receipts) == 1
        counts = receipts[0].detail["counts"]
        assert {t: c["values_erased"] for t, c in counts.items()} == {"acme": 2, "globex": 2}
        assert {t: c["value_threads"] for t, c in counts.items()} == {"acme": 2, "globex": 2}
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


def test_forget_by_identifiers_with_a_writer_running_does_not_bring_erased_tokens_back(
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
            admin.forget_subject(identifiers=[SUBJECT_MAIL], tenants=["acme"],
                                 requested_by="dpo")
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
        admin.forget_subject(identifiers=[SUBJECT_MAIL], tenants=["acme"], requested_by="dpo")
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

        def keyed() -> list[str]:
            with saver.services.registry.begin() as conn:
                return sorted(conn.exec_driver_sql(
                    "SELECT thread_id FROM securesaver_thread_keys WHERE tenant = 'acme'"
                ).scalars().all())
        # emptied, not deleted yet: a run of the thread may be writing (rollback)
        assert keyed() == ["kept", "solo"]
        assert saver.services.registry.get_thread("acme", "solo").state == "emptied"
        assert saver.receipts(tenant="acme", thread_id="solo") == []
        # a sweep within the grace leaves it; the first one after deletes it, key included
        grace = Sweep(saver, now=None, limit=None, dry_run=True, tenant=None).emptied_grace()
        assert saver.prune_expired(now=time.time() + grace / 2).deleted == []
        assert keyed() == ["kept", "solo"]
        report = saver.prune_expired(now=time.time() + grace + 1)
        assert report.deleted == [("acme", "solo")]
        assert keyed() == ["kept"]
        assert saver.services.registry.get_thread("acme", "solo") is None
        receipts = saver.receipts(tenant="acme", thread_id="solo")
        assert [r.reason for r in receipts] == ["delete_for_runs"]
        assert receipts[0].detail["thread_keys"] == 1
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


# --- one person forgotten: the subject's threads, by their keyed digest ------------------------
DANA, ERIN = "user-dana-17", "user-erin-42"
DANA_MAIL = "dana.person@example.com"
ERIN_MAIL = "erin.person@example.com"
#: (tenant, thread, subject, how the subject is given)
SUBJECT_LAYOUT = [
    ("acme", "d1", DANA, "config"), ("acme", "d2", DANA, "scope"), ("acme", "d3", DANA, "config"),
    ("acme", "e1", ERIN, "config"), ("acme", "n1", None, None),
    ("globex", "g1", DANA, "scope"), ("globex", "g2", DANA, "config"),
    ("globex", "g3", ERIN, "config"),
    ("initech", "i1", DANA, "config"),        # a tenant the request does not name
]
DANA_THREADS = {(t, th) for t, th, s, _h in SUBJECT_LAYOUT if s == DANA and t != "initech"}


def _scfg(thread: str, tenant: str, subject: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "tenant_id": tenant}
    if subject is not None:
        conf["subject_id"] = subject
    return {"configurable": conf}


def _say_as(saver: SecureSaver, tenant: str, thread: str, subject: str | None, how: str | None,
            text: str) -> None:
    from langgraph_securesaver import subject_scope
    graph = build_chat_graph(saver)
    if how == "scope" and subject is not None:
        with subject_scope(subject):
            graph.invoke({"messages": [HumanMessage(text)]}, _scfg(thread, tenant))
    else:
        graph.invoke({"messages": [HumanMessage(text)]}, _scfg(thread, tenant, subject))


def _write_people(url: str, ring: Path) -> None:
    """Every thread of SUBJECT_LAYOUT (two turns each, the subject's e-mail in dana's),
    an idempotency record and a recovery record in a thread of each person, and store items
    under ``(subject, "memories")`` in both tenants."""
    from langgraph_securesaver.idempotency import IdempotencyStore, KeyScope
    from langgraph_securesaver.idempotency.recovery import mark_recoverable, release_recoverable
    from langgraph_securesaver.store import secure_pair
    with secure_pair(url, keyring=Keyring.from_file(ring)) as (saver, store):
        for tenant, thread, subject, how in SUBJECT_LAYOUT:
            mail = DANA_MAIL if subject == DANA else ERIN_MAIL
            _say_as(saver, tenant, thread, subject, how, f"hello from {thread}, {mail}")
            _say_as(saver, tenant, thread, subject, how, f"second turn of {thread}")
        idem = IdempotencyStore.for_saver(saver)
        idem.setup()
        for tenant, thread, subject in (("acme", "d1", DANA), ("acme", "e1", ERIN)):
            idem.execute(KeyScope(tenant, thread, f"k-{thread}", "business", "refund"),
                         lambda claim: {"refund": "ok"})
            conf = _scfg(thread, tenant, subject)
            mark_recoverable(conf, saver=saver)
            release_recoverable(conf, saver=saver)
        for tenant in ("acme", "globex"):
            with tenant_scope(tenant):
                store.put((DANA, "memories"), "m1", {"note": f"dana likes tea, {DANA_MAIL}"})
                store.put((DANA,), "profile", {"name": "Dana"})
                store.put((ERIN, "memories"), "m1", {"note": f"erin likes coffee, {ERIN_MAIL}"})


def _subject_rows(url: str) -> list[tuple[str, str, str]]:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return sorted(tuple(r) for r in conn.exec_driver_sql(
                "SELECT tenant, thread_id, subject FROM securesaver_thread_subjects").all())
    finally:
        engine.dispose()


def _companion_rows(url: str, tenant: str, thread: str) -> int:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return sum(int(conn.execute(sa.text(
                f"SELECT COUNT(*) FROM {table} WHERE tenant = :t AND thread_id = :th"),
                {"t": tenant, "th": thread}).scalar() or 0)
                for table in ("securesaver_idempotency", "securesaver_recoverable",
                              "securesaver_thread_keys", "securesaver_pii_refs",
                              "securesaver_threads"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_forget_subject_deletes_their_threads_in_two_tenants_and_nothing_of_them_opens(
        mode: str, store: tuple[str, Path | None], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    sealed = Sealed()
    sealed.install(monkeypatch)
    _write_people(url, ring)
    rows = _subject_rows(url)
    # the subject is recorded as a keyed digest per tenant, never in clear
    assert {(t, th) for t, th, _d in rows} == {
        (t, th) for t, th, s, _h in SUBJECT_LAYOUT if s is not None}
    digests = {d for _t, _th, d in rows}
    assert len(digests) == 5          # dana in three tenants, erin in two: one digest each
    # (the store's namespaces are the application's clear labels: docs/erasure.md)
    ours = _live_rows(url, skip=("store", "store_vectors"))
    assert DANA not in ours and ERIN not in ours and "user-" not in ours
    assert _companion_rows(url, "acme", "d1") >= 4      # idempotency, recovery, key, refs
    with _saver(url, ring) as saver:
        dana_digests = {d for t, th, d in rows if (t, th) in DANA_THREADS}
        entry_tokens = {t: {saver.services.pii.public_token(saver.services.tenant_keys(t),
                                                            "EMAIL_ADDRESS", DANA_MAIL)}
                        for t in ("acme", "globex")}
        if mode == "sync":
            report = saver.forget_subject(DANA, tenants=["acme", "globex"], requested_by="dpo")
        else:
            report = asyncio.run(saver.aforget_subject(DANA, tenants=["acme", "globex"],
                                                       requested_by="dpo"))
        assert report.tenants == ["acme", "globex"]
        assert report.threads == {"acme": 3, "globex": 2} and report.total_threads == 5
        assert report.store_items == {"acme": 2, "globex": 2}
        assert report.pii_values == {"acme": 1, "globex": 1}     # dana's e-mail, per tenant
        assert report.detail["acme"]["idempotency_records"] >= 2   # the record, the recovery
        assert report.detail["acme"]["thread_keys"] == 3
        # one receipt for the whole request, counts only
        receipts = [r for r in saver.receipts() if r.reason == "forget_subject"]
        assert len(receipts) == 1 and receipts[0].action == "forgotten"
        assert receipts[0].tenant == "" and receipts[0].thread_id is None
        assert receipts[0].detail["counts"]["globex"]["threads"] == 2
        text = repr(receipts[0]) + repr(saver.registry.list_events(kind="subject_forgotten"))
        assert DANA not in text and DANA_MAIL not in text
        assert not [d for d in dana_digests if d in text]
        assert [r for r in saver.receipts() if r.reason != "forget_subject"] == []
        for tenant, thread in DANA_THREADS:
            assert saver.get_tuple(_cfg(thread, tenant)) is None
            assert _companion_rows(url, tenant, thread) == 0
        graph = build_chat_graph(saver)
        for tenant, thread, _subject, _how in SUBJECT_LAYOUT:   # everyone else untouched
            if (tenant, thread) not in DANA_THREADS:
                values = graph.get_state(_cfg(thread, tenant)).values
                assert len(values["messages"]) == 4, (tenant, thread)
        assert DANA_MAIL in str(graph.get_state(_cfg("i1", "initech")).values["messages"])
        assert _companion_rows(url, "acme", "e1") >= 4
    assert {(t, th) for t, th, _d in _subject_rows(url)} == {
        (t, th) for t, th, s, _h in SUBJECT_LAYOUT if s is not None} - DANA_THREADS
    # carving: every ciphertext of dana's threads and vault entries, wherever a copy of it
    # survives (SQLite db+WAL, PostgreSQL pages): none opens with the live keyring
    doomed = sealed.of(lambda tenant, scope: scope is not None and (
        (scope[0] == THREAD and (tenant, scope[2]) in DANA_THREADS)
        or (scope[0] == ENTRY and scope[2] in entry_tokens.get(tenant, set()))))
    assert len(doomed) > 20
    raw = _raw_bytes(url, db)
    carved = [s for s in doomed if s[2] in raw]
    assert _opens(url, ring, doomed) == 0, f"{len(carved)} carved"
    if db is not None:   # SQLite: secure_delete + WAL truncation leave nothing to carve
        assert carved == []
        assert not [d for d in dana_digests if d.encode() in raw]
        assert DANA_MAIL.encode() not in raw and b"dana likes tea" not in raw
    # the other subjects' and tenants' ciphertexts all open (the test tells them apart), and
    # the carving finds them in the same bytes (PostgreSQL: dead tuples of dana's rows are
    # carved too until VACUUM, and never open)
    kept = sealed.of(lambda tenant, scope: scope is not None and scope[0] == THREAD
                     and (tenant, scope[2]) not in DANA_THREADS)
    assert kept and _opens(url, ring, kept) == len(kept)
    assert [s for s in kept if s[2] in raw]
    from langgraph_securesaver.store import secure_pair
    with secure_pair(url, keyring=Keyring.from_file(ring)) as (_s, st):
        for tenant in ("acme", "globex"):
            with tenant_scope(tenant):
                assert st.get((DANA, "memories"), "m1") is None
                assert st.get((DANA,), "profile") is None
                item = st.get((ERIN, "memories"), "m1")
                assert item is not None and ERIN_MAIL in item.value["note"]


def test_forget_subject_with_writers_running_in_both_tenants(
        store: tuple[str, Path | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers keep writing other subjects' threads (and threads without a subject) in both
    tenants while dana is forgotten: they finish without an error, every turn they wrote is
    there, and nothing dana's threads held before the erasure opens."""
    url, _db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    sealed = Sealed()
    sealed.install(monkeypatch)
    with _saver(url, ring) as saver:
        for tenant, thread, subject, how in SUBJECT_LAYOUT:
            _say_as(saver, tenant, thread, subject, how, f"first turn of {thread}, {DANA_MAIL}")
    before = sealed.of(lambda tenant, scope: scope is not None and scope[0] == THREAD
                       and (tenant, scope[2]) in DANA_THREADS)
    assert before
    writers = [("acme", "e1", ERIN), ("acme", "n1", None), ("globex", "g3", ERIN),
               ("globex", "w9", ERIN)]
    turns = 6
    errors: list[BaseException] = []
    started = threading.Barrier(len(writers) + 1, timeout=120)
    with _saver(url, ring) as writer_saver, _saver(url, ring) as admin:

        def write(tenant: str, thread: str, subject: str | None) -> None:
            graph = build_chat_graph(writer_saver)
            try:
                started.wait()
                for n in range(turns):
                    graph.invoke({"messages": [HumanMessage(f"turn {n} of {thread}")]},
                                 _scfg(thread, tenant, subject))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=w) for w in writers]
        for t in threads:
            t.start()
        started.wait()
        try:
            report = admin.forget_subject(DANA, tenants=["acme", "globex"])
        finally:
            for t in threads:
                t.join()
        assert not errors, errors
        assert report.threads == {"acme": 3, "globex": 2}
        graph = build_chat_graph(admin)
        for tenant, thread, _subject in writers:
            messages = graph.get_state(_cfg(thread, tenant)).values["messages"]
            expected = 2 * turns + (2 if thread != "w9" else 0)
            assert len(messages) == expected, (tenant, thread, len(messages))
        for tenant, thread in DANA_THREADS:
            assert admin.get_tuple(_cfg(thread, tenant)) is None
    assert _opens(url, ring, before) == 0
    kept = sealed.of(lambda tenant, scope: scope is not None and scope[0] == THREAD
                     and (tenant, scope[2]) in {(w[0], w[1]) for w in writers})
    assert kept and _opens(url, ring, kept) == len(kept)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_threads_subject_is_fixed_by_its_first_write(
        mode: str, store: tuple[str, Path | None], tmp_path: Path) -> None:
    from langgraph_securesaver import subject_scope
    url, _db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _saver(url, ring) as saver:
        graph = build_chat_graph(saver)

        def invoke(text: str, config: dict[str, Any]) -> Any:
            if mode == "sync":
                return graph.invoke({"messages": [HumanMessage(text)]}, config)
            return asyncio.run(graph.ainvoke({"messages": [HumanMessage(text)]}, config))

        invoke("dana's thread", _scfg("t1", "acme", DANA))
        stored = len(list(saver.list(_cfg("t1"))))
        # another subject writing the thread: refused before anything is stored, recorded
        with pytest.raises(AccessDenied, match="another subject"):
            invoke("erin writes here", _scfg("t1", "acme", ERIN))
        with subject_scope(ERIN), pytest.raises(AccessDenied, match="another subject"):
            invoke("erin writes here", _cfg("t1"))
        assert len(list(saver.list(_cfg("t1")))) == stored
        assert "erin writes here" not in str(saver.get_tuple(_cfg("t1")).checkpoint)
        denied = saver.registry.list_events(kind="access_denied")
        assert denied and {e.tenant for e in denied} == {"acme"}
        assert DANA not in repr(denied) and ERIN not in repr(denied)
        # a scope and a config naming different subjects: refused (any call)
        with subject_scope(DANA), pytest.raises(AccessDenied):
            saver.get_tuple(_scfg("t1", "acme", ERIN))
        # a write naming no subject keeps the thread's (and is forgotten with it)
        invoke("no subject named", _cfg("t1"))
        invoke("dana again", _scfg("t1", "acme", DANA))
        # another process (a fresh saver, its own cache) refuses as well
        with _saver(url, ring) as other:
            with pytest.raises(AccessDenied, match="another subject"):
                build_chat_graph(other).invoke({"messages": [HumanMessage("x")]},
                                               _scfg("t1", "acme", ERIN))
        # the same thread id in another tenant is another thread
        invoke("erin at globex", _scfg("t1", "globex", ERIN))
        # copying the thread copies its subject: the copy is forgotten with it
        with tenant_scope("acme"):
            saver.copy_thread("t1", "t1-copy")
        assert saver.forget_subject(DANA, tenants=["acme"]).threads == {"acme": 2}
        assert saver.get_tuple(_cfg("t1-copy")) is None
        # a deleted thread's id can be used by anyone again
        invoke("erin now", _scfg("t1", "acme", ERIN))
        with tenant_scope("acme"):
            saver.delete_thread("t1")
        invoke("dana now", _scfg("t1", "acme", DANA))
        assert saver.get_tuple(_cfg("t1", "globex")) is not None


def test_odd_subject_ids_are_refused_with_typed_errors_that_do_not_echo_them(
        tmp_path: Path) -> None:
    from langgraph_securesaver import ConfigurationError, subject_scope
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _saver(f"sqlite:///{tmp_path / 'odd.db'}", ring) as saver:
        graph = build_chat_graph(saver)
        secret = "x" * 256
        for odd in ("", " dana", "dana ", "da\x00na", "da\u202ena", "da\u200bna", secret, 17,
                    ["dana"]):
            with pytest.raises(ConfigurationError) as err:
                graph.invoke({"messages": [HumanMessage("hi")]}, _scfg("t1", "acme", odd))
            assert "dana" not in str(err.value) and secret not in str(err.value)
            if isinstance(odd, str):
                with pytest.raises(ConfigurationError):
                    with subject_scope(odd):
                        pass
                with pytest.raises(ConfigurationError):
                    saver.forget_subject(odd)
        assert saver.get_tuple(_cfg("t1")) is None     # nothing was written
        assert _subject_rows(f"sqlite:///{tmp_path / 'odd.db'}") == []
        graph.invoke({"messages": [HumanMessage("hi")]}, _scfg("t1", "acme", "d" * 255))
        # one subject per call; identifiers go in identifiers=
        with pytest.raises(ConfigurationError, match="identifiers"):
            saver.forget_subject(["dana@example.com"])  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            saver.forget_subject()
        with pytest.raises(ConfigurationError):
            saver.forget_subject(DANA, identifiers="dana@example.com")
        with pytest.raises(ConfigurationError):
            saver.forget_subject(DANA, store_namespace="memories")
        with pytest.raises(ConfigurationError):
            saver.forget_subject(DANA, tenants="acme")
        assert [r for r in saver.receipts() if r.reason == "forget_subject"] == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tenant_scope_forgets_its_own_subject_only(
        mode: str, store: tuple[str, Path | None], tmp_path: Path) -> None:
    url, _db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _saver(url, ring) as saver:
        for tenant, thread, subject, how in SUBJECT_LAYOUT:
            _say_as(saver, tenant, thread, subject, how, f"turn of {thread}")

        def forget(**kwargs: Any) -> Any:
            if mode == "sync":
                return saver.forget_subject(DANA, **kwargs)
            return asyncio.run(saver.aforget_subject(DANA, **kwargs))

        with tenant_scope("acme"):
            with pytest.raises(AccessDenied, match="recorded"):
                forget(tenants=["globex"])
            with pytest.raises(AccessDenied):
                forget(tenants=["acme", "globex"])
        assert saver.get_tuple(_cfg("g1", "globex")) is not None
        assert [r for r in saver.receipts() if r.reason == "forget_subject"] == []
        with tenant_scope("acme"):
            report = forget()                       # no tenant named: its own
        assert report.tenants == ["acme"] and report.threads == {"acme": 3}
        assert saver.get_tuple(_cfg("g1", "globex")) is not None
        assert saver.get_tuple(_cfg("i1", "initech")) is not None
        # unscoped, no tenant named: the operator's, every tenant
        report = forget()
        assert report.threads == {"acme": 0, "globex": 2, "initech": 1}
        assert saver.get_tuple(_cfg("g3", "globex")) is not None
        assert saver.get_tuple(_cfg("e1")) is not None
        # nobody of that name: nothing deleted, still one receipt (the request is recorded)
        assert forget().total_threads == 0
        assert len([r for r in saver.receipts() if r.reason == "forget_subject"]) == 3


def test_retention_and_shredding_delete_the_subject_rows(tmp_path: Path) -> None:
    import time as _time
    url = f"sqlite:///{tmp_path / 'ret.db'}"
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _saver(url, ring) as saver:
        for thread in ("p1", "p2", "p3"):
            _say_as(saver, "acme", thread, DANA, "config", f"turn of {thread}")
        _say_as(saver, "globex", "g1", DANA, "config", "globex turn")
        with tenant_scope("acme"):
            saver.set_retention("p1", idle_ttl=60.0)
            saver.prune(["p2"], strategy="delete")
        assert saver.prune_expired(_time.time() + 3600).deleted == [("acme", "p1")]
        assert [th for t, th, _d in _subject_rows(url) if t == "acme"] == ["p3"]
        saver.shred_tenant("globex")
        assert [t for t, _th, _d in _subject_rows(url)] == ["acme"]


def test_cli_forget_subject(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from langgraph_securesaver.cli.main import app
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    with _saver(url, ring) as saver:
        for tenant, thread, subject, how in SUBJECT_LAYOUT:
            _say_as(saver, tenant, thread, subject, how, f"turn of {thread}, {DANA_MAIL}")
    runner = CliRunner()
    base = ["forget-subject", "--url", url, "--keyring", str(ring)]
    for bad in (["--subject", " dana"], [], ["--tenant", "nobody", "--subject", DANA],
                ["--subject", DANA, "--requested-by", "x\x00"]):
        result = runner.invoke(app, [*base, *bad, "--yes"])
        assert result.exit_code == 2, result.output
    result = runner.invoke(app, [*base, "--subject", DANA], input="n\n")
    assert result.exit_code == 1 and "aborted" in result.output
    with _saver(url, ring) as saver:
        assert saver.get_tuple(_cfg("d1")) is not None
    result = runner.invoke(app, [*base, "--subject", "-", "--tenant", "acme", "--tenant",
                                 "globex", "--identifier", DANA_MAIL, "--requested-by", "dpo",
                                 "--yes", "--json"], input=DANA + "\n")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["tenants"] == ["acme", "globex"]
    assert shown["counts"]["acme"]["threads"] == 3 and shown["counts"]["globex"]["threads"] == 2
    assert DANA not in result.output
    with _saver(url, ring) as saver:
        assert saver.get_tuple(_cfg("d1")) is None and saver.get_tuple(_cfg("e1")) is not None
        assert saver.get_tuple(_cfg("i1", "initech")) is not None
        assert [r.requested_by for r in saver.receipts() if r.reason == "forget_subject"] == [
            "dpo"]
    result = runner.invoke(app, [*base, "--subject", DANA, "--yes"])
    assert result.exit_code == 0 and "initech" in result.output


def test_store_items_are_chosen_by_namespace_prefix(tmp_path: Path) -> None:
    """Only namespaces equal to or under the prefix go (LIKE wildcards in an id match only
    themselves); ``store_namespace`` names another prefix, None no store item."""
    from langgraph_securesaver.store import secure_pair
    url = f"sqlite:///{tmp_path / 'ns.db'}"
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    odd = "a_b%"
    with secure_pair(url, keyring=Keyring.from_file(ring)) as (saver, st):
        with tenant_scope("acme"):
            for ns in ((odd,), (odd, "memories"), ("aXbY", "memories"), ("a_b%x",),
                       ("users", DANA, "notes"), (DANA, "memories"), ("other", odd)):
                st.put(ns, "k", {"v": 1})
        assert saver.forget_subject(odd, tenants=["acme"]).store_items == {"acme": 2}
        assert saver.forget_subject(DANA, tenants=["acme"],
                                    store_namespace=None).store_items == {"acme": 0}
        assert saver.forget_subject(DANA, tenants=["acme"], store_namespace=(
            "users", DANA)).store_items == {"acme": 1}
        with tenant_scope("acme"):
            left = sorted(tuple(n) for n in st.list_namespaces())
        assert left == sorted([("aXbY", "memories"), ("a_b%x",), (DANA, "memories"),
                               ("other", odd)])
