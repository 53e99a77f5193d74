"""Issue 11: tenant boundaries on every API, bounded ids, security events never lost, scoped
list(None) that reads only the tenant's rows, delta metadata keys that cannot carry PII or
block retention, key material out of every repr and traceback, a keyring bound to its
databases, time arguments as aware datetimes. SQLite and PostgreSQL, sync and async."""

from __future__ import annotations

import asyncio
import base64
import logging
import sqlite3
import traceback
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import (
    AccessDenied,
    ConfigurationError,
    Keyring,
    SecureSaver,
    tenant_scope,
)
from langgraph_securesaver.keys.crypto import KeyManager, TenantKeys, row_context
from langgraph_securesaver.keys.keyring import WrappedKey
from langgraph_securesaver.keys.provider import NoKeys
from langgraph_securesaver.retention import RetentionPolicy
from langgraph_securesaver.tenancy import MAX_THREAD_ID_LENGTH, inner_thread_id, thread_prefix
from tests.fake_agent import build_chat_graph

EMAIL = "li.na@example.com"
PHONE = "+1 415 555 0137"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _cfg(thread: str, tenant: str | None = None, **extra: Any) -> dict:
    conf: dict[str, Any] = {"thread_id": thread, **extra}
    if tenant is not None:
        conf["tenant_id"] = tenant
    return {"configurable": conf}


@pytest.fixture(scope="module")
def redactor():
    from langgraph_securesaver.redaction import Redactor
    return Redactor()


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    return request.getfixturevalue("pg_url")


class Api:
    """One saver, called through its sync or its async API (async: on afrom_url's savers,
    AsyncSqliteSaver / AsyncPostgresSaver, unless ``async_inner=False``: audits and scans
    read the tables of sync savers only)."""

    def __init__(self, url: str, mode: str, ring: Keyring, *, async_inner: bool = True,
                 **options: Any) -> None:
        self.url, self.mode, self.ring, self.options = url, mode, ring, options
        self.async_inner = async_inner

    def run(self, body: Any) -> Any:
        """body(call, saver, graph) with call(name, *args, **kwargs) -> result."""
        if self.mode == "sync":
            with SecureSaver.from_url(self.url, keyring=self.ring, **self.options) as saver:
                graph = build_chat_graph(saver)

                def call(name: str, *args: Any, **kwargs: Any) -> Any:
                    if name == "invoke":
                        return graph.invoke(*args, **kwargs)
                    result = getattr(saver, name)(*args, **kwargs)
                    return list(result) if name == "list" else result
                return body(call, saver, graph)

        async def main() -> Any:
            opener = SecureSaver.afrom_url if self.async_inner else _sync_in_async
            async with opener(self.url, keyring=self.ring, **self.options) as saver:
                graph = build_chat_graph(saver)
                loop = asyncio.get_running_loop()
                import concurrent.futures
                pool = concurrent.futures.ThreadPoolExecutor(1)

                def call(name: str, *args: Any, **kwargs: Any) -> Any:
                    async def one() -> Any:
                        if name == "invoke":
                            return await graph.ainvoke(*args, **kwargs)
                        if name == "list":
                            return [t async for t in saver.alist(*args, **kwargs)]
                        return await getattr(saver, "a" + name)(*args, **kwargs)
                    fut = asyncio.run_coroutine_threadsafe(one(), loop)
                    return fut.result()

                def in_thread() -> Any:
                    return body(call, saver, graph)
                try:
                    import contextvars
                    return await loop.run_in_executor(pool, contextvars.copy_context().run,
                                                      in_thread)
                finally:
                    pool.shutdown()
        return asyncio.run(main())


from contextlib import asynccontextmanager  # noqa: E402


@asynccontextmanager
async def _sync_in_async(url: str, **options: Any) -> Any:
    with SecureSaver.from_url(url, **options) as saver:
        yield saver


def _seed(call: Any) -> None:
    for tenant in ("acme", "globex"):
        call("invoke", {"messages": [HumanMessage(f"{tenant}: mail me at {EMAIL}")]},
             _cfg("t1", tenant))


def _scoped(scope: str, call: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """call() inside tenant_scope(scope), the scope reaching the async task too."""
    with tenant_scope(scope):
        return call(name, *args, **kwargs)


# --- finding 1: admin methods follow the active scope -----------------------------------------
NAMING_ACME: list[tuple[str, tuple, dict]] = [
    ("pii_inventory", ("acme",), {}),
    ("forget_pii", ("acme",), {"kind": "EMAIL_ADDRESS"}),
    ("forget_subject", ("dana",), {"identifiers": [EMAIL], "tenants": ["acme"]}),
    ("export_subject", ("dana",), {"tenants": ["acme"]}),
    ("set_tenant_retention", ("acme", RetentionPolicy(legal_hold=True)), {}),
    ("rotate_data_key", ("acme",), {}),
    ("events", (), {"tenant": "acme"}),
    ("receipts", (), {"tenant": "acme"}),
    ("audit", (), {"tenant": "acme"}),
    ("shred_tenant", ("acme",), {}),
    ("reencrypt", (), {"tenants": ["acme"]}),
    ("prune_expired", (), {"tenant": "acme"}),
]
OPERATOR_ONLY: list[tuple[str, tuple, dict]] = [
    ("scan", (), {}),
    ("rotate_keys", (), {}),
    ("rewrap_keys", (), {}),
    ("master_versions_in_use", (), {}),
    ("destroy_master_key", ("1",), {}),
    ("erasure_epoch", (), {}),
    ("set_default_retention", (None,), {}),
]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_admin_methods_refuse_another_tenant_inside_a_scope(url: str, mode: str,
                                                            redactor, tmp_path: Path) -> None:
    ring = Keyring.generate()
    ring.save(tmp_path / "keyring.json")        # shred/rotation need a file keyring

    def body(call: Any, saver: SecureSaver, graph: Any) -> None:
        _seed(call)
        acme_keys = saver.registry.load_key_rows("acme")
        acme_pii = saver.pii_inventory("acme")
        assert acme_pii == {("acme", "t1"): {"EMAIL_ADDRESS": 1}}
        for name, args, kwargs in NAMING_ACME + OPERATOR_ONLY:
            with pytest.raises(AccessDenied, match="recorded"):
                _scoped("globex", call, name, *args, **kwargs)
        # nothing took effect
        assert saver.pii_inventory("acme") == acme_pii
        assert saver.registry.get_policy("acme") is None
        assert saver.registry.load_key_rows("acme") == acme_keys
        assert saver.registry.tenants() == ["acme", "globex"]
        assert f"acme: mail me at {EMAIL}" in _contents(call, "acme")
        # every attempt is an access_denied event naming who tried what on whom
        denied = [e for e in saver.registry.list_events(kind="access_denied")]
        assert [(e.actor, e.detail["operation"]) for e in denied] == [
            ("globex", name) for name, _a, _k in NAMING_ACME + OPERATOR_ONLY]
        assert {e.tenant for e in denied} == {"acme", "*"}
        # inside its own scope a tenant gets its own data only, tenant named or not
        assert _scoped("globex", call, "pii_inventory") == {("globex", "t1"):
                                                            {"EMAIL_ADDRESS": 1}}
        report = _scoped("globex", call, "audit")
        assert [t.tenant for t in report.tenants] == ["globex"]
        assert {t.tenant for t in report.threads} == {"globex"}
        assert _scoped("globex", call, "rotate_data_key", "globex") == 2
        assert _scoped("globex", call, "forget_pii", "globex", kind="EMAIL_ADDRESS") == 1
        assert {e.tenant for e in _scoped("globex", call, "events")} == {"globex"}
        # unscoped is the operator: any tenant, or all of them
        assert set(call("pii_inventory")) == {("acme", "t1")}
        assert {e.tenant for e in call("events", tenant="acme")} == {"acme"}
        assert call("forget_pii", "acme", kind="EMAIL_ADDRESS") == 1

    Api(url, mode, Keyring.from_file(tmp_path / "keyring.json"), redaction=redactor,
        async_inner=False).run(body)


def _contents(call: Any, tenant: str, thread: str = "t1") -> list[str]:
    tup = call("get_tuple", _cfg(thread, tenant))
    return [] if tup is None else [str(m.content)
                                   for m in tup.checkpoint["channel_values"]["messages"]]


# --- finding 2: bounded ids, events never lost, registry never ahead --------------------------
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ids_are_bounded_on_every_backend_and_nothing_is_half_done(url: str, mode: str) -> None:
    longest = "L" * MAX_THREAD_ID_LENGTH
    too_long = "x" * (MAX_THREAD_ID_LENGTH + 1)

    def body(call: Any, saver: SecureSaver, graph: Any) -> None:
        _seed(call)
        # a 512-character id works end to end: stored, registered, deleted with a receipt
        call("invoke", {"messages": [HumanMessage("long id")]}, _cfg(longest, "acme"))
        assert saver.registry.get_thread("acme", longest) is not None
        with tenant_scope("acme"):
            call("delete_thread", longest)
        assert [r.thread_id for r in saver.registry.list_receipts(tenant="acme")] == [longest]
        # one more character is refused up front, by every method, before anything is stored
        for name, args in (("invoke", ({"messages": [HumanMessage("x")]},
                                       _cfg(too_long, "acme"))),
                           ("get_tuple", (_cfg(too_long, "acme"),)),
                           ("list", (_cfg(too_long, "acme"),))):
            with pytest.raises(ConfigurationError, match="at most 512"):
                call(name, *args)
        for name, args, kwargs in (("delete_thread", (too_long,), {}),
                                   ("set_retention", (too_long,), {"legal_hold": True}),
                                   ("copy_thread", ("t1", too_long), {}),
                                   ("prune", ([too_long],), {})):
            with pytest.raises(ConfigurationError, match="at most 512"):
                _scoped("acme", call, name, *args, **kwargs)
        with pytest.raises(ConfigurationError, match="checkpoint_ns"):
            call("get_tuple", _cfg("t1", "acme", checkpoint_ns="n" * 5000))
        with pytest.raises(ConfigurationError, match="tenant ids"):
            call("get_tuple", _cfg("t1", "a" * 256))
        assert saver.registry.get_thread("acme", too_long) is None
        assert inner_thread_id("acme", too_long) not in (saver.services.storage.thread_ids(
            thread_prefix("acme")) or [])
        assert len(saver.registry.list_receipts(tenant="acme")) == 1      # none half-done
        # a cross-tenant attempt with an id no column could hold is still recorded
        with pytest.raises(AccessDenied, match="recorded"):
            _scoped("globex", call, "get_tuple", _cfg(too_long, "acme"))
        denied = saver.registry.list_events(kind="access_denied")
        assert [(e.tenant, e.actor, e.thread_id) for e in denied] == [("acme", "globex", None)]

    Api(url, mode, Keyring.generate(), redaction=None).run(body)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failed_registry_touch_is_retried_and_never_skipped(url: str, mode: str) -> None:
    def body(call: Any, saver: SecureSaver, graph: Any) -> None:
        real = saver.registry.touch_thread
        outage = {"on": True, "failed": 0}

        def flaky(*args: Any, **kwargs: Any) -> None:
            if outage["on"]:   # the registry is down for the whole first turn
                outage["failed"] += 1
                raise RuntimeError("registry unavailable")
            real(*args, **kwargs)

        saver.registry.touch_thread = flaky  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            call("invoke", {"messages": [HumanMessage("one")]}, _cfg("t", "acme"))
        assert outage["failed"] >= 1
        assert saver.registry.get_thread("acme", "t") is None
        assert call("get_tuple", _cfg("t", "acme")) is None    # nothing stored unregistered
        outage["on"] = False
        call("invoke", {"messages": [HumanMessage("two")]}, _cfg("t", "acme"))
        assert saver.registry.get_thread("acme", "t") is not None   # the touch was redone

    Api(url, mode, Keyring.generate(), redaction=None).run(body)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_denial_events_are_retried_and_a_lost_one_is_said(url: str, mode: str) -> None:
    def body(call: Any, saver: SecureSaver, graph: Any) -> None:
        call("invoke", {"messages": [HumanMessage("hi")]}, _cfg("t", "acme"))
        real = saver.registry.record_event
        failures = {"left": 2}

        def flaky(kind: str, **kwargs: Any) -> None:
            if failures["left"] > 0:
                failures["left"] -= 1
                raise RuntimeError("registry unavailable")
            real(kind, **kwargs)

        saver.registry.record_event = flaky  # type: ignore[method-assign]
        with pytest.raises(AccessDenied, match="was recorded"):
            _scoped("globex", call, "get_tuple", _cfg("t", "acme"))
        assert len(saver.registry.list_events(kind="access_denied")) == 1
        failures["left"] = 100
        # a repeat within the window is counted for the window's summary (docs/denials.md)
        with pytest.raises(AccessDenied, match="counted"):
            _scoped("globex", call, "get_tuple", _cfg("t", "acme"))
        with pytest.raises(AccessDenied, match="could NOT be recorded"):
            _scoped("globex", call, "pii_inventory", "acme")
        # the registry is known to fail now: a repeat says so too
        with pytest.raises(AccessDenied, match="could NOT be recorded yet"):
            _scoped("globex", call, "get_tuple", _cfg("t", "acme"))
        saver.registry.dispose()      # the summaries cannot be written: kept, not dropped
        assert len(saver.registry.list_events(kind="access_denied")) == 1
        failures["left"] = 0
        saver.registry.dispose()      # written now, every attempt counted exactly once
        denied = saver.registry.list_events(kind="access_denied")
        assert sum(e.detail.get("count", 1) for e in denied) == 4
        assert {(e.detail["operation"], e.detail.get("count", 1)) for e in denied[1:]} == {
            ("get_tuple", 2), ("pii_inventory", 1)}

    Api(url, mode, Keyring.generate(), redaction=None).run(body)


# --- finding 3: a scoped list(None) reads only that tenant's rows ------------------------------
def _add_other_tenant_rows(url: str, saver: SecureSaver, tenant: str, n: int) -> None:
    """n checkpoint rows of ``tenant`` over n/100 threads, copied in SQL from one real row."""
    prefix = thread_prefix(tenant)
    if url.startswith("sqlite"):
        path = url[len("sqlite:///"):]
        conn = sqlite3.connect(path)
        try:
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                "INSERT INTO checkpoints SELECT thread_id || '-' || (i / 100), checkpoint_ns, "
                "printf('%s-%05d', checkpoint_id, i), parent_checkpoint_id, type, checkpoint, "
                "metadata FROM checkpoints, n WHERE substr(thread_id, 1, ?) = ? "
                "AND checkpoint_id = (SELECT max(checkpoint_id) FROM checkpoints "
                "WHERE substr(thread_id, 1, ?) = ?)",
                (n - 1, len(prefix), prefix, len(prefix), prefix))
            conn.commit()
        finally:
            conn.close()
        return
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO checkpoints SELECT thread_id || '-' || (i / 100), checkpoint_ns, "
            "checkpoint_id || '-' || lpad(i::text, 5, '0'), parent_checkpoint_id, type, "
            "checkpoint, metadata FROM checkpoints, generate_series(0, %s) AS i "
            "WHERE left(thread_id, %s) = %s AND checkpoint_id = (SELECT max(checkpoint_id) "
            "FROM checkpoints WHERE left(thread_id, %s) = %s)",
            (n - 1, len(prefix), prefix, len(prefix), prefix))
        conn.execute("ANALYZE checkpoints")


def _count_inner_rows(saver: SecureSaver) -> dict[str, int]:
    """Counts every tuple the inner saver hands over, and every thread id its prefix query
    returns (the rows SecureSaver reads from storage)."""
    seen = {"rows": 0, "thread_ids": 0}
    inner: Any = saver.inner
    real_list, real_alist = inner.list, inner.alist

    def counting_list(*args: Any, **kwargs: Any) -> Any:
        for tup in real_list(*args, **kwargs):
            seen["rows"] += 1
            yield tup

    async def counting_alist(*args: Any, **kwargs: Any) -> Any:
        async for tup in real_alist(*args, **kwargs):
            seen["rows"] += 1
            yield tup

    real_ids, real_aids = saver.services.storage.thread_ids, saver.services.storage.athread_ids

    def ids(prefix: str) -> Any:
        found = real_ids(prefix)
        seen["thread_ids"] += len(found or [])
        return found

    async def aids(prefix: str) -> Any:
        found = await real_aids(prefix)
        seen["thread_ids"] += len(found or [])
        return found

    inner.list, inner.alist = counting_list, counting_alist
    saver.services.storage.thread_ids, saver.services.storage.athread_ids = ids, aids  # type: ignore[method-assign]
    return seen


def _plan_uses_an_index_range(url: str, saver: SecureSaver) -> None:
    from langgraph_securesaver.storage.sql import (
        PG_THREADS_IN_RANGE,
        SQLITE_THREADS_IN_RANGE,
        prefix_range,
    )
    lo, hi = prefix_range(thread_prefix("acme"))
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            plan = " ".join(str(r[-1]) for r in conn.execute(
                "EXPLAIN QUERY PLAN " + SQLITE_THREADS_IN_RANGE, (lo, hi)))
        finally:
            conn.close()
        assert "SEARCH" in plan and "thread_id>? AND thread_id<?" in plan, plan
        return
    import psycopg
    with psycopg.connect(url) as conn:
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN " + PG_THREADS_IN_RANGE, {"lo": lo, "hi": hi}))
    assert "Index" in plan and "Seq Scan" not in plan, plan


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_scoped_list_none_reads_only_the_tenants_rows(url: str, mode: str) -> None:
    other_rows = 10_000

    def body(call: Any, saver: SecureSaver, graph: Any) -> None:
        for thread in ("a1", "a2", "a3"):
            call("invoke", {"messages": [HumanMessage(f"acme {thread}")]}, _cfg(thread, "acme"))
        call("invoke", {"messages": [HumanMessage("globex")]}, _cfg("g", "globex"))
        mine = [t.config["configurable"]["checkpoint_id"]
                for thread in ("a1", "a2", "a3") for t in call("list", _cfg(thread, "acme"))]
        _add_other_tenant_rows(url, saver, "globex", other_rows)
        seen = _count_inner_rows(saver)
        listed = _scoped("acme", call, "list", None)
        assert sorted(t.config["configurable"]["checkpoint_id"] for t in listed) == sorted(mine)
        assert [t.config["configurable"]["checkpoint_id"] for t in listed] == sorted(
            mine, reverse=True)                                     # newest first, as before
        assert all("tenant_id" not in t.config["configurable"] for t in listed)  # invisible
        assert seen == {"rows": len(mine), "thread_ids": 3}         # not one globex row
        newest_two = _scoped("acme", call, "list", None, limit=2)
        assert [t.config["configurable"]["checkpoint_id"] for t in newest_two] == sorted(
            mine, reverse=True)[:2]
        _plan_uses_an_index_range(url, saver)
        # the same listing without the prefix query reads every other tenant's row: the
        # bound above is what the pushdown buys
        saver.services.storage.thread_ids = lambda prefix: None  # type: ignore[method-assign]

        async def none(prefix: str) -> None:
            return None
        saver.services.storage.athread_ids = none  # type: ignore[method-assign]
        seen["rows"] = 0
        assert len(_scoped("acme", call, "list", None)) == len(mine)
        assert seen["rows"] > other_rows

    Api(url, mode, Keyring.generate(), redaction=None).run(body)


# --- finding 4: forced-allowlist delta keys ----------------------------------------------------
def _raw_text(url: str) -> str:
    if url.startswith("sqlite"):
        return Path(url[len("sqlite:///"):]).read_bytes().decode("latin-1")
    import psycopg
    with psycopg.connect(url) as conn:
        return "\n".join(str(r[0]) for r in conn.execute("SELECT metadata::text FROM checkpoints"))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_delta_keys_from_run_metadata_are_sealed_and_cannot_block_retention(url: str,
                                                                             mode: str) -> None:
    poisoned = {"counters_since_delta_snapshot": EMAIL, "delta_writes_versioned": PHONE}

    def body(call: Any, saver: SecureSaver, graph: Any) -> None:
        # one turn each (a second turn would make LangGraph itself choke on the string it
        # reads back as its counters); a turn writes several checkpoints
        for thread in ("t", "u"):
            call("invoke", {"messages": [HumanMessage(f"turn in {thread}")]},
                 {**_cfg(thread, "acme"), "metadata": poisoned})
        tup = call("get_tuple", _cfg("t", "acme"))
        assert tup.metadata["counters_since_delta_snapshot"] == EMAIL   # sealed, not lost
        assert EMAIL not in _raw_text(url) and PHONE not in _raw_text(url)
        before = len(call("list", _cfg("t", "acme")))
        _scoped("acme", call, "prune", ["t"], strategy="keep_latest")   # not refused
        assert before > 1 and len(call("list", _cfg("t", "acme"))) == 1
        # ... and retention with keep_latest is not blocked either
        call("set_tenant_retention", "acme", RetentionPolicy(idle_ttl="1h",
                                                             strategy="keep_latest"))
        later = datetime.now(timezone.utc) + timedelta(hours=2)
        report = call("prune_expired", later, active_grace=0)
        assert ("acme", "u") in report.pruned_to_latest and not report.errors, report
        assert len(call("list", _cfg("u", "acme"))) == 1

    Api(url, mode, Keyring.generate(), redaction=None).run(body)


def test_delta_counters_in_langgraphs_shape_stay_clear_for_the_inner_prune() -> None:
    from langgraph_securesaver.seal import _clear_ok
    ckpt: Any = {"channel_versions": {"messages": "00001.1"}}
    assert _clear_ok("counters_since_delta_snapshot", {"messages": [2, 3]}, ckpt)
    assert _clear_ok("counters_since_delta_snapshot", {"messages": (2, 3)}, ckpt)
    for bad in (EMAIL, 5, True, {"x@example.com": [1, 1]}, {"messages": [1, EMAIL]},
                {"messages": [1, 2, 3]}, {"messages": [-1, 2]}, {"messages": [True, 1]}, {}):
        assert not _clear_ok("counters_since_delta_snapshot", bad, ckpt), bad
    assert not _clear_ok("delta_writes_versioned", True, ckpt)
    assert _clear_ok("source", "loop", ckpt)


# --- finding 5: key material never printed -----------------------------------------------------
def _key_forms(raw: bytes) -> list[str]:
    return [raw.hex(), base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
            base64.urlsafe_b64encode(raw).decode().rstrip("="), repr(raw)[2:-1]]


def test_no_key_material_in_repr_str_logs_or_tracebacks(url: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    ring = Keyring.generate()
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        graph = build_chat_graph(saver)
        graph.invoke({"messages": [HumanMessage("hi")]}, _cfg("t", "acme"))
        keys = saver.keys.require("acme")
        rows = saver.registry.load_key_rows("acme")
        secrets_ = [m.reveal() for m in ring._masters.values()] + [keys.index_key.reveal()]
        secrets_ += [ring.unwrap("acme", WrappedKey(r.master_version, r.wrapped),
                                 row_context(saver.registry, "acme", r.purpose, r.version)) for r in rows]
        forms = [f for raw in secrets_ for f in _key_forms(raw)]
        holders: list[Any] = [ring, saver, saver.keys, keys, *rows,
                              WrappedKey(rows[0].master_version, rows[0].wrapped), NoKeys(),
                              KeyManager(ring, saver.registry), saver.registry, saver.vault]
        for obj in holders:
            for text in (repr(obj), str(obj)):
                assert not any(f in text for f in forms), type(obj).__name__
        assert "TenantKeys(tenant='acme'" in repr(keys) and "index_key" not in repr(keys)

        # an exception from inside put, logged with its traceback and every frame's locals
        def broken_put(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("storage failed")
        saver.inner.put = broken_put  # type: ignore[method-assign]
        with pytest.raises(RuntimeError) as info:
            graph.invoke({"messages": [HumanMessage("again")]}, _cfg("t", "acme"))
        with caplog.at_level(logging.ERROR):
            logging.getLogger("app").exception("a turn failed", exc_info=info.value)
        # every frame's locals from the graph down to the storage call (this test's own
        # frames hold the key material it searches for, so they are left out)
        frames = [(f, n) for f, n in traceback.walk_tb(info.value.__traceback__)
                  if f.f_code.co_filename != __file__]
        stack = traceback.StackSummary.extract(iter(frames), capture_locals=True)
        dumps = ["".join(stack.format()), caplog.text, str(info.value), repr(info.value)]
        assert "storage failed" in dumps[0] and "keys = TenantKeys(" in dumps[0]
        for text in dumps:
            assert not any(f in text for f in forms)


def test_tenant_keys_repr_is_safe_even_as_a_dataclass_field() -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    raw = bytes(range(32))
    keys = TenantKeys("acme", 1, {1: AESGCM(raw)}, raw)
    for form in _key_forms(raw):
        assert form not in repr(keys) and form not in str(keys) and form not in repr([keys])


# --- finding 6: one keyring, two databases -----------------------------------------------------
@pytest.fixture(params=BACKENDS)
def second_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'second.sqlite'}"
    return request.getfixturevalue("pg_url")


def test_a_keyring_serving_two_databases_cannot_break_the_other(tmp_path: Path,
                                                                second_url: str) -> None:
    path = Keyring.generate().save(tmp_path / "keyring.json")
    first = f"sqlite:///{tmp_path / 'first.sqlite'}"
    for url in (first, second_url):
        with SecureSaver.from_url(url, keyring=Keyring.from_file(path), redaction=None) as s:
            graph = build_chat_graph(s)
            for tenant in ("acme", "globex", "initech" if url == second_url else "acme"):
                graph.invoke({"messages": [HumanMessage(f"{tenant} hi")]}, _cfg("t", tenant))
    assert len(Keyring.from_file(path).databases()) == 2
    before = path.read_bytes()
    with SecureSaver.from_url(first, keyring=Keyring.from_file(path), redaction=None) as saver:
        with pytest.raises(ConfigurationError, match="also serves 1 other database"):
            saver.shred_tenant("acme")
        with pytest.raises(ConfigurationError, match="also serves 1 other database"):
            asyncio.run(saver.ashred_tenant("acme"))
        report = saver.rotate_keys(retire_old=True)
        assert not report.ok and report.retired == []
        assert any("also serves" in p for p in report.problems)
        assert saver.get_tuple(_cfg("t", "acme")) is not None
        first_id = saver.database_id()
    assert Keyring.from_file(path).versions() == ["1", "2"]     # nothing destroyed
    assert path.read_bytes() != before                          # (only a version added)
    with SecureSaver.from_url(second_url, keyring=Keyring.from_file(path),
                              redaction=None) as other:
        for tenant in ("acme", "globex", "initech"):
            assert other.get_tuple(_cfg("t", tenant)) is not None
        second_id = other.database_id()
    assert first_id != second_id
    # once the operator says the second database is gone, shredding goes ahead
    ring = Keyring.from_file(path)
    ring.forget_database(second_id)
    ring.persist()
    assert set(Keyring.from_file(path).databases()) == {first_id}
    with SecureSaver.from_url(first, keyring=Keyring.from_file(path), redaction=None) as saver:
        assert saver.shred_tenant("acme") == 1
        assert saver.get_tuple(_cfg("t", "globex")) is not None


def test_cli_shred_refuses_a_keyring_that_serves_another_database(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from langgraph_securesaver.cli.main import app
    path = Keyring.generate().save(tmp_path / "keyring.json")
    urls = [f"sqlite:///{tmp_path / n}" for n in ("one.sqlite", "two.sqlite")]
    for url in urls:
        with SecureSaver.from_url(url, keyring=Keyring.from_file(path), redaction=None) as s:
            build_chat_graph(s).invoke({"messages": [HumanMessage("hi")]}, _cfg("t", "acme"))
    before = path.read_bytes()
    result = CliRunner().invoke(app, ["shred-tenant", "acme", "--url", urls[0], "--keyring",
                                      str(path), "--yes"])
    assert result.exit_code == 2 and "also serves" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert path.read_bytes() == before


# --- finding 9: time arguments -------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_time_arguments_take_aware_datetimes_and_epochs(url: str, mode: str) -> None:
    def body(call: Any, saver: SecureSaver, graph: Any) -> None:
        call("invoke", {"messages": [HumanMessage("hi")]}, _cfg("t", "acme"))
        call("set_tenant_retention", "acme", RetentionPolicy(idle_ttl="1h"))
        now = datetime.now(timezone.utc)
        assert call("prune_expired", now, dry_run=True).would_delete == []
        later = now + timedelta(hours=2)
        assert call("prune_expired", later.timestamp(), dry_run=True).would_delete == [
            ("acme", "t")]
        in_shanghai = later.astimezone(timezone(timedelta(hours=8)))
        assert call("prune_expired", in_shanghai, dry_run=True).would_delete == [("acme", "t")]
        for naive in (datetime.now(), datetime(2025, 1, 1)):
            with pytest.raises(ConfigurationError, match="naive"):
                call("prune_expired", naive)
            with pytest.raises(ConfigurationError, match="naive"):
                call("events", since=naive)
            with pytest.raises(ConfigurationError, match="naive"):
                call("receipts", until=naive)
            with pytest.raises(ConfigurationError, match="naive"):
                call("audit", now=naive)
        with pytest.raises(ConfigurationError, match="finite"):
            call("prune_expired", float("nan"))
        events = call("events", since=now - timedelta(minutes=5), until=later)
        assert any(e.kind == "retention_changed" for e in events)
        assert call("events", since=later) == []
        with tenant_scope("acme"):
            call("delete_thread", "t")
        assert len(call("receipts", since=now - timedelta(minutes=5))) == 1
        assert call("receipts", since=later.timestamp()) == []
        assert call("audit", now=later).overdue == []

    Api(url, mode, Keyring.generate(), redaction=None, async_inner=False).run(body)


def test_every_public_method_is_in_the_tenancy_table() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "concepts" / "tenancy.md")
    table = page.read_text(encoding="utf-8").split("## Who a method acts for", 1)[1]
    # SecureSaver's own methods and those it inherits from the package (ops.api), not
    # LangGraph's; class attributes that are classes (gate_class) are not methods
    own = {n for klass in SecureSaver.__mro__ if klass.__module__.startswith("langgraph_secure")
           for n, v in vars(klass).items()
           if not n.startswith("_") and not isinstance(v, type)
           and (callable(v) or isinstance(v, classmethod))}
    missing = sorted(n for n in own if f"`{n}" not in table and not (
        n.startswith("a") and n[1:] in own and f"`{n[1:]}" in table))
    assert missing == [], missing


# --- finding 7 (and the rest of the CLI): one line, exit 2, nothing changed --------------------
def _fingerprint(url: str, keyring: Path) -> tuple:
    if url.startswith("sqlite"):
        return (Path(url[len("sqlite:///"):]).read_bytes(), keyring.read_bytes())
    import psycopg
    with psycopg.connect(url) as conn:
        rows = tuple(tuple(conn.execute(f"SELECT count(*) FROM {t}").fetchone()) for t in (
            "checkpoints", "checkpoint_writes", "securesaver_events", "securesaver_threads",
            "securesaver_tenant_keys", "securesaver_receipts"))
    return rows, keyring.read_bytes()


BAD_ARGUMENTS: list[list[str]] = [
    ["prune", "--every", "5x"], ["prune", "--every", "0s"], ["prune", "--active-grace", "-1m"],
    ["prune", "--tenant", ""], ["prune", "--tenant", "x" * 300], ["prune", "--tenant", " a"],
    ["audit", "--tenant", "x" * 300], ["events", "--tenant", "a\x00b"],
    ["events", "--thread", "x" * 600], ["events", "--thread", "a\x00b"],
    ["events", "--since", "nan"], ["events", "--until", "inf"], ["events", "--since", "soon"],
    ["events", "--since", "2025-13-01"], ["events", "--since", "2025-11-01T10:00:00"],
    ["shred-tenant", "x" * 300, "--yes"], ["shred-tenant", "acme", "--yes",
                                           "--requested-by", "y" * 300],
    ["recover", "--graph", "x:y", "--older-than", "zz"], ["recover", "--graph", "x:y",
                                                         "--tenant", "x" * 300],
]
BAD_URLS = ["foo://x", "sqlite:/x", "", "sqlite:///nonexistent/dir/x.db",
            "postgresql://127.0.0.1:1/x", "postgresql://[bad"]


def _needs_keyring(command: list[str]) -> bool:
    return command[0] in ("shred-tenant", "rotate-keys", "recover", "scan")


@pytest.mark.parametrize("command", BAD_ARGUMENTS, ids=lambda c: " ".join(c)[:40])
def test_cli_refuses_malformed_arguments_in_one_line(url: str, tmp_path: Path,
                                                     command: list[str]) -> None:
    from typer.testing import CliRunner

    from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401
    from langgraph_securesaver.cli.main import app
    ring = Keyring.generate()
    path = ring.save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=Keyring.from_file(path), redaction=None) as s:
        build_chat_graph(s).invoke({"messages": [HumanMessage("hi")]}, _cfg("t", "acme"))
    before = _fingerprint(url, path)
    args = [*command, "--url", url] + (["--keyring", str(path)] if _needs_keyring(command)
                                       else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert _fingerprint(url, path) == before


@pytest.mark.parametrize("bad_url", BAD_URLS)
@pytest.mark.parametrize("command", [["scan"], ["audit"], ["events"], ["prune"],
                                     ["rotate-keys"], ["shred-tenant", "acme", "--yes"]],
                         ids=lambda c: c[0])
def test_cli_refuses_malformed_urls_in_one_line(tmp_path: Path, command: list[str],
                                                bad_url: str) -> None:
    from typer.testing import CliRunner

    from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401
    from langgraph_securesaver.cli.main import app
    path = Keyring.generate().save(tmp_path / "keyring.json")
    before = path.read_bytes()
    args = [*command, "--url", bad_url] + (["--keyring", str(path)]
                                           if _needs_keyring(command) else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert path.read_bytes() == before and not Path("nonexistent").exists()


def test_the_server_saver_applies_the_rule_to_the_authenticated_user(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under LangGraph Server the caller is the authenticated user, not a tenant_scope."""
    import sys
    import types

    from langgraph.checkpoint.memory import InMemorySaver

    from langgraph_securesaver.server.saver import AuthTenantSaver
    saver = AuthTenantSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)
    graph = build_chat_graph(saver)
    for user in ("acme", "globex"):
        graph.invoke({"messages": [HumanMessage("hi")]},
                     {"configurable": {"thread_id": "t", "langgraph_auth_user":
                                       {"identity": user}}})
    saver.set_tenant_retention("acme", RetentionPolicy(idle_ttl="1d"))     # no user: operator
    request = types.SimpleNamespace(user={"identity": "globex"})
    fake = types.ModuleType("langgraph_api.utils")
    fake.get_auth_ctx = lambda: request  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "langgraph_api.utils", fake)
    for name, args, kwargs in (("events", (), {"tenant": "acme"}),
                               ("set_tenant_retention", ("acme", None), {}),
                               ("rotate_data_key", ("acme",), {}), ("rewrap_keys", (), {})):
        with pytest.raises(AccessDenied):
            getattr(saver, name)(*args, **kwargs)
    assert saver.rotate_data_key("globex") == 2                      # its own tenant: fine
    assert {e.tenant for e in saver.events()} == {"globex"}
    assert saver.registry.get_policy("acme") is not None
    monkeypatch.delitem(sys.modules, "langgraph_api.utils")
    assert [e.actor for e in saver.events(kind="access_denied")] == ["globex"] * 4
