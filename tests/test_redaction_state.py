"""Walking LangGraph state: copies, messages, restore, robustness and caching (real presidio)."""


from __future__ import annotations

import copy
import dataclasses
import json
import threading
from collections import namedtuple
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.types import Send
from pydantic import BaseModel

from langgraph_securesaver.redaction import (
    TOKEN_RE,
    RedactionError,
    RedactionPolicy,
    Redactor,
    VaultEntry,
)

KEY = b"t" * 32
EMAIL = "zhang.wei@163.com"
EMAIL2 = "bob@example.com"
MOBILE = "13812345678"
CN_ID = "11010519491231002X"
SECRET = "sk-proj-Xy7_Kp2-Lm9Qr4St8Uv1Wx6Yz3Ab5Cd0Ef2Gh4Ij6Kl8Mn"
PII = [EMAIL, EMAIL2, MOBILE, CN_ID, SECRET, "10.1.2.3"]


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor()


def conversation() -> list[Any]:
    args_json = json.dumps({"email": EMAIL2, "note": f"邮箱{EMAIL2}"})  # \\u-escaped Chinese
    return [
        SystemMessage("You are a support agent.", id="sys-1"),
        HumanMessage(f"我的邮箱是{EMAIL}，手机{MOBILE}，身份证{CN_ID}，key {SECRET}", id="h-1"),
        AIMessage(
            content=[{"type": "text", "text": f"Looking up {EMAIL2}"},
                     {"type": "tool_use", "id": "tu_1", "name": "lookup",
                      "input": {"email": EMAIL2}}],
            tool_calls=[{"name": "lookup", "args": {"email": EMAIL2, "phone": MOBILE},
                         "id": "call_1"}],
            additional_kwargs={"tool_calls": [{"id": "call_1", "type": "function",
                                               "function": {"name": "lookup",
                                                            "arguments": args_json}}]},
            response_metadata={"model_name": "gpt-4o"},
            id="ai-1"),
        ToolMessage(json.dumps({"customer": {"email": EMAIL2, "ip": "10.1.2.3"},
                                "order": "2023111512345678"}),
                    tool_call_id="call_1", name="lookup", id="tool-1"),
        AIMessage(f"Done, I emailed {EMAIL2}.", id="ai-2"),
    ]


def dump(value: Any) -> str:
    """Everything reachable from value, as text (to look for leaked PII)."""
    def default(o: Any) -> Any:
        if hasattr(o, "model_dump"):
            return o.model_dump()
        if dataclasses.is_dataclass(o):
            return dataclasses.asdict(o)  # type: ignore[arg-type]
        return repr(o)
    return json.dumps(value, default=default, ensure_ascii=False)


def vault_lookup(entries: list[VaultEntry]) -> Callable[[Sequence[str]], dict[str, str]]:
    table = {e.token: e.value for e in entries}
    return lambda tokens: {t: table[t] for t in tokens if t in table}


# ------------------------------------------------------------------------- messages
def test_messages_are_redacted_and_restored(redactor: Redactor) -> None:
    original = conversation()
    snapshot = copy.deepcopy(original)
    redacted, vault = redactor.redact_value(original, channel="messages", token_key=KEY)

    text = dump(redacted)
    for value in PII:
        assert value not in text, value
    assert "\\u90ae\\u7bb1<EMAIL_ADDRESS:" in redacted[2].additional_kwargs[
        "tool_calls"][0]["function"]["arguments"]
    assert {v.kind for v in vault} == {"EMAIL_ADDRESS", "CN_MOBILE", "CN_RESIDENT_ID",
                                       "IP_ADDRESS"}
    assert original == snapshot  # nothing the graph holds was touched

    # identity of messages and tool calls survives
    assert [type(m) for m in redacted] == [type(m) for m in original]
    assert [m.id for m in redacted] == [m.id for m in original]
    assert redacted[2].tool_calls[0]["id"] == "call_1"
    assert redacted[2].tool_calls[0]["name"] == "lookup"
    assert redacted[2].additional_kwargs["tool_calls"][0]["function"]["name"] == "lookup"
    assert redacted[2].content[1]["id"] == "tu_1"
    assert redacted[3].tool_call_id == "call_1" and redacted[3].name == "lookup"
    assert redacted[0] is original[0]  # nothing to redact: shared, not copied

    restored = redactor.restore_value(redacted, vault_lookup(vault))
    expected = copy.deepcopy(original)
    expected[1] = expected[1].model_copy(
        update={"content": expected[1].content.replace(SECRET, "<API_SECRET:masked>")})
    assert restored == expected  # everything but the masked secret comes back


def test_restore_leaves_erased_and_unknown_tokens(redactor: Redactor) -> None:
    redacted, vault = redactor.redact_value({"a": f"mail {EMAIL}", "b": f"m {MOBILE}"},
                                            channel="c", token_key=KEY)
    fake = "<EMAIL_ADDRESS:" + "0" * 32 + ">"
    value = {**redacted, "c": f"user wrote {fake}"}
    kept = [e for e in vault if e.kind != "EMAIL_ADDRESS"]  # the email was erased
    restored = redactor.restore_value(value, vault_lookup(kept))
    assert restored["b"] == f"m {MOBILE}"
    assert restored["a"] == redacted["a"] and TOKEN_RE.search(restored["a"])
    assert restored["c"] == f"user wrote {fake}"
    seen: list[list[str]] = []

    def spy(toks: Sequence[str]) -> dict[str, str]:
        seen.append(list(toks))
        return {}

    redactor.restore_value(value, spy)
    assert seen == [redactor.find_tokens(value)]
    assert len(seen[0]) == 3 and fake in seen[0]


def test_find_tokens_in_order(redactor: Redactor) -> None:
    redacted, vault = redactor.redact_value([f"{MOBILE} {EMAIL}", {EMAIL: CN_ID}],
                                            channel="c", token_key=KEY)
    tokens = redactor.find_tokens(redacted)
    assert [TOKEN_RE.fullmatch(t).group(1) for t in tokens] == [  # type: ignore[union-attr]
        "CN_MOBILE", "EMAIL_ADDRESS", "CN_RESIDENT_ID"]
    assert set(tokens) == {v.token for v in vault}


# ------------------------------------------------------------------------- other types
@dataclasses.dataclass(frozen=True)
class Ticket:
    subject: str
    reporter: str
    attachments: tuple[bytes, ...] = ()


class Profile(BaseModel):
    name: str
    contact: dict[str, str]


Pair = namedtuple("Pair", "left right")


class Opaque:
    def __init__(self, secret: str) -> None:
        self.secret = secret


def test_containers_dataclasses_pydantic_and_send(redactor: Redactor) -> None:
    blob = f"raw {EMAIL}".encode()
    opaque = Opaque(EMAIL)
    value = {
        "ticket": Ticket(f"from {EMAIL}", "agent", (blob,)),
        "profile": Profile(name="x", contact={"mobile": MOBILE}),
        "pair": Pair(EMAIL, 3),
        "tags": {f"{EMAIL}", "plain"},
        "frozen": frozenset({MOBILE}),
        "send": Send("node", {"email": EMAIL}),
        "bytes": blob,
        "opaque": opaque,
        "numbers": [1, 2.5, None, True],
        EMAIL: "dict keys are redacted too",
    }
    snapshot = copy.deepcopy(value)
    out, _ = redactor.redact_value(value, channel="c", token_key=KEY)
    assert isinstance(out["ticket"], Ticket) and EMAIL not in out["ticket"].subject
    # bytes that decode as UTF-8 text are redacted like text (and stay bytes)
    assert isinstance(out["ticket"].attachments[0], bytes)
    assert EMAIL.encode() not in out["ticket"].attachments[0]
    assert isinstance(out["profile"], Profile) and MOBILE not in out["profile"].contact["mobile"]
    assert type(out["pair"]) is Pair and EMAIL not in out["pair"].left and out["pair"].right == 3
    assert isinstance(out["tags"], set) and "plain" in out["tags"] and EMAIL not in out["tags"]
    assert isinstance(out["frozen"], frozenset) and MOBILE not in out["frozen"]
    assert isinstance(out["send"], Send) and out["send"].node == "node"
    assert EMAIL not in out["send"].arg["email"]
    assert isinstance(out["bytes"], bytes) and EMAIL.encode() not in out["bytes"]
    assert out["opaque"] is opaque  # passed through unchanged
    assert out["numbers"] is value["numbers"]
    assert EMAIL not in out and "dict keys are redacted too" in out.values()
    assert value["ticket"] == snapshot["ticket"] and value["send"].arg == {"email": EMAIL}  # type: ignore[attr-defined]
    assert value["profile"] == snapshot["profile"]


def test_json_strings_keep_their_shape(redactor: Redactor) -> None:
    compact = json.dumps({"a": EMAIL, "n": 1}, separators=(",", ":"))
    out, vault = redactor.redact_value(compact, channel="c", token_key=KEY)
    assert json.loads(out)["n"] == 1 and "," in out and ", " not in out
    assert redactor.restore_value(out, vault_lookup(vault)) == compact
    not_json = "{ looks like json but " + EMAIL + " }"
    out, _ = redactor.redact_value(not_json, channel="c", token_key=KEY)
    assert EMAIL not in out and out.startswith("{ looks like json but <EMAIL_ADDRESS:")


def test_dict_keys_colliding_after_redaction_fail_closed(redactor: Redactor) -> None:
    r = Redactor(RedactionPolicy.strict())
    with pytest.raises(RedactionError, match="same key"):
        r.redact_value({"a@example.com": 1, "b@example.com": 2}, channel="c", token_key=KEY)


# ------------------------------------------------------------------------- robustness
def test_cycles_are_refused(redactor: Redactor) -> None:
    loop: list[Any] = ["a"]
    loop.append(loop)
    with pytest.raises(RedactionError, match="cyclic"):
        redactor.redact_value({"x": loop}, channel="c", token_key=KEY)
    d: dict[str, Any] = {}
    d["self"] = {"inner": d}
    with pytest.raises(RedactionError, match=r"cyclic.*\['self'\]\['inner'\]"):
        redactor.redact_value(d, channel="c", token_key=KEY)
    msg = HumanMessage("hi", id="m")
    msg.additional_kwargs["me"] = msg
    with pytest.raises(RedactionError):
        redactor.redact_value([msg], channel="messages", token_key=KEY)
    shared = {"email": EMAIL}
    out, _ = redactor.redact_value([shared, shared], channel="c", token_key=KEY)
    assert out[0] is out[1]  # shared, not cyclic: fine, and aliasing is kept


def nest(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def test_depth_limit_fails_closed(redactor: Redactor) -> None:
    out, _ = redactor.redact_value(nest(90, EMAIL), channel="c", token_key=KEY)
    inner = out
    for _ in range(90):
        inner = inner[0]
    assert TOKEN_RE.fullmatch(inner)
    with pytest.raises(RedactionError, match="max_depth=100"):
        redactor.redact_value(nest(300, EMAIL), channel="c", token_key=KEY)
    deep_json = "[" * 2000 + "]" * 2000  # json.loads would recurse too deep: treated as text
    out, _ = redactor.redact_value(deep_json, channel="c", token_key=KEY)
    assert out == deep_json


def test_lone_surrogates_do_not_crash(redactor: Redactor) -> None:
    text = f"bad \ud800 text {EMAIL} and \udfff"
    out, vault = redactor.redact_value({"t": text, "k\udc80": MOBILE}, channel="c",
                                       token_key=KEY)
    assert EMAIL not in out["t"] and "\ud800" in out["t"]
    assert MOBILE not in out["k\udc80"]
    assert redactor.restore_value(out, vault_lookup(vault)) == {"t": text, "k\udc80": MOBILE}


def test_long_text_is_analyzed_in_overlapping_chunks() -> None:
    policy = RedactionPolicy(max_chars=2_000, hard_max_chars=100_000)
    r = Redactor(policy)
    pem = ("-----BEGIN PRIVATE KEY-----\n" + "\n".join(["MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"] * 80)
           + "\n-----END PRIVATE KEY-----")
    filler = "lorem ipsum dolor sit amet " * 70  # 1890 chars
    text = filler + EMAIL + " " + filler[:80] + pem + " " + filler + MOBILE + " end"
    assert len(text) > 6_000
    for boundary_shift in (0, 5, 11):  # put the email across a chunk boundary
        shifted = "x" * (1_990 - len(filler) + boundary_shift) + text
        result = r.redact(shifted, token_key=KEY)
        assert EMAIL not in result.text and MOBILE not in result.text
        assert "MIIEvQ" not in result.text and "<API_SECRET:masked>" in result.text
        assert [e.kind for e in result.entities] == ["EMAIL_ADDRESS", "API_SECRET", "CN_MOBILE"]
    with pytest.raises(RedactionError, match="hard_max_chars"):
        r.redact_value("9" * 100_001, channel="c", token_key=KEY)


def test_concurrent_use_gives_the_same_results(redactor: Redactor) -> None:
    values = [{"m": f"user{i}@example.com {MOBILE}"} for i in range(40)]
    expected = [redactor.redact_value(v, channel="c", token_key=KEY)[0] for v in values]
    fresh = Redactor()
    results: list[Any] = [None] * 4
    def work(slot: int) -> None:
        results[slot] = [fresh.redact_value(v, channel="c", token_key=KEY)[0] for v in values]
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == expected for r in results)


# ------------------------------------------------------------------------- caching
def test_second_pass_hits_the_cache() -> None:
    r = Redactor()
    msgs = conversation()
    first, vault1 = r.redact_value(msgs, channel="messages", token_key=KEY)
    analyzed = r.stats.values_analyzed
    chars = r.stats.chars_analyzed
    hits = r.stats.cache_hits
    assert analyzed > 0 and chars > 0
    second, vault2 = r.redact_value(msgs, channel="messages", token_key=KEY)
    assert second == first and {v.token for v in vault2} == {v.token for v in vault1}
    assert r.stats.values_analyzed == analyzed and r.stats.chars_analyzed == chars
    assert r.stats.cache_hits > hits
    reloaded = copy.deepcopy(msgs)  # as after reading the checkpoint back
    third, _ = r.redact_value(reloaded, channel="messages", token_key=KEY)
    assert third == first and r.stats.values_analyzed == analyzed
    other_key, _ = r.redact_value(msgs, channel="messages", token_key=b"z" * 32)
    assert other_key != first and r.stats.values_analyzed > analyzed
    assert r.stats.entities_found["EMAIL_ADDRESS"] > 0
    r.stats.reset()
    assert r.stats.as_dict() == {"chars_analyzed": 0, "values_analyzed": 0, "values_seen": 0,
                                 "cache_hits": 0, "entities_found": {}}


def test_redaction_outputs_are_not_analyzed_again() -> None:
    r = Redactor()
    out, _ = r.redact_value({"a": f"x {EMAIL} y 1"}, channel="c", token_key=KEY)
    analyzed = r.stats.values_analyzed
    again, vault = r.redact_value(out, channel="c", token_key=KEY)
    assert again == out and vault == []
    assert r.stats.values_analyzed == analyzed


def test_growing_history_only_analyzes_new_messages() -> None:
    r = Redactor()
    history: list[Any] = []
    per_turn: list[int] = []
    for i in range(30):
        history = [*history, HumanMessage(f"turn {i}: mail user{i}@example.com", id=f"h{i}"),
                   AIMessage(f"ok {i}, noted 1{i}", id=f"a{i}")]
        before = r.stats.chars_analyzed
        out, vault = r.redact_value(history, channel="messages", token_key=KEY)
        per_turn.append(r.stats.chars_analyzed - before)
        assert len(out) == len(history) and len(vault) == i + 1
        assert all(f"user{j}@example.com" not in dump(out) for j in range(i + 1))
    assert max(per_turn[1:]) <= per_turn[1] + 5  # constant, not growing with the history


def test_one_message_lists_do_not_evict_a_conversation() -> None:
    """Every turn also redacts one-message lists (the input, a node's write); thousands of
    them between two turns of a conversation do not push the conversation out of the
    list-level reuse (the list cache holds conversations only), and the next turn analyzes
    only its new message."""
    r = Redactor()
    history = [HumanMessage(f"turn {i}: mail user{i}@example.com", id=f"h{i}")
               for i in range(40)]
    r.redact_value(history, channel="messages", token_key=KEY)
    for i in range(3000):
        r.redact_value([HumanMessage(f"write {i}", id=f"w{i}")], channel="messages",
                       token_key=KEY)
    assert len(r._list_cache) == 1     # only the conversation: nothing of it was evicted
    before = r.stats.chars_analyzed
    new = HumanMessage("turn 40: mail user40@example.com", id="h40")
    r.redact_value([*history, new], channel="messages", token_key=KEY)
    assert r.stats.chars_analyzed - before <= len(new.content) + 5


def test_in_place_edits_are_noticed() -> None:
    r = Redactor()
    msg = AIMessage("nothing here", id="a1",
                    tool_calls=[{"name": "f", "args": {"q": "x"}, "id": "c1"}])
    r.redact_value([msg], channel="messages", token_key=KEY)
    msg.tool_calls[0]["args"]["q"] = EMAIL  # edited deep inside, same objects
    out, vault = r.redact_value([msg], channel="messages", token_key=KEY)
    assert TOKEN_RE.fullmatch(out[0].tool_calls[0]["args"]["q"])
    assert [v.value for v in vault] == [EMAIL]
    msg.content = f"now with {MOBILE}"
    out, _ = r.redact_value([msg], channel="messages", token_key=KEY)
    assert out[0].content.startswith("now with <CN_MOBILE:") and out[0].id == "a1"
    late = HumanMessage(f"hi {EMAIL}")  # add_messages assigns ids in place
    r.redact_value([late], channel="messages", token_key=KEY)
    late.id = "assigned-later"
    out, _ = r.redact_value([late], channel="messages", token_key=KEY)
    assert out[0].id == "assigned-later" and out[0].content.startswith("hi <EMAIL_ADDRESS:")


def test_long_history_edited_in_place_deep_inside_is_redone() -> None:
    """The list-level reuse keeps immutable field values by reference and copies the rest:
    an edit made in place inside a dict or a list of a message in the middle of a long
    history is redone, whatever else stayed the same object."""
    r = Redactor()
    history: list[Any] = []
    for i in range(40):
        history.append(HumanMessage(f"question {i}", id=f"h{i}"))
        history.append(AIMessage(f"answer {i}", id=f"a{i}", response_metadata={"n": i},
                                 tool_calls=[{"name": "f", "args": {"q": f"x{i}"},
                                              "id": f"c{i}"}]))
    r.redact_value(history, channel="messages", token_key=KEY)
    history[21].tool_calls[0]["args"]["q"] = EMAIL          # a list inside a dict, in place
    history[31].response_metadata["note"] = f"call {MOBILE}"  # a dict, in place
    history[40].content = "question " + "20"                 # an equal string, new object
    history.append(HumanMessage("and one more", id="h40"))
    out, vault = r.redact_value(history, channel="messages", token_key=KEY)
    assert TOKEN_RE.fullmatch(out[21].tool_calls[0]["args"]["q"])
    assert out[31].response_metadata["note"].startswith("call <CN_MOBILE:")
    assert out[40].content == "question 20" and out[-1].content == "and one more"
    assert sorted(v.value for v in vault) == sorted([EMAIL, MOBILE])
    assert EMAIL not in dump(out) and MOBILE not in dump(out)


def test_edited_middle_of_history_is_redone() -> None:
    r = Redactor()
    history = [HumanMessage(f"m{i} 1{i}", id=f"h{i}") for i in range(10)]
    r.redact_value(history, channel="messages", token_key=KEY)
    edited = list(history)
    edited[4] = HumanMessage(f"edited {EMAIL}", id="h4")
    out, _ = r.redact_value(edited, channel="messages", token_key=KEY)
    assert out[4].content.startswith("edited <EMAIL_ADDRESS:") and out[5].content == "m5 15"
    shorter, _ = r.redact_value(history[:6], channel="messages", token_key=KEY)
    assert [m.id for m in shorter] == [f"h{i}" for i in range(6)]


def test_restored_messages_are_private_copies() -> None:
    r = Redactor()
    redacted, vault = r.redact_value(conversation(), channel="messages", token_key=KEY)
    first = r.restore_value(copy.deepcopy(redacted), vault_lookup(vault))  # fills the cache
    second = r.restore_value(copy.deepcopy(redacted), vault_lookup(vault))  # served from it
    assert second == first and second[1] is not first[1]
    second[1].content += " EDITED BY THE GRAPH"
    second[2].tool_calls[0]["args"]["email"] = "changed"
    third = r.restore_value(copy.deepcopy(redacted), vault_lookup(vault))
    assert third == first
    erased = [e for e in vault if e.kind != "CN_MOBILE"]  # an erasure changes the result
    fourth = r.restore_value(copy.deepcopy(redacted), vault_lookup(erased))
    assert MOBILE not in fourth[1].content and EMAIL in fourth[1].content


def test_owned_rereads_follow_each_reads_originals() -> None:
    """A conversation read every turn (freshly loaded, restored in place) is restored from
    the previous read's memo only while the message and its tokens' originals are the same:
    an erasure between reads, a message edited in storage, or a longer history each give the
    answer a cold redactor gives."""
    r = Redactor()
    history = conversation() + [HumanMessage(f"turn {i}", id=f"t{i}") for i in range(20)]
    redacted, vault = r.redact_value(history, channel="messages", token_key=KEY)

    def read(entries: list[VaultEntry], stored: list[Any] | None = None,
             redactor: Redactor = r) -> list[Any]:
        return redactor.restore_value(copy.deepcopy(stored or redacted),
                                      vault_lookup(entries), owned=True)

    cold = read(vault, redactor=Redactor())
    assert MOBILE in cold[1].content and SECRET not in dump(cold)   # secrets stay masked
    assert read(vault) == cold
    assert read(vault) == cold and read(vault) == cold   # served from the memo
    erased = [e for e in vault if e.kind != "CN_MOBILE"]
    after_erasure = read(erased)
    assert MOBILE not in dump(after_erasure) and EMAIL in after_erasure[1].content
    assert after_erasure == read(erased, redactor=Redactor())
    assert read(vault) == cold   # (an erasure is per read: the vault said what it holds)
    edited = copy.deepcopy(redacted)
    edited[1].content = edited[1].content.replace("我的邮箱是", "邮箱: ")
    assert read(vault, edited)[1].content.startswith(f"邮箱: {EMAIL}")
    assert read(vault, edited) == read(vault, edited, redactor=Redactor())
    longer = [*redacted, HumanMessage("later", id="later")]
    assert read(vault, longer) == [*cold, HumanMessage("later", id="later")]


def test_json_documents_are_analyzed_in_batches_like_one_by_one() -> None:
    rows = [{"email": f"user{i}@example.com", "ip": f"10.0.{i}.1", "note": f"订单 2024{i:08d}",
             "parts": ["13812345", "678"], "split": ["a.b@example", ".com"], "n": i}
            for i in range(30)]
    doc = json.dumps({"rows": rows}, ensure_ascii=False)
    batched = Redactor()
    out, vault = batched.redact_value(doc, channel="tools", token_key=KEY)
    one_by_one = Redactor()

    def each(v: Any) -> Any:
        if isinstance(v, str):
            return one_by_one.redact(v, token_key=KEY).text
        if isinstance(v, dict):
            return {k: each(x) for k, x in v.items()}
        if isinstance(v, list):
            return [each(x) for x in v]
        return v

    assert json.loads(out) == each(json.loads(doc))
    assert json.loads(out)["rows"][3]["parts"] == ["13812345", "678"]  # no match across strings
    assert json.loads(out)["rows"][3]["split"] == ["a.b@example", ".com"]
    assert len(vault) == 60 and batched.stats.values_analyzed >= 90


def test_error_paths_do_not_show_personal_data(redactor: Redactor) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(RedactionError) as info:
        redactor.redact_value({"messages": {EMAIL: {MOBILE: loop}}}, channel="c", token_key=KEY)
    assert EMAIL not in str(info.value) and MOBILE not in str(info.value)
    assert "['messages'][<key>][<key>][0]" in str(info.value)
