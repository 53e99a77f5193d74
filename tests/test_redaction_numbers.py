"""Numbers are data: card, phone, SSN and ID numbers stored as ints, floats or Decimals (in
state, in JSON tool results, in a saver's channels) are redacted like the same digits in text;
counters, steps, timestamps and ids are kept."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import END, START, StateGraph

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.redaction import Action, RedactionPolicy, Redactor
from langgraph_securesaver.tenancy import ThreadRef, inner_thread_id

KEY = b"n" * 32
CARD = 4111111111111111
PHONE = 4155550142
MOBILE = 13812345678
CN_ID = 110105194912310118  # valid check digit, real birth date


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor()


def redact(redactor: Redactor, value: Any, channel: str | None = "state") -> Any:
    return redactor.redact_value(value, channel=channel, token_key=KEY)


def test_the_cn_id_constant_is_valid() -> None:
    from langgraph_securesaver.redaction.recognizers import is_valid_cn_resident_id
    assert is_valid_cn_resident_id(str(CN_ID))


def test_json_numbers_in_a_tool_message_are_redacted_keys_and_structure_kept(
        redactor: Redactor) -> None:
    content = json.dumps({"card_number": CARD, "phone": PHONE, "qty": 3,
                          "items": [{"sku": 4000123412341234, "price": 12.5}]})
    msg = ToolMessage(content=content, tool_call_id="call_1", id="t1")
    out, vault = redact(redactor, [msg], channel="messages")
    stored = json.loads(out[0].content)
    assert stored["card_number"] == "<CREDIT_CARD:masked>"
    assert stored["phone"].startswith("<PHONE_NUMBER:")
    # structure and the ordinary numbers stay (an SKU named as such is not a card)
    assert stored["qty"] == 3 and stored["items"] == [{"sku": 4000123412341234, "price": 12.5}]
    assert str(CARD) not in out[0].content and str(PHONE) not in out[0].content
    # the same digits in prose get the same token
    prose = redactor.redact(f"call me at {PHONE}", token_key=KEY).text
    assert stored["phone"] in prose
    assert [e.value for e in vault] == [str(PHONE)]


@pytest.mark.parametrize("number", [CARD, float(CARD), Decimal(CARD), Decimal("4111111111111111.00")])
def test_card_numbers_of_every_numeric_type_are_masked(redactor: Redactor, number: Any) -> None:
    out, vault = redact(redactor, {"card": number, "note": "ok"})
    assert out == {"card": "<CREDIT_CARD:masked>", "note": "ok"}
    assert vault == []


def test_a_card_number_is_masked_without_a_name_but_phones_need_one(redactor: Redactor) -> None:
    out, _ = redact(redactor, [CARD, PHONE, MOBILE], channel=None)
    assert out == ["<CREDIT_CARD:masked>", PHONE, MOBILE]
    out, _ = redact(redactor, {"phones": [PHONE, MOBILE]})
    assert out["phones"][0].startswith("<PHONE_NUMBER:")
    assert out["phones"][1].startswith("<CN_MOBILE:")


def test_names_in_other_spellings_are_understood(redactor: Redactor) -> None:
    out, _ = redact(redactor, {"customerPhone": PHONE, "mobile_no": MOBILE, "ssn": 78051121,
                               "id_card": CN_ID, "to": PHONE})
    assert out["customerPhone"].startswith("<PHONE_NUMBER:")
    assert out["mobile_no"].startswith("<CN_MOBILE:")
    assert out["ssn"].startswith("<US_SSN:")  # the leading zero an int lost
    assert out["id_card"].startswith("<CN_RESIDENT_ID:")
    assert out["to"].startswith("<PHONE_NUMBER:")


def test_a_state_channel_named_like_pii_is_a_name(redactor: Redactor) -> None:
    out, vault = redact(redactor, PHONE, channel="phone")
    assert out.startswith("<PHONE_NUMBER:") and vault[0].value == str(PHONE)


def test_a_digit_string_whose_name_is_the_only_hint_is_redacted(redactor: Redactor) -> None:
    out, _ = redact(redactor, json.dumps({"ssn": "078051121", "ref": "078051121"}))
    stored = json.loads(out)
    assert stored["ssn"].startswith("<US_SSN:") and stored["ref"] == "078051121"


@pytest.mark.parametrize("value", [
    {"step": CARD}, {"id": CARD}, {"user_id": CARD}, {"ts": 1_764_633_600_000},
    {"created_at": 1_764_633_600}, {"count": MOBILE}, {"size": 15_032_385_536},
    {"order_id": 4000123412341234}, {"n": PHONE}, {"total": 12_345_678_901},
    {"x": 1.5, "y": True, "z": 123, "big": 10**30, "neg": -CARD}, [1, 2, 3, 2**53],
    {"version": 4111111111111111},
])
def test_ordinary_numbers_are_kept(redactor: Redactor, value: Any) -> None:
    out, vault = redact(redactor, value)
    assert out is value and vault == []


def test_keep_and_tokenize_actions_apply_to_numbers() -> None:
    keep = Redactor(RedactionPolicy(actions={"CREDIT_CARD": Action.KEEP}))
    assert redact(keep, {"card": CARD}) == ({"card": CARD}, [])
    tok = Redactor(RedactionPolicy(actions={"CREDIT_CARD": Action.TOKENIZE}))
    out, vault = redact(tok, {"card": CARD})
    assert out["card"].startswith("<CREDIT_CARD:") and vault[0].value == str(CARD)


def test_restore_gives_the_digits_back_as_a_string(redactor: Redactor) -> None:
    out, vault = redact(redactor, {"phone": PHONE})
    table = {e.token: e.value for e in vault}
    restored = redactor.restore_value(out, lambda ts: {t: table[t] for t in ts if t in table})
    assert restored == {"phone": str(PHONE)}


class _State(TypedDict):
    phone: int
    card: int
    counter: int


def _stored_channel(saver: SecureSaver, thread: str, channel: str) -> Any:
    raw = saver.inner.get_tuple({"configurable": {"thread_id": inner_thread_id("acme", thread),
                                                  "checkpoint_ns": ""}})
    assert raw is not None
    ref = ThreadRef("acme", thread)
    keys = saver.keys.require("acme")
    version = raw.checkpoint["channel_versions"][channel]
    token = raw.checkpoint["channel_values"][channel]
    return saver.codec.load(keys.open(token, saver.codec.channel_aad(ref, channel, version)))


def test_numbers_in_graph_state_are_not_stored_through_a_saver(tmp_path: Path,
                                                               redactor: Redactor) -> None:
    def node(state: _State) -> dict[str, Any]:
        return {"counter": state["counter"] + 1}

    graph = StateGraph(_State)
    graph.add_node("n", node)
    graph.add_edge(START, "n")
    graph.add_edge("n", END)
    cfg = {"configurable": {"thread_id": "t", "tenant_id": "acme"}}
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}",
                              keyring=Keyring.generate(), redaction=redactor) as saver:
        app = graph.compile(checkpointer=saver)
        app.invoke({"phone": PHONE, "card": CARD, "counter": 123_456_789_012}, cfg)
        assert _stored_channel(saver, "t", "phone").startswith("<PHONE_NUMBER:")
        assert _stored_channel(saver, "t", "card") == "<CREDIT_CARD:masked>"
        assert _stored_channel(saver, "t", "counter") == 123_456_789_013
        state = app.get_state(cfg).values  # the owning tenant reads the originals back
        assert state["phone"] == str(PHONE) and state["counter"] == 123_456_789_013
        assert state["card"] == "<CREDIT_CARD:masked>"


def test_tool_call_args_numbers(redactor: Redactor) -> None:
    msg = AIMessage("", tool_calls=[{"name": "charge", "id": "c1",
                                     "args": {"card": CARD, "amount": 4111111111111111}}])
    out, _ = redact(redactor, [msg], channel="messages")
    assert out[0].tool_calls[0]["args"] == {"card": "<CREDIT_CARD:masked>",
                                            "amount": 4111111111111111}
