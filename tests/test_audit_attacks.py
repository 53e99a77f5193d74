"""The SQL audit under attack: rows a writer with database access crafts (odd timestamps,
metadata, channel values, blobs, PII kinds), awkward ids and collations, clocks on a bucket
boundary, and careless consumers. The audit must not raise, must report what the row walk
(``_audit_walk``) reports, and must not hide stored data."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from langgraph_securesaver import SecureSaver, tenant_scope
from langgraph_securesaver.audit.inventory import _audit_walk, audit, iter_audit
from langgraph_securesaver.keys.crypto import THREAD_KEY_VERSION
from langgraph_securesaver.keys.provider import NoKeys
from langgraph_securesaver.tenancy import thread_prefix
from tests.test_audit import DAY, build


@pytest.fixture(scope="module")
def redactor():
    from langgraph_securesaver.redaction import Redactor
    return Redactor()


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


T0 = "2026-01-01T00:00:00+00:00"
# clocks: now, on a bucket boundary of T0 (and between a truncated and the exact bound), a
# clock that puts T0-ish texts on either side of an offset, and careless far clocks
NOWS = [None, _epoch(T0) + DAY, _epoch(T0) + DAY + 0.75, _epoch(T0) + 7 * DAY,
        _epoch(T0) + 365 * DAY, _epoch("2026-01-02T05:30:00+00:00"), 2.6e11, -1e10, 0.0]


def _compare(saver: SecureSaver, nows: list[float | None] = NOWS,
             tenants: tuple[str | None, ...] = (None, "acme", "globex")) -> dict[str, Any]:
    """The SQL audit equals the walk for every tenant filter and clock; the last report."""
    names = saver.registry.tenants()
    first: dict[str, Any] = {}
    for now in nows:
        at = time.time() if now is None else now
        for tenant in tenants:
            new = audit(saver, tenant=tenant, now=at).as_dict()
            old = _audit_walk(saver, names, tenant, at, None).as_dict()
            for key in old:
                assert new[key] == old[key], (key, tenant, now)
            first = first or new
    return first


def _unsealed(report: dict[str, Any]) -> dict[str, int]:
    out = {}
    for p in report["problems"]:
        if "never writes" in p:
            out[p.split(" of ")[1].split()[0]] = int(p.split()[0])
    return out


_COPY_CHECKPOINT = (
    "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
    "type, checkpoint, metadata) SELECT :tid, checkpoint_ns, checkpoint_id || :n, "
    "parent_checkpoint_id, type, {checkpoint}, {metadata} FROM checkpoints "
    "WHERE thread_id LIKE :src ORDER BY checkpoint_id LIMIT 1")


def _copies(conn: sa.Connection, name: str, values: list[Any], *, checkpoint: str = "checkpoint",
            metadata: str = "metadata", tenant: str = "acme", raw: bool = False) -> str:
    """Copies of one of t-plain's checkpoints under an unregistered thread of ``tenant``, one
    per value (bound as :v, as JSON text, or as given when ``raw``); no blobs or writes."""
    tid = thread_prefix(tenant) + name
    sql = _COPY_CHECKPOINT.format(checkpoint=checkpoint, metadata=metadata)
    for n, value in enumerate(values):
        conn.execute(sa.text(sql), {"tid": tid, "n": f"-{n}", "src": "%:t-plain",
                                    "v": value if raw else json.dumps(value)})
    return tid


_TS = "jsonb_set(checkpoint, '{ts}', CAST(:v AS jsonb))"
_ODD_TS = {
    "num-date": [20260101], "object": [{"a": [1]}], "array": [[1, 2]], "bool": [True],
    "null": [None], "long": ["2026-01-01T" + "0" * 20000],
    "year-5-digits": ["10000-01-01T00:00:00+00:00"],
    "before-1970": ["0001-01-01T00:00:00+00:00", "1969-12-31T23:59:59.999999+00:00"],
    "year-9999": ["9999-12-31T23:59:59.999999+00:00"],
    "offset": ["2026-01-01T10:00:00+05:00", "2026-01-01T06:00:00+00:00"],
    "zulu": ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.000001+00:00"],
    "naive-and-date": ["2026-01-01T00:00:00", "2026-01-01"],
    "short-fraction": ["2026-01-01T00:00:00.5+00:00", "2026-01-01T00:00:00.25+00:00"],
    "huge-number": [1.5e300], "edge": [T0, "2026-01-01T00:00:00.500000+00:00"],
    "edge-2": ["2025-12-31T23:59:59.999999+00:00", "2026-01-01T00:00:00.000001+00:00"],
    "leap-days": ["2024-02-29T12:00:00+00:00", "2000-02-29T00:00:00+00:00"],
    "separators": ["2026-01-01t00:00:00+00:00", "2026-01-01T00:00:00,250000+00:00",
                   "2026-01-01T00:00:00-00:00", "2026-W01-1T00:00:00+00:00"],
}
# texts of LangGraph's ts shape that are no date: PostgreSQL's statement tests the shape with
# LIKE (a regular expression per row cost +2.7 s on the 100k-thread build), so these are aged
# by their text there; SQLite's decodes each row as the walk does
_SHAPED_NOT_DATES = {
    "bad-day": ["2026-02-30T00:00:00+00:00"], "year-0": ["0000-01-01T00:00:00+00:00"],
    "shape": ["abcd-ef-ghT00:00:00+00:00"],
    "not-leap": ["2100-02-29T00:00:00+00:00", "2024-02-29T12:00:00+00:00"],
    "shaped-not-dates": ["2026-01-01T24:00:00+00:00", "2026-01-01T23:59:60+00:00",
                         "\uff12026-01-01T00:00:00+00:00", "2026-00-10T00:00:00+00:00"],
}


@pytest.mark.postgres
def test_odd_checkpoint_timestamps_age_like_the_walk(pg_url: str, redactor) -> None:
    """Whatever ``ts`` holds (not a string, not ISO, not UTC, out of range, on a boundary),
    checkpoint counts, bytes, first/last activity and age buckets are the walk's."""
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            for name, values in _ODD_TS.items():
                _copies(conn, name, values, checkpoint=_TS)
            _copies(conn, "no-ts", [0], checkpoint="checkpoint - 'ts'")
        report = _compare(saver)
    threads = {t["thread_id"]: t for t in report["threads"]}
    assert threads["offset"]["first_checkpoint"] == "2026-01-01T05:00:00+00:00"
    assert threads["num-date"]["first_checkpoint"] == "2026-01-01T00:00:00+00:00"
    assert threads["long"]["checkpoints"] == 1 and threads["long"]["stored_bytes"] > 0


_AGE_FIELDS = ("first_checkpoint", "last_checkpoint")


@pytest.mark.postgres
def test_shaped_texts_that_are_no_date_are_counted_and_only_their_age_differs(
        pg_url: str, redactor) -> None:
    """The accepted divergence, bounded: on PostgreSQL a ts of LangGraph's shape that is no
    date is aged by its text (the walk: unknown age). The audit does not raise, every
    checkpoint and byte is reported, and nothing but those threads' first/last checkpoint and
    the age buckets differs from the walk."""
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            for name, values in _SHAPED_NOT_DATES.items():
                _copies(conn, name, values, checkpoint=_TS)
        names = saver.registry.tenants()
        for now in NOWS:
            at = time.time() if now is None else now
            for tenant in (None, "acme", "globex"):
                new = audit(saver, tenant=tenant, now=at).as_dict()
                old = _audit_walk(saver, names, tenant, at, None).as_dict()
                assert len(new["threads"]) == len(old["threads"])
                for a, b in zip(new["threads"], old["threads"], strict=True):
                    if a["thread_id"] in _SHAPED_NOT_DATES:
                        a = {k: v for k, v in a.items() if k not in _AGE_FIELDS}
                        b = {k: v for k, v in b.items() if k not in _AGE_FIELDS}
                    assert a == b, (tenant, now)
                assert new["tenants"] == old["tenants"]
                assert new["problems"] == old["problems"]
                for key, per in old["stored_bytes_by_age"].items():
                    assert sum(new["stored_bytes_by_age"][key].values()) == sum(per.values())
        every = audit(saver).as_dict()
    shaped = {t["thread_id"]: t for t in every["threads"] if t["thread_id"] in _SHAPED_NOT_DATES}
    assert {k: t["checkpoints"] for k, t in shaped.items()} == {
        k: len(v) for k, v in _SHAPED_NOT_DATES.items()}


def test_odd_checkpoint_timestamps_on_sqlite(tmp_path: Path, redactor) -> None:
    """SQLite's statement reads a row's ts from the document decoded as the walk decodes it:
    a ts that is no string, a long one (no fixstr), another offset, or a map holding ``ts``
    twice (the decoder keeps the last) ages as in the walk."""
    import sqlite3

    import ormsgpack
    db = tmp_path / "agent.db"
    build(f"sqlite:///{db}", redactor)
    with sqlite3.connect(db) as conn:
        base = conn.execute(
            "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
            "checkpoint, metadata FROM checkpoints WHERE thread_id LIKE '%:t-plain' "
            "ORDER BY checkpoint_id LIMIT 1").fetchone()
        doc = ormsgpack.unpackb(base[5])
        assert list(doc)[:2] == ["v", "ts"]
        rest = ormsgpack.packb({k: v for k, v in doc.items() if k != "ts"})
        twice = (bytes([rest[0] + 2]) + ormsgpack.packb("ts") + ormsgpack.packb(T0) + rest[1:]
                 + ormsgpack.packb("ts") + ormsgpack.packb("2025-06-01T00:00:00+00:00"))
        bodies = {name: [ormsgpack.packb({**doc, "ts": v}) for v in values]
                  for name, values in {**_ODD_TS, **_SHAPED_NOT_DATES}.items()}
        bodies["twice"] = [twice]
        for name, blobs in bodies.items():
            for n, blob in enumerate(blobs):
                conn.execute("INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (thread_prefix("acme") + name, base[1], f"{base[2]}-{n}", base[3],
                              base[4], blob, base[6]))
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=NoKeys(), redaction=None) as saver:
        report = _compare(saver)
    threads = {t["thread_id"]: t for t in report["threads"]}
    assert threads["twice"]["first_checkpoint"] == "2025-06-01T00:00:00+00:00"
    assert threads["num-date"]["first_checkpoint"] == "2026-01-01T00:00:00+00:00"
    assert threads["shaped-not-dates"]["first_checkpoint"] is None


_MD = "jsonb_set(metadata, '{__securesaver__}', CAST(:v AS jsonb))"
_ODD_METADATA = {
    "md-number": [7], "md-object": [{"a": 1}], "md-array": [[1]], "md-null": [None],
    "md-plain": ["garbage"], "md-prefix-junk": ["ss1.U1MB!!!!!!!!!!!!"],
    "md-case": ["SS1.U1MBAAAAAQ" + "A" * 60], "md-long": ["ss1.U1MB" + "A" * 100_000],
    "md-empty": [""],
}
# not a string, or a string that is no text token's head: SecureSaver never wrote these
_MD_UNSEALED = ("md-number", "md-object", "md-array", "md-null", "md-plain", "md-case",
                "md-empty", "md-scalar", "md-list", "md-json-null", "md-none")


@pytest.mark.postgres
def test_odd_sealed_metadata_is_counted_like_the_walk(pg_url: str, redactor) -> None:
    """``__securesaver__`` that is no string, no token's head (a plain string, the prefix in
    another case), a token's head over junk: the same unsealed count and key versions as the
    walk; every row that does not start like a text token is counted."""
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            for name, values in _ODD_METADATA.items():
                _copies(conn, name, values, metadata=_MD)
            for name, body in (("md-scalar", '"ss1.U1MB"'), ("md-list", "[1]"),
                               ("md-json-null", "null"), ("md-none", "{}")):
                _copies(conn, name, [body], metadata="CAST(:v AS jsonb)", raw=True)
        report = _compare(saver, nows=[None])
    threads = {t["thread_id"]: t for t in report["threads"]}
    for name in _MD_UNSEALED:
        assert threads[name]["checkpoints"] == 1 and threads[name]["key_versions"] == []
    assert _unsealed(report)["checkpoints"] == len(_MD_UNSEALED)


@pytest.mark.postgres
def test_a_truncated_text_token_names_its_header_version(pg_url: str, redactor) -> None:
    """Accepted divergence, tampered rows only: the statement reads a text token's key
    version from its head (characters 9-16), the walk decodes the whole token and names none
    for one too short to be a ciphertext. Nothing raises and everything else is the walk's."""
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            _copies(conn, "md-short", ["ss1.U1MBAAAACQAA"], metadata=_MD)
        names = saver.registry.tenants()
        now = time.time()
        new = audit(saver, now=now).as_dict()
        old = _audit_walk(saver, names, None, now, None).as_dict()
    short = [t for t in new["threads"] if t["thread_id"] == "md-short"]
    assert short[0]["key_versions"] == [9] and short[0]["checkpoints"] == 1
    assert next(t for t in old["threads"] if t["thread_id"] == "md-short")["key_versions"] == []
    for report in (new, old):
        for t in report["threads"] + report["tenants"]:
            t["key_versions"] = [v for v in t["key_versions"] if v != 9]
    assert new == old


def test_odd_sealed_metadata_on_sqlite(tmp_path: Path, redactor) -> None:
    """SQLite's statement: the text token's prefix is matched case-sensitively (LIKE is not),
    and a string that is no token's head is counted, as in the walk."""
    from langgraph_securesaver.keys.tokens import from_text, to_text
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    md = "json_set(CAST(metadata AS TEXT), '$.__securesaver__', json(:v))"
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            sealed = conn.execute(sa.text(
                "SELECT json_extract(CAST(metadata AS TEXT), '$.__securesaver__') FROM "
                "checkpoints LIMIT 1")).scalar_one()
            token = from_text(sealed)
            other = to_text(token[:3] + (9).to_bytes(4, "big") + token[7:])   # key version 9
            for name, value in (("md-case", "SS1." + other[4:]), ("md-plain", "garbage"),
                                ("md-number", 7), ("md-null", None)):
                _copies(conn, name, [value], metadata=md)
        report = _compare(saver, nows=[None])
    threads = {t["thread_id"]: t for t in report["threads"]}
    assert threads["md-case"]["key_versions"] == [THREAD_KEY_VERSION]  # its values' key only
    assert _unsealed(report) == {"checkpoints": 4}


_CV = "jsonb_set(checkpoint, '{channel_values}', CAST(:v AS jsonb))"


@pytest.mark.postgres
def test_odd_checkpoint_bodies_and_channel_values(pg_url: str, redactor) -> None:
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            _copies(conn, "cv", [[1], "s", 5, None, {}, {"a": None}, {"a": {"b": 1}}],
                    checkpoint=_CV)
            _copies(conn, "body", ['"text"', "5", "null", "[]", "{}"],
                    checkpoint="CAST(:v AS jsonb)", raw=True)
        report = _compare(saver, nows=[None])
    threads = {t["thread_id"]: t for t in report["threads"]}
    assert threads["cv"]["checkpoints"] == 7 and threads["body"]["checkpoints"] == 5
    # {"a": null} and {"a": {"b": 1}} are values in the clear; the 4 bodies not an object
    assert _unsealed(report)["checkpoints"] == 2 + 4


@pytest.mark.postgres
def test_odd_blobs_and_writes(pg_url: str, redactor) -> None:
    """NULL, empty, short and mistyped blobs / writes: bytes, versions and unsealed counts
    are the walk's (a header with the magic on a value too short to be a ciphertext names
    no key version)."""
    build(pg_url, redactor)
    header = b"SS\x01" + (9).to_bytes(4, "big")
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            tid = _copies(conn, "blobs", [0])
            token = bytes(conn.execute(sa.text(
                "SELECT blob FROM checkpoint_blobs WHERE type = 'bytes' LIMIT 1")).scalar_one())
            rows = [("bytes", None), ("empty", None), ("bytes", b""), ("bytes", header),
                    ("bytes", header + b"x" * 8), ("json", token), ("msgpack", b"\x93\x01")]
            for n, (type_, blob) in enumerate(rows):
                conn.execute(sa.text(
                    "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, "
                    "type, blob) VALUES (:t, '', 'c', :v, :ty, :b)"),
                    {"t": tid, "v": str(n), "ty": type_, "b": blob})
            for n, (type_, blob) in enumerate([(None, b"x"), ("bytes", header),
                                               ("bytes", b""), ("json", token)]):
                conn.execute(sa.text(
                    "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, "
                    "task_id, idx, channel, type, blob, task_path) VALUES (:t, '', 'c', 'k', "
                    ":i, 'c', :ty, :b, '')"), {"t": tid, "i": n, "ty": type_, "b": blob})
            # rows without a value still name their threads (one unknown to every tenant)
            for tid in (thread_prefix("acme") + "null-only", "tffffffffffffffffffffffff:null"):
                conn.execute(sa.text(
                    "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, "
                    "type, blob) VALUES (:t, '', 'c', '1', 'empty', NULL)"), {"t": tid})
        report = _compare(saver, nows=[None])
    threads = {t["thread_id"]: t for t in report["threads"]}
    assert threads["null-only"]["stored_bytes"] == 0 and not threads["null-only"]["registered"]
    assert [o["thread_id"] for o in report["orphans"]] == ["tffffffffffffffffffffffff:null"]
    assert 9 not in threads["blobs"]["key_versions"]
    assert _unsealed(report) == {"checkpoint_blobs": 5, "checkpoint_writes": 4}


@pytest.mark.postgres
def test_large_toasted_blobs_and_writes_name_their_versions(pg_url: str, redactor) -> None:
    """Values PostgreSQL keeps compressed or out of line (TOAST): the statement reads only a
    slice of each (its header), and still reports their bytes and key versions as the walk."""
    import os
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            tid = _copies(conn, "big", [0])
            token = bytes(conn.execute(sa.text(
                "SELECT blob FROM checkpoint_blobs WHERE type = 'bytes' LIMIT 1")).scalar_one())
            # version 7 and 70 (past the bit mask): compressible (compressed inline) and
            # random (stored out of line, uncompressed) bodies of 300 kB
            for n, (version, body) in enumerate([(7, b"ab" * 150_000),
                                                 (70, os.urandom(300_000))]):
                blob = token[:3] + version.to_bytes(4, "big") + token[7:] + body
                conn.execute(sa.text(
                    "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, "
                    "type, blob) VALUES (:t, '', 'c', :v, 'bytes', :b)"),
                    {"t": tid, "v": str(n), "b": blob})
                conn.execute(sa.text(
                    "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, "
                    "task_id, idx, channel, type, blob, task_path) VALUES (:t, '', 'c', 'k', "
                    ":i, 'c', 'bytes', :b, '')"), {"t": tid, "i": n, "b": blob})
            stored = conn.execute(sa.text(
                "SELECT pg_column_size(blob) < length(blob) FROM checkpoint_blobs "
                "WHERE thread_id = :t AND channel = 'c' ORDER BY version"), {"t": tid}).all()
        report = _compare(saver, nows=[None])
    assert [bool(r[0]) for r in stored] == [True, False]   # one compressed, one not
    big = {t["thread_id"]: t for t in report["threads"]}["big"]
    assert {7, 70} <= set(big["key_versions"])
    assert big["stored_bytes"] > 4 * 300_000


def _report_after(url: str, redactor, *edits: str, **params: Any) -> tuple[dict[str, Any], str]:
    """The demo build's audit (the SQL audit equal to the walk) after ``edits`` made in the
    database, and its streamed JSON."""
    import io

    from langgraph_securesaver.audit.inventory import audit_stream
    build(url, redactor)
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            for sql in edits:
                conn.execute(sa.text(sql), params)
        report = _compare(saver, nows=[None])
        out = io.StringIO()
        audit_stream(saver, out)
    return report, out.getvalue()


@pytest.mark.parametrize("value", [1e20, -1e20, float("inf")])
def test_registry_times_that_are_no_date_do_not_break_the_audit(tmp_path: Path, redactor,
                                                                value: float) -> None:
    """A registry row edited to a time no calendar holds: every output of the audit is still
    written (the number stands for the date), and the SQL audit equals the walk."""
    _odd_registry_times(f"sqlite:///{tmp_path / 'agent.db'}", tmp_path, redactor, value)


@pytest.mark.parametrize("value", ["abc", b"\x00x", "2026-01-01T00:00:00+00:00"])
def test_registry_times_of_another_type_on_sqlite(tmp_path: Path, redactor, value: Any) -> None:
    """SQLite keeps text or a blob in a REAL column as given: an edited registry row's times
    are reported as unknown (null) by both audits, which no longer raise TypeError."""
    report, _ = _report_after(
        f"sqlite:///{tmp_path / 'agent.db'}", redactor,
        "UPDATE securesaver_threads SET created_at = :v, last_activity = :v, expires_at = :v, "
        "idle_ttl = :v WHERE thread_id = 't-plain'", v=value)
    plain = {t["thread_id"]: t for t in report["threads"]}["t-plain"]
    assert (plain["created_at"], plain["expires_at"], plain["idle_ttl"]) == (None, None, None)
    assert plain["checkpoints"] > 0


_NUL_EDITS = {
    # a copy of t-plain's rows under "t-plain\0evil": stored data with no registry row
    "copy": ["INSERT INTO checkpoints SELECT thread_id || char(0) || 'evil', checkpoint_ns, "
             "checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata FROM checkpoints "
             "WHERE thread_id LIKE '%' || char(58) || 't-plain'"],
    # t-plain renamed "t-plain\0x" everywhere: still registered under its whole name
    "rename": [f"UPDATE {table} SET thread_id = thread_id || char(0) || 'x' WHERE "
               f"thread_id {cond}" for table, cond in (
                   ("securesaver_threads", "= 't-plain'"),
                   ("checkpoints", "LIKE '%' || char(58) || 't-plain'"),
                   ("writes", "LIKE '%' || char(58) || 't-plain'"))],
    # a checkpoint body set to NULL: its metadata's bytes still count
    "null-body": ["UPDATE checkpoints SET type = NULL, checkpoint = NULL "
                  "WHERE thread_id LIKE '%' || char(58) || 't-plain'"],
}


@pytest.mark.parametrize("edit", sorted(_NUL_EDITS))
def test_ids_holding_a_nul_and_null_bodies_on_sqlite(tmp_path: Path, redactor, edit: str) -> None:
    """SQLite's substr() of a TEXT stops at a NUL: a stored id "t-plain\0evil" was matched to
    t-plain's registry row (its data hidden under another thread's retention) and a renamed
    registered thread lost its registry row. Both audits agree, and stored data without a
    registry row is reported as such."""
    report, _ = _report_after(f"sqlite:///{tmp_path / 'agent.db'}", redactor, *_NUL_EDITS[edit])
    threads = {t["thread_id"]: t for t in report["threads"]}
    if edit == "copy":
        assert not threads["t-plain\x00evil"]["registered"] and threads["t-plain"]["registered"]
        assert any("no registry row" in p for p in report["problems"])
    elif edit == "rename":
        assert threads["t-plain\x00x"]["registered"] and "t-plain" not in threads
    else:
        assert threads["t-plain"]["stored_bytes"] > 0


@pytest.mark.postgres
@pytest.mark.parametrize("value", [float("nan"), -1e20])   # (SQLite stores NaN as NULL)
def test_registry_times_that_are_no_date_on_postgres(pg_url: str, tmp_path: Path, redactor,
                                                     value: float) -> None:
    _odd_registry_times(pg_url, tmp_path, redactor, value)


def _odd_registry_times(url: str, tmp_path: Path, redactor, value: float) -> None:
    from typer.testing import CliRunner

    from langgraph_securesaver.cli.main import app
    report, streamed = _report_after(
        url, redactor, "UPDATE securesaver_threads SET created_at = :v, last_activity = :v, "
        "expires_at = :v WHERE thread_id = 't-plain'", v=value)
    plain = {t["thread_id"]: t for t in report["threads"]}["t-plain"]
    assert plain["created_at"] == repr(value)
    assert '"t-plain"' in streamed
    page = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["audit", "--url", url, "--format", "html",
                                      "--out", str(page)])
    # 1: the audit found problems (the build has an overdue thread); no traceback
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "t-plain" in page.read_text(encoding="utf-8")


@pytest.mark.postgres
def test_a_json_number_too_long_for_python_does_not_break_the_audit(pg_url: str,
                                                                    redactor) -> None:
    """A ts, or a channel value, that is a JSON number of 5,000 digits (PostgreSQL keeps
    131,072; Python reads 4,300): the audit reports the row (unknown age, unsealed) as the walk
    does instead of a ValueError from the driver."""
    build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            _copies(conn, "long-ts", [0], checkpoint=(
                "jsonb_set(checkpoint, '{ts}', CAST(repeat('9', 5000) AS jsonb))"))
            _copies(conn, "long-value", [0], checkpoint=(
                "jsonb_set(checkpoint, '{channel_values}', "
                "jsonb_build_object('n', CAST(repeat('7', 5000) AS jsonb)))"))
        report = _compare(saver, nows=[None])
    threads = {t["thread_id"]: t for t in report["threads"]}
    assert threads["long-ts"]["first_checkpoint"] is None
    assert threads["long-value"]["checkpoints"] == 1
    assert _unsealed(report).get("checkpoints", 0) >= 1


@pytest.mark.postgres
def test_pii_kinds_holding_the_separators_do_not_break_the_audit(pg_url: str,
                                                                 redactor) -> None:
    """A PII kind is free text in the database: one holding the statement's separators is
    reported as it is stored, and the audit does not raise."""
    build(pg_url, redactor)
    odd = "A\x1eB\x1fC"
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            conn.execute(sa.text("UPDATE securesaver_pii_refs SET kind = :k WHERE kind = "
                                 "'PHONE_NUMBER'"), {"k": odd})
            conn.execute(sa.text("UPDATE securesaver_pii_vault SET kind = :k WHERE kind = "
                                 "'PHONE_NUMBER'"), {"k": odd})
        report = _compare(saver, nows=[None])
    pii = next(t for t in report["threads"] if t["thread_id"] == "t-pii")["pii"]
    assert pii == {"EMAIL_ADDRESS": 1, odd: 1}


def test_pii_kinds_holding_the_separators_or_a_blob_on_sqlite(tmp_path: Path,
                                                              redactor) -> None:
    """SQLite stores any value in the kind column: a blob that is no UTF-8 text (the
    statement's text result could not even be read) and a kind holding the separators."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    odd = "A\x1eB\x1fC"
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            for table in ("securesaver_pii_refs", "securesaver_pii_vault"):
                conn.execute(sa.text(f"UPDATE {table} SET kind = :k "
                                     "WHERE kind = 'PHONE_NUMBER'"), {"k": odd})
                conn.execute(sa.text(f"UPDATE {table} SET kind = X'41ff' "
                                     "WHERE kind = 'EMAIL_ADDRESS'"))
        names = saver.registry.tenants()
        now = time.time()
        new, old = audit(saver, now=now), _audit_walk(saver, names, None, now, None)
    assert [t.pii for t in new.threads] == [t.pii for t in old.threads]
    assert next(t for t in new.threads if t.thread_id == "t-pii").pii == {b"A\xff": 1, odd: 1}


_AWKWARD_TENANT = "o'brien \"q\" %_\\ ü"


@pytest.mark.postgres
def test_awkward_tenants_and_thread_ids_and_a_non_c_collation(pg_url: str, redactor) -> None:
    """Tenant names that need quoting, thread ids with LIKE wildcards, huge ones, and the
    ids' columns under a linguistic collation: the same threads, in the walk's order
    (code points), whichever tenant is asked for."""
    from langchain_core.messages import HumanMessage

    from tests.fake_agent import build_chat_graph
    ring = build(pg_url, redactor)
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            for table, column in (("securesaver_threads", "tenant"),
                                  ("securesaver_threads", "thread_id"),
                                  ("checkpoints", "thread_id"),
                                  ("checkpoint_blobs", "thread_id"),
                                  ("checkpoint_writes", "thread_id")):
                conn.execute(sa.text(f'ALTER TABLE {table} ALTER COLUMN {column} '
                                     f'TYPE text COLLATE "en-US-x-icu"'))
            for name in ("B-upper", "a-lower", "%", "_", "a_b%", "Ä", "z" * 2500):
                _copies(conn, name, [0])
            _copies(conn, "%", [0], tenant="globex")
    with SecureSaver.from_url(pg_url, keyring=ring, redaction=None) as saver:
        graph = build_chat_graph(saver)
        for thread in ("%", "_x", "T-1"):
            graph.invoke({"messages": [HumanMessage("hi")]},
                         {"configurable": {"thread_id": thread, "tenant_id": _AWKWARD_TENANT}})
        report = _compare(saver, nows=[None],
                          tenants=(None, "acme", "globex", _AWKWARD_TENANT))
    mine = [t["thread_id"] for t in report["threads"] if t["tenant"] == _AWKWARD_TENANT]
    assert mine == sorted(mine) == ["%", "T-1", "_x"]


def _stop_midway(url: str) -> None:
    """``finish()`` after a partial (or closed) iteration summarises every thread, as the
    walk's finish does; the saver stays usable."""
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        now = time.time()
        whole = audit(saver, now=now)
        stream, finish = iter_audit(saver, now=now)
        next(stream)
        partial = finish()                     # stopped after one thread, not closed
        stream, finish = iter_audit(saver, now=now)
        next(stream)
        stream.close()
        closed = finish()
        for summary in (partial, closed):
            assert summary.threads == len(whole.threads) == 5
            assert [t.as_dict() for t in summary.tenants] == [
                t.as_dict() for t in whole.tenants]
            assert summary.age_bytes == whole.age_bytes and summary.overdue == 1
        with tenant_scope("acme"):
            assert len(audit(saver).threads) == 3


@pytest.mark.postgres
def test_a_consumer_that_stops_midway_gets_complete_totals_on_postgres(pg_url: str,
                                                                       redactor) -> None:
    build(pg_url, redactor)
    _stop_midway(pg_url)


def test_a_consumer_that_stops_midway_gets_complete_totals_on_sqlite(tmp_path: Path,
                                                                     redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    _stop_midway(url)


@pytest.mark.postgres
def test_progress_is_reported_to_the_end(pg_url: str, redactor) -> None:
    build(pg_url, redactor)
    seen: list[tuple[int, int]] = []
    with SecureSaver.from_url(pg_url, keyring=NoKeys(), redaction=None) as saver:
        report = audit(saver, tenant="acme", progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1] == (len(report.threads), len(report.threads)) == (3, 3)


def test_rows_without_a_value_name_their_threads_on_sqlite(tmp_path: Path, redactor) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    build(url, redactor)
    with SecureSaver.from_url(url, keyring=NoKeys(), redaction=None) as saver:
        with saver.registry.begin() as conn:
            for tid in (thread_prefix("acme") + "null-write", "tffffffffffffffffffffffff:null"):
                conn.execute(sa.text(
                    "INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, "
                    "channel, type, value) VALUES (:t, '', 'c', 'k', 0, 'c', 'bytes', NULL)"),
                    {"t": tid})
        report = _compare(saver, nows=[None])
    threads = {t["thread_id"]: t for t in report["threads"]}
    assert threads["null-write"]["stored_bytes"] == 0
    assert [o["thread_id"] for o in report["orphans"]] == ["tffffffffffffffffffffffff:null"]
