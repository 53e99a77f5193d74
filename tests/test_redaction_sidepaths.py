"""Every stored path goes through the redactor, end to end, on SQLite and PostgreSQL.

One graph run plants a distinct value on each side path: an exception's text in the
``__error__`` write, checkpoint metadata (what LangGraph copies from ``configurable`` and from
``config["metadata"]``), a ``str`` subclass and ``bytes`` in the state, a ``Send`` payload, an
interrupt, an idempotency result and a recovery record. Afterwards the raw database holds
none of them; ``pii_inventory`` lists them; ``forget_pii`` erases them; and a second process
that had already restored a value stops restoring it once it is erased.
"""

from __future__ import annotations

import asyncio
import operator
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
import sqlalchemy as sa
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send, interrupt
from typing_extensions import TypedDict

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import mark_recoverable, run_once
from langgraph_securesaver.redaction import (
    RedactionError,
    RedactionPolicy,
    Redactor,
    make_token,
)
from tests.fake_agent import build_chat_graph

from .conftest import drop_pg_schema, new_pg_schema, pg_url_in, require_postgres

ROOT = Path(__file__).resolve().parents[1]
TENANT = "acme"
PLANTED = {
    "error": "err.person@example.com",
    "config_metadata": "md.person@example.net",
    "configurable": "meta.person@example.org",
    "str_subclass": "sub.person@example.com",
    "bytes": "bytes.person@example.com",
    "send": "send.person@example.com",
    "interrupt": "interrupt.person@example.com",
    "idempotency_result": "idem.person@example.com",
    "recovery_record": "recovery.person@example.com",
}
CARD = "4012 8888 8888 1881"  # in the exception text too (masked, stored nowhere)
PHONE = "+1 212 555 0147"     # user_phone in configurable


class Note(str):
    """A str subclass in the state (walked like any string)."""


class State(TypedDict, total=False):
    note: Any
    blob: Any
    items: Annotated[list[int], operator.add]
    receipt: Any
    answer: Any


def _graph(saver: SecureSaver) -> Any:
    def start(state: State) -> dict[str, Any]:
        return {"note": Note(f"note for {PLANTED['str_subclass']}"),
                "blob": f"blob {PLANTED['bytes']}".encode()}

    def fan_out(state: State) -> list[Send]:
        return [Send("worker", {"to": PLANTED["send"]})]

    def worker(arg: dict[str, Any]) -> dict[str, Any]:
        return {"items": [len(arg["to"])]}

    def effect(state: State) -> dict[str, Any]:
        receipt = run_once(0, lambda: f"receipt for {PLANTED['idempotency_result']}")
        mark_recoverable(saver=saver)
        return {"receipt": len(receipt)}

    def ask(state: State) -> dict[str, Any]:
        return {"answer": interrupt(f"confirm {PLANTED['interrupt']}")}

    builder = StateGraph(State)
    builder.add_node("start", start)
    builder.add_node("worker", worker)
    builder.add_node("effect", effect)
    builder.add_node("ask", ask)
    builder.add_edge(START, "start")
    builder.add_conditional_edges("start", fan_out, ["worker"])
    builder.add_edge("worker", "effect")
    builder.add_edge("effect", "ask")
    builder.add_edge("ask", END)
    return builder.compile(checkpointer=saver)


def _failing_graph(saver: SecureSaver) -> Any:
    def boom(state: State) -> dict[str, Any]:
        raise ValueError(f"charge of card {CARD} for {PLANTED['error']} failed")

    builder = StateGraph(State)
    builder.add_node("boom", boom)
    builder.add_edge(START, "boom")
    return builder.compile(checkpointer=saver)


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "tenant_id": TENANT,
                             "customer_email": PLANTED["configurable"], "user_phone": PHONE,
                             "recovery_email": PLANTED["recovery_record"]},
            "metadata": {"contact": PLANTED["config_metadata"]}}


def _run(saver: SecureSaver) -> None:
    graph = _graph(saver)
    graph.invoke({}, _config("t"), durability="sync")
    state = graph.get_state(_config("t"))
    # the owning tenant sees the real values again
    assert state.values["note"] == f"note for {PLANTED['str_subclass']}"
    assert state.values["blob"] == f"blob {PLANTED['bytes']}".encode()
    assert PLANTED["interrupt"] in str(state.interrupts[0].value)
    assert state.metadata["customer_email"] == PLANTED["configurable"]
    assert state.metadata["contact"] == PLANTED["config_metadata"]
    graph.invoke(Command(resume="yes"), _config("t"), durability="sync")
    with pytest.raises(ValueError, match="failed"):
        _failing_graph(saver).invoke({}, _config("e"), durability="sync")


def _raw_sqlite(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(tmp_path.glob("db.sqlite*")))


def _raw_postgres(url: str) -> bytes:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    out = []
    with engine.connect() as conn:
        tables = conn.execute(sa.text(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema()")).scalars().all()
        for table in tables:
            for (row,) in conn.execute(sa.text(f'SELECT row_to_json(t)::text FROM "{table}" t')):
                out.append(row)
    engine.dispose()
    # bytea columns come out hex-encoded: decode them too
    text = "\n".join(out)
    import re
    hexes = b"".join(bytes.fromhex(h) for h in re.findall(r"\\\\x([0-9a-f]+)", text)
                     if len(h) % 2 == 0)
    return text.encode() + hexes


def _assert_clean(raw: bytes) -> None:
    for where, value in PLANTED.items():
        assert value.encode() not in raw, f"{where}: {value} stored in clear"
    for value in (CARD, CARD.replace(" ", ""), PHONE, "212 555 0147"):
        assert value.encode() not in raw


def _assert_inventory_and_erasure(saver: SecureSaver, url: str, ring: Path) -> None:
    keys = saver.keys.require(TENANT)
    pii = saver.services.pii
    tokens = {where: pii.public_token(keys, "EMAIL_ADDRESS", v) for where, v in PLANTED.items()}
    assert None not in tokens.values()
    # the tokens storage holds are random, not the HMAC of the value the redactor computes
    token_key = pii.token_key(keys)
    assert not {make_token(token_key, "EMAIL_ADDRESS", v) for v in PLANTED.values()} & set(
        tokens.values())
    # every planted value has its original in the vault, reachable by the inventory
    found = saver.vault.lookup(keys, list(tokens.values()))
    assert sorted(found.values()) == sorted(PLANTED.values())
    inventory = saver.pii_inventory(TENANT)
    assert inventory[(TENANT, "t")]["EMAIL_ADDRESS"] >= 8
    assert inventory[(TENANT, "e")]["EMAIL_ADDRESS"] >= 1
    assert "PHONE_NUMBER" in inventory[(TENANT, "t")]

    # a second process restores the metadata value, then sees its erasure
    script = (
        "import sys\n"
        "from langgraph_securesaver import Keyring, SecureSaver\n"
        f"cm = SecureSaver.from_url({url!r}, keyring=Keyring.load({str(ring)!r}))\n"
        "saver = cm.__enter__()\n"
        f"cfg = {{'configurable': {{'thread_id': 't', 'tenant_id': {TENANT!r}}}}}\n"
        "def show():\n"
        "    md = saver.get_tuple(cfg).metadata\n"
        f"    print({PLANTED['configurable']!r} in str(md), flush=True)\n"
        "show()\n"
        "sys.stdin.readline()\n"
        "show()\n")
    other = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdin is not None
        assert other.stdout.readline().strip() == "True"
        for value in PLANTED.values():
            assert saver.forget_pii(TENANT, value, requested_by="dpo") >= 1
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "False"
    except AssertionError:
        other.kill()
        raise AssertionError(other.stderr.read() if other.stderr else "") from None
    finally:
        other.stdin.close() if other.stdin else None
        other.wait(timeout=120)
    assert other.returncode == 0, other.stderr.read() if other.stderr else ""
    assert saver.vault.lookup(keys, list(tokens.values())) == {}
    state = _graph(saver).get_state(_config("t"))
    assert PLANTED["configurable"] not in str(state.metadata)
    assert PLANTED["str_subclass"] not in str(state.values["note"])
    assert "EMAIL_ADDRESS" not in saver.pii_inventory(TENANT).get((TENANT, "e"), {})


@pytest.fixture
def ring(tmp_path: Path) -> Path:
    path = tmp_path / "keyring.json"
    Keyring.generate().save(path)
    return path


def test_every_side_path_is_redacted_inventoried_and_erased_sqlite(tmp_path: Path,
                                                                  ring: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with SecureSaver.from_url(url, keyring=Keyring.load(ring)) as saver:
        _run(saver)
        _assert_clean(_raw_sqlite(tmp_path))
        _assert_inventory_and_erasure(saver, url, ring)


def test_every_side_path_is_redacted_inventoried_and_erased_postgres(ring: Path) -> None:
    require_postgres()
    schema = new_pg_schema()
    url = pg_url_in(schema)
    try:
        with SecureSaver.from_url(url, keyring=Keyring.load(ring)) as saver:
            _run(saver)
            _assert_clean(_raw_postgres(url))
            _assert_inventory_and_erasure(saver, url, ring)
    finally:
        drop_pg_schema(schema)


def test_list_filters_on_redacted_metadata_still_match(tmp_path: Path, ring: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with SecureSaver.from_url(url, keyring=Keyring.load(ring), blind_index=True) as saver:
        build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _config("t"))
        hits = list(saver.list({"configurable": {"thread_id": "t", "tenant_id": TENANT}},
                               filter={"customer_email": PLANTED["configurable"]}))
        assert hits and hits[0].metadata["customer_email"] == PLANTED["configurable"]
        assert not list(saver.list({"configurable": {"thread_id": "t", "tenant_id": TENANT}},
                                   filter={"customer_email": "someone.else@example.org"}))
        assert PLANTED["configurable"].encode() not in _raw_sqlite(tmp_path)


# ------------------------------------------------------------------------- time budget


class _JumpingClock:
    """A clock that moves on an hour each time it is read: every analysis overruns."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 3600.0
        return self.now


def _overrunning() -> Redactor:
    redactor = Redactor(RedactionPolicy())
    redactor._clock = _JumpingClock()
    return redactor


def test_a_budget_overrun_refuses_the_value_and_never_withholds_in_silence() -> None:
    text = f"write to {PLANTED['error']} about card {CARD}"
    with pytest.raises(RedactionError, match="time budget") as info:
        _overrunning().redact(text)
    assert PLANTED["error"] not in str(info.value) and CARD not in str(info.value)
    with pytest.raises(RedactionError, match="time budget"):
        _overrunning().redact_value({"a": [text, {"b": text}]}, channel="c",
                                    token_key=b"k" * 32)


def test_a_budget_overrun_never_stores_the_value(tmp_path: Path) -> None:
    text = f"write to {PLANTED['error']} about card {CARD}"
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}",
                              keyring=Keyring.generate(),
                              redaction=_overrunning()) as saver:
        with pytest.raises(RedactionError):
            build_chat_graph(saver).invoke({"messages": [HumanMessage(text)]}, _config("u"))
        assert saver.get_tuple(_config("u")) is None
    assert PLANTED["error"].encode() not in _raw_sqlite(tmp_path)
    assert CARD.encode() not in _raw_sqlite(tmp_path)


# ------------------------------------------------------------------------- event loop


class _ThreadRecordingRedactor(Redactor):
    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def redact_value(self, value: Any, **kwargs: Any) -> Any:
        self.threads.add(threading.get_ident())
        return super().redact_value(value, **kwargs)


def test_async_redaction_never_runs_on_the_event_loop_thread(tmp_path: Path) -> None:
    redactor = _ThreadRecordingRedactor()

    async def main() -> int:
        loop_thread = threading.get_ident()
        async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'a.db'}",
                                         keyring=Keyring.generate(),
                                         redaction=redactor) as saver:
            graph = build_chat_graph(saver)
            for i in range(3):
                await graph.ainvoke({"messages": [HumanMessage(
                    f"turn {i}: mail {PLANTED['send']}")]}, _config("t"))
            tup = await saver.aget_tuple(_config("t"))
            assert PLANTED["send"] in tup.checkpoint["channel_values"]["messages"][0].content
            found = [x async for x in saver.alist(
                _config("t"), filter={"customer_email": PLANTED["configurable"]})]
            assert found is not None
        return loop_thread

    loop_thread = asyncio.run(main())
    assert redactor.threads, "the redactor was never called"
    assert loop_thread not in redactor.threads


@pytest.mark.parametrize("redaction", ["default", "off"])
def test_aput_and_aput_writes_do_their_cpu_work_off_the_event_loop_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redaction: str) -> None:
    """A large value's redaction, serialization, metadata/manifest sealing, encryption and
    vault rows all happen in worker threads, for checkpoints and for pending writes, with and
    without redaction; the value still round-trips and no original is stored in clear."""
    from langgraph.checkpoint.base import empty_checkpoint

    from langgraph_securesaver.keys.crypto import TenantKeys
    from langgraph_securesaver.registry.pii_vault import PiiVault
    from langgraph_securesaver.seal import SealedCodec

    seen: dict[str, set[int]] = {}

    def recording(cls: Any, name: str) -> None:
        original = getattr(cls, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen.setdefault(name, set()).add(threading.get_ident())
            return original(*args, **kwargs)
        monkeypatch.setattr(cls, name, wrapper)

    recording(TenantKeys, "seal")
    recording(SealedCodec, "dump")
    recording(SealedCodec, "seal_metadata")
    recording(SealedCodec, "seal_writes")
    recording(PiiVault, "store")
    recording(Redactor, "redact_value")
    big = ("lorem ipsum 1.2.1.2. " * 15_000) + f" mail {PLANTED['send']}"

    async def main() -> tuple[int, Any, list[Any]]:
        loop_thread = threading.get_ident()
        async with SecureSaver.afrom_url(
                f"sqlite:///{tmp_path / 'big.db'}", keyring=Keyring.generate(),
                **({} if redaction == "default" else {"redaction": None})) as saver:
            cp = empty_checkpoint()
            cp["channel_values"] = {"note": big}
            cp["channel_versions"] = {"note": 1}
            config = {"configurable": {"thread_id": "t", "tenant_id": TENANT,
                                       "checkpoint_ns": ""}}
            saved = await saver.aput(config, cp, {"source": "input", "step": -1}, {"note": 1})
            seen_after_put = {k: set(v) for k, v in seen.items()}
            await saver.aput_writes(saved, [("note", big)], "task-1")
            tup = await saver.aget_tuple(saved)
        assert tup is not None
        for name in ("seal", "dump", "seal_metadata"):
            assert seen_after_put.get(name), f"aput never called {name}"
        return loop_thread, tup, list(tup.pending_writes or [])

    loop_thread, tup, writes = asyncio.run(main())
    expected = {"seal", "dump", "seal_metadata", "seal_writes"}
    if redaction == "default":
        expected |= {"redact_value", "store"}  # the e-mail's original goes to the vault
    assert expected <= set(seen), f"not exercised: {expected - set(seen)}"
    on_loop = sorted(name for name, threads in seen.items() if loop_thread in threads)
    assert not on_loop, f"ran on the event loop's thread: {on_loop}"
    assert tup.checkpoint["channel_values"]["note"] == big  # behaviour unchanged
    assert [(ch, v) for _task, ch, v in writes] == [("note", big)]
    raw = (tmp_path / "big.db").read_bytes()
    assert PLANTED["send"].encode() not in raw and b"lorem ipsum" not in raw


def test_aput_keeps_the_event_loop_responsive_while_redacting(tmp_path: Path) -> None:
    """Behaviour, not timing: a ticker coroutine gets to run while a large put is redacted
    (it could not if redaction ran on the loop)."""
    big = ("lorem 1.2.1.2. " * 4000) + f" mail {PLANTED['send']}"

    async def main() -> tuple[int, str]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'b.db'}",
                                         keyring=Keyring.generate()) as saver:
            task = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            start = ticks
            await build_chat_graph(saver).ainvoke({"messages": [HumanMessage(big)]},
                                                   _config("t"))
            done.set()
            await task
        return ticks - start, ""

    ticks, _ = asyncio.run(main())
    assert ticks > 10


@pytest.fixture
def sqlite_saver(tmp_path: Path) -> Iterator[SecureSaver]:
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}",
                              keyring=Keyring.generate()) as saver:
        yield saver


def test_erasure_in_one_saver_is_seen_by_another_on_the_same_database(tmp_path: Path,
                                                                       ring: Path) -> None:
    """Two savers (as two processes would have): the second one's vault cache is dropped
    once the erasure epoch moves on."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    value = PLANTED["send"]
    with SecureSaver.from_url(url, keyring=Keyring.load(ring)) as a, \
            SecureSaver.from_url(url, keyring=Keyring.load(ring)) as b:
        build_chat_graph(a).invoke({"messages": [HumanMessage(f"mail {value}")]},
                                   _config("t"))
        for _ in range(2):  # b caches the original
            assert value in b.get_tuple(_config("t")).checkpoint["channel_values"][
                "messages"][0].content
        assert a.forget_pii(TENANT, value) == 1
        time.sleep(0)  # no waiting needed: the epoch is read on every lookup
        content = b.get_tuple(_config("t")).checkpoint["channel_values"]["messages"][0].content
        assert value not in content and "<EMAIL_ADDRESS:" in content


# ------------------------------------------------------------------------- bypasses, end to end
TOKENIZED_BYPASSES = {  # form as typed -> (kind, the plain spelling forget_pii is given)
    "ｌｉ．ｎａ＠ｅｘａｍｐｌｅ．ｃｏｍ": ("EMAIL_ADDRESS", "li.na@example.com"),
    "wang。fang@example。cn": ("EMAIL_ADDRESS", "wang.fang@example.cn"),
    "139－1234－5678": ("CN_MOBILE", "13912345678"),
    "137\u30001234\u30005678": ("CN_MOBILE", "13712345678"),
    "110105\u300019491231\u3000002X": ("CN_RESIDENT_ID", "11010519491231002X"),
    "440305 1990 0307 1236": ("CN_RESIDENT_ID", "440305199003071236"),
    "１０．２０．３０．４０": ("IP_ADDRESS", "10.20.30.40"),
    "212\u2013555\u20130148": ("PHONE_NUMBER", "212-555-0148"),
}
MASKED_BYPASSES = [
    "4111\u00a01111\u00a01111\u00a01111", "5555\u202f5555\u202f5555\u202f4444",
    "4012.8888.8888.1881", "٤٢٤٢٤٢٤٢٤٢٤٢٤٢٤٢",
    "<AKIAIOSFODNN7EXAMPLE:masked>",
]
DATA_URL_EMAIL = "hidden.person@example.com"


def _valid_cn_id(body17: str) -> str:
    weights = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
    return body17 + "10X98765432"[sum(int(d) * w for d, w in zip(body17, weights,
                                                               strict=True)) % 11]


def test_unicode_and_format_bypasses_end_to_end(tmp_path: Path, ring: Path) -> None:
    import base64

    assert _valid_cn_id("44030519900307123") == "440305199003071236"
    payload = base64.b64encode(f"mail {DATA_URL_EMAIL}".encode()).decode()
    text = ("；".join([*TOKENIZED_BYPASSES, *MASKED_BYPASSES])
            + f" data:text/plain;base64,{payload} end")
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with SecureSaver.from_url(url, keyring=Keyring.load(ring)) as saver:
        build_chat_graph(saver).invoke({"messages": [HumanMessage(text)]}, _config("t"))
        raw = _raw_sqlite(tmp_path)
        for form, (_kind, plain) in TOKENIZED_BYPASSES.items():
            assert form.encode() not in raw and plain.encode() not in raw, form
        for form in [*MASKED_BYPASSES, payload, DATA_URL_EMAIL]:
            assert form.encode() not in raw, form
        assert b"AKIAIOSFODNN7EXAMPLE" not in raw and b"4242424242424242" not in raw
        kinds = saver.pii_inventory(TENANT)[(TENANT, "t")]
        for kind, _plain in TOKENIZED_BYPASSES.values():
            assert kinds.get(kind, 0) >= 1, kind
        restored = saver.get_tuple(_config("t")).checkpoint["channel_values"]["messages"][0]
        assert all(form in restored.content for form in TOKENIZED_BYPASSES)
        # erasure by the plain spelling reaches the value stored in its typed form
        for _kind, plain in TOKENIZED_BYPASSES.values():
            assert saver.forget_pii(TENANT, plain) >= 1, plain
        restored = saver.get_tuple(_config("t")).checkpoint["channel_values"]["messages"][0]
        assert not any(form in restored.content for form in TOKENIZED_BYPASSES)
