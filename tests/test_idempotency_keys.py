"""Key derivation and argument fingerprints (pure functions) and policy validation."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from pydantic import BaseModel

from langgraph_securesaver import ConfigurationError, Keyring, SecureSaver
from langgraph_securesaver.idempotency import IdempotencyPolicy, IdempotencyStore
from langgraph_securesaver.idempotency.keys import (
    canonical_json,
    find_tool_call,
    fingerprint,
    parent_namespace,
    step_key_of,
    strip_task_ids,
    task_key,
    tool_call_key,
)
from langgraph_securesaver.keys.crypto import KeyManager
from langgraph_securesaver.registry.core import Registry


def keys_for(tenant: str, ring: Keyring | None = None):  # type: ignore[no-untyped-def]
    manager = KeyManager(ring or Keyring.generate(), Registry.in_memory())
    return manager.keys_for(tenant)


def test_graph_path_drops_task_ids() -> None:
    assert strip_task_ids("") == ""
    assert strip_task_ids("tools:7b6b552c-2719-7e1b") == "tools"
    assert strip_task_ids("agent:1f0|tools:7b6") == "agent|tools"
    assert parent_namespace("agent:1f0|tools:7b6") == "agent:1f0"
    assert parent_namespace("tools:7b6") == ""


def test_tool_call_keys_are_deterministic_distinct_and_opaque() -> None:
    keys = keys_for("acme")
    base = dict(thread_id="t1", graph_path="tools", ai_message_id="ai-1",
                tool_call_id="call_1", tool_name="send_email")
    k = tool_call_key(keys, **base)
    assert k == tool_call_key(keys, **base) and k.startswith("ssik1_") and len(k) <= 64
    for field, other in [("thread_id", "t2"), ("graph_path", "sub|tools"),
                         ("ai_message_id", "ai-2"), ("tool_call_id", "call_2"),
                         ("tool_name", "charge_card")]:
        assert tool_call_key(keys, **{**base, field: other}) != k, field
    assert tool_call_key(keys, **base, checkpoint_id="c1") != k  # on_fork="reexecute"
    assert tool_call_key(keys_for("beta"), **base) != k  # per tenant
    # no ambiguity between parts that contain separators
    a = task_key(keys, thread_id="a\x00b", graph_path="", task_id="x", name="n")
    b = task_key(keys, thread_id="a", graph_path="b", task_id="x", name="n")
    assert a != b
    assert step_key_of(keys, k, 0) != step_key_of(keys, k, "0") != step_key_of(keys, k, 1)


def test_keys_survive_a_restart_with_the_same_keyring(tmp_path: Path) -> None:
    ring = Keyring.generate()
    url = f"sqlite:///{tmp_path / 'k.db'}"
    derived = []
    for _ in range(2):
        with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
            keys = IdempotencyStore.for_saver(saver).tenant_keys("acme")
            derived.append(tool_call_key(keys, thread_id="t", graph_path="tools",
                                         ai_message_id="a", tool_call_id="c", tool_name="n"))
    assert derived[0] == derived[1]


class Order(BaseModel):
    id: str
    amount: int


def test_canonical_json_and_fingerprints() -> None:
    assert canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1})
    assert canonical_json(Order(id="o", amount=1)) == '{"amount":1,"id":"o"}'
    assert canonical_json({"t": dt.date(2025, 1, 2), "s": {2, 1}, "b": b"\x00"}) == (
        '{"b":{"$bytes":"AA=="},"s":[1,2],"t":"2025-01-02"}')
    # an object without a stable form counts by its type, never by its address
    assert canonical_json(object()) == canonical_json(object())
    keys = keys_for("acme")
    assert fingerprint(keys, {"a": 1}) == fingerprint(keys, {"a": 1})
    assert fingerprint(keys, {"a": 1}) != fingerprint(keys, {"a": 2})
    assert fingerprint(keys, {"a": 1}) != fingerprint(keys_for("beta"), {"a": 1})


def test_find_tool_call_takes_the_last_carrying_message() -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    call = {"name": "send_email", "args": {"to": "x"}, "id": "c1", "type": "tool_call"}
    msgs = [HumanMessage("hi"), AIMessage("", id="ai-old", tool_calls=[call]),
            ToolMessage("ok", tool_call_id="c1"), AIMessage("", id="ai-new", tool_calls=[call])]
    found = find_tool_call(msgs, "c1")
    assert found is not None and found[0] == "ai-new" and found[1]["name"] == "send_email"
    assert find_tool_call(msgs, "missing") is None


def test_policy_validation_and_store_cache(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        IdempotencyPolicy(on_conflict="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        IdempotencyPolicy(lease=0)
    with pytest.raises(TypeError):
        IdempotencyPolicy().with_options(no_such_option=1)
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'c.db'}", keyring=Keyring.generate(),
                              redaction=None) as saver:
        store = IdempotencyStore.for_saver(saver)
        assert IdempotencyStore.for_saver(saver) is store
        assert IdempotencyStore.for_services(saver.services) is store  # the purge path's
