"""SecureSaver's own tables (SQLAlchemy Core) and what they hold.

- :mod:`.core` -- ``Registry``: its engine, transactions and ``setup()``; its base classes
  hold the statements: :mod:`.thread_rows` -- thread rows and retention policies;
  :mod:`.chains` -- receipts and events on per-tenant hash chains; :mod:`.base` -- what the
  base classes use of ``Registry``, declared once.
- :mod:`.schema` -- the tables, row types and engines; :mod:`.claims` -- the pruner's claims
  and fenced deletes; :mod:`.verify` -- MAC and hash-chain verification; :mod:`.integrity` --
  the registry MAC key and row MACs; :mod:`.wrapped_keys` -- the wrapped key rows;
  :mod:`.dialects` -- where the SQL of SQLite, PostgreSQL and MySQL/MariaDB differs;
  :mod:`.direct_reads` -- one hot read without the pool's per-checkout work.
- :mod:`.denials` -- refused attempts, coalesced before they reach the registry.
- :mod:`.thread_keys` -- per-thread data keys (what deletion destroys); :mod:`.item_versions`
  -- the versions store items are bound to (an older copy does not open); :mod:`.pii_vault` --
  the sealed originals of redacted PII; :mod:`.subjects` -- the keyed subject of a thread.

May import: the foundation modules and :mod:`..keys`. Nothing here imports the inner saver's
storage, the saver, an operation or the CLI.
"""
