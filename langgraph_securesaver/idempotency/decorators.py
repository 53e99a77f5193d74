"""``@idempotent``, the ToolNode wrapper and ``run_once``: exactly-once effects in graphs.

``@idempotent`` works on tool functions (under ``@tool``), on node functions, and on plain
helpers called from either; sync and async. ``IdempotentToolCalls`` plugs into
``ToolNode(wrap_tool_call=..., awrap_tool_call=...)`` and covers a whole tool list, including
the tools of ``create_react_agent`` (pass it the ToolNode).

Inside the effect, :func:`current_idempotency_key` returns the key to send downstream.
"""

from __future__ import annotations

import functools
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolNode, ToolRuntime
from langgraph.types import Command

from ..errors import ConfigurationError
from ..offthread import to_thread
from ..tenancy import current_tenant_scope, validate_tenant
from .context import (
    CONFIG_KEY_CHECKPOINTER,
    ActiveCall,
    RunContext,
    active_call,
    current_call,
    note_replayed_task,
    run_context,
)
from .durability import aguard_durability, guard_durability
from .errors import NoIdempotencyContext
from .keys import (
    KeyScope,
    business_key,
    find_tool_call,
    fingerprint,
    messages_of,
    step_key_of,
    task_key,
    tool_call_key,
)
from .policy import IdempotencyPolicy
from .store import Claim, IdempotencyStore, Outcome
from .tracing import call_span

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
REPLAYED_FLAG = "securesaver_replayed"
RUNTIME_PARAM = "securesaver_runtime"
# parameters LangGraph / LangChain inject by name; never part of the fingerprint
_INJECTED_NAMES = frozenset({"config", "runtime", "store", "writer", "run_manager", "callbacks",
                             RUNTIME_PARAM})



# --------------------------------------------------------------------------------------------
# shared plumbing
# --------------------------------------------------------------------------------------------
def _resolve_store(store: IdempotencyStore | None, ctx: RunContext | None) -> IdempotencyStore:
    if store is not None:
        return store
    if ctx is not None and ctx.saver is not None:
        return IdempotencyStore.for_saver(ctx.saver)
    found = None if ctx is None else type(ctx.configurable.get(CONFIG_KEY_CHECKPOINTER)).__name__
    raise ConfigurationError(
        "an idempotent call needs a store: compile the graph with a SecureSaver (the running "
        f"checkpointer is {found}) or pass store=IdempotencyStore.for_saver(saver)")


def _tenant_of(store: IdempotencyStore, ctx: RunContext | None) -> str:
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


def _as_replayed_tool_message(value: Any, tool_call_id: str, name: str) -> Any:
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


def _is_error_result(value: Any) -> bool:
    return isinstance(value, ToolMessage) and value.status == "error"


def _note_replay(ctx: RunContext | None) -> None:
    if ctx is not None and ctx.task_id is not None:
        note_replayed_task(ctx.thread_id, ctx.task_id)


# --------------------------------------------------------------------------------------------
# planning one call: which key, which fingerprint
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    store: IdempotencyStore
    ctx: RunContext | None
    tenant: str
    scope: KeyScope
    fingerprint: str | None
    policy: IdempotencyPolicy
    tool_call_id: str | None


KeyFn = Callable[..., Any]
FingerprintOpt = bool | Callable[..., Any]


@dataclass(frozen=True)
class _Spec:
    name: str
    key: str | KeyFn | None
    store: IdempotencyStore | None
    policy: IdempotencyPolicy | None
    policy_options: Mapping[str, Any]
    fingerprint: FingerprintOpt
    signature: inspect.Signature
    runtime_param: str | None

    def resolved_policy(self, store: IdempotencyStore) -> IdempotencyPolicy:
        base = self.policy or store.policy
        return base.with_options(**self.policy_options)

    def fp_args(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError:
            return {"args": list(args), "kwargs": dict(kwargs)}
        return {k: v for k, v in bound.arguments.items()
                if k not in _INJECTED_NAMES and k != self.runtime_param
                and not isinstance(v, ToolRuntime)}


def _plan_call(spec: _Spec, args: tuple[Any, ...], kwargs: Mapping[str, Any],
               runtime: ToolRuntime | None) -> _Plan | None:
    """None: run unguarded because an enclosing wrapper already owns this very tool call."""
    active = current_call()
    tool_call_id = runtime.tool_call_id if runtime is not None else None
    if active is not None and tool_call_id is not None and active.tool_call_id == tool_call_id:
        return None
    ctx: RunContext | None
    if runtime is not None:
        ctx = run_context(runtime.config)
    elif spec.key is not None and spec.store is not None:
        try:
            ctx = run_context()
        except NoIdempotencyContext:
            ctx = None  # a business key with an explicit store works outside graphs too
    else:
        ctx = run_context()
    store = _resolve_store(spec.store, ctx)
    policy = spec.resolved_policy(store)
    tenant = _tenant_of(store, ctx)
    keys = store.tenant_keys(tenant)
    call: Mapping[str, Any] | None = None
    if tool_call_id is not None and runtime is not None:
        found = find_tool_call(messages_of(runtime.state), tool_call_id)
        ai_id, call = found if found is not None else (None, None)
    fp_source: Any
    if call is not None:
        fp_source = call.get("args", {})
    else:
        fp_source = spec.fp_args(args, kwargs)
    if callable(spec.fingerprint):
        fp_source = spec.fingerprint(*args, **kwargs)
    fp = fingerprint(keys, fp_source) if spec.fingerprint is not False else None

    thread_id = ctx.thread_id if ctx is not None else ""
    if spec.key is not None:
        value = spec.key(*args, **kwargs) if callable(spec.key) else spec.key
        if policy.scope == "thread" and ctx is None:
            raise NoIdempotencyContext("a thread-scoped business key needs a graph run; use "
                                       "scope='tenant' outside graphs")
        thread = thread_id if policy.scope == "thread" else ""
        scope = KeyScope(tenant, thread, business_key(keys, thread_id=thread, name=spec.name,
                                                      value=str(value)), "business", spec.name)
    elif tool_call_id is not None and ctx is not None:
        tool_name = str(call.get("name")) if call is not None else spec.name
        scope = KeyScope(tenant, ctx.thread_id, tool_call_key(
            keys, thread_id=ctx.thread_id, graph_path=ctx.graph_path,
            ai_message_id=ai_id if call is not None else None, tool_call_id=tool_call_id,
            tool_name=tool_name,
            checkpoint_id=ctx.parent_checkpoint_id if policy.on_fork == "reexecute" else None,
        ), "tool", tool_name)
    elif active is not None:
        scope = KeyScope(tenant, active.scope.thread_id,
                         step_key_of(keys, active.scope.key, f"call:{spec.name}"), "step",
                         spec.name)
    else:
        if ctx is None or ctx.task_id is None:
            raise NoIdempotencyContext(
                f"@idempotent {spec.name} has no tool call, task or key to derive its key from")
        scope = KeyScope(tenant, ctx.thread_id, task_key(
            keys, thread_id=ctx.thread_id, graph_path=ctx.graph_path, task_id=ctx.task_id,
            name=spec.name), "task", spec.name)
    return _Plan(store, ctx, tenant, scope, fp, policy, tool_call_id)


def _finish(plan: _Plan, outcome: Outcome) -> Any:
    if not outcome.replayed:
        return outcome.value
    _note_replay(plan.ctx)
    if plan.tool_call_id is not None and plan.policy.mark_replays:
        return _as_replayed_tool_message(outcome.value, plan.tool_call_id, plan.scope.name)
    return outcome.value


def _run_sync(spec: _Spec, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any], runtime: ToolRuntime | None) -> Any:
    plan = _plan_call(spec, args, kwargs, runtime)
    if plan is None:
        return fn(*args, **kwargs)
    if plan.ctx is not None:
        guard_durability(plan.store, plan.ctx, plan.tenant, plan.policy)
    with call_span(plan.scope) as span:
        def body(claim: Claim) -> Any:
            span.outcome(replayed=False, attempt=claim.attempts, fencing_token=claim.token)
            with active_call(ActiveCall(plan.scope, claim.token, False, plan.tool_call_id)):
                return fn(*args, **kwargs)

        outcome = plan.store.execute(plan.scope, body, fingerprint=plan.fingerprint,
                                     policy=plan.policy, is_failure=_is_error_result)
        if outcome.replayed:
            span.outcome(replayed=True, attempt=outcome.attempts,
                         fencing_token=outcome.fencing_token)
    return _finish(plan, outcome)


async def _run_async(spec: _Spec, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                     kwargs: dict[str, Any], runtime: ToolRuntime | None) -> Any:
    active = current_call()
    if (runtime is not None and active is not None and active.tool_call_id is not None
            and active.tool_call_id == runtime.tool_call_id):
        return await fn(*args, **kwargs)
    # key derivation may read the registry (tenant keys): keep it off the event loop
    plan = await to_thread(_plan_in_context(spec, args, kwargs, runtime))
    if plan is None:
        return await fn(*args, **kwargs)
    if plan.ctx is not None:
        await aguard_durability(plan.store, plan.ctx, plan.tenant, plan.policy)
    with call_span(plan.scope) as span:
        async def body(claim: Claim) -> Any:
            span.outcome(replayed=False, attempt=claim.attempts, fencing_token=claim.token)
            with active_call(ActiveCall(plan.scope, claim.token, False, plan.tool_call_id)):
                return await fn(*args, **kwargs)

        outcome = await plan.store.aexecute(plan.scope, body, fingerprint=plan.fingerprint,
                                            policy=plan.policy, is_failure=_is_error_result)
        if outcome.replayed:
            span.outcome(replayed=True, attempt=outcome.attempts,
                         fencing_token=outcome.fencing_token)
    return _finish(plan, outcome)


def _plan_in_context(spec: _Spec, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                     runtime: ToolRuntime | None) -> Callable[[], _Plan | None]:
    # to_thread (offthread) copies the context, so get_config()/current_call() still work there
    return functools.partial(_plan_call, spec, args, kwargs, runtime)


# --------------------------------------------------------------------------------------------
# @idempotent
# --------------------------------------------------------------------------------------------
def _runtime_param(sig: inspect.Signature, hints: Mapping[str, Any]) -> str | None:
    for name, param in sig.parameters.items():
        ann = hints.get(name, param.annotation)
        origin = typing.get_origin(ann)
        candidates = typing.get_args(ann) if origin is not None else (ann,)
        if any(isinstance(c, type) and issubclass(c, ToolRuntime) for c in candidates):
            return name
    return None


@overload
def idempotent(fn: F, /) -> F: ...


@overload
def idempotent(
    fn: None = None, /, *, key: str | KeyFn | None = ..., store: IdempotencyStore | None = ...,
    policy: IdempotencyPolicy | None = ..., fingerprint: FingerprintOpt = ...,
    name: str | None = ..., **policy_options: Any,
) -> Callable[[F], F]: ...


def idempotent(
    fn: F | None = None, /, *, key: str | KeyFn | None = None,
    store: IdempotencyStore | None = None, policy: IdempotencyPolicy | None = None,
    fingerprint: FingerprintOpt = True, name: str | None = None, **policy_options: Any,
) -> F | Callable[[F], F]:
    """Make a tool, node or helper function take effect at most once per logical call.

    Use bare (``@idempotent``) or with options (``@idempotent(key=..., on_conflict="raise")``);
    put ``@tool`` ON TOP of it. The key is derived from persisted identity (see
    :mod:`langgraph_securesaver.idempotency.keys`):

    * called as a tool call (through ``ToolNode``/``create_react_agent``): thread, graph path,
      AIMessage id, tool-call id and tool name;
    * called as a node or from a node: thread, graph path, the task id and the function name
      (a second call of the same function in the same task needs ``key=`` or ``run_once``);
    * inside another idempotent call: the enclosing key and the function name;
    * ``key=`` (a string, or a callable receiving the function's arguments) overrides all of
      this with a business key (e.g. an order id), unique per thread (``scope="tenant"``: per
      tenant).

    Args:
        key: business key override.
        store: the store (default: the SecureSaver running the graph, from the run config).
        policy: an :class:`IdempotencyPolicy`; ``**policy_options`` override its fields.
        fingerprint: check that a key is never reused with other arguments (True: the tool-call
            arguments, or the function's arguments minus injected ones; a callable: its return
            value; False: no check).
        name: record name (default: the function's ``__name__``).
    """
    if policy_options:
        IdempotencyPolicy().with_options(**policy_options)  # validate option names early

    def decorate(func: F) -> F:
        sig = inspect.signature(func)
        try:
            hints = typing.get_type_hints(func, include_extras=True)
        except (NameError, TypeError, AttributeError):  # unresolvable forward references
            hints = dict(getattr(func, "__annotations__", {}))
        runtime_param = _runtime_param(sig, hints)
        spec = _Spec(name or str(getattr(func, "__name__", "call")), key, store, policy,
                     dict(policy_options), fingerprint, sig, runtime_param)
        injected = runtime_param is None

        def split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], ToolRuntime | None]:
            if injected:
                rt = kwargs.pop(RUNTIME_PARAM, None)
            else:
                rt = kwargs.get(cast(str, runtime_param))
            return kwargs, rt if isinstance(rt, ToolRuntime) else None

        wrapper: Any
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                kw, rt = split(kwargs)
                return await _run_async(spec, func, args, kw, rt)
            wrapper = async_wrapper
        else:
            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                kw, rt = split(kwargs)
                return _run_sync(spec, func, args, kw, rt)
            wrapper = sync_wrapper

        if injected:
            # ask ToolNode to inject the ToolRuntime (tool-call id + state) under our own name;
            # LLM-facing tool schemas never show injected parameters
            params = list(sig.parameters.values())
            extra = inspect.Parameter(RUNTIME_PARAM, inspect.Parameter.KEYWORD_ONLY,
                                      default=None, annotation=ToolRuntime)
            if params and params[-1].kind == inspect.Parameter.VAR_KEYWORD:
                params.insert(len(params) - 1, extra)
            else:
                params.append(extra)
            setattr(wrapper, "__signature__", sig.replace(parameters=params))  # noqa: B010
            annotations = dict(hints)
            annotations[RUNTIME_PARAM] = ToolRuntime
            wrapper.__annotations__ = annotations
        setattr(wrapper, "__securesaver_idempotent__", spec)  # noqa: B010
        return cast(F, wrapper)

    if fn is not None:
        return decorate(fn)
    return decorate


# --------------------------------------------------------------------------------------------
# run_once / step_key for several effects in one node
# --------------------------------------------------------------------------------------------
def _step_plan(step: int | str, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: Mapping[str, Any], store: IdempotencyStore | None,
               policy: IdempotencyPolicy | None, fp_opt: FingerprintOpt,
               policy_options: Mapping[str, Any]) -> _Plan:
    active = current_call()
    ctx = run_context()
    st = _resolve_store(store, ctx)
    pol = (policy or st.policy).with_options(**policy_options)
    tenant = _tenant_of(st, ctx)
    keys = st.tenant_keys(tenant)
    name = getattr(fn, "__name__", "step")
    if active is not None:
        parent, thread = active.scope.key, active.scope.thread_id
    else:
        if ctx.task_id is None:
            raise NoIdempotencyContext("run_once()/step_key() need a graph task")
        parent = task_key(keys, thread_id=ctx.thread_id, graph_path=ctx.graph_path,
                          task_id=ctx.task_id, name="")
        thread = ctx.thread_id
    scope = KeyScope(tenant, thread, step_key_of(keys, parent, step), "step", name)
    fp = None
    if fp_opt is not False:
        src = (fp_opt(*args, **kwargs) if callable(fp_opt) else
               {"fn": getattr(fn, "__qualname__", name), "args": list(args),
                "kwargs": dict(kwargs)})
        fp = fingerprint(keys, src)
    return _Plan(st, ctx, tenant, scope, fp, pol, None)


def step_key(step: int | str, *, store: IdempotencyStore | None = None) -> str:
    """The key of effect number ``step`` of the current node task (or idempotent call).

    Stable across resumes of the same task; pass it downstream yourself, or use
    :func:`run_once` to also record and replay the effect.
    """
    return _step_plan(step, step_key, (), {}, store, None, False, {}).scope.key


def run_once(step: int | str, fn: Callable[..., Any], /, *args: Any,
             store: IdempotencyStore | None = None, policy: IdempotencyPolicy | None = None,
             fingerprint: FingerprintOpt = True, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` as effect ``step`` of the current task, at most once.

    ``step`` numbers the effects of one node (``0``, ``1``, ...). ``fn`` sees the step key via
    :func:`current_idempotency_key`.
    """
    plan = _step_plan(step, fn, args, kwargs, store, policy, fingerprint, {})
    guard_durability(plan.store, cast(RunContext, plan.ctx), plan.tenant, plan.policy)
    with call_span(plan.scope) as span:
        def body(claim: Claim) -> Any:
            span.outcome(replayed=False, attempt=claim.attempts, fencing_token=claim.token)
            with active_call(ActiveCall(plan.scope, claim.token, False)):
                return fn(*args, **kwargs)

        outcome = plan.store.execute(plan.scope, body, fingerprint=plan.fingerprint,
                                     policy=plan.policy)
        if outcome.replayed:
            span.outcome(replayed=True, attempt=outcome.attempts,
                         fencing_token=outcome.fencing_token)
            _note_replay(plan.ctx)
    return outcome.value


async def arun_once(step: int | str, fn: Callable[..., Any], /, *args: Any,
                    store: IdempotencyStore | None = None,
                    policy: IdempotencyPolicy | None = None,
                    fingerprint: FingerprintOpt = True, **kwargs: Any) -> Any:
    """Async :func:`run_once`; ``fn`` may be a coroutine function or a plain function."""
    plan = await to_thread(functools.partial(
        _step_plan, step, fn, args, kwargs, store, policy, fingerprint, {}))
    await aguard_durability(plan.store, cast(RunContext, plan.ctx), plan.tenant, plan.policy)
    with call_span(plan.scope) as span:
        async def body(claim: Claim) -> Any:
            span.outcome(replayed=False, attempt=claim.attempts, fencing_token=claim.token)
            with active_call(ActiveCall(plan.scope, claim.token, False)):
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                return result

        outcome = await plan.store.aexecute(plan.scope, body, fingerprint=plan.fingerprint,
                                            policy=plan.policy)
        if outcome.replayed:
            span.outcome(replayed=True, attempt=outcome.attempts,
                         fencing_token=outcome.fencing_token)
            _note_replay(plan.ctx)
    return outcome.value


# --------------------------------------------------------------------------------------------
# ToolNode(wrap_tool_call=...)
# --------------------------------------------------------------------------------------------
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

    def _plan(self, request: ToolCallRequest) -> _Plan:
        call = request.tool_call
        runtime = request.runtime
        config = runtime.config if isinstance(runtime, ToolRuntime) else None
        ctx = run_context(config)
        store = _resolve_store(self.store, ctx)
        policy = (self.policy or store.policy).with_options(**self.policy_options)
        tenant = _tenant_of(store, ctx)
        keys = store.tenant_keys(tenant)
        name = str(call["name"])
        call_id = str(call.get("id") or "")
        if not call_id:
            raise NoIdempotencyContext(f"tool call {name!r} has no id to derive a key from")
        args = call.get("args", {})
        fp = fingerprint(keys, args)
        bk = self.business_keys.get(name)
        if bk is not None:
            thread = ctx.thread_id if policy.scope == "thread" else ""
            scope = KeyScope(tenant, thread, business_key(
                keys, thread_id=thread, name=name, value=str(bk(args))), "business", name)
        else:
            found = find_tool_call(messages_of(request.state, self.messages_key), call_id)
            ai_id = found[0] if found is not None else None
            scope = KeyScope(tenant, ctx.thread_id, tool_call_key(
                keys, thread_id=ctx.thread_id, graph_path=ctx.graph_path, ai_message_id=ai_id,
                tool_call_id=call_id, tool_name=name,
                checkpoint_id=ctx.parent_checkpoint_id if policy.on_fork == "reexecute"
                else None), "tool", name)
        return _Plan(store, ctx, tenant, scope, fp, policy, call_id)

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
                                         policy=plan.policy, is_failure=_is_error_result)
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
                                                policy=plan.policy, is_failure=_is_error_result)
            if outcome.replayed:
                span.outcome(replayed=True, attempt=outcome.attempts,
                             fencing_token=outcome.fencing_token)
        return cast(ToolResult, self._finish(plan, outcome))

    @staticmethod
    def _finish(plan: _Plan, outcome: Outcome) -> Any:
        if not outcome.replayed:
            return outcome.value
        _note_replay(plan.ctx)
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
