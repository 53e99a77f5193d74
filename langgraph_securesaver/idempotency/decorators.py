"""``@idempotent`` and ``run_once``: exactly-once effects in graphs.

``@idempotent`` works on tool functions (under ``@tool``), on node functions, and on plain
helpers called from either; sync and async. ``run_once`` / ``step_key`` number several
effects of one node. The ToolNode wrapper (``IdempotentToolCalls``) is :mod:`.tool_calls`;
what both plan a call with is :mod:`.call_plan`.

Inside the effect, :func:`current_idempotency_key` returns the key to send downstream.
"""

from __future__ import annotations

import functools
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

from langgraph.prebuilt.tool_node import ToolRuntime

from ..offthread import to_thread
from .call_plan import (
    CallPlan,
    as_replayed_tool_message,
    is_error_result,
    note_replay,
    resolve_store,
    tenant_of,
)
from .context import (
    ActiveCall,
    RunContext,
    active_call,
    current_call,
    run_context,
)
from .durability import aguard_durability, guard_durability
from .errors import NoIdempotencyContext
from .keys import (
    KeyScope,
    find_tool_call,
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
RUNTIME_PARAM = "securesaver_runtime"
# parameters LangGraph / LangChain inject by name; never part of the fingerprint
_INJECTED_NAMES = frozenset({"config", "runtime", "store", "writer", "run_manager", "callbacks",
                             RUNTIME_PARAM})


# --------------------------------------------------------------------------------------------
# planning one call: which key, which fingerprint
# --------------------------------------------------------------------------------------------
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
               runtime: ToolRuntime | None) -> CallPlan | None:
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
    store = resolve_store(spec.store, ctx)
    policy = spec.resolved_policy(store)
    tenant = tenant_of(store, ctx)
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
    thread_id = ctx.thread_id if ctx is not None else ""
    fp = (store.fingerprint_of(keys, thread_id, fp_source) if spec.fingerprint is not False
          else None)
    if spec.key is not None:
        value = spec.key(*args, **kwargs) if callable(spec.key) else spec.key
        if policy.scope == "thread" and ctx is None:
            raise NoIdempotencyContext("a thread-scoped business key needs a graph run; use "
                                       "scope='tenant' outside graphs")
        scope = store.business_scope(
            keys, thread_id=thread_id if policy.scope == "thread" else "", origin=thread_id,
            name=spec.name, value=value)
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
    return CallPlan(store, ctx, tenant, scope, fp, policy, tool_call_id)


def _finish(plan: CallPlan, outcome: Outcome) -> Any:
    if not outcome.replayed:
        return outcome.value
    note_replay(plan.ctx)
    if plan.tool_call_id is not None and plan.policy.mark_replays:
        return as_replayed_tool_message(outcome.value, plan.tool_call_id, plan.scope.name)
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
                                     policy=plan.policy, is_failure=is_error_result)
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
                                            policy=plan.policy, is_failure=is_error_result)
        if outcome.replayed:
            span.outcome(replayed=True, attempt=outcome.attempts,
                         fencing_token=outcome.fencing_token)
    return _finish(plan, outcome)


def _plan_in_context(spec: _Spec, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                     runtime: ToolRuntime | None) -> Callable[[], CallPlan | None]:
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
               policy_options: Mapping[str, Any]) -> CallPlan:
    active = current_call()
    ctx = run_context()
    st = resolve_store(store, ctx)
    pol = (policy or st.policy).with_options(**policy_options)
    tenant = tenant_of(st, ctx)
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
        fp = st.fingerprint_of(keys, thread, src)
    return CallPlan(st, ctx, tenant, scope, fp, pol, None)


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
            note_replay(plan.ctx)
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
            note_replay(plan.ctx)
    return outcome.value
