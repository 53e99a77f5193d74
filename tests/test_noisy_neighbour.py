"""One tenant cannot slow another down: the redaction budget of a write, the redaction worker
processes, and coalesced access-denied events -- each attacked as a hostile tenant would.

No timing assertions: the budget is exceeded here by its deterministic bounds (characters,
strings) or by a budget made tiny; speed is measured in ``benchmarks/noisy_neighbour.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import string
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from typer.testing import CliRunner

from langgraph_securesaver import AccessDenied, Keyring, SecureSaver, tenant_scope
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.redaction import RedactionError, RedactionPolicy, Redactor
from langgraph_securesaver.redaction import pool as pool_mod
from langgraph_securesaver.redaction.budget import WriteBudget, write_scope
from langgraph_securesaver.registry.denials import DenialLog
from tests.scripts.budget_restart import tool_output

WITHHELD = "<WITHHELD:masked>"
KEY = b"k" * 32
runner = CliRunner()


def _filler(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + "      ") for _ in range(n))


def _hostile_parts(count: int, size: int = 2000, seed: int = 7) -> list[dict[str, str]]:
    """``count`` text parts of ~``size`` characters, each with an e-mail and a unique marker."""
    rng = random.Random(seed)
    return [{"type": "text",
             "text": f"{_filler(rng, size)} SECRETPART{i:05d}X mail p{i}@example.com"}
            for i in range(count)]


def _checkpoint(messages: list[Any]) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": messages}
    cp["channel_versions"] = {"messages": 1}
    return cp


def _cfg(thread: str, tenant: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant, "checkpoint_ns": ""}}


def _put(saver: SecureSaver, mode: str, cfg: dict[str, Any], cp: Any) -> Any:
    md: Any = {"source": "input", "step": -1, "parents": {}}
    if mode == "sync":
        saver.put(cfg, cp, md, {"messages": 1})
        return saver.get_tuple(cfg)

    async def run() -> Any:
        await saver.aput(cfg, cp, md, {"messages": 1})
        return await saver.aget_tuple(cfg)
    return asyncio.run(run())


def _storage_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


@pytest.fixture(autouse=True)
def _in_process_pool() -> Any:
    """Each test gets a fresh process pool (and the default one back afterwards)."""
    yield
    pool_mod.configure_pool()


# --------------------------------------------------------------------------------------------
# the budget of one write
# --------------------------------------------------------------------------------------------
def test_a_write_past_the_parts_budget_is_refused_and_nothing_is_returned() -> None:
    pool_mod.configure_pool(0)
    redactor = Redactor(RedactionPolicy(write_budget=WriteBudget(max_parts=5)))
    values = [f"note {i}: write to user{i}@example.com" for i in range(12)]
    with pytest.raises(RedactionError, match="budget") as info:
        redactor.redact_value(values, channel="messages", token_key=KEY)
    assert "user1" not in str(info.value) and "example" not in str(info.value)
    # a new write has a budget of its own: five strings go through, whole
    again, vault = redactor.redact_value(values[5:10], channel="messages", token_key=KEY)
    assert all("<EMAIL_ADDRESS:" in v for v in again) and len(vault) == 5


def test_each_string_is_charged_once_whatever_the_caches_hold() -> None:
    """Costs are deterministic: a string analyzed in a batch and looked up again by the walk
    is charged once, even when no cache keeps the batch's result (as when other tenants'
    load evicts it). On main it was charged twice and half the write withheld."""
    pool_mod.configure_pool(0)
    values = [f"note {i}: write to user{i}@example.com" for i in range(300)]
    for cache_size in (0, 16_384):
        redactor = Redactor(RedactionPolicy(write_budget=WriteBudget(max_parts=300)),
                            cache_size=cache_size)
        with write_scope() as spend:
            out, vault = redactor.redact_value(values, channel="rows", token_key=KEY)
        assert spend.parts == 300 and spend.chars == sum(map(len, values))
        assert WITHHELD not in out and len(vault) == 300

def test_a_list_of_strings_analyzed_in_batches_gives_each_string_its_own_tokens() -> None:
    """The strings of one list go to the analyzer in batches: every string comes out as it
    would alone (same tokens, same vault), and no detection leaks across two strings."""
    pool_mod.configure_pool(0)
    rows = [f"row {i}: call 415-555-{i:04d} or mail r{i}@example.com" for i in range(40)]
    rows += ["plain words only", "4155550142", f"{'x' * 30}@example.org"]
    batched, batched_vault = Redactor().redact_value(rows, channel="rows", token_key=KEY)
    alone = Redactor(cache_size=0)
    one_by_one = [alone.redact(r, token_key=KEY).text for r in rows]
    assert batched == one_by_one
    assert {e.value for e in batched_vault} >= {f"r{i}@example.com" for i in range(40)}
    # a tuple is batched too, and keeps its type
    out, _ = Redactor().redact_value(tuple(rows), channel="rows", token_key=KEY)
    assert type(out) is tuple and list(out) == one_by_one


def test_no_string_of_a_batch_is_judged_by_its_neighbours_text() -> None:
    """A batch joins strings for one analyzer call, but no validator or veto may read a
    neighbour: an e-mail followed by ':22' is a mailbox unless a path follows in the SAME
    string (an scp remote). Batched in content parts, a list and a JSON document, it is
    tokenized exactly as alone -- and the cache then never hands out a clear result."""
    pool_mod.configure_pool(0)
    mail = "ssh alice.smith@example.com:22 failed"
    path = "see /var/log/auth.log pid 1234567"
    alone = Redactor(cache_size=0).redact(mail, token_key=KEY).text
    assert "alice.smith@example.com" not in alone
    parts = HumanMessage(content=[{"type": "text", "text": mail}, {"type": "text", "text": path}])
    out, _ = Redactor().redact_value([parts], channel="messages", token_key=KEY)
    assert out[0].content[0]["text"] == alone
    rows = [mail, path] * 6
    out_rows, _ = Redactor().redact_value(rows, channel="rows", token_key=KEY)
    assert out_rows[0] == alone and out_rows[2] == alone
    doc, _ = Redactor().redact_value(json.dumps([mail, path]), channel="x", token_key=KEY)
    assert "alice.smith@example.com" not in doc
    # a veto label ending one string does not excuse a card number opening the next
    card = "4111 1111 1111 1111"
    rows = ["see tracking", card] + [f"ticket {1000000 + i} closed" for i in range(8)]
    out_rows, _ = Redactor().redact_value(rows, channel="rows", token_key=KEY)
    assert out_rows[1] == Redactor(cache_size=0).redact(card, token_key=KEY).text
    assert "4111" not in out_rows[1]


def test_a_custom_analyzer_is_never_batched() -> None:
    """A user's recognizers may anchor on a whole value (^...$) or read context words: their
    strings are analyzed one by one, so a list of 8 gives what each string gives alone."""
    from presidio_analyzer import Pattern, PatternRecognizer

    from langgraph_securesaver.redaction.engine import build_analyzer
    pool_mod.configure_pool(0)
    employee = PatternRecognizer(supported_entity="EMPLOYEE_ID",
                                 patterns=[Pattern("emp", r"^EMP\d{6}$", 0.9)])
    analyzer = build_analyzer(extra_recognizers=[employee])
    ids = [f"EMP{100000 + i}" for i in range(12)]
    out, _ = Redactor(analyzer=analyzer).redact_value(ids, channel="x", token_key=KEY)
    assert all(v.startswith("<EMPLOYEE_ID:") for v in out)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_value_of_many_strings_past_the_budget_is_refused_whole(tmp_path: Path,
                                                                  mode: str) -> None:
    """A value of 100,000 short strings with a phone number each, default settings: the
    write is refused with RedactionError, and nothing of it -- no head, no marker -- is
    stored (on main its head was kept and its tail silently withheld)."""
    db = tmp_path / "agent.db"
    rows = [f"row SECRETROW{i:06d}X call 415-555-{i % 10000:04d}" for i in range(100_000)]
    cp = empty_checkpoint()
    cp["channel_values"] = {"rows": rows}
    cp["channel_versions"] = {"rows": 1}
    cfg = _cfg("t", "mallory")
    md: Any = {"source": "input", "step": -1, "parents": {}}
    if mode == "sync":
        with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate()) as saver:
            with pytest.raises(RedactionError, match="budget"):
                saver.put(cfg, cp, md, {"rows": 1})
            assert saver.get_tuple(cfg) is None
    else:
        async def run() -> Any:
            async with SecureSaver.afrom_url(f"sqlite:///{db}",
                                             keyring=Keyring.generate()) as saver:
                with pytest.raises(RedactionError, match="budget"):
                    await saver.aput(cfg, cp, md, {"rows": 1})
                return await saver.aget_tuple(cfg)
        assert asyncio.run(run()) is None
    raw = _storage_bytes(db)
    for i in range(0, len(rows), 997):
        assert f"SECRETROW{i:06d}X".encode() not in raw


def test_a_write_scope_is_one_budget_for_every_channel() -> None:
    pool_mod.configure_pool(0)
    redactor = Redactor(RedactionPolicy(write_budget=WriteBudget(max_parts=3)))
    with write_scope():
        first, _ = redactor.redact_value(["a1@example.com", "a2@example.com"], channel="a",
                                         token_key=KEY)
        with pytest.raises(RedactionError, match="budget"):
            redactor.redact_value(["b1@example.com", "b2@example.com"], channel="b",
                                  token_key=KEY)
    assert WITHHELD not in first


def test_a_string_past_its_time_budget_refuses_the_write() -> None:
    """The per-string time budget (a hostile string that is slow to analyze) refuses the
    write; it never withholds part of it in silence."""
    pool_mod.configure_pool(0)
    redactor = Redactor()
    ticks = iter(range(10**6))
    redactor._clock = lambda: float(next(ticks)) * 100  # every look at the clock: 100 s
    with pytest.raises(RedactionError, match="time budget") as info:
        redactor.redact_value(["write to alice@example.com"], channel="messages",
                              token_key=KEY)
    assert "alice" not in str(info.value)


def test_budget_settings_are_checked() -> None:
    for bad in ({"max_chars": 10}, {"max_parts": 0}):
        with pytest.raises(Exception, match="budget"):
            WriteBudget(**bad)
    with pytest.raises(Exception, match="WriteBudget"):
        RedactionPolicy(write_budget={"max_parts": 3})  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_hostile_message_is_refused_with_default_settings(tmp_path: Path, mode: str) -> None:
    """2,000 parts of ~2 KB, each with an e-mail (4 MB of text to analyze against 600,000
    characters): refused with RedactionError, on a busy machine as on a quiet one; nothing
    of it reaches storage or the vault, and the same tenant's next chat turn is stored whole
    (no cool-down)."""
    db = tmp_path / "agent.db"
    hostile = _checkpoint([HumanMessage(content=_hostile_parts(2000))])
    turn = _checkpoint([HumanMessage("please mail ann@example.org the summary")])
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=Keyring.generate()) as saver:
        with pytest.raises(RedactionError, match="budget"):
            _put(saver, mode, _cfg("h", "mallory"), hostile)
        assert saver.get_tuple(_cfg("h", "mallory")) is None
        assert saver.pii_inventory("mallory") == {}
        tup = _put(saver, mode, _cfg("c", "mallory"), turn)
    assert tup.checkpoint["channel_values"]["messages"][0].content == (
        "please mail ann@example.org the summary")
    raw = _storage_bytes(db)
    assert b"SECRETPART01999X" not in raw and b"SECRETPART00000X" not in raw


@pytest.mark.parametrize("size", ["200 KB document", "100 KB tool output", "CRM search"])
def test_a_real_turn_stays_far_from_the_default_budget(size: str) -> None:
    """Real turns, default settings: each uses at most half of the character and string
    bounds -- counted deterministically, so the margin does not depend on the machine's
    speed or load."""
    pool_mod.configure_pool(0)
    rng = random.Random(3)
    if size == "200 KB document":
        value: Any = HumanMessage(content="\n".join(
            _filler(rng, 400) + (f" call 415-555-{i:04d} or p{i}@ex.com" if i % 5 == 0
                                 else "") for i in range(500)))
    elif size == "100 KB tool output":
        value = HumanMessage(content=json.dumps(
            [{"id": i, "email": f"u{i}@corp.example.com", "phone": f"+1 415 555 {1000 + i}",
              "note": _filler(rng, 80)} for i in range(700)]))
    else:
        value = HumanMessage(content=tool_output(7))
    with write_scope() as spend:
        out, _ = Redactor().redact_value([value], channel="messages", token_key=KEY)
    assert WITHHELD not in out[0].content
    budget = WriteBudget()
    assert 0 < 2 * spend.chars <= budget.max_chars
    assert 2 * spend.parts <= budget.max_parts


# --------------------------------------------------------------------------------------------
# worker processes
# --------------------------------------------------------------------------------------------
def test_offloaded_analysis_gives_the_same_tokens_as_in_process() -> None:
    parts = _hostile_parts(30, size=1500, seed=11)
    msg = HumanMessage(content=parts)
    pool_mod.configure_pool(0)
    local, local_vault = Redactor().redact_value([msg], channel="messages", token_key=KEY)
    pool = pool_mod.configure_pool(1, offload_after=1000)
    assert pool.wait_ready()
    remote, remote_vault = Redactor().redact_value([msg], channel="messages", token_key=KEY)
    assert remote[0].content == local[0].content and remote_vault == local_vault
    assert WITHHELD not in json.dumps(remote[0].content)


@pytest.mark.parametrize("failure", ["refused", "error while finishing"])
def test_a_write_failing_while_a_batch_is_in_flight_leaves_the_worker_clean(
        failure: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a worker analyzes one batch, the write finishes the previous one. A write that
    fails meanwhile (refused by the raise policy, or any error while finishing) collects the
    batch in flight: the worker serves the next write with nothing of the failed one left in
    its pipe, and is not replaced."""
    pool = pool_mod.configure_pool(1, offload_after=1000)
    assert pool.wait_ready()
    pids = pool.pids()
    hostile = HumanMessage(content=_hostile_parts(60, size=1500, seed=3))  # ~90,000 chars
    if failure == "refused":
        strict = Redactor(RedactionPolicy(write_budget=WriteBudget(max_chars=50_000)))
        with pytest.raises(RedactionError, match="budget"):
            strict.redact_value([hostile], channel="messages", token_key=KEY)
    else:
        broken = Redactor()
        finished: list[int] = []
        real = broken._finish_batch

        def finish_then_fail(texts: list[str], found: Any, call: Any) -> None:
            finished.append(len(texts))
            if len(finished) == 2:
                assert pool.busy  # the next batch is in the worker meanwhile
                raise RuntimeError("finishing failed")
            real(texts, found, call)

        monkeypatch.setattr(broken, "_finish_batch", finish_then_fail)
        with pytest.raises(RuntimeError, match="finishing failed"):
            broken.redact_value([hostile], channel="messages", token_key=KEY)
    assert not pool.busy  # the batch in flight was collected
    params = Redactor()._worker_params(RedactionPolicy())
    assert pool.detect("mail ann@example.com", params, 5.0) is not None  # and it is free
    msg = HumanMessage(content=_hostile_parts(40, size=1500, seed=4))
    remote, remote_vault = Redactor().redact_value([msg], channel="messages", token_key=KEY)
    assert pool.pids() == pids
    pool_mod.configure_pool(0)
    local, local_vault = Redactor().redact_value([msg], channel="messages", token_key=KEY)
    assert remote[0].content == local[0].content and remote_vault == local_vault
    assert "SECRETPART" in json.dumps(remote[0].content)  # the markers are not PII: kept
    assert "example.com" not in json.dumps(remote[0].content)


def test_a_killed_worker_fails_its_write_closed_and_the_next_write_succeeds() -> None:
    pool = pool_mod.configure_pool(1, offload_after=1000)
    assert pool.wait_ready()
    unlimited = RedactionPolicy(write_budget=WriteBudget.unlimited(), time_budget=3600.0)
    redactor = Redactor(unlimited, cache_size=0)
    big = HumanMessage(content=_hostile_parts(3000, seed=5))
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            outcome["value"] = redactor.redact_value([big], channel="messages", token_key=KEY)
        except RedactionError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=write)
    thread.start()
    pid = None
    for _ in range(100_000):
        if pool.busy:
            pid = next(iter(pool.busy), None)
            if pid is not None:
                break
        time.sleep(0.001)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    thread.join()
    assert "value" not in outcome and "worker" in str(outcome["error"])
    assert pid not in pool.pids()
    # the next write succeeds (in-process while the replacement starts, then offloaded)
    small = HumanMessage(content=_hostile_parts(5, seed=6))
    out, vault = redactor.redact_value([small], channel="messages", token_key=KEY)
    assert WITHHELD not in json.dumps(out[0].content) and len(vault) == 5
    assert pool.wait_ready()
    out, vault = redactor.redact_value([HumanMessage(content=_hostile_parts(8, seed=8))],
                                       channel="messages", token_key=KEY)
    assert WITHHELD not in json.dumps(out[0].content) and len(vault) == 8


def test_a_worker_killed_while_idle_costs_no_write() -> None:
    pool = pool_mod.configure_pool(1, offload_after=1000)
    assert pool.wait_ready()
    (pid,) = pool.pids()
    os.kill(pid, signal.SIGKILL)
    for _ in range(10_000):  # until the kernel reports it gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                          text=True).stdout.strip().startswith("Z"):
            break
        time.sleep(0.01)
    out, vault = Redactor().redact_value([HumanMessage(content=_hostile_parts(6, seed=9))],
                                         channel="messages", token_key=KEY)
    assert WITHHELD not in json.dumps(out[0].content) and len(vault) == 6
    assert pid not in pool.pids()


def _stand_in_worker(pool: pool_mod.RedactionPool, code: str) -> pool_mod.Worker:
    """A process running ``code`` in place of a worker, idle in ``pool``."""
    worker = pool_mod.Worker.__new__(pool_mod.Worker)
    worker.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE)
    worker.pid = worker.proc.pid
    pool._live[worker.pid] = worker
    pool._idle.put(worker)
    return worker


def test_an_answer_that_arrives_with_its_acknowledgement_is_read() -> None:
    """The acknowledgement and the answer in one write (a fast analysis): both frames are in
    the pipe at once, and the answer is read (not waited for until the deadline)."""
    pool = pool_mod.configure_pool(1, offload_after=1000)
    worker = _stand_in_worker(pool, (
        "import json, struct, sys\n"
        "def frame(doc):\n"
        "    body = json.dumps(doc).encode()\n"
        "    return struct.pack('>I', len(body)) + body\n"
        "while len(head := sys.stdin.buffer.read(4)) == 4:\n"
        "    sys.stdin.buffer.read(struct.unpack('>I', head)[0])\n"
        "    sys.stdout.buffer.write(frame({'accepted': True}) + frame(\n"
        "        {'raw': [['EMAIL_ADDRESS', 0, 5, 0.9]], 'took': 0.25}))\n"
        "    sys.stdout.buffer.flush()\n"))
    for _ in range(3):   # missed, the answer would be waited for until the deadline (65 s)
        assert pool.detect("a@b.c", {}, 60.0) == ({("EMAIL_ADDRESS", 0, 5): 0.9}, None, 0.25)
    assert pool.pids() == [worker.pid]
    pool.close()


def test_a_worker_gone_before_it_takes_the_request_costs_no_write() -> None:
    """A SIGKILLed worker is not reaped (``poll()`` says it runs) and its pipes stay open until
    its last thread has exited: a request can reach its pipe and then meet the end of its
    output. Made deterministic by a stand-in worker that exits as soon as the request is in
    its pipe, without taking it: the string is analyzed in-process, the write succeeds."""
    pool = pool_mod.configure_pool(1, offload_after=1000)
    gone = _stand_in_worker(pool, "import os, select, sys\n"
                                  "select.select([sys.stdin], [], [])\n"
                                  "os._exit(0)\n")
    out, vault = Redactor().redact_value([HumanMessage(content=_hostile_parts(6, seed=12))],
                                         channel="messages", token_key=KEY)
    assert WITHHELD not in json.dumps(out[0].content) and len(vault) == 6
    assert gone.proc.returncode == 0 and gone.pid not in pool.pids()   # reaped and replaced


def test_a_malformed_worker_answer_is_refused() -> None:
    for reply in ({"raw": [["EMAIL", "0", 3, 1.0]]}, {"raw": "x"}, [], {"error": "Boom"}):
        with pytest.raises(RedactionError):
            pool_mod._parse(reply)


# --------------------------------------------------------------------------------------------
# coalesced denials
# --------------------------------------------------------------------------------------------
def _denied_counts(saver: SecureSaver) -> tuple[int, int]:
    rows = saver.registry.list_events(kind="access_denied")
    return len(rows), sum(int(e.detail.get("count", 1)) for e in rows)


def _verify(url: str, ring_path: Path) -> int:
    result = runner.invoke(app, ["events", "--url", url, "--verify", "--format", "json",
                                 "--keyring", str(ring_path)],
                           env={"SECURESAVER_MASTER_KEY": ""})
    return result.exit_code


def test_the_first_denial_is_recorded_at_once_and_every_attempt_raises(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        with tenant_scope("mallory"):
            with pytest.raises(AccessDenied, match="recorded"):
                saver.get_tuple(_cfg("t1", "victim"))
            assert _denied_counts(saver) == (1, 1)  # before any window closed
            for _ in range(50):
                with pytest.raises(AccessDenied):
                    saver.get_tuple(_cfg("t1", "victim"))
            assert _denied_counts(saver) == (1, 1)  # counted, not written per attempt
            with pytest.raises(AccessDenied, match="recorded"):
                saver.list(_cfg("t1", "victim"), limit=1).__next__()  # another operation
        assert _denied_counts(saver) == (2, 2)
        saver.registry.dispose()  # flushes the pending summary
        rows = saver.registry.list_events(kind="access_denied")
        assert _denied_counts(saver) == (3, 52)
        summary = rows[-1]
        assert (summary.tenant, summary.actor, summary.thread_id) == ("victim", "mallory", "t1")
        assert summary.detail["coalesced"] is True and summary.detail["operation"] == "get_tuple"
        assert summary.detail["first_at"] <= summary.detail["last_at"]


def test_a_summary_that_cannot_be_written_is_kept_and_retried() -> None:
    written: list[dict[str, object]] = []
    fail = [True]

    def record(kind: str, tenant: str, thread_id: str | None, actor: str,
               detail: dict[str, object]) -> None:
        if fail[0]:
            raise OSError("registry down")
        written.append(detail)

    log = DenialLog(record, window=3600)
    assert log.attempt("m", "v", "get_tuple", None) is True
    for _ in range(9):
        assert log.attempt("m", "v", "get_tuple", None) is False
    log.defer("m", "v", "get_tuple", None)  # the first one, whose write failed
    assert log.flush() == 0 and log.pending() == 10
    fail[0] = False
    assert log.flush() == 10 and log.pending() == 0
    assert [d["count"] for d in written] == [10]


def test_async_denials_are_coalesced(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"

    async def run() -> tuple[int, int]:
        async with SecureSaver.afrom_url(url, keyring=Keyring.generate(),
                                         redaction=None) as saver:
            with tenant_scope("mallory"):
                for _ in range(40):
                    with pytest.raises(AccessDenied):
                        await saver.aget_tuple(_cfg("t1", "victim"))
            await asyncio.to_thread(saver.registry.dispose)
            return _denied_counts(saver)
    assert asyncio.run(run()) == (2, 40)


def test_a_repeated_denial_is_held_before_it_is_raised(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The first refused attempt is raised at once; every repeat (counted into the summary)
    is held REPEAT_HOLD seconds first -- sync in the caller's thread, async on the event loop
    (no thread of SecureSaver's pool is taken) -- and still raised every time."""
    import langgraph_securesaver.gate as gate_mod
    held: list[tuple[str, float, str]] = []
    real_sleep, real_asleep = time.sleep, asyncio.sleep

    def sleep(seconds: float) -> None:
        held.append(("sync", seconds, threading.current_thread().name))
        real_sleep(seconds)

    async def asleep(seconds: float, *args: Any) -> Any:
        held.append(("async", seconds, threading.current_thread().name))
        return await real_asleep(seconds, *args)

    monkeypatch.setattr(gate_mod.time, "sleep", sleep)
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver, \
            tenant_scope("mallory"):
        errors = []
        for _ in range(3):
            with pytest.raises(AccessDenied) as caught:
                saver.get_tuple(_cfg("t1", "victim"))
            errors.append(caught.value)
    monkeypatch.setattr(gate_mod.time, "sleep", real_sleep)
    assert [e.repeated for e in errors] == [False, True, True]
    hold = gate_mod.TenantGate.REPEAT_HOLD
    assert [h for h in held if h[1] == hold] == [("sync", hold, "MainThread")] * 2

    held.clear()
    monkeypatch.setattr(gate_mod.asyncio, "sleep", asleep)

    async def run() -> list[bool]:
        async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'b.db'}",
                                         keyring=Keyring.generate(), redaction=None) as s2:
            out = []
            with tenant_scope("mallory"):
                for _ in range(3):
                    with pytest.raises(AccessDenied) as caught:
                        await s2.aget_tuple(_cfg("t1", "victim"))
                    out.append(caught.value.repeated)
            return out
    assert asyncio.run(run()) == [False, True, True]
    assert [h for h in held if h[1] == hold] == [("async", hold, "MainThread")] * 2


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_coalesced_counts_are_exact_under_floods_from_two_processes(
        database: tuple[str, Any], tmp_path: Path) -> None:
    url, _raw = database
    ring = Keyring.generate()
    ring_path = ring.save(tmp_path / "keyring.json")
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        saver.put(_cfg("t1", "victim"), _checkpoint([]), {"source": "input", "step": -1,
                                                         "parents": {}}, {"messages": 1})
    env = {**os.environ, "SECURESAVER_MASTER_KEY": ring.to_json()}
    per_process, threads = 600, 3
    procs = [subprocess.Popen([sys.executable, "-m", "tests.scripts.denial_flood", url,
                               str(per_process), str(threads)], env=env,
                              stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    raised = sum(int(out.split()[-1]) for out in outputs)
    assert raised == 2 * per_process * threads  # AccessDenied every single time
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        rows, total = _denied_counts(saver)
    assert total == raised                       # the count is exact
    assert rows <= 2 * 2 * 3                     # a few rows per process, not one per attempt
    assert _verify(url, ring_path) == 0          # the chains verify


# --------------------------------------------------------------------------------------------
# the async API's hops: SecureSaver's own threads, not the application's default executor
# --------------------------------------------------------------------------------------------
def test_the_async_api_never_needs_the_loops_default_executor(tmp_path: Path) -> None:
    """The loop's default executor (six threads on 2 cores, shared with the application) is
    replaced by one that refuses work: puts, writes, reads, listings and a refused
    cross-tenant read all still work, tenant_scope included, and PII is restored."""
    from concurrent.futures import ThreadPoolExecutor

    class Refusing(ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the loop's default executor was used")

    pool_mod.configure_pool(0)
    cfg = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    md: Any = {"source": "input", "step": -1, "parents": {}}

    async def run() -> tuple[Any, int, bool]:
        async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'a.db'}",
                                         keyring=Keyring.generate()) as saver:
            asyncio.get_running_loop().set_default_executor(Refusing(1))
            with tenant_scope("acme"):
                stored = await saver.aput(
                    cfg, _checkpoint([HumanMessage("mail me at ann@example.com")]), md,
                    {"messages": 1})
                await saver.aput_writes(stored, [("messages", "or bob@example.com")], "task-1")
                tup = await saver.aget_tuple(cfg)
                listed = [t async for t in saver.alist(cfg)]
            denied = False
            with tenant_scope("globex"):
                try:
                    await saver.aget_tuple(_cfg("t1", "acme"))
                except AccessDenied:
                    denied = True
            return tup, len(listed), denied

    tup, listed, denied = asyncio.run(run())
    assert tup is not None and listed == 1 and denied
    assert tup.checkpoint["channel_values"]["messages"][0].content == "mail me at ann@example.com"
    assert [w[2] for w in tup.pending_writes] == ["or bob@example.com"]


def test_reading_back_a_huge_list_looks_at_no_more_items_than_it_can_remember(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of a checkpoint holding 1,000,000 strings walked every one of them to find
    messages worth remembering (readback.py), holding the GIL while other tenants waited:
    plain values are skipped, and no more items are looked at than the cache keeps."""
    from langchain_core.messages import AIMessage

    from langgraph_securesaver.redaction import readback

    looked: list[Any] = []
    real = readback.content_strings
    monkeypatch.setattr(readback, "content_strings", lambda m: looked.append(m) or real(m))
    rb = readback.ReadBack()
    rb.remember(b"ctx", [f"r{i}" for i in range(200_000)])
    assert looked == []
    long = "x" * (readback.MIN_CHARS + 1)
    messages = [AIMessage(long + str(i)) for i in range(readback.MAX_MESSAGES + 10)]
    rb.remember(b"ctx", messages)
    assert len(looked) == readback.MAX_MESSAGES
    assert rb.exempt(b"ctx", messages[-1]) is not None  # the latest are remembered
    assert rb.exempt(b"other", messages[-1]) is None
