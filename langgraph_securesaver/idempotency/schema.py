"""Tables of the idempotency component, on the registry's shared ``metadata``.

``Registry.setup()`` (``metadata.create_all``) creates them once this module is imported; the
store also calls ``create_all`` itself on first use. All times are seconds since the epoch on the
DATABASE clock (see :func:`db_now`), never the Python clock of a worker.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from ..registry.core import metadata
from ..registry.dialects import MYSQL
from ..registry.schema import Blob, ThreadId

#: Claim states of an idempotency record.
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
FAILED = "failed"
UNKNOWN = "unknown"

idempotency_records = sa.Table(
    "securesaver_idempotency", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    # "" for tenant-scoped business keys
    sa.Column("thread_id", ThreadId, primary_key=True),
    # the derived key (keyed HMAC, hex); the same string is given to downstream APIs
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),        # tool | task | step | business
    sa.Column("name", sa.String(255), nullable=False),       # tool / function name (operators)
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("fingerprint", sa.String(64), nullable=True),  # keyed HMAC of canonical args
    sa.Column("owner", sa.String(128), nullable=True),
    sa.Column("fencing_token", sa.BigInteger, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("lease_expires_at", sa.Double, nullable=True),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("result", Blob, nullable=True),      # sealed, bound to tenant/thread/key
    sa.Column("error", Blob, nullable=True),       # sealed error text of the last try
    # registry MAC over (tenant, thread_id, key, fingerprint): a forged fingerprint is refused
    sa.Column("fp_mac", sa.String(64), nullable=True),
    # the thread that claimed a tenant-wide record (thread_id ""): the record's PII-vault
    # references are that thread's and it is erased with that thread (NULL otherwise)
    sa.Column("origin", ThreadId, nullable=True),
    sa.Index("ix_securesaver_idempotency_state", "tenant", "state"),
    # the holder of the current claim (see liveness.py); NULL when nobody holds it
    *(sa.Column(name, type_, nullable=True) for name, type_ in (
        ("holder_host", sa.String(64)),    # boot id + pid namespace digest, or NULL
        ("holder_pid", sa.Integer),
        ("holder_start", sa.BigInteger),   # process start, clock ticks since boot
        ("holder_nonce", sa.String(32)),   # random per process
        ("holder_lock", sa.BigInteger),    # PostgreSQL session advisory lock key
    )),
)


#: the columns naming the process that holds a claim or a recovery lease
HOLDER_COLUMNS = ("holder_host", "holder_pid", "holder_start", "holder_nonce", "holder_lock")

recoverable_threads = sa.Table(
    "securesaver_recoverable", metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    sa.Column("thread_id", ThreadId, primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),       # armed | done | dead
    sa.Column("owner", sa.String(128), nullable=True),
    sa.Column("fencing_token", sa.BigInteger, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("lease_expires_at", sa.Double, nullable=True),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("configurable", Blob, nullable=True),  # sealed run configurable
    sa.Column("last_error", Blob, nullable=True),    # sealed
    sa.Index("ix_securesaver_recoverable_state", "state", "lease_expires_at"),
    # the process holding the recovery lease (the running worker or a recoverer), as on
    # idempotency claims; NULL when nobody holds it
    *(sa.Column(name, type_, nullable=True) for name, type_ in (
        ("holder_host", sa.String(64)),
        ("holder_pid", sa.Integer),
        ("holder_start", sa.BigInteger),
        ("holder_nonce", sa.String(32)),
        ("holder_lock", sa.BigInteger),
        # last recorded activity of the thread's run (database clock): opt-in, lease
        # renewals of a live holder, the end of a run; what ``older_than`` is measured from
        ("active_at", sa.Double),
    )),
)

dead_letters = sa.Table(
    "securesaver_dead_letters", metadata,
    sa.Column("letter_id", sa.String(36), primary_key=True),
    sa.Column("tenant", sa.String(255), nullable=False, index=True),
    sa.Column("thread_id", ThreadId, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("worker", sa.String(128), nullable=True),
    sa.Column("error_type", sa.String(255), nullable=True),
    sa.Column("error", Blob, nullable=True),       # sealed
)

TABLES = (idempotency_records, recoverable_threads, dead_letters)


def db_now(dialect: str) -> ColumnElement[float]:
    """The database's wall clock in epoch seconds, evaluated by the server in the statement."""
    if dialect == "postgresql":
        return sa.literal_column("CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
                                 sa.Float)
    if dialect == "sqlite":
        return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Float)
    if dialect in MYSQL:   # SYSDATE, not NOW(): the time of evaluation, not of the statement
        return sa.literal_column("(UNIX_TIMESTAMP(SYSDATE(6)) + 0e0)", sa.Double)
    raise ValueError(f"the idempotency store runs on SQLite, PostgreSQL or MySQL, not {dialect!r}")


def _register_sealed_columns() -> None:
    """Tell scan and re-encryption where this package keeps ciphertexts, and their AAD."""
    from typing import Any

    from ..keys.tokens import associated_data
    from ..storage.sealed_columns import SealedColumn, register_sealed_column

    def col(table: str, column: str, aad: Any) -> None:
        register_sealed_column(SealedColumn(table, column, "tenant", aad))

    col("securesaver_idempotency", "result", lambda r: associated_data(
        "idem", str(r["tenant"]), str(r["thread_id"]), str(r["key"])))
    col("securesaver_idempotency", "error", lambda r: associated_data(
        "idem-error", str(r["tenant"]), str(r["thread_id"]), str(r["key"])))
    col("securesaver_recoverable", "configurable", lambda r: associated_data(
        "recover-conf", str(r["tenant"]), str(r["thread_id"])))
    col("securesaver_recoverable", "last_error", lambda r: associated_data(
        "recover-error", str(r["tenant"]), str(r["thread_id"]), "last"))
    col("securesaver_dead_letters", "error", lambda r: associated_data(
        "recover-error", str(r["tenant"]), str(r["thread_id"]), str(r["letter_id"])))


_register_sealed_columns()
