"""What is stored, what happened, and what the disk shows: the operations that read.

- :mod:`.inventory` -- the inventory (``audit``, ``audit_stream``, ``iter_audit``) and the
  trail (``events``); :mod:`.report` -- the report types; :mod:`.report_html` -- the HTML
  report.
- :mod:`.statements` -- the inventory as one grouped statement per dialect; :mod:`.sql` --
  runs it and folds the totals; :mod:`.db` -- ``AuditDatabase`` (a database opened by URL);
  :mod:`.trail` -- security events and deletion receipts (``TrailEntry``).
- :mod:`.summaries` -- maintained per-thread and per-tenant totals.
- :mod:`.scan` -- the at-rest scan of the raw tables; :mod:`.scan_report` -- the kinds of
  violation and the report it returns; :mod:`.clear_text` -- personal data and secrets found
  (and masked) in clear values; :mod:`.store_items` -- SecureStore items in the audit and the
  scan.

May import: everything below the operations (foundation, :mod:`..keys`, :mod:`..registry`,
:mod:`..storage`, the per-turn path, :mod:`..redaction`). :mod:`..ops`, the saver and the CLI
import this package, never the reverse.
"""
