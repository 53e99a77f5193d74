"""Exactly-once side effects for LangGraph graphs checkpointed by a SecureSaver.

A checkpointer guarantees that a step runs at least once; this package makes its side effects
take effect once: deterministic keys from persisted identity, an atomic claim store with leases
and fencing tokens, sealed (encrypted, tenant/thread-bound) results replayed on resume, a
ToolNode wrapper, a durability guard, replay-aware tracing, and stalled-run recovery.
See docs/idempotency.md.
"""

# the entry point of `securesaver recover` opens a SecureSaver: it lives above the saver
from ..recover import recover_main
from .context import (
    current_fencing_token,
    current_idempotency_key,
    is_replaying,
)
from .decorators import (
    REPLAYED_FLAG,
    IdempotentToolCalls,
    arun_once,
    idempotent,
    idempotent_tool_node,
    mark_replayed,
    run_once,
    step_key,
)
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
)
from .keys import KeyScope, canonical_json, strip_task_ids
from .policy import IdempotencyPolicy
from .recovery import (
    DeadLetter,
    RecoveryReport,
    amark_recoverable,
    arecover_stalled,
    dead_letters_of,
    mark_recoverable,
    recover_stalled,
    recovery_state,
    unmark_recoverable,
)
from .store import Claim, Hit, IdempotencyRecord, IdempotencyStore, Outcome

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
    "RecoveryReport",
    "amark_recoverable",
    "arecover_stalled",
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
    "recover_main",
    "recover_stalled",
    "recovery_state",
    "run_once",
    "step_key",
    "strip_task_ids",
    "unmark_recoverable",
]
