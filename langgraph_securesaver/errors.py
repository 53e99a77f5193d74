"""Every exception the library raises on purpose.

One type per thing a caller must react to differently; every message says what to do next.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class SecureSaverError(Exception):
    """Base class for all langgraph-securesaver errors."""


class ConfigurationError(SecureSaverError, ValueError):
    """The saver was built with missing or contradictory settings."""


#: Where a keyring is read from when none is passed. Defined here, not in :mod:`.keys.keyring`, so
#: that the CLI can name it in its help without loading ``cryptography``.
ENV_VAR = "SECURESAVER_MASTER_KEY"


class KeyringRequired(ConfigurationError):
    """No keyring was given and none could be found in the environment."""

    def __init__(self, detail: str = "") -> None:
        #: what was missing, without the Python API hint (the CLI words its own hint)
        self.detail = detail
        super().__init__(
            "SecureSaver needs a keyring: pass keyring=Keyring.from_file(path) or set "
            f"{ENV_VAR}. Create one with `securesaver keygen --out keyring.json`."
            + (f" ({detail})" if detail else "")
        )


class TamperedDataError(SecureSaverError):
    """Stored data could not be authenticated and decrypted.

    Raised for every way a read can fail: a missing or wrong key, a changed byte, a ciphertext
    moved to another tenant, thread or checkpoint, or a plain value where a ciphertext was
    expected. Nothing is returned when this is raised.
    """


class ItemChangedError(TamperedDataError):
    """A SecureStore item does not open under its item's key: it has no key (deleted), or was
    sealed under one deleted since. SecureStore reads such an item again three times (another
    process deleting or rewriting the item may have been half-way through); still failing, it
    is raised: a copy put back after the deletion, a value moved from another item, or --
    on SQLite under heavy write contention -- a deletion the other process has not finished:
    read again."""


class KeyringMismatch(TamperedDataError):
    """The database's registry key does not unwrap with this keyring.

    Almost always a different keyring than the one the database was created with (a new
    ``Keyring.generate()`` against an existing database, another environment's key). A
    :class:`TamperedDataError`, so code that fails closed on tampering also stops here; the
    message is one line that says which keyring to load.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(
            "this database was created with another keyring: its keys do not unwrap with this "
            f"one ({reason}); load the keyring it was created with, or, if this is that "
            "keyring, the key row was altered: restore it from a backup")


# what a stored row can do to an inner saver's own parsing (SQLite's clear metadata is JSON;
# the strict serializer raises TamperedDataError itself)
PARSE_ERRORS = (TamperedDataError, json.JSONDecodeError, UnicodeDecodeError, TypeError,
                 AttributeError)


def parse_failure(where: str, exc: BaseException) -> BaseException:
    """A parse failure of a stored row as the TamperedDataError naming it (``where``; never
    its bytes). Defined with the errors so storage-layer reads refuse rows in the same words."""
    if isinstance(exc, SecureSaverError) and not isinstance(exc, TamperedDataError):
        return exc  # our own typed errors (e.g. AsyncOnlySaverError) pass through unchanged
    if isinstance(exc, TamperedDataError):
        reason = str(exc)
    elif isinstance(exc, json.JSONDecodeError):
        reason = "its clear metadata is not valid JSON (altered bytes)"
    else:
        reason = f"it does not decode ({type(exc).__name__})"
    return TamperedDataError(f"a stored row of {where} was refused: {reason}")


@contextmanager
def refusing_rows(where: Callable[[], str]) -> Iterator[None]:
    """Reads of stored rows inside the block: a row that does not parse is
    :func:`parse_failure`'s TamperedDataError naming ``where()``, never a raw decoder error.
    ``where`` is called only on a failure (naming the row may look it up)."""
    try:
        yield
    except PARSE_ERRORS as exc:
        raise parse_failure(where(), exc) from None


class TenantRequired(SecureSaverError, LookupError):
    """An operation needs a tenant and none was given."""

    def __init__(self, operation: str) -> None:
        super().__init__(
            f"{operation} needs a tenant: wrap the call in `with tenant_scope('acme'):`, put "
            "tenant_id in the run's config['configurable'] (a node's store calls read the run "
            "config too), or construct SecureSaver / SecureStore with default_tenant=...."
        )


class AccessDenied(SecureSaverError, PermissionError):
    """A caller tried to reach another tenant's data. The attempt is recorded.

    ``repeated`` is True for an attempt counted into its window's summary (not the first of
    its actor, target and operation): the saver raised it only after a short hold
    (``TenantGate.REPEAT_HOLD``), so a flood of refused calls cannot keep the process busy.
    """

    repeated: bool = False


class AsyncOnlySaverError(SecureSaverError, TypeError):
    """A synchronous call reached an inner saver that only works asynchronously."""


class UnsupportedBySaverError(SecureSaverError, NotImplementedError):
    """The inner saver cannot do this operation (its API lacks it and SecureSaver has no
    native implementation for it); refused before anything changed (docs/savers.md)."""


class UnsealedDataError(SecureSaverError):
    """The thread has checkpoints that SecureSaver did not write (a raw LangGraph saver wrote
    them before it was wrapped): they are in clear, outside encryption, retention and deletion.
    Never shown as an empty thread; bring them in with ``securesaver adopt``
    (docs/guides/adopt.md)."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(
            f"thread {thread_id!r} has checkpoints in the inner saver that SecureSaver did not "
            "write (a raw saver wrote them, unencrypted): they are not shown as an empty "
            "thread. Seal them in place under their tenant with `securesaver adopt` "
            "(docs/guides/adopt.md), or delete them with the raw saver")


class UnsupportedFilterError(SecureSaverError, ValueError):
    """list(filter=...) used a protected metadata key in a way the blind index cannot answer."""


class DeltaChannelPruneError(SecureSaverError, NotImplementedError):
    """keep_latest was refused because the thread uses a DeltaChannel."""


class StoreNotReachedError(SecureSaverError):
    """forget_subject was refused, before anything was deleted: a SecureStore of this registry
    wrote items to a store the call did not name (another database, file or process memory),
    so the subject's items there would have survived. Name it: ``stores=[store]`` (CLI:
    ``--store-url``)."""


class KeyGoneError(SecureSaverError):
    """The write could not be made readable, and nothing of it was stored: the key it would be
    sealed under is being destroyed or was replaced by another process (the thread is being
    deleted or pruned, or a key rotation retires the key-encryption key). Retryable: the next
    attempt confirms the thread's live key, and a deleted thread starts afresh under a new key
    (docs/key-lifecycle.md)."""

    retryable = True


class KeyProviderUnavailable(SecureSaverError):
    """The key provider (a KMS, an HSM) could not be reached or refused our credentials.

    Not a tamper error: the stored data is intact and becomes readable again when the provider
    answers. Keys already cached in the process keep working for their lifetime."""
