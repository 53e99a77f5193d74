"""Deterministic idempotency keys from persisted identity, and argument fingerprints.

A key is a keyed HMAC (the tenant's index key, :meth:`TenantKeys.blind`) over a versioned,
length-unambiguous tuple of identity parts, so it is stable across processes and resumes,
distinct per tenant, and reveals nothing about thread ids, message ids or arguments to a
downstream API that receives it as its ``Idempotency-Key``.

Identity parts (never run ids, attempt counters or task ids for tool calls):

* tool call: thread, graph path without task-id segments, AIMessage id, tool-call id, tool name
  (plus, with ``on_fork="reexecute"``, the id of the checkpoint the task started from);
* task (a node or a plain function called in a node): thread, graph path, task id (stable on
  resume from the same checkpoint, new on a fork), function name;
* step ``i`` of a task or tool call: the enclosing key and ``i``;
* business key: thread (or the whole tenant with ``scope="tenant"``), name, the business value.

Personal data never enters one of these HMACs: the business value and the arguments are
*tokenized* first (:meth:`.store.IdempotencyStore.tokenized`: each PII value replaced by the
random public token of its PII-vault entry), so a key or fingerprint confirms no guessed value
once that entry is erased -- in live rows, dead tuples and backups alike, whatever becomes of
the tenant index key (docs/erasure.md, "Keyed derivatives").
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..keys.crypto import TenantKeys
from ..keys.tokens import associated_data

KEY_VERSION = "v1"
KEY_PREFIX = "ssik1_"
NS_SEP = "|"
NS_END = ":"


@dataclass(frozen=True)
class KeyScope:
    """Where one idempotency record lives, and the key downstream APIs receive."""

    tenant: str
    thread_id: str  # "" for tenant-wide business keys
    key: str
    kind: str  # tool | task | step | business
    name: str
    #: the thread that claimed a tenant-wide record ("" outside graphs): the record's PII-vault
    #: references are that thread's, and the record is erased with it (see store.delete_thread)
    origin: str = ""

    @property
    def refs_thread(self) -> str:
        """The thread the PII-vault references of this record's values are recorded under."""
        return self.thread_id or self.origin

    def result_aad(self) -> bytes:
        return associated_data("idem", self.tenant, self.thread_id, self.key)

    def error_aad(self) -> bytes:
        return associated_data("idem-error", self.tenant, self.thread_id, self.key)


def _derive(keys: TenantKeys, *parts: str) -> str:
    # TenantKeys.blind joins with NUL; parts never contain NUL after this escaping
    safe = [p.replace("\\", "\\\\").replace("\x00", "\\0") for p in parts]
    return KEY_PREFIX + keys.blind("idem-key", KEY_VERSION, *safe)


def strip_task_ids(checkpoint_ns: str) -> str:
    """``"agent:1f0...|tools:7b6..."`` -> ``"agent|tools"`` (task ids change on forks)."""
    if not checkpoint_ns:
        return ""
    return NS_SEP.join(seg.split(NS_END, 1)[0] for seg in checkpoint_ns.split(NS_SEP))


def parent_namespace(checkpoint_ns: str) -> str:
    """The namespace of the graph that created the task running in ``checkpoint_ns``."""
    if not checkpoint_ns:
        return ""
    return NS_SEP.join(checkpoint_ns.split(NS_SEP)[:-1])


def tool_call_key(keys: TenantKeys, *, thread_id: str, graph_path: str,
                  ai_message_id: str | None, tool_call_id: str, tool_name: str,
                  checkpoint_id: str | None = None) -> str:
    parts = ["tool", thread_id, graph_path, ai_message_id or "", tool_call_id, tool_name]
    if checkpoint_id is not None:
        parts += ["fork", checkpoint_id]
    return _derive(keys, *parts)


def task_key(keys: TenantKeys, *, thread_id: str, graph_path: str, task_id: str,
             name: str) -> str:
    return _derive(keys, "task", thread_id, graph_path, task_id, name)


def step_key_of(keys: TenantKeys, parent_key: str, step: int | str) -> str:
    return _derive(keys, "step", parent_key, f"{type(step).__name__}:{step}")


def business_key(keys: TenantKeys, *, thread_id: str, name: str, value: str) -> str:
    return _derive(keys, "business", thread_id, name, value)


# --- arguments -----------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(
            value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _jsonable(dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    # unknown objects: their type only (a repr may hold a memory address, which would make the
    # fingerprint differ between two runs of the same call)
    return {"$type": f"{type(value).__module__}.{type(value).__qualname__}"}


def canonical_json(value: Any) -> str:
    """Sorted-keys, compact JSON of ``value`` (pydantic, dataclasses, bytes, dates handled)."""
    return json.dumps(_jsonable(value), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def fingerprint(keys: TenantKeys, args: Any) -> str:
    """Keyed HMAC of the canonical JSON of the (tokenized) arguments: equality only, never
    reversible; callers pass :meth:`.store.IdempotencyStore.tokenized` arguments."""
    return keys.blind("idem-fp", KEY_VERSION, canonical_json(args))


# --- finding the tool call in the state ------------------------------------------------------
def messages_of(state: Any, messages_key: str = "messages") -> Sequence[Any]:
    if state is None:
        return ()
    if isinstance(state, list):
        return state
    if isinstance(state, Mapping):
        found = state.get(messages_key)
    else:
        found = getattr(state, messages_key, None)
    return found if isinstance(found, Sequence) and not isinstance(found, str) else ()


def find_tool_call(messages: Sequence[Any], tool_call_id: str
                   ) -> tuple[str | None, Mapping[str, Any]] | None:
    """The id of the last AIMessage whose ``tool_calls`` carry ``tool_call_id``, and the call."""
    for message in reversed(messages):
        if getattr(message, "type", None) != "ai":
            continue
        for call in getattr(message, "tool_calls", None) or ():
            if call.get("id") == tool_call_id:
                return getattr(message, "id", None), call
    return None
