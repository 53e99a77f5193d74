"""Retention: TTL policies, expiry bookkeeping and the pruner that executes them.

Policies live in the registry (``securesaver_policies``) so a pruner started from cron or a
Kubernetes CronJob, with no application code, applies the same rules the application set.
Each thread row carries its *effective* TTLs and a precomputed ``expires_at`` (indexed), so a
sweep finds expired threads in O(expired) and a sweep with nothing to do is one index probe.

Sweeps are safe on several machines at once: threads are claimed with a lease in one atomic
UPDATE (``FOR UPDATE SKIP LOCKED`` on PostgreSQL), expiry is re-checked under the claim, and the
final step (receipt + registry row delete) is one transaction fenced by the claim token, so each
thread is deleted and receipted exactly once. A pruner killed mid-way leaves claimed rows whose
lease expires; the next sweep takes them over and finishes idempotently.

Tamper evidence (see :mod:`langgraph_securesaver.registry.integrity`): thread rows carry MACs over
their retention fields and their last activity, and the sweep acts on those fields only. It
recomputes each claimed thread's expiry from them; ``expires_at`` is just the index that finds
candidates. A row whose MACs do not verify, or whose ``expires_at`` is earlier than its MACed
fields imply, is reported as an error and never deleted, which is why a sweep needs the
keyring. A forged legal hold at worst keeps data (and is reported the same way). A checkpoint's
``ts`` keeps an expired thread (written since the registry last heard of it, or in use) only
once that checkpoint authenticates as ``get_tuple`` authenticates it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from .errors import ConfigurationError

Strategy = Literal["delete", "keep_latest"]
STRATEGIES: tuple[str, ...] = ("delete", "keep_latest")
DEFAULT_POLICY_KEY = "*"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w|y)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                 "y": 365 * 86400, None: 1}


def parse_duration(value: Any, *, what: str = "duration",
                   allow_zero: bool = False) -> float | None:
    """``None``, seconds, a ``timedelta``, or text like ``"90s"``, ``"12h"``, ``"1y"``.
    Positive and finite; zero too with ``allow_zero`` (a grace period that may be off)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a duration, got {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value.lower())
        if not match:
            raise ConfigurationError(
                f"{what} {value!r} is not a duration; use e.g. 90s, 10m, 12h, 30d, 2w or 1y")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    else:
        raise ConfigurationError(f"{what} must be a duration, got {type(value).__name__}")
    if allow_zero and seconds == 0:
        return 0.0
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ConfigurationError(f"{what} must be a positive, finite duration, got {value!r}")
    return seconds



def format_duration(seconds: float | None) -> str:
    """Seconds as the largest exact unit of :func:`parse_duration` (``7776000`` -> ``90d``,
    ``90`` -> ``90s``, ``150`` -> ``150s``); ``""`` for None. Round trips through it."""
    if seconds is None:
        return ""
    for unit in ("y", "w", "d", "h", "m"):
        size = _UNIT_SECONDS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"

@dataclass(frozen=True)
class RetentionPolicy:
    """How long a thread is kept.

    Args:
        idle_ttl: delete (or prune) a thread this long after its last write.
        max_age: ... this long after its first write, however active it is.
        strategy: ``"delete"`` removes the thread; ``"keep_latest"`` keeps only its latest
            checkpoint per namespace (the graph can continue from it).
        legal_hold: never prune, whatever the TTLs say.
    """

    idle_ttl: float | None = None
    max_age: float | None = None
    strategy: str = "delete"
    legal_hold: bool = False

    def __init__(self, idle_ttl: Any = None, max_age: Any = None, strategy: str = "delete",
                 legal_hold: bool = False) -> None:
        if strategy not in STRATEGIES:
            raise ConfigurationError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        object.__setattr__(self, "idle_ttl", parse_duration(idle_ttl, what="idle_ttl"))
        object.__setattr__(self, "max_age", parse_duration(max_age, what="max_age"))
        object.__setattr__(self, "strategy", strategy)
        object.__setattr__(self, "legal_hold", bool(legal_hold))

    def expires_at(self, created_at: float, last_activity: float) -> float | None:
        if self.legal_hold:
            return None
        candidates = []
        if self.idle_ttl is not None:
            candidates.append(last_activity + self.idle_ttl)
        if self.max_age is not None:
            candidates.append(created_at + self.max_age)
        return min(candidates) if candidates else None

    def as_row(self) -> dict[str, Any]:
        return {"idle_ttl": self.idle_ttl, "max_age": self.max_age, "strategy": self.strategy,
                "legal_hold": self.legal_hold}


NO_RETENTION = RetentionPolicy()


@dataclass
class PruneReport:
    """What one sweep did. ``errors`` holds (tenant, thread, message) and never content."""

    now: float
    dry_run: bool = False
    deleted: list[tuple[str, str]] = field(default_factory=list)
    pruned_to_latest: list[tuple[str, str]] = field(default_factory=list)
    held: list[tuple[str, str]] = field(default_factory=list)
    skipped_active: list[tuple[str, str]] = field(default_factory=list)
    survived: list[tuple[str, str]] = field(default_factory=list)
    would_delete: list[tuple[str, str]] = field(default_factory=list)
    would_prune: list[tuple[str, str]] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def pairs(rows: list[tuple[str, str]]) -> list[dict[str, str]]:
            return [{"tenant": t, "thread_id": th} for t, th in rows]
        return {
            "now": self.now, "dry_run": self.dry_run,
            "deleted": pairs(self.deleted), "pruned_to_latest": pairs(self.pruned_to_latest),
            "held": pairs(self.held), "skipped_active": pairs(self.skipped_active),
            "survived": pairs(self.survived), "would_delete": pairs(self.would_delete),
            "would_prune": pairs(self.would_prune),
            "errors": [{"tenant": t, "thread_id": th, "error": e} for t, th, e in self.errors],
        }

    @property
    def ok(self) -> bool:
        return not self.errors
