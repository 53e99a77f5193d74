"""Planning one guarded call, and marking a replayed result: what ``@idempotent``,
``run_once`` (:mod:`.decorators`) and the ToolNode wrapper (:mod:`.tool_calls`) share.

Which store the call uses, which tenant it acts for, the plan a call runs under
(:class:`CallPlan`), and how a result replayed from the store is marked
``securesaver_replayed`` for the model and for tracing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.types import Command

from ..errors import ConfigurationError
from ..tenancy import current_tenant_scope, validate_tenant
from .context import CONFIG_KEY_CHECKPOINTER, RunContext, note_replayed_task
from .errors import NoIdempotencyContext
from .keys import KeyScope
from .policy import IdempotencyPolicy
from .store import IdempotencyStore

REPLAYED_FLAG = "securesaver_replayed"


@dataclass(frozen=True)
class CallPlan:
    """One guarded call, planned: its store, run, tenant, key scope, fingerprint and policy."""

    store: IdempotencyStore
    ctx: RunContext | None
    tenant: str
    scope: KeyScope
    fingerprint: str | None
    policy: IdempotencyPolicy
    tool_call_id: str | None


def resolve_store(store: IdempotencyStore | None, ctx: RunContext | None) -> IdempotencyStore:
    """``store``, else the store of the SecureSaver running the graph."""
    if store is not None:
        return store
    if ctx is not None and ctx.saver is not None:
        return IdempotencyStore.for_saver(ctx.saver)
    found = None if ctx is None else type(ctx.configurable.get(CONFIG_KEY_CHECKPOINTER)).__name__
    raise ConfigurationError(
        "an idempotent call needs a store: compile the graph with a SecureSaver (the running "
        f"checkpointer is {found}) or pass store=IdempotencyStore.for_saver(saver)")


def tenant_of(store: IdempotencyStore, ctx: RunContext | None) -> str:
    """The tenant the call acts for (the saver's tenant gate, else the run config or scope)."""
    services = (ctx.saver.services if ctx is not None and ctx.saver is not None
                else store.services)
    if services is not None:
        if ctx is None:
            return services.gate.resolve_tenant("idempotency")
        return services.gate.resolve_ref(ctx.config, "idempotency").tenant
    explicit = ctx.configurable.get("tenant_id") if ctx is not None else None
    tenant = current_tenant_scope() or explicit
    if tenant is None:
        raise NoIdempotencyContext(
            "no tenant for the idempotent call: pass tenant_id in the run config or use "
            "tenant_scope(...)")
    return validate_tenant(str(tenant))


# --- replay marking ----------------------------------------------------------------------------
def _mark_message(msg: ToolMessage) -> ToolMessage:
    meta = dict(msg.response_metadata or {})
    meta[REPLAYED_FLAG] = True
    return msg.model_copy(update={"response_metadata": meta})


def mark_replayed(value: Any) -> Any:
    """A copy of a tool result with every ToolMessage marked ``securesaver_replayed``."""
    if isinstance(value, ToolMessage):
        return _mark_message(value)
    if isinstance(value, Command) and isinstance(value.update, dict):
        msgs = value.update.get("messages")
        if isinstance(msgs, list):
            update = dict(value.update)
            update["messages"] = [_mark_message(m) if isinstance(m, ToolMessage) else m
                                  for m in msgs]
            return Command(graph=value.graph, update=update, resume=value.resume,
                           goto=value.goto)
        return value
    if isinstance(value, list):
        return [mark_replayed(v) for v in value]
    return value


def as_replayed_tool_message(value: Any, tool_call_id: str, name: str) -> Any:
    """What ``@tool`` would have built from ``value``, marked as replayed."""
    if isinstance(value, (ToolMessage, Command)):
        return mark_replayed(value)
    if isinstance(value, (tuple, list)):
        return value  # content_and_artifact tuples / content blocks: returned as stored
    if isinstance(value, str):
        content = value
    else:
        import json
        try:
            content = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            content = str(value)
    return ToolMessage(content=content, tool_call_id=tool_call_id, name=name,
                       response_metadata={REPLAYED_FLAG: True})


def is_error_result(value: Any) -> bool:
    """A ToolMessage with ``status="error"``: a failed attempt, not a result to keep."""
    return isinstance(value, ToolMessage) and value.status == "error"


def note_replay(ctx: RunContext | None) -> None:
    """Remember that the current task replayed a stored result (``is_replaying``)."""
    if ctx is not None and ctx.task_id is not None:
        note_replayed_task(ctx.thread_id, ctx.task_id)
