"""The inner saver's own storage, reached below the BaseCheckpointSaver API.

- :mod:`.backends` -- opening an inner saver and its registry from a URL.
- :mod:`.strict_serde` -- the inner savers' serializer: nothing stored is evaluated.
- :mod:`.ops` / :mod:`.sql` / :mod:`.flush` -- native keep-latest, whole-thread and per-run
  deletes (the interface and its fallback), their SQL, and SQLite's deletion hygiene; each
  backend's implementation: :mod:`.ops_memory`, :mod:`.ops_sqlite`, :mod:`.ops_postgres`;
  :mod:`.ops_select` picks the one for an inner saver.
- :mod:`.raw_tables` / :mod:`.raw_sql` -- raw rows of the inner tables (for audit, scan,
  rotation), their SQL and pager; :mod:`.registry_tables` -- raw rows of every
  ``securesaver_*`` table, reflected (for scan and rotation).
- :mod:`.store_format` -- a SecureStore item's stored form, for code that never opens it.
- :mod:`.stored_json` -- JSON read from rows a database writer can craft, never raising on
  one (no other import: the audit on PostgreSQL reads through it alone).

May import: the foundation modules, :mod:`..keys` and :mod:`..registry`. The per-turn path,
the operations and the CLI import this package, never the reverse.
"""
