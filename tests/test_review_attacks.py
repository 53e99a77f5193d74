"""An attacker's review of run tenants, terminal escaping and redaction of numbers and
decoding views: each test is an attack; those the library does not stop yet are strict
xfails naming why."""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.runtime import RunControl

from langgraph_securesaver import (
    AccessDenied,
    Keyring,
    SecureSaver,
    TenantRequired,
    tenant_scope,
)
from langgraph_securesaver.errors import ConfigurationError
from langgraph_securesaver.redaction import RedactionError, Redactor
from langgraph_securesaver.tenancy import TenantThreadId, validate_thread_id

from . import test_no_side_doors_keys as keys_tests

KEY = b"r" * 32
CARD = 4111111111111111


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: SecureSaver) -> Any:
    def step(state: State) -> dict:
        return {"log": ["step"]}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    return builder.compile(checkpointer=saver)


def _saver() -> SecureSaver:
    return SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None)


CFG: Any = {"configurable": {"thread_id": "shared"}}


# -- run tenants ------------------------------------------------------------------------------
def test_a_returned_thread_id_under_another_scope_is_denied_and_recorded() -> None:
    saver = _saver()
    graph = _graph(saver)
    graph.invoke({"log": ["acme-secret"]}, {"configurable": {"thread_id": "shared",
                                                             "tenant_id": "acme"}})
    returned = saver.get_tuple({"configurable": {"thread_id": "shared", "tenant_id": "acme"}})
    assert returned is not None
    config = returned.config
    assert isinstance(config["configurable"]["thread_id"], TenantThreadId)
    with tenant_scope("globex"), pytest.raises(AccessDenied):
        graph.get_state(config)
    with tenant_scope("globex"), pytest.raises(AccessDenied):
        graph.update_state(config, {"log": ["globex"]})
    events = saver.registry.list_events(kind="access_denied")
    assert {(e.actor, e.tenant) for e in events} == {("globex", "acme")}
    # a copy that went through JSON names nobody
    with pytest.raises(TenantRequired):
        graph.get_state(json.loads(json.dumps(config)))
    # globex's own thread of the same id holds none of acme's entries
    with tenant_scope("globex"):
        assert graph.get_state(CFG).values == {}


def test_a_fresh_run_control_without_a_tenant_is_refused() -> None:
    saver = _saver()
    graph = _graph(saver)
    with tenant_scope("acme"):
        graph.invoke({"log": ["acme-secret"]}, CFG)
    with pytest.raises(TenantRequired):
        graph.invoke({"log": ["x"]}, CFG, control=RunControl())


@pytest.mark.xfail(strict=True, reason=(
    "a RunControl reused after a run keeps its binding while the caller holds it: the next "
    "run on that thread id that names no tenant acts for the first run's tenant (the binding "
    "cannot tell two runs of one control apart)"))
def test_a_reused_run_control_gives_a_tenantless_run_no_tenant() -> None:
    saver = _saver()
    graph = _graph(saver)
    control = RunControl()
    with tenant_scope("acme"):
        graph.invoke({"log": ["acme-secret"]}, CFG, control=control)
    with pytest.raises(TenantRequired):   # docs/concepts/tenancy.md: "after a run ... TenantRequired"
        graph.invoke({"log": ["x"]}, CFG, control=control)


# -- terminal escaping ------------------------------------------------------------------------
@pytest.mark.parametrize("char", ["\x85", "\x9b", "\u2028", "\u202e", "\u2066"])
def test_line_breaking_and_reordering_characters_are_refused_in_ids(char: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        validate_thread_id(f"a{char}b")
    assert char not in str(caught.value)


# -- redaction of numbers and decoding views --------------------------------------------------
@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor()


def _redact(redactor: Redactor, value: Any) -> Any:
    out, _vault = redactor.redact_value(value, channel="state", token_key=KEY)
    return out


def test_a_card_number_as_an_int_dictionary_key_is_redacted(redactor: Redactor) -> None:
    out = _redact(redactor, {"cards": {CARD: "primary"}})
    assert str(CARD) not in repr(out)
    assert out == {"cards": {"<CREDIT_CARD:masked>": "primary"}}


@pytest.mark.parametrize("value", [
    {1: "a", 2: "b"}, {"step": 12, "ts": 1733097600000, "count": CARD},
    {1733097600000: "event"}, {"versions": {"__start__": 2, "log": 3}},
    [3, 12, 123456789012], {"n": True, "card": False}])
def test_ordinary_ints_and_int_keys_are_kept(redactor: Redactor, value: Any) -> None:
    assert _redact(redactor, value) == value


@pytest.mark.parametrize("value", [
    {"note": "mail alice%40example.com now"}, {"note": "mail alice&#x40;example&#46;com"},
    {"items": ["4111111111111111"]}, {"value": CARD}, {"value": "4111111111111111"},
    {"x": 4.111111111111111e15}, {"x": 4111111111111111.0},
    {"r": json.dumps([CARD])}, {"r": "[4.111111111111111e15]"}])
def test_other_encodings_of_a_card_or_address_are_redacted(redactor: Redactor,
                                                           value: Any) -> None:
    text = repr(_redact(redactor, value))
    assert "alice" not in text and "4111111111111111" not in text


def test_decimal_forms_of_a_card_are_redacted(redactor: Redactor) -> None:
    from decimal import Decimal
    for number in (Decimal("4111111111111111.0"), Decimal("4.111111111111111E+15")):
        assert _redact(redactor, {"x": number}) == {"x": "<CREDIT_CARD:masked>"}


def test_a_doubly_percent_encoded_address_is_redacted(redactor: Redactor) -> None:
    out = _redact(redactor, {"u": "https://x.test/login?next=%2Fmail%3Fto%3Dalice%2540example.com"})
    assert "alice" not in repr(out)


#: what an attacker tries after ``%40`` and ``&#64;`` are caught: encodings nested in each
#: other, the other spellings of a reference, the escapes of JSON/JavaScript in a string that
#: is not itself JSON (a log line, a truncated document)
NESTED_AND_OTHER_ENCODINGS = [
    "alice%252540example.com",                        # percent-encoded three times
    "alice%25252540example.com",                      # four times
    "alice%26%2364;example.com",                      # an entity, percent-encoded
    "alice%26commat%3Bexample.com",                   # a named entity, percent-encoded
    "alice&#37;40example.com",                        # a percent escape, as an entity
    "alice&amp;#64;example.com",                      # an entity, escaped again for HTML
    "alice&amp;amp;#x40;example.com",                 # ... twice
    "alice&#X40;example.com", "alice&#x0040;example.com", "alice&#000064;example.com",
    "alice&#64example.com",                           # no semicolon (browsers accept it)
    "alice&commat;example&period;com",
    "log: {\"to\": \"alice\\u0040example.com\", \"trunc",  # JSON escape, not valid JSON
    "alice\\u0040example\\u002ecom",                 # every separator escaped
    "alice\\x40example.com",                          # a JavaScript/Python hex escape
    "alice%5Cu0040example.com",                       # a JSON escape, percent-encoded
    "\\u0061\\u006c\\u0069\\u0063\\u0065\\u0040example.com",  # every letter escaped
    "al\u2060ice%2540exa\u3164mple.com",                # invisible characters and an encoding
    "mailto%253Aalice%2540example.com",
]


@pytest.mark.parametrize("text", NESTED_AND_OTHER_ENCODINGS)
def test_nested_and_other_encodings_of_an_address_are_tokenized_like_the_plain_one(
        redactor: Redactor, text: str) -> None:
    plain = redactor.redact("alice@example.com", token_key=KEY).text
    result = redactor.redact(text, token_key=KEY)
    assert plain in result.text, result.text
    assert "alice" not in result.text and "\\u0061" not in result.text
    (entity,) = result.entities     # the span is the encoded original, replaced whole
    assert entity.text == text[entity.start:entity.end]


def test_repeated_decoding_stops_at_the_time_budget_and_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pass of the decoding view costs time on a long hostile string: past the
    string's time budget no further pass is made, and the value is refused, never stored
    as written."""
    from langgraph_securesaver.redaction import decoding
    redactor = Redactor()
    now = [0.0]
    redactor._clock = lambda: now[0]
    passes: list[str] = []
    one_pass = decoding._decode_once

    def slow_pass(text: str) -> Any:
        passes.append(text)
        now[0] += 3600.0          # each pass "takes" an hour
        return one_pass(text)

    monkeypatch.setattr(decoding, "_decode_once", slow_pass)
    with pytest.raises(RedactionError, match="time budget") as info:
        redactor.redact("mail alice%252540example.com", token_key=KEY)
    assert "alice" not in str(info.value)
    assert len(passes) == 1


def test_a_doubly_encoded_card_and_phone_in_a_query_string(redactor: Redactor) -> None:
    out = redactor.redact("GET /r?next=%2Fpay%3Fcard%3D4111%25201111%25201111%25201111"
                          "%26to%3D%252B44%25207700%2520900657", token_key=KEY).text
    assert "1111" not in out and "7700" not in out and "<CREDIT_CARD:masked>" in out


@pytest.mark.parametrize("text", [
    "100%2525 of 50%25 done", "see %252F and %25%32%35", "&amp;amp;lt;b&amp;gt; &#38;#38;",
    "path C:\\x86\\new and \\u00e9t\\u00e9", "\\ud83d\\ude00 ok \\ud800 lone",
    "%25%25%25%25%25%25%25%25%25%25%25%25%25%25%25%25%25%25%25%25%2540",
])
def test_nested_encodings_without_personal_data_stay_as_written(redactor: Redactor,
                                                                  text: str) -> None:
    result = redactor.redact(text, token_key=KEY)
    assert result.text == text and result.entities == []


def test_cli_log_lines_escape_ids_read_from_the_database(tmp_path: Any) -> None:
    """Library log lines name tenants and threads with ``%s`` (recovery, rotation); under
    the CLI they reach the operator's terminal, so its log handler escapes them."""
    import subprocess
    import sys
    script = (
        "import logging, sys\n"
        "from langgraph_securesaver.cli.common import main\n"
        "main(verbose=False)\n"
        "logging.getLogger('langgraph_securesaver.idempotency.recovery').error(\n"
        "    'recovery of %s/%s failed outside the run', 'acme', '\\x1b]0;pwned\\x07\\x1b[2J',\n"
        "    exc_info=ValueError('thread \\x1b[31mred\\u202e'))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    assert "pwned" in done.stderr and "red" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert "\u202e" not in done.stderr


# -- key secrecy: operations other than reads and rewrap on tampered key rows -----------------
def _op(url: str, ring_path: Any, op: str) -> object:
    from langchain_core.messages import HumanMessage

    from tests.fake_agent import build_chat_graph
    ring = Keyring.from_file(ring_path)
    with SecureSaver.from_url(url, keyring=ring) as saver:
        cfg: Any = {"configurable": {"thread_id": "t1", "tenant_id": "acme"}}
        if op == "reencrypt":
            return saver.reencrypt()
        if op == "rotate_data_key":
            return saver.rotate_data_key("acme")
        if op == "rotate_keys":
            return saver.rotate_keys()
        if op == "forget_pii":
            return saver.forget_pii("acme", "ann@example.com")
        if op == "pii_inventory":
            return saver.pii_inventory("acme")
        if op == "invoke":
            return build_chat_graph(saver).invoke({"messages": [HumanMessage("again")]}, cfg)
        if op == "list":
            return list(saver.list(cfg))
        if op == "delete_thread":
            with tenant_scope("acme"):
                return saver.delete_thread("t1")
        raise AssertionError(op)


async def _aop(url: str, ring_path: Any, op: str) -> object:
    from langchain_core.messages import HumanMessage

    from tests.fake_agent import build_chat_graph
    ring = Keyring.from_file(ring_path)
    async with SecureSaver.afrom_url(url, keyring=ring) as saver:
        cfg: Any = {"configurable": {"thread_id": "t1", "tenant_id": "acme"}}
        if op == "ainvoke":
            return await build_chat_graph(saver).ainvoke({"messages": [HumanMessage("x")]}, cfg)
        return [c async for c in saver.alist(cfg)]


# the database with tampered key rows, written once per module (test_no_side_doors_keys.py);
# each case tampers with its own copy
database_seed = keys_tests.database_seed

_OPS = ["reencrypt", "rotate_data_key", "rotate_keys", "forget_pii", "pii_inventory",
        "invoke", "list", "delete_thread", "ainvoke", "alist"]


@pytest.mark.parametrize("op", _OPS)
@pytest.mark.parametrize("case", ["altered data row v2", "altered index row"])
def test_operations_on_tampered_key_rows_leak_no_key(case: str, op: str, tmp_path: Any,
                                                     database_seed: Any) -> None:
    import asyncio
    from functools import partial

    from .secrecy_helpers import leaks
    url, ring_path, found = keys_tests._database(tmp_path, database_seed)
    statement, params = keys_tests._TAMPER[case]
    keys_tests._sql(url, statement, *params)
    if op.startswith("a"):
        def run() -> object:
            return asyncio.run(_aop(url, ring_path, op))
        fn: Any = run
    else:
        fn = partial(_op, url, ring_path, op)
    exc, result = _outcome(fn)
    if exc is not None:   # formatted as error reporters do
        hits = leaks(exc, found)
        assert not hits, (op, type(exc).__name__, hits)
    else:   # refusals kept in a report: its text holds no key either
        shown = repr(result) + repr(getattr(result, "__dict__", ""))
        assert not [n for _, n in found.needles() if n in shown], (op, shown)


def _outcome(fn: Any) -> tuple[BaseException | None, object]:
    """What ``fn`` raised or returned, from a frame that holds no secret (the test's frame
    holds them all)."""
    try:
        return None, fn()
    except Exception as exc:
        return exc, None


# -- run tenants with a default tenant ----------------------------------------------------------
def _run_config(saver: SecureSaver) -> Any:
    """A config exactly as LangGraph hands put_writes, captured from inside acme's run."""
    seen: list[Any] = []
    original = saver.put_writes

    def spy(config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        seen.append(config)
        original(config, writes, task_id, task_path)
    saver.put_writes = spy  # type: ignore[method-assign]
    try:
        with tenant_scope("acme"):
            _graph(saver).invoke({"log": ["acme-secret"]}, CFG)
    finally:
        del saver.put_writes
    return seen[-1]


def test_an_ambiguous_run_files_nothing_under_the_default_tenant() -> None:
    """docs/concepts/tenancy.md: an ambiguous run resolves nobody -- with a ``default_tenant`` too:
    acme's tenant-less writes must not land in the default tenant's thread."""
    saver = SecureSaver(InMemorySaver(), keyring=Keyring.generate(), redaction=None,
                        default_tenant="public")
    config = _run_config(saver)
    with tenant_scope("globex"), pytest.raises(AccessDenied):
        saver.put_writes(config, [("log", ["globex"])], "task-x")
    with pytest.raises(TenantRequired):
        saver.put_writes(config, [("log", ["acme-late"])], "task-y")
    with tenant_scope("public"):
        public = saver.get_tuple(CFG)
    assert public is None or not any(t == "task-y" for t, _c, _v in public.pending_writes)


# -- invisible characters in ids ----------------------------------------------------------------
@pytest.mark.parametrize("char", ["\u2060", "\ufeff", "\u180e", "\u200b", "\U000e0041",
                                  "\u034f", "\u2064"])
def test_two_tenants_never_print_alike(char: str) -> None:
    """'acme' and 'ac<U+2060>me' would be two tenants an operator's terminal shows alike:
    refused at the API, and escaped if a forged row holds one."""
    from langgraph_securesaver.cli.common import shown
    from langgraph_securesaver.tenancy import validate_tenant
    with pytest.raises(ConfigurationError, match="invisible"):
        validate_tenant(f"ac{char}me")
    assert char not in shown(f"ac{char}me")   # shown escaped, as controls are
