"""How an idempotent call behaves on conflicts, expiry, failures, forks and durability."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from ..errors import ConfigurationError

OnConflict = Literal["wait", "raise"]
OnExpired = Literal["retry", "unknown"]
OnFork = Literal["dedupe", "reexecute"]
DurabilityPolicy = Literal["warn", "refuse", "ignore"]


@dataclass(frozen=True)
class IdempotencyPolicy:
    """Options of one idempotent call site (``@idempotent(policy=...)`` or keyword overrides).

    Attributes:
        on_conflict: a concurrent duplicate (key in progress, lease valid) ``"wait"``s, polling
            until the holder finishes or ``wait_timeout`` passes, or ``"raise"``s
            :class:`IdempotencyConflict` at once.
        wait_timeout: longest wait (seconds) under ``on_conflict="wait"``.
        poll_interval: first poll delay while waiting (grows x1.5 up to 0.5 s).
        lease: seconds a claim is valid without a heartbeat, on the database clock; after it a
            duplicate may take the key over (fencing token + 1). Before it, a duplicate takes
            over only a holder it finds dead: a process on the same host that no longer exists
            (or whose pid now belongs to another process), or on PostgreSQL a holder whose
            database session is gone. Holders on other hosts without such a signal are waited
            for until the lease runs out (so keep it short; heartbeats keep live ones).
        heartbeat: renew the lease every ``lease / 3`` seconds while the effect runs (so long
            effects keep their claim); off, the lease is a hard execution deadline.
        on_expired: an in-progress claim whose holder died (found dead, or lease expired) is
            taken over and re-executed with the SAME key (``"retry"``, the downstream API
            deduplicates by the key), or marked ``unknown`` for an operator (``"unknown"``).
        max_attempts: attempts (first try, retries after failures, takeovers) before the key
            is refused with :class:`IdempotencyAttemptsExhausted`.
        on_fork: after time travel / ``update_state`` forks, a tool call with the same
            tool-call id is deduplicated (``"dedupe"``, default: the fork replays the stored
            result) or executed again (``"reexecute"``: the task's checkpoint id joins the key).
        durability: what to do when the run's checkpoints would not keep the key stable across
            a crash (``durability="exit"``, or ``"async"`` whose checkpoint fence failed):
            ``"warn"`` (log and run), ``"refuse"`` (raise :class:`DurabilityError`) or
            ``"ignore"``.
        fence: under ``durability="async"``, wait (up to ``fence_timeout``) until the
            checkpoint the task started from is persisted before executing the effect.
        fence_timeout: seconds to wait for the fence.
        mark_replays: mark results served from the store (ToolMessage
            ``response_metadata["securesaver_replayed"] = True``).
        scope: business keys are unique per thread (``"thread"``) or per tenant
            (``"tenant"``; such records are removed by ``delete_tenant`` only).
    """

    on_conflict: OnConflict = "wait"
    wait_timeout: float = 30.0
    poll_interval: float = 0.02
    lease: float = 10.0
    heartbeat: bool = True
    on_expired: OnExpired = "retry"
    max_attempts: int = 5
    on_fork: OnFork = "dedupe"
    durability: DurabilityPolicy = "warn"
    fence: bool = True
    fence_timeout: float = 5.0
    mark_replays: bool = True
    scope: Literal["thread", "tenant"] = "thread"

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool]] = [
            ("on_conflict must be 'wait' or 'raise'", self.on_conflict in ("wait", "raise")),
            ("on_expired must be 'retry' or 'unknown'", self.on_expired in ("retry", "unknown")),
            ("on_fork must be 'dedupe' or 'reexecute'", self.on_fork in ("dedupe", "reexecute")),
            ("durability must be 'warn', 'refuse' or 'ignore'",
             self.durability in ("warn", "refuse", "ignore")),
            ("scope must be 'thread' or 'tenant'", self.scope in ("thread", "tenant")),
            ("lease must be > 0", self.lease > 0),
            ("wait_timeout must be >= 0", self.wait_timeout >= 0),
            ("poll_interval must be > 0", self.poll_interval > 0),
            ("max_attempts must be >= 1", self.max_attempts >= 1),
            ("fence_timeout must be >= 0", self.fence_timeout >= 0),
        ]
        for message, ok in checks:
            if not ok:
                raise ConfigurationError(f"IdempotencyPolicy: {message}")

    def with_options(self, **options: Any) -> IdempotencyPolicy:
        return replace(self, **options) if options else self


DEFAULT_POLICY = IdempotencyPolicy()
