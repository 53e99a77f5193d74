"""Swapping HMAC tokens for public tokens (redaction.translate) and restoring read-back
messages in place: the shortcuts that spare a conversation's old part on every turn must
give what a full walk gives, and redo whatever changed."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage

from langgraph_securesaver.redaction import Redactor
from langgraph_securesaver.redaction.translate import TokenTranslator

A = "<EMAIL_ADDRESS:" + "a" * 32 + ">"
B = "<PHONE_NUMBER:" + "b" * 32 + ">"
PA = "<EMAIL_ADDRESS:" + "1" * 32 + ">"
PA2 = "<EMAIL_ADDRESS:" + "2" * 32 + ">"
PB = "<PHONE_NUMBER:" + "3" * 32 + ">"
DEPTH = 100


def _conversation() -> list:
    return [HumanMessage("hello", id="h0"), AIMessage("hi", id="a0"),
            HumanMessage(f"mail {A}", id="h1"), AIMessage(f"noted {A}", id="a1"),
            HumanMessage(f"call {B}", id="h2")]


def test_translation_replaces_mapped_tokens_and_keeps_the_rest() -> None:
    t = TokenTranslator()
    msgs = _conversation()
    out = t.translate(msgs, {A: PA}, DEPTH)
    assert [m.content for m in out] == ["hello", "hi", f"mail {PA}", f"noted {PA}", f"call {B}"]
    assert out[0] is msgs[0] and out[4] is msgs[4]        # nothing to swap: shared
    assert msgs[2].content == f"mail {A}"                 # the input is not modified
    assert t.translate({"note": f"x {A} {B}"}, {A: PA, B: PB}, DEPTH) == {
        "note": f"x {PA} {PB}"}


def test_the_next_turn_reuses_the_prefix_and_redoes_what_changed() -> None:
    t = TokenTranslator()
    msgs = _conversation()
    first = t.translate(msgs, {A: PA, B: PB}, DEPTH)
    # the next turn: the same message objects plus a new one
    longer = [*msgs, AIMessage(f"ok {B}", id="a2")]
    second = t.translate(longer, {A: PA, B: PB}, DEPTH)
    assert all(a is b for a, b in zip(first, second[:5], strict=False))   # reused
    assert second[5].content == f"ok {PB}"
    # the entry of A was erased and the value came back under a new public token
    third = t.translate(longer, {A: PA2, B: PB}, DEPTH)
    assert [m.content for m in third] == [
        "hello", "hi", f"mail {PA2}", f"noted {PA2}", f"call {PB}", f"ok {PB}"]
    # a token no longer mapped stays as the redactor wrote it
    assert t.translate(longer, {B: PB}, DEPTH)[2].content == f"mail {A}"
    # and once mapped again, it is translated again (not reused unmapped)
    assert t.translate(longer, {A: PA, B: PB}, DEPTH)[2].content == f"mail {PA}"
    # a message replaced by another object (an edit) is translated again
    edited = list(longer)
    edited[1] = AIMessage(f"hi {A}", id="a0")
    assert t.translate(edited, {A: PA, B: PB}, DEPTH)[1].content == f"hi {PA}"


def test_owned_restore_updates_messages_in_place_and_gives_the_same_result() -> None:
    r = Redactor()
    originals = {A: "dana@example.com", B: "+1 415 555 0100"}

    def lookup(wanted: list[str]) -> dict[str, str]:
        return {t: originals[t] for t in wanted if t in originals}

    for _ in range(2):   # a miss, then a cache hit
        copy_ = _conversation()
        owned = _conversation()
        plain = r.restore_value(copy_, lookup)
        in_place = r.restore_value(owned, lookup, owned=True)
        assert [m.content for m in plain] == [m.content for m in in_place] == [
            "hello", "hi", "mail dana@example.com", "noted dana@example.com",
            "call +1 415 555 0100"]
        assert copy_[2].content == f"mail {A}"           # not owned: never modified
    # on a hit the caller's own message objects carry the originals
    owned = _conversation()
    out = r.restore_value(owned, lookup, owned=True)
    assert out[2] is owned[2] and owned[2].content == "mail dana@example.com"
    # an erased value stays a token
    gone = _conversation()
    assert r.restore_value(gone, lambda w: {}, owned=True)[2].content == f"mail {A}"
