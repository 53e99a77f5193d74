"""The operations of a SecureSaver, one module each, behind :class:`~..services.SaverServices`.

- :mod:`.threads` -- deleting and pruning threads (the one purge path: storage, PII vault,
  idempotency records, receipts).
- :mod:`.retention` -- retention policies, per-thread overrides, the expiry sweep, receipts.
- :mod:`.shredding` -- crypto-shredding a tenant.
- :mod:`.pii` -- PII inventory and erasure.
- :mod:`.keys` -- rewrapping, data-key rotation, master versions, the one-database rule.
- :mod:`.pruner` / :mod:`.pruner_deletes` / :mod:`.pruner_emptied` -- the retention sweep
  (``Sweep``): claims expired threads, re-checks them, deletes or prunes them in fenced
  batches, leaves receipts; how it deletes a batch; its part for threads ``delete_for_runs``
  left empty.
- :mod:`.rotation` -- master-key rotation and resumable re-encryption.
- :mod:`.api` -- the public methods of SecureSaver that delegate to the above (and to
  audit, scan and rotation).

An operation sees the saver only through ``SaverServices`` (never ``saver.py``, never the
CLI); the saver imports the operations, not the other way round.

May import: everything below the saver -- the foundation modules, :mod:`..keys`,
:mod:`..registry`, :mod:`..storage`, the per-turn path (``services``, ``gate``, ...),
:mod:`..audit` and :mod:`..idempotency`; never the saver, :mod:`..store`, :mod:`..server` or
:mod:`..cli`.
"""
