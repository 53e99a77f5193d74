"""Evidence an auditor can check: the subject access export, and signed documents verified
offline with the public key alone.

The export is attacked as the person asking would check it (every thread of theirs, in every
tenant, their personal data readable although it is tokenized at rest) and as the person
beside them would (nothing of theirs in it). Signed documents are attacked as an auditor's
adversary would: one byte changed anywhere, a receipt left out of the set handed over, a
receipt deleted from the database before a listing was signed, a document signed by another
key, a signature file edited. The signing key is searched for in every output, and in the
error reports (with locals) of every way loading and signing can fail.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from typer.testing import CliRunner

from langgraph_securesaver import ConfigurationError, Keyring, SecureSaver
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.evidence import SigningKey, signed_file
from langgraph_securesaver.keys.lifecycle import LEASE_FENCE
from langgraph_securesaver.redaction.tokens import TOKEN_RE
from langgraph_securesaver.registry.schema import normalize_url
from tests.secrecy_helpers import Secrets, capture, leaks
from tests.test_forget_subject import (
    DANA,
    DANA_MAIL,
    DANA_THREADS,
    ERIN,
    ERIN_MAIL,
    SUBJECT_LAYOUT,
    _live_rows,
    _write_people,
)

runner = CliRunner()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'agent.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def people(url: str, tmp_path: Path) -> tuple[str, Path]:
    """Dana and Erin written in several threads of three tenants (SUBJECT_LAYOUT), with
    idempotency records and store items (default settings: redaction on)."""
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    _write_people(url, ring)
    return url, ring


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    private, public = tmp_path / "signing.pem", tmp_path / "public.pem"
    result = runner.invoke(app, ["signing-key", "--out", str(private),
                                 "--public-out", str(public)])
    assert result.exit_code == 0, result.output
    assert os.stat(private).st_mode & 0o077 == 0
    return private, public


def _cli(*args: str, code: int = 0) -> Any:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result


def _verify(public: Path, *files: Path, chain: bool = False) -> Any:
    result = runner.invoke(app, ["verify", "--public-key", str(public), *map(str, files),
                                 *(["--chain"] if chain else [])])
    return result


def _threads(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(t["tenant"], th["thread_id"]) for t in document["tenants"] for th in t["threads"]}


def _human_texts(thread: dict[str, Any]) -> list[str]:
    latest = thread["checkpoints"][0]["channel_values"]["messages"]
    return [m["data"]["content"] for m in latest if m["type"] == "human"]


# --- the export ------------------------------------------------------------------------------
def test_the_export_holds_every_thread_of_the_subject_restored_and_nothing_of_another(
        people: tuple[str, Path]) -> None:
    url, ring = people
    # at rest the e-mail is a token (redaction is on by default): the export must restore it
    assert DANA_MAIL not in _live_rows(url)
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring)) as saver:
        named = saver.export_subject(DANA, tenants=["acme", "globex"])
        every = saver.export_subject(DANA)
        erin = saver.export_subject(ERIN)
        nobody = saver.export_subject("user-nobody")
    # a tenant where the person has nothing is not even named
    assert [t["tenant"] for t in erin["tenants"]] == ["acme", "globex"]
    assert nobody["tenants"] == [] and nobody["counts"]["threads"] == 0
    assert named["format"] == "securesaver-subject-export/1" and named["subject"] == DANA
    assert _threads(named) == DANA_THREADS
    assert _threads(every) == DANA_THREADS | {("initech", "i1")}
    for tenant in named["tenants"]:
        for thread in tenant["threads"]:
            # every turn of the subject, with their e-mail as they wrote it
            assert _human_texts(thread) == [f"hello from {thread['thread_id']}, {DANA_MAIL}",
                                            f"second turn of {thread['thread_id']}"]
            assert len(thread["checkpoints"]) >= 4     # the history, not only the latest
            assert thread["retention"]["state"] == "active"
        # store items: the subject's namespaces, opened and restored
        items = {(tuple(i["namespace"]), i["key"]): i["value"] for i in tenant["store_items"]}
        assert set(items) == {((DANA, "memories"), "m1"), ((DANA,), "profile")}
        assert items[((DANA, "memories"), "m1")] == {"note": f"dana likes tea, {DANA_MAIL}"}
    acme = next(t for t in named["tenants"] if t["tenant"] == "acme")
    d1 = next(t for t in acme["threads"] if t["thread_id"] == "d1")
    assert [(r["key"], r["state"], r["result"]) for r in d1["idempotency_records"]] == [
        ("k-d1", "completed", {"refund": "ok"})]
    text = json.dumps(every)
    assert TOKEN_RE.search(text) is None           # nothing left tokenized
    assert ERIN not in text and ERIN_MAIL not in text and "erin likes" not in text
    others = {th for _t, th, s, _h in SUBJECT_LAYOUT if s != DANA}
    assert not others & {th for _t, th in _threads(every)}
    assert named["counts"] == {"tenants": 2, "threads": len(DANA_THREADS),
                               "checkpoints": sum(len(th["checkpoints"])
                                                  for t in named["tenants"]
                                                  for th in t["threads"]),
                               "store_items": 4}


def test_the_export_follows_the_scope_rule_pages_and_the_async_twin_agrees(
        people: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from langgraph_securesaver import AccessDenied, tenant_scope
    from langgraph_securesaver.evidence import export as export_module
    url, ring = people
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring)) as saver:
        with tenant_scope("globex"):
            scoped = saver.export_subject(DANA)
            with pytest.raises(AccessDenied):
                saver.export_subject(DANA, tenants=["acme"])
        sync = saver.export_subject(DANA)
        # read two checkpoints at a time: the same history, in the same order
        monkeypatch.setattr(export_module, "PAGE", 2)
        paged = saver.export_subject(DANA)
    assert _threads(scoped) == {(t, th) for t, th in DANA_THREADS if t == "globex"}
    assert sync["counts"]["checkpoints"] > 2 * len(DANA_THREADS)
    paged.pop("exported_at")

    async def run() -> dict[str, Any]:
        async with SecureSaver.afrom_url(url, keyring=Keyring.from_file(ring)) as asaver:
            return await asaver.aexport_subject(DANA)
    asynced = asyncio.run(run())
    for doc in (sync, asynced):
        doc.pop("exported_at")
    assert asynced == sync and paged == sync


def test_export_subject_cli_writes_a_signed_export_that_verifies(
        people: tuple[str, Path], keys: tuple[Path, Path], tmp_path: Path) -> None:
    url, ring = people
    private, public = keys
    out = tmp_path / "dana.json"
    _cli("export-subject", "--url", url, "--keyring", ring, "--subject", DANA,
         "--tenant", "acme", "--tenant", "globex", "--out", out, "--signing-key", private)
    document = json.loads(out.read_text())
    assert _threads(document) == DANA_THREADS and DANA_MAIL in out.read_text()
    assert _verify(public, out).exit_code == 0
    # printed without --out, the subject read from stdin (out of the process list)
    printed = runner.invoke(app, ["export-subject", "--url", url, "--keyring", str(ring),
                                  "--subject", "-", "--tenant", "acme"], input=DANA + "\n")
    assert printed.exit_code == 0, printed.output
    assert _threads(json.loads(printed.stdout)) == {x for x in DANA_THREADS if x[0] == "acme"}
    # once the subject is forgotten, the export holds nothing of them
    _cli("forget-subject", "--url", url, "--keyring", ring, "--subject", DANA, "--tenant",
         "acme", "--yes")
    after = _cli("export-subject", "--url", url, "--keyring", ring, "--subject", DANA,
                 "--tenant", "acme").stdout
    assert json.loads(after)["tenants"] == [] and DANA_MAIL not in after
    # --signing-key needs somewhere to put the signature; an unknown tenant is refused
    _cli("export-subject", "--url", url, "--keyring", ring, "--subject", DANA,
         "--signing-key", private, code=2)
    _cli("export-subject", "--url", url, "--keyring", ring, "--subject", DANA,
         "--tenant", "nobody", code=2)


# --- signed documents ------------------------------------------------------------------------
def _signed_documents(url: str, ring: Path, private: Path, tmp_path: Path) -> list[Path]:
    export, receipt, listing = (tmp_path / n for n in ("export.json", "receipt.json",
                                                       "events.json"))
    _cli("export-subject", "--url", url, "--keyring", ring, "--subject", DANA, "--out", export,
         "--signing-key", private)
    _cli("forget-subject", "--url", url, "--keyring", ring, "--subject", ERIN, "--yes",
         "--out", receipt, "--signing-key", private)
    _cli("events", "--url", url, "--keyring", ring, "--format", "json", "--out", listing,
         "--signing-key", private)
    return [export, receipt, listing]


def test_signed_export_receipt_and_listing_verify_and_one_changed_byte_fails(
        people: tuple[str, Path], keys: tuple[Path, Path], tmp_path: Path) -> None:
    url, ring = people
    private, public = keys
    documents = _signed_documents(url, ring, private, tmp_path)
    receipt = json.loads(documents[1].read_text())["receipts"]
    assert [r["action"] for r in receipt] == ["forgotten"] and receipt[0]["chain"]["seq"] >= 1
    result = _verify(public, *documents)
    assert result.exit_code == 0, result.output
    for path in documents:
        original = path.read_bytes()
        for at in (0, len(original) // 2, len(original) - 2):
            changed = bytearray(original)
            changed[at] ^= 0x01
            path.write_bytes(bytes(changed))
            result = _verify(public, path)
            assert result.exit_code == 1, (path.name, at, result.output)
            assert "altered" in result.output
        path.write_bytes(original)
        sig = path.with_name(path.name + ".sig")
        signature = sig.read_bytes()
        for at in (10, len(signature) // 2, len(signature) - 3):
            changed = bytearray(signature)
            changed[at] ^= 0x01
            sig.write_bytes(bytes(changed))
            assert _verify(public, path).exit_code == 1, (sig.name, at)
        sig.write_bytes(signature)
        assert _verify(public, path).exit_code == 0
    # signed by another key; not signed at all; cannot run
    other = tmp_path / "other"
    other.mkdir()
    _cli("signing-key", "--out", other / "k.pem", "--public-out", other / "p.pem")
    result = _verify(other / "p.pem", documents[0])
    assert result.exit_code == 1 and "another key" in result.output
    documents[1].with_name(documents[1].name + ".sig").unlink()
    assert _verify(public, documents[1]).exit_code == 1
    assert _verify(public, tmp_path / "missing.json").exit_code == 2
    assert _verify(private, documents[0]).exit_code == 2       # not a public key
    assert _verify(tmp_path / "nokey.pem", documents[0]).exit_code == 2


def _receipt_rows(url: str) -> list[tuple[int, str, int]]:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.exec_driver_sql(  # type: ignore[misc]
                "SELECT id, tenant, seq FROM securesaver_receipts ORDER BY id").all()]
    finally:
        engine.dispose()


def _delete_receipt(url: str, row_id: int) -> None:
    engine = sa.create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM securesaver_receipts WHERE id = :i"),
                         {"i": row_id})
    finally:
        engine.dispose()


def test_a_receipt_removed_from_a_chain_is_found_with_the_public_key_alone(
        people: tuple[str, Path], keys: tuple[Path, Path], tmp_path: Path) -> None:
    url, ring = people
    private, public = keys
    receipts = []
    for i, subject in enumerate((DANA, ERIN, "user-nobody")):   # three receipts of acme
        receipts.append(tmp_path / f"r{i}.json")
        _cli("forget-subject", "--url", url, "--keyring", ring, "--subject", subject,
             "--tenant", "acme", "--yes", "--out", receipts[-1], "--signing-key", private)
    seqs = [json.loads(r.read_text())["receipts"][0]["chain"]["seq"] for r in receipts]
    assert seqs == [1, 2, 3]
    assert _verify(public, *receipts, chain=True).exit_code == 0
    # the one in the middle, or the first, left out of the set handed over
    for kept in ([receipts[0], receipts[2]], [receipts[1], receipts[2]]):
        result = _verify(public, *kept, chain=True)
        assert result.exit_code == 1 and "missing" in result.output, result.output
    # a listing of whole chains (no filter) checks itself
    listing = tmp_path / "receipts.json"
    _cli("events", "--url", url, "--keyring", ring, "--kind", "receipt", "--format", "json",
         "--out", listing, "--signing-key", private)
    assert _verify(public, listing).exit_code == 0
    assert _verify(public, listing, *receipts, chain=True).exit_code == 0
    # a signer made to leave one receipt out of the listing: still found
    document = json.loads(listing.read_text())
    document["entries"] = [e for e in document["entries"] if e["chain"]["seq"] != 2
                           or e["tenant"] != "acme"]
    with signed_file(listing, "event-listing", SigningKey.load(private)) as target:
        json.dump(document, target)
    result = _verify(public, listing)
    assert result.exit_code == 1 and "missing" in result.output
    # a receipt deleted from the database before the listing was signed
    middle = next(i for i, tenant, seq in _receipt_rows(url) if tenant == "acme" and seq == 2)
    _delete_receipt(url, middle)
    _cli("events", "--url", url, "--keyring", ring, "--kind", "receipt", "--format", "json",
         "--out", listing, "--signing-key", private)
    result = _verify(public, listing)
    assert result.exit_code == 1 and "positions 2 are missing" in result.output
    # the newest receipt deleted: the listing's own head says so
    newest = max(i for i, tenant, _s in _receipt_rows(url) if tenant == "acme")
    _delete_receipt(url, newest)
    _cli("events", "--url", url, "--keyring", ring, "--kind", "receipt", "--tenant", "acme",
         "--format", "json", "--out", listing, "--signing-key", private)
    result = _verify(public, listing)
    assert result.exit_code == 1 and "newest entries are missing" in result.output


def test_signed_audit_reports_and_prune_documents_verify(
        people: tuple[str, Path], keys: tuple[Path, Path], tmp_path: Path) -> None:
    from langgraph_securesaver import RetentionPolicy
    url, ring = people
    private, public = keys
    reports = []
    for fmt in ("json", "html"):
        reports.append(tmp_path / f"audit.{fmt}")
        result = runner.invoke(app, ["audit", "--url", url, "--keyring", str(ring), "--format",
                                     fmt, "--out", str(reports[-1]), "--signing-key",
                                     str(private)])
        assert result.exit_code in (0, 1), result.output      # 1: a finding, still written
    _cli("audit", "--url", url, "--signing-key", private, code=2)   # a table is not signed
    with SecureSaver.from_url(url, keyring=Keyring.from_file(ring)) as saver:
        saver.set_tenant_retention("globex", RetentionPolicy(idle_ttl=1))
    pruned = tmp_path / "prune.json"
    import time
    time.sleep(LEASE_FENCE + 0.2)   # expired (idle 1 s) and past the write lease
    _cli("prune", "--url", url, "--keyring", ring, "--tenant", "globex", "--active-grace", "0s",
         "--out", pruned, "--signing-key", private)
    document = json.loads(pruned.read_text())
    deleted = {(d["tenant"], d["thread_id"]) for d in document["report"]["deleted"]}
    assert {(r["tenant"], r["thread_id"]) for r in document["receipts"]} >= deleted
    assert deleted >= {("globex", "g1"), ("globex", "g2")}
    result = _verify(public, *reports, pruned)
    assert result.exit_code == 0, result.output
    changed = bytearray(reports[1].read_bytes())
    changed[len(changed) // 3] ^= 0x20
    reports[1].write_bytes(bytes(changed))
    assert _verify(public, reports[1]).exit_code == 1


# --- the signing key never leaks -------------------------------------------------------------
def _key_secrets(private: Path) -> Secrets:
    text = private.read_text()
    key = serialization.load_pem_private_key(text.encode(), None)
    found = Secrets()
    found.add_key("seed", key.private_bytes(  # type: ignore[union-attr]
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
        serialization.NoEncryption()))
    found.add_key("pkcs8", key.private_bytes(  # type: ignore[union-attr]
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    body = "".join(line for line in text.splitlines() if not line.startswith("-----"))
    found.add_text("pem", body[:24])
    return found


def _no_key_in(text: str, found: Secrets) -> None:
    hits = [(name, needle[:8]) for name, needle in found.needles() if needle in text]
    assert not hits, hits


def test_the_signing_key_is_in_no_output_log_or_traceback_with_locals(
        people: tuple[str, Path], keys: tuple[Path, Path], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    import logging
    url, ring = people
    private, public = keys
    found = _key_secrets(private)
    # the search works: the key's own file is found
    assert any(needle in private.read_text() for _n, needle in found.needles())
    caplog.set_level(logging.DEBUG)
    made = runner.invoke(app, ["signing-key", "--out", str(tmp_path / "second.pem"),
                               "--public-out", str(tmp_path / "second.pub")])
    assert made.exit_code == 0
    _no_key_in(made.output, _key_secrets(tmp_path / "second.pem"))
    outputs = []
    for args in (["--verbose", "export-subject", "--url", url, "--keyring", str(ring),
                  "--subject", DANA, "--out", str(tmp_path / "e.json"), "--signing-key",
                  str(private)],
                 ["--verbose", "forget-subject", "--url", url, "--keyring", str(ring),
                  "--subject", ERIN, "--yes", "--out", str(tmp_path / "r.json"),
                  "--signing-key", str(private)],
                 ["--verbose", "events", "--url", url, "--format", "json", "--out",
                  str(tmp_path / "v.json"), "--signing-key", str(private)],
                 ["verify", "--public-key", str(public), str(tmp_path / "e.json"),
                  str(tmp_path / "r.json"), str(tmp_path / "v.json")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    for path in tmp_path.iterdir():
        if path.suffix in (".json", ".sig"):
            outputs.append(path.read_text())
    outputs.append(caplog.text)
    _no_key_in("\n".join(outputs), found)
    assert repr(SigningKey.load(private)).startswith("<SigningKey ed25519:")

    # every way loading and signing fails: reports with locals hold none of the key
    text = private.read_text()
    loose = tmp_path / "loose.pem"
    loose.write_text(text)
    os.chmod(loose, 0o644)                                  # readable by others: refused
    cut = tmp_path / "cut.pem"
    cut.write_text(text[: len(text) // 2 + 20])             # half the key: does not parse
    os.chmod(cut, 0o600)
    public_as_private = tmp_path / "pub-as-private.pem"
    public_as_private.write_text(public.read_text())
    os.chmod(public_as_private, 0o600)
    for bad in (loose, cut, public_as_private):
        exc = capture(lambda bad=bad: SigningKey.load(bad))
        assert isinstance(exc, ConfigurationError), repr(exc)
        assert not leaks(exc, found), bad.name
        result = runner.invoke(app, ["events", "--url", url, "--format", "json", "--out",
                                     str(tmp_path / "x.json"), "--signing-key", str(bad)])
        assert result.exit_code == 2
        _no_key_in(result.output, found)
    loaded = SigningKey.load(private)
    exc = capture(lambda: _sign_into(loaded, tmp_path / "no-such-dir" / "out.json"))
    assert not leaks(exc, found)
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(loaded)


def _sign_into(key: SigningKey, path: Path) -> None:
    with signed_file(path, "x", key) as target:
        target.write("{}")


# --- the chain check itself, on documents made here ------------------------------------------
def _entry(seq: int, chain: str = "acme", table: str = "securesaver_receipts",
           mac: str | None = None) -> dict[str, Any]:
    return {"chain": {"table": table, "chain": chain, "seq": seq,
                      "prev_mac": "" if seq == 1 else f"m{seq - 1}", "mac": mac or f"m{seq}"}}


def test_the_chain_check_finds_gaps_rewrites_and_missing_tails() -> None:
    from langgraph_securesaver.evidence.chains import check

    def doc(*seqs: int, head: int | None = None, **extra: Any) -> dict[str, Any]:
        heads = [] if head is None else [{"table": "securesaver_receipts", "chain": "acme",
                                          "seq": head, "mac": f"m{head}"}]
        return {"receipts": [_entry(s) for s in seqs], "chain_heads": heads, **extra}

    assert check([doc(1, 2, 3, head=3)], whole=True) == []
    # entries written after the head was read are newer, not missing
    assert check([doc(1, 2, 3, head=2)], whole=True) == []
    assert "positions 2 are missing" in check([doc(1, 3)], whole=True)[0]
    assert "positions 1-2 are missing" in check([doc(3)], whole=True)[0]
    assert "newest entries are missing" in check([doc(1, 2, head=3)], whole=True)[0]
    # without ``whole`` a gap is no finding, a broken link between neighbours is
    assert check([doc(1, 3)], whole=False) == []
    broken = doc(1, 2)
    broken["receipts"][1]["chain"]["prev_mac"] = "forged"
    assert "does not follow" in check([broken], whole=False)[0]
    # a position whose entry changed between two documents (a chain rewritten since)
    rewritten = {"receipts": [_entry(2, mac="other")]}
    assert "two different entries" in check([doc(1, 2), rewritten], whole=False)[0]
    # chains are apart: per table and per tenant
    other = {"receipts": [_entry(1, chain="globex"), _entry(1, table="securesaver_events")]}
    assert check([doc(1, 2), other], whole=True) == []


def test_a_tampered_checkpoint_fails_the_export_and_leaves_no_signature(
        tmp_path: Path, keys: tuple[Path, Path]) -> None:
    """Fail closed: a row that does not authenticate stops the export (exit 2, the row
    named); the signature of an earlier export of the same file is gone, so the half-written
    file never verifies."""
    import sqlite3
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    ring = Keyring.generate().save(tmp_path / "keyring.json")
    _write_people(url, ring)
    private, public = keys
    out = tmp_path / "dana.json"
    _cli("export-subject", "--url", url, "--keyring", ring, "--subject", DANA, "--out", out,
         "--signing-key", private)
    assert _verify(public, out).exit_code == 0
    with sqlite3.connect(tmp_path / "agent.db") as conn:
        rowid, blob = conn.execute("SELECT rowid, checkpoint FROM checkpoints WHERE thread_id "
                                   "LIKE '%:d2' LIMIT 1").fetchone()
        changed = bytearray(blob)
        changed[-5] ^= 0x01
        conn.execute("UPDATE checkpoints SET checkpoint = ? WHERE rowid = ?",
                     (bytes(changed), rowid))
    result = runner.invoke(app, ["export-subject", "--url", url, "--keyring", str(ring),
                                 "--subject", DANA, "--out", str(out), "--signing-key",
                                 str(private)])
    assert result.exit_code == 2 and "d2" in result.output, result.output
    assert not out.with_name(out.name + ".sig").exists()
    assert _verify(public, out).exit_code == 1
