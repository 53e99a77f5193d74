"""``IdempotentToolCalls`` and ``idempotent_tool_node``: every tool call of a ``ToolNode``
taken at most once.

``ToolNode(tools, wrap_tool_call=w, awrap_tool_call=w.awrap)`` covers a whole tool list,
including the tools of ``create_react_agent`` (pass it the ToolNode); a call's key comes from
its AIMessage and tool-call ids (or a business key per tool). ``@idempotent`` on single
functions is :mod:`.decorators`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, cast

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolNode, ToolRuntime
from langgraph.types import Command

from ..offthread import to_thread
from .call_plan import (
    CallPlan,
    is_error_result,
    mark_replayed,
    note_replay,
    resolve_store,
    tenant_of,
)
from .context import ActiveCall, RunContext, active_call, run_context
from .durability import aguard_durability, guard_durability
from .errors import NoIdempotencyContext
from .keys import KeyScope, find_tool_call, messages_of, tool_call_key
from .policy import IdempotencyPolicy
from .store import Claim, IdempotencyStore, Outcome
from .tracing import call_span

ToolResult = ToolMessage | Command


class IdempotentToolCalls:
    """A ``ToolNode`` tool-call wrapper that makes every (or selected) tool call idempotent.

    ``ToolNode(tools, wrap_tool_call=w, awrap_tool_call=w.awrap)`` with
    ``w = IdempotentToolCalls()``; or :func:`idempotent_tool_node`. Results (ToolMessage or
    Command) are stored sealed; on a replay the stored result is returned with
    ``response_metadata["securesaver_replayed"] = True``. A ToolMessage with
    ``status="error"`` counts as a failed attempt (not cached; retried with the same key).

    Args:
        store: the store (default: the SecureSaver running the graph).
        policy: an :class:`IdempotencyPolicy`; ``**policy_options`` override its fields.
        tools: names of the tools to cover (default: all).
        exclude: names never covered (pure/read-only tools).
        business_keys: per tool name, a callable receiving the call's args and returning a
            business key (e.g. ``{"charge_card": lambda a: a["order_id"]}``).
        messages_key: the state key holding the messages (to find the AIMessage id).
    """

    def __init__(self, store: IdempotencyStore | None = None, *,
                 policy: IdempotencyPolicy | None = None, tools: Collection[str] | None = None,
                 exclude: Collection[str] = (),
                 business_keys: Mapping[str, Callable[[Mapping[str, Any]], Any]] | None = None,
                 messages_key: str = "messages", **policy_options: Any) -> None:
        if policy_options:
            IdempotencyPolicy().with_options(**policy_options)
        self.store = store
        self.policy = policy
        self.policy_options = dict(policy_options)
        self.tools = frozenset(tools) if tools is not None else None
        self.exclude = frozenset(exclude)
        self.business_keys = dict(business_keys or {})
        self.messages_key = messages_key

    def covers(self, tool_name: str) -> bool:
        if tool_name in self.exclude:
            return False
        return self.tools is None or tool_name in self.tools

    def _plan(self, request: ToolCallRequest) -> CallPlan:
        call = request.tool_call
        runtime = request.runtime
        config = runtime.config if isinstance(runtime, ToolRuntime) else None
        ctx = run_context(config)
        store = resolve_store(self.store, ctx)
        policy = (self.policy or store.policy).with_options(**self.policy_options)
        tenant = tenant_of(store, ctx)
        keys = store.tenant_keys(tenant)
        name = str(call["name"])
        call_id = str(call.get("id") or "")
        if not call_id:
            raise NoIdempotencyContext(f"tool call {name!r} has no id to derive a key from")
        args = call.get("args", {})
        fp = store.fingerprint_of(keys, ctx.thread_id, args)
        bk = self.business_keys.get(name)
        if bk is not None:
            scope = store.business_scope(
                keys, thread_id=ctx.thread_id if policy.scope == "thread" else "",
                origin=ctx.thread_id, name=name, value=bk(args))
        else:
            found = find_tool_call(messages_of(request.state, self.messages_key), call_id)
            ai_id = found[0] if found is not None else None
            scope = KeyScope(tenant, ctx.thread_id, tool_call_key(
                keys, thread_id=ctx.thread_id, graph_path=ctx.graph_path, ai_message_id=ai_id,
                tool_call_id=call_id, tool_name=name,
                checkpoint_id=ctx.parent_checkpoint_id if policy.on_fork == "reexecute"
                else None), "tool", name)
        return CallPlan(store, ctx, tenant, scope, fp, policy, call_id)

    def wrap(self, request: ToolCallRequest,
             execute: Callable[[ToolCallRequest], ToolResult]) -> ToolResult:
        if not self.covers(str(request.tool_call["name"])):
            return execute(request)
        plan = self._plan(request)
        guard_durability(plan.store, cast(RunContext, plan.ctx), plan.tenant, plan.policy)
        with call_span(plan.scope) as span:
            def body(claim: Claim) -> ToolResult:
                span.outcome(replayed=False, attempt=claim.attempts, fencing_token=claim.token)
                with active_call(ActiveCall(plan.scope, claim.token, False, plan.tool_call_id)):
                    return execute(request)

            outcome = plan.store.execute(plan.scope, body, fingerprint=plan.fingerprint,
                                         policy=plan.policy, is_failure=is_error_result)
            if outcome.replayed:
                span.outcome(replayed=True, attempt=outcome.attempts,
                             fencing_token=outcome.fencing_token)
        return cast(ToolResult, self._finish(plan, outcome))

    __call__ = wrap

    async def awrap(self, request: ToolCallRequest,
                    execute: Callable[[ToolCallRequest], Awaitable[ToolResult]]) -> ToolResult:
        if not self.covers(str(request.tool_call["name"])):
            return await execute(request)
        plan = await to_thread(self._plan, request)
        await aguard_durability(plan.store, cast(RunContext, plan.ctx), plan.tenant,
                                 plan.policy)
        with call_span(plan.scope) as span:
            async def body(claim: Claim) -> ToolResult:
                span.outcome(replayed=False, attempt=claim.attempts, fencing_token=claim.token)
                with active_call(ActiveCall(plan.scope, claim.token, False, plan.tool_call_id)):
                    return await execute(request)

            outcome = await plan.store.aexecute(plan.scope, body, fingerprint=plan.fingerprint,
                                                policy=plan.policy, is_failure=is_error_result)
            if outcome.replayed:
                span.outcome(replayed=True, attempt=outcome.attempts,
                             fencing_token=outcome.fencing_token)
        return cast(ToolResult, self._finish(plan, outcome))

    @staticmethod
    def _finish(plan: CallPlan, outcome: Outcome) -> Any:
        if not outcome.replayed:
            return outcome.value
        note_replay(plan.ctx)
        return mark_replayed(outcome.value) if plan.policy.mark_replays else outcome.value


def idempotent_tool_node(tools: Sequence[Any], *, store: IdempotencyStore | None = None,
                         policy: IdempotencyPolicy | None = None,
                         idempotent_tools: Collection[str] | None = None,
                         exclude: Collection[str] = (),
                         business_keys: Mapping[str, Callable[[Mapping[str, Any]], Any]]
                         | None = None,
                         **tool_node_options: Any) -> ToolNode:
    """A ``ToolNode`` whose tool calls go through :class:`IdempotentToolCalls`.

    Pass it as ``tools=`` to ``create_react_agent`` to cover a prebuilt agent.
    """
    messages_key = tool_node_options.get("messages_key", "messages")
    wrapper = IdempotentToolCalls(store, policy=policy, tools=idempotent_tools, exclude=exclude,
                                  business_keys=business_keys, messages_key=messages_key)
    return ToolNode(tools, wrap_tool_call=wrapper.wrap, awrap_tool_call=wrapper.awrap,
                    **tool_node_options)
