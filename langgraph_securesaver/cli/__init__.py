"""The ``securesaver`` command line (the entry point is ``cli:app``; ``python -m
langgraph_securesaver.cli`` runs it too).

- :mod:`.common` -- the Typer app, consoles, exit codes, options, opening a saver on
  ``--url``.
- :mod:`.main` -- ``keygen``, ``demo``, ``prune``, ``shred-tenant``, ``recover``; it loads
  :mod:`.ops` (``audit``, ``scan``, ``rotate-keys``, ``events``; the audit's tables printed by
  :mod:`.audit_tables`, the events by :mod:`.events`), :mod:`.subjects` (``forget-subject``)
  :mod:`.summaries` (``summaries``) and :mod:`.adopt` (``adopt``).
- :mod:`.demo` -- the demo graph with a scripted chat model (the examples use it);
  :mod:`.demo_run` -- ``securesaver demo``.
- :mod:`.recover` -- ``securesaver recover`` as a function.

May import: anything; nothing but the package facades imports it.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .main import app as app


def __getattr__(name: str) -> Any:
    """``app``, loaded on first use (importing a sibling module does not load it)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .main import app
    return app


__all__ = ["app"]
