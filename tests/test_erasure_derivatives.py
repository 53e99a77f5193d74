"""Erased means no one can confirm it (docs/erasure.md, "Keyed derivatives").

The attacker holds the live keyring -- after ``forget_subject`` + the erasure epoch, the
keyring as the epoch left it -- and a copy of the storage: every live row of every table, the
SQLite files (database + WAL), and on PostgreSQL every raw page (dead tuples included, through
``pageinspect``). For each guess of an erased value they compute every keyed derivative the
library stores (vault lookup, idempotency keys and fingerprints of the raw value, and of its
public token while the entry lives) and look for it. A value of another person, still live,
confirms through the same search (the search works); an erased one confirms nowhere."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage
from langgraph.graph import START, StateGraph
from typing_extensions import TypedDict

from langgraph_securesaver import Keyring, SecureSaver, SecureStore
from langgraph_securesaver.idempotency import IdempotencyStore, idempotent
from langgraph_securesaver.idempotency.keys import business_key, fingerprint
from langgraph_securesaver.registry.schema import normalize_url
from langgraph_securesaver.seal import SealedCodec
from langgraph_securesaver.store import codec
from langgraph_securesaver.tenancy import tenant_scope
from tests.fake_agent import build_chat_graph
from tests.test_erasure import _raw_bytes

DANA, ERIN = "user-dana-17", "user-erin-42"
DANA_MAIL = "dana.person@example.com"
ERIN_MAIL = "erin.person@example.com"
ORDER = "order-5531"


class Order(TypedDict, total=False):
    customer: str
    log: list[str]


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


def _cfg(thread: str, subject: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "tenant_id": "acme"}
    if subject is not None:
        conf["subject_id"] = subject
    return {"configurable": conf}


def _order_graph(saver: SecureSaver) -> Any:
    """A node that charges once per customer for the whole tenant (a business key built
    from the customer's e-mail), and records the shipment once per thread (the e-mail in
    the call's arguments: the fingerprint)."""

    @idempotent(key=lambda customer, order: customer, scope="tenant")
    def charge(customer: str, order: str) -> str:
        return f"charged {customer} for {order}"

    @idempotent
    def ship(customer: str, order: str) -> str:
        return f"shipped {order} to {customer}"

    def node(state: Order) -> Order:
        return {"log": [charge(state["customer"], ORDER), ship(state["customer"], ORDER)]}

    g = StateGraph(Order)
    g.add_node("order", node)
    g.add_edge(START, "order")
    return g.compile(checkpointer=saver)


def _write(url: str, ring: Path) -> None:
    """dana's and erin's threads: a conversation naming their e-mail, and an order each; and
    a memory each in the SecureStore on the same database (blind-indexed e-mail field)."""
    with _saver(url, ring) as saver, SecureStore.from_url(url, saver=saver) as memories:
        chat = build_chat_graph(saver)
        orders = _order_graph(saver)
        for thread, subject, mail in (("d1", DANA, DANA_MAIL), ("e1", ERIN, ERIN_MAIL)):
            chat.invoke({"messages": [HumanMessage(f"my mail is {mail}")]},
                        {**_cfg(thread, subject), "metadata": {"customer_email": mail}})
            orders.invoke({"customer": mail, "log": []}, _cfg(thread + "-order", subject))
            with tenant_scope("acme"):
                memories.put((subject, "memories"), "contact", {"email": mail, "n": 1})


def _guesses(value: str) -> list[str]:
    """60 guesses of an e-mail, the value among them."""
    local, domain = value.split("@")
    return [value] + [f"{local}{n}@{domain}" for n in range(59)]


def _derivatives(saver: SecureSaver, value: str, threads: list[str]) -> dict[str, set[str]]:
    """What a keyring holder computes for one guess, by kind: the vault lookup, the
    idempotency keys and fingerprint of the order calls and the metadata blind index -- of
    the raw value, and of its public token when the guess has a live vault entry --, and the
    value itself in clear."""
    keys = saver.services.tenant_keys("acme")
    out: dict[str, set[str]] = {
        "lookup": {saver.services.pii.lookup_of(keys, "EMAIL_ADDRESS", value)},
        "business_key": set(), "fingerprint": set(), "blind_index": set(),
        "store_blind_index": set(), "clear": {value, value.upper()}}
    public = saver.services.pii.public_token(keys, "EMAIL_ADDRESS", value)
    for form in (value, public) if public is not None else (value,):
        for thread in ("", *threads):
            out["business_key"].add(business_key(keys, thread_id=thread, name="charge",
                                                 value=form))
        out["fingerprint"].add(fingerprint(keys, {"customer": form, "order": ORDER}))
        out["blind_index"].add(SealedCodec.blind_value(keys, "customer_email", form))
        out["store_blind_index"].add(codec.blind_value(keys, "email", form))
    return out


def _live_rows(url: str) -> str:
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


def _confirmed(url: str, ring: Path, db: Path | None, value: str,
               threads: list[str]) -> dict[str, set[str]]:
    """``where:kind`` -> the guesses of ``value`` a derivative of that kind confirmed, in the
    live rows (``rows``) or the raw storage (``raw``: files, pages, dead tuples)."""
    rows, raw = _live_rows(url), _raw_bytes(url, db)
    found: dict[str, set[str]] = {}
    with _saver(url, ring, redaction=None) as saver:
        for guess in _guesses(value):
            for kind, hits in _derivatives(saver, guess, threads).items():
                if any(h in rows for h in hits):
                    found.setdefault(f"rows:{kind}", set()).add(guess)
                if any(h.encode() in raw for h in hits):
                    found.setdefault(f"raw:{kind}", set()).add(guess)
    return found


def _order_records(saver: SecureSaver) -> list[Any]:
    store = IdempotencyStore.for_saver(saver)
    store.setup()
    return store.list_records("acme")


def test_forget_subject_erases_their_tenant_wide_business_record(
        store: tuple[str, Path | None], tmp_path: Path) -> None:
    """Reproduction 1: the tenant-wide record of a business key built from the subject's
    e-mail is erased with the subject (counted in the receipt), and neither its result (the
    public API) nor its key gives the e-mail back."""
    url, db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    _write(url, ring)
    with _saver(url, ring) as saver:
        records = _order_records(saver)
        tenant_wide = [r for r in records if r.thread_id == "" and r.name == "charge"]
        assert len(tenant_wide) == 2                   # dana's and erin's
        idem = IdempotencyStore.for_saver(saver)
        results = {idem.result("acme", "", r.key): r.key for r in tenant_wide}
        assert set(results) == {f"charged {DANA_MAIL} for {ORDER}",
                                f"charged {ERIN_MAIL} for {ORDER}"}
        # no raw e-mail in any key or fingerprint (tokenized before the HMAC)
        keys = saver.services.tenant_keys("acme")
        raw_derived = {business_key(keys, thread_id="", name="charge", value=DANA_MAIL)}
        assert not raw_derived & {r.key for r in records}

        report = saver.forget_subject(DANA, tenants=["acme"], requested_by="dpo")
        assert report.threads == {"acme": 2}
        assert report.detail["acme"]["idempotency_records"] == 2  # charge (tenant-wide), ship
        assert report.pii_values == {"acme": 1}                    # dana's e-mail
        left = _order_records(saver)
        assert [r.key for r in left if r.thread_id == ""] == [
            results[f"charged {ERIN_MAIL} for {ORDER}"]]
        with pytest.raises(LookupError):     # the public API gives nothing of dana's back
            idem.result("acme", "", results[f"charged {DANA_MAIL} for {ORDER}"])
        for r in left:
            value = idem.result("acme", r.thread_id, r.key) if r.has_result else ""
            assert DANA_MAIL not in str(value)
        # erin's order still replays exactly once, dana's would run again (erased)
        orders = _order_graph(saver)
        out = orders.invoke({"customer": ERIN_MAIL, "log": []}, _cfg("e2-order", ERIN))
        assert out["log"][0] == f"charged {ERIN_MAIL} for {ORDER}"
    found = _confirmed(url, ring, db, DANA_MAIL, ["d1-order", "d1"])
    assert {k: v for k, v in found.items() if k.startswith("rows:")} == {}
    assert found.get("raw:business_key") is None and found.get("raw:fingerprint") is None
    control = _confirmed(url, ring, db, ERIN_MAIL, ["e1-order", "e1"])
    assert control["rows:lookup"] == control["rows:business_key"] == {ERIN_MAIL}
    assert control["rows:fingerprint"] == control["rows:blind_index"] == {ERIN_MAIL}


@pytest.mark.parametrize("how", ["forget_pii", "identifiers"])
def test_fingerprints_confirm_no_erased_value(
        how: str, store: tuple[str, Path | None], tmp_path: Path) -> None:
    """Reproduction 2: after ``forget_pii`` or ``forget_subject(identifiers=...)`` (the
    threads live on), the fingerprint column confirms none of 60 guesses of the e-mail."""
    url, db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    _write(url, ring)
    with _saver(url, ring) as saver:
        fps = {r.fingerprint for r in _order_records(saver)} - {None}
        assert len(fps) == 2             # charge and ship (same arguments), for dana and erin
        if how == "forget_pii":
            assert saver.forget_pii("acme", DANA_MAIL.upper(), requested_by="dpo") == 1
        else:
            erased = saver.forget_subject(identifiers=[DANA_MAIL], tenants=["acme"],
                                          requested_by="dpo")
            assert erased.pii_values == {"acme": 1}
        # the records stay (their threads do), and replay without the e-mail
        assert {r.fingerprint for r in _order_records(saver)} - {None} == fps
        orders = _order_graph(saver)
        state = orders.get_state(_cfg("d1-order", DANA)).values
        assert DANA_MAIL not in str(state)
    found = _confirmed(url, ring, db, DANA_MAIL, ["d1-order", "d1"])
    assert {k: v for k, v in found.items() if k.startswith("rows:")} == {}
    assert found.get("raw:business_key") is None and found.get("raw:fingerprint") is None
    control = _confirmed(url, ring, db, ERIN_MAIL, ["e1-order"])
    assert control["rows:fingerprint"] == {ERIN_MAIL}


US_SPELLINGS = ["415-555-0142", "+1 415 555 0142", "1-415-555-0142", "001-415-555-0142",
                "(415) 555-0142", "+1 (415) 555-0142"]
GB_SPELLINGS = ["+44 20 7946 0958", "020 7946 0958", "+44 (0)20 7946 0958",
                "0044 20 7946 0958"]
KEPT_PHONE = "+1 415 555 0177"


@pytest.mark.parametrize("how", ["forget_pii", "identifiers"])
def test_erasing_one_spelling_erases_every_spelling(
        how: str, store: tuple[str, Path | None], tmp_path: Path) -> None:
    """Reproduction 4: the spellings people type of one number share one vault entry, so
    erasing ``415-555-0142`` and ``+44 20 7946 0958`` leaves none of the others restorable."""
    url, _db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    threads = [f"s{i}" for i in range(len(US_SPELLINGS + GB_SPELLINGS))]
    with _saver(url, ring) as saver:
        chat = build_chat_graph(saver)
        for thread, spelling in zip(threads, US_SPELLINGS + GB_SPELLINGS, strict=True):
            chat.invoke({"messages": [HumanMessage(f"call me on {spelling}, or {KEPT_PHONE}")]},
                        _cfg(thread))
        keys = saver.services.tenant_keys("acme")
        tokens = {s: saver.services.pii.public_token(keys, "PHONE_NUMBER", s)
                  for s in US_SPELLINGS + GB_SPELLINGS}
        assert len({tokens[s] for s in US_SPELLINGS}) == 1 and None not in tokens.values()
        assert len({tokens[s] for s in GB_SPELLINGS}) == 1
        if how == "forget_pii":
            assert saver.forget_pii("acme", "415-555-0142", requested_by="dpo") == 1
            assert saver.forget_pii("acme", "+44 20 7946 0958", requested_by="dpo") == 1
        else:
            erased = saver.forget_subject(identifiers=["415-555-0142", "+44 20 7946 0958"],
                                          tenants=["acme"], requested_by="dpo")
            assert erased.pii_values == {"acme": 2}
        for thread, spelling in zip(threads, US_SPELLINGS + GB_SPELLINGS, strict=True):
            text = str(chat.get_state(_cfg(thread)).values["messages"])
            assert spelling not in text and KEPT_PHONE in text
            digits = "".join(c for c in text if c.isdigit())
            assert "4155550142" not in digits and "79460958" not in digits
        assert saver.services.pii.public_token(keys, "PHONE_NUMBER", KEPT_PHONE) is not None


def test_after_forget_subject_and_the_epoch_nothing_confirms_an_erased_value(
        store: tuple[str, Path | None], tmp_path: Path) -> None:
    """Reproduction 3 and the walk: after ``forget_subject`` and the erasure epoch
    (``rotate_keys(retire_old=True)``), every table and -- on PostgreSQL -- every dead tuple
    (``pageinspect``), searched with the keyring the epoch left, confirms no guess of the
    subject's e-mail, by any keyed derivative; erin's (live) still confirms."""
    url, db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    _write(url, ring)
    before = _confirmed(url, ring, db, DANA_MAIL, ["d1-order", "d1"])
    assert before["rows:lookup"] == before["rows:business_key"] == {DANA_MAIL}
    assert before["rows:store_blind_index"] == {DANA_MAIL}   # through her public token
    with _saver(url, ring) as saver:
        saver.forget_subject(DANA, tenants=["acme"], requested_by="dpo")
        report = saver.rotate_keys(retire_old=True)
        assert report.retired and not report.problems
    found = _confirmed(url, ring, db, DANA_MAIL, ["d1-order", "d1"])
    assert found == {}
    control = _confirmed(url, ring, db, ERIN_MAIL, ["e1-order", "e1"])
    assert {"rows:lookup", "rows:business_key", "rows:fingerprint",
            "rows:blind_index", "rows:store_blind_index"} <= set(control)


def test_a_second_entry_under_another_lookup_key_is_re_keyed_as_an_alias_and_still_erased(
        store: tuple[str, Path | None], tmp_path: Path) -> None:
    """A value entered under another lookup key (a row an older writer keyed under the index
    key) is a second entry of the value. The epoch re-keys both under the new version's
    lookup key, the second as an alias lookup; erasure by value finds both."""
    from langgraph_securesaver.redaction import VaultEntry, make_token
    from langgraph_securesaver.registry.pii_lookups import index_derived_key
    url, _db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")

    def vault_rows() -> list[tuple[str, Any]]:
        engine = sa.create_engine(normalize_url(url))
        try:
            with engine.connect() as conn:
                return [(str(r[0]), r[1]) for r in conn.exec_driver_sql(
                    "SELECT lookup, lookup_key FROM securesaver_pii_vault").all()]
        finally:
            engine.dispose()

    with _saver(url, ring) as saver:
        chat = build_chat_graph(saver)
        chat.invoke({"messages": [HumanMessage(f"mail {DANA_MAIL}")]}, _cfg("t1"))
        chat.invoke({"messages": [HumanMessage(f"mail {ERIN_MAIL}")]}, _cfg("t3"))
        keys = saver.services.tenant_keys("acme")
        older = make_token(index_derived_key(keys), "EMAIL_ADDRESS", DANA_MAIL.upper())
        second = saver.services.vault.resolve(
            keys, [VaultEntry(older, "EMAIL_ADDRESS", DANA_MAIL.upper())], thread_id="t2")
        token = second[older].token
        assert token != saver.services.pii.public_token(keys, "EMAIL_ADDRESS", DANA_MAIL)
        assert len(vault_rows()) == 3
        report = saver.rotate_keys(retire_old=True)
        assert report.retired and not report.problems
        rows = vault_rows()
        assert len({key for _l, key in rows}) == 1       # all under the new version's key
        assert sum("~" in lookup for lookup, _k in rows) == 1
        assert saver.services.vault.lookup(keys, [token]) == {token: DANA_MAIL.upper()}
        assert saver.forget_pii("acme", DANA_MAIL, requested_by="dpo") == 2
        assert saver.services.vault.lookup(keys, [token]) == {}
        assert DANA_MAIL not in str(chat.get_state(_cfg("t1")).values["messages"])
        assert ERIN_MAIL in str(chat.get_state(_cfg("t3")).values["messages"])


@pytest.mark.parametrize(("kind", "spellings"), [
    ("EMAIL_ADDRESS", ["Dana.Person@Example.COM", "mailto:dana.person@example.com",
                       "dana.person@example.com."]),
    ("EMAIL_ADDRESS", ["jörg@bücher.de", "JÖRG@BÜCHER.DE", "jörg@xn--bcher-kva.de"]),
    ("CREDIT_CARD", ["4111 1111 1111 1111", "4111-1111-1111-1111", "4111111111111111"]),
    ("IBAN_CODE", ["GB82 WEST 1234 5698 7654 32", "gb82west12345698765432",
                   "GB82-WEST-1234-5698-7654-32"]),
    ("PHONE_NUMBER", US_SPELLINGS),
    ("PHONE_NUMBER", GB_SPELLINGS),
])
def test_the_spellings_people_type_normalize_to_one_value(kind: str,
                                                          spellings: list[str]) -> None:
    from langgraph_securesaver.redaction.normalize import normalize_value
    assert len({normalize_value(kind, s) for s in spellings}) == 1
    other = {"PHONE_NUMBER": KEPT_PHONE, "EMAIL_ADDRESS": ERIN_MAIL,
             "CREDIT_CARD": "4111 1111 1111 1112", "IBAN_CODE": "GB82 WEST 1234 5698 7654 33"}
    assert normalize_value(kind, other[kind]) != normalize_value(kind, spellings[0])


def test_a_business_key_whose_value_the_policy_masks_is_refused(tmp_path: Path) -> None:
    """Masked values would give every customer the same key (one charge replayed to all):
    refused with a typed error before anything runs."""
    from langgraph_securesaver import ConfigurationError
    from langgraph_securesaver.redaction import Action, RedactionPolicy, Redactor
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    policy = RedactionPolicy(actions={"EMAIL_ADDRESS": Action.MASK})
    with _saver(f"sqlite:///{tmp_path / 'agent.db'}", ring,
                redaction=Redactor(policy)) as saver:
        with pytest.raises(ConfigurationError, match="masks or drops"):
            _order_graph(saver).invoke({"customer": DANA_MAIL, "log": []}, _cfg("o1"))
        assert _order_records(saver) == []


def test_the_retention_sweep_deletes_the_tenant_wide_records_its_threads_claimed(
        store: tuple[str, Path | None], tmp_path: Path) -> None:
    """The sweep's batch deletion (not the one-thread path) takes a thread's tenant-wide
    records with it, as ``delete_thread`` does; another thread's stay."""
    import time

    from langgraph_securesaver.tenancy import tenant_scope
    url, _db = store
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    _write(url, ring)
    with _saver(url, ring) as saver:
        with tenant_scope("acme"):
            saver.set_retention("d1-order", idle_ttl=60.0)
        report = saver.prune_expired(time.time() + 3600)
        assert report.deleted == [("acme", "d1-order")]
        left = _order_records(saver)
        assert {(r.thread_id, r.name) for r in left} == {("", "charge"), ("e1-order", "ship")}
        idem = IdempotencyStore.for_saver(saver)
        assert [idem.result("acme", "", r.key) for r in left if r.thread_id == ""] == [
            f"charged {ERIN_MAIL} for {ORDER}"]
