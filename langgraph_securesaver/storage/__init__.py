"""The inner saver's own storage, reached below the BaseCheckpointSaver API.

- :mod:`.backends` -- opening an inner saver and its registry from a URL.
- :mod:`.strict_serde` -- the inner savers' serializer: nothing stored is evaluated.
- :mod:`.ops` / :mod:`.sql` / :mod:`.flush` -- native keep-latest, whole-thread and per-run
  deletes on each backend, their SQL, and SQLite's deletion hygiene.
- :mod:`.raw_tables` / :mod:`.raw_sql` -- raw rows of the inner tables and the registry (for
  audit, scan, rotation), their SQL and pager.
- :mod:`.store_format` -- a SecureStore item's stored form, for code that never opens it.
- :mod:`.stored_json` -- JSON read from rows a database writer can craft, never raising on
  one (no other import: the audit on PostgreSQL reads through it alone).

May import: the foundation modules, :mod:`..keys` and :mod:`..registry`. The per-turn path,
the operations and the CLI import this package, never the reverse.
"""
