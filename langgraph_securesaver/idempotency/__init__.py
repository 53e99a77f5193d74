"""Exactly-once side effects for LangGraph graphs checkpointed by a SecureSaver.

A checkpointer guarantees that a step runs at least once; this package makes its side effects
take effect once: deterministic keys from persisted identity, an atomic claim store with leases
and fencing tokens, sealed (encrypted, tenant/thread-bound) results replayed on resume, a
ToolNode wrapper, a durability guard, replay-aware tracing, and stalled-run recovery.
See docs/idempotency.md.

May import: the foundation modules, :mod:`..keys`, :mod:`..registry`, :mod:`..storage` and
the per-turn path (``services``); the operations, the saver and the CLI import it. This
``__init__`` is a facade: it also re-exports ``recover_main`` from :mod:`..cli.recover`
(loaded on first use).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..cli.recover import recover_main
    from .call_plan import REPLAYED_FLAG, mark_replayed
    from .context import (
        current_fencing_token,
        current_idempotency_key,
        is_replaying,
    )
    from .decorators import arun_once, idempotent, run_once, step_key
    from .errors import (
        DurabilityError,
        IdempotencyAttemptsExhausted,
        IdempotencyConflict,
        IdempotencyError,
        IdempotencyKeyReused,
        IdempotencyLeaseLost,
        IdempotencyOutcomeUnknown,
        IdempotencyStoreUnavailable,
        NoIdempotencyContext,
        RecoveryLeaseLost,
    )
    from .keys import KeyScope, canonical_json, strip_task_ids
    from .policy import IdempotencyPolicy
    from .records import IdempotencyRecord
    from .recovery import (
        DeadLetter,
        RecoveryReport,
        amark_recoverable,
        arecover_stalled,
        arecoverable_run,
        dead_letters_of,
        mark_recoverable,
        rearm_dead_letter,
        recover_stalled,
        recoverable_run,
        recovery_state,
        release_recoverable,
        unmark_recoverable,
    )
    from .store import Claim, Hit, IdempotencyStore, Outcome
    from .tool_calls import IdempotentToolCalls, idempotent_tool_node

# loaded on first use (PEP 562): the registry imports .schema to create the tables, which must
# not pull in LangGraph and LangChain for commands that never run a graph
_EXPORTS: dict[str, str] = {
    "current_fencing_token": "context",
    "current_idempotency_key": "context",
    "is_replaying": "context",
    "IdempotentToolCalls": "tool_calls",
    "REPLAYED_FLAG": "call_plan",
    "arun_once": "decorators",
    "idempotent": "decorators",
    "idempotent_tool_node": "tool_calls",
    "mark_replayed": "call_plan",
    "run_once": "decorators",
    "step_key": "decorators",
    "DurabilityError": "errors",
    "IdempotencyAttemptsExhausted": "errors",
    "IdempotencyConflict": "errors",
    "IdempotencyError": "errors",
    "IdempotencyKeyReused": "errors",
    "IdempotencyLeaseLost": "errors",
    "RecoveryLeaseLost": "errors",
    "IdempotencyOutcomeUnknown": "errors",
    "IdempotencyStoreUnavailable": "errors",
    "NoIdempotencyContext": "errors",
    "KeyScope": "keys",
    "canonical_json": "keys",
    "strip_task_ids": "keys",
    "IdempotencyPolicy": "policy",
    "DeadLetter": "recovery",
    "RecoveryReport": "recovery",
    "amark_recoverable": "recovery",
    "arecover_stalled": "recovery",
    "arecoverable_run": "recovery",
    "dead_letters_of": "recovery",
    "mark_recoverable": "recovery",
    "rearm_dead_letter": "recovery",
    "recoverable_run": "recovery",
    "release_recoverable": "recovery",
    # the entry point of `securesaver recover` opens a SecureSaver: it lives above the saver
    "recover_main": ".cli.recover",
    "recover_stalled": "recovery",
    "recovery_state": "recovery",
    "unmark_recoverable": "recovery",
    "Claim": "store",
    "Hit": "store",
    "IdempotencyRecord": "records",
    "IdempotencyStore": "store",
    "Outcome": "store",
}


def __getattr__(name: str) -> Any:
    import importlib
    module = _EXPORTS.get(name)
    if module is None:
        try:  # a submodule (idempotency.store, ...)
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "REPLAYED_FLAG",
    "Claim",
    "DeadLetter",
    "DurabilityError",
    "Hit",
    "IdempotencyAttemptsExhausted",
    "IdempotencyConflict",
    "IdempotencyError",
    "IdempotencyKeyReused",
    "IdempotencyLeaseLost",
    "IdempotencyOutcomeUnknown",
    "IdempotencyPolicy",
    "IdempotencyRecord",
    "IdempotencyStore",
    "IdempotencyStoreUnavailable",
    "IdempotentToolCalls",
    "KeyScope",
    "NoIdempotencyContext",
    "Outcome",
    "RecoveryLeaseLost",
    "RecoveryReport",
    "amark_recoverable",
    "arecover_stalled",
    "arecoverable_run",
    "arun_once",
    "canonical_json",
    "current_fencing_token",
    "current_idempotency_key",
    "dead_letters_of",
    "idempotent",
    "idempotent_tool_node",
    "is_replaying",
    "mark_recoverable",
    "mark_replayed",
    "rearm_dead_letter",
    "recover_main",
    "recover_stalled",
    "recoverable_run",
    "recovery_state",
    "release_recoverable",
    "run_once",
    "step_key",
    "strip_task_ids",
    "unmark_recoverable",
]
