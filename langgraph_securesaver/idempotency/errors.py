"""Exceptions of the idempotency component (all are :class:`SecureSaverError` subclasses)."""

from __future__ import annotations

from ..errors import SecureSaverError


class IdempotencyError(SecureSaverError):
    """Base class for the idempotency component's errors."""


class IdempotencyKeyReused(IdempotencyError, ValueError):
    """The key was already used with different arguments (argument fingerprint mismatch).

    The stored result is not returned and the effect is not executed: the same key naming two
    different operations is a bug in the key (or a business key reused for another request).
    """


class IdempotencyConflict(IdempotencyError):
    """Another worker holds the key (in progress, lease still valid).

    Raised at once under ``on_conflict="raise"``, or after ``wait_timeout`` seconds of waiting
    under ``on_conflict="wait"``. Retry later: the holder completes it or its lease expires.
    """


class IdempotencyLeaseLost(IdempotencyConflict):
    """This worker's lease expired and another worker took the key over (higher fencing token).

    The result of this attempt is not stored; the taker's result is the one that counts.
    """


class RecoveryLeaseLost(IdempotencyError):
    """A recoverer's checkpoint write was refused: the thread's recovery lease changed hands
    (the user's next turn, or another recoverer, took it). Nothing of the write was stored;
    the recoverer stops and the run that holds the lease now wins."""


class IdempotencyOutcomeUnknown(IdempotencyError):
    """The key is in state ``unknown``: an attempt may or may not have taken effect.

    Resolve it with ``IdempotencyStore.resolve(...)`` (record the real outcome, or allow a retry)
    after checking the downstream system with the key.
    """


class IdempotencyAttemptsExhausted(IdempotencyError):
    """The key failed ``max_attempts`` times; it is not executed again automatically."""


class IdempotencyStoreUnavailable(IdempotencyError):
    """The idempotency store could not be reached or used. The effect was NOT executed
    (fail closed), or, if raised after the effect, its result could not be recorded."""


class DurabilityError(IdempotencyError):
    """An idempotent call ran under a durability mode whose keys would not survive a crash
    (``durability="exit"``, or ``"async"`` without the checkpoint fence) and the policy is
    ``durability="refuse"``."""


class NoIdempotencyContext(IdempotencyError, LookupError):
    """``current_idempotency_key()`` / ``step_key()`` / ``@idempotent`` was used where there is
    no idempotent call or graph run to derive a key from."""
