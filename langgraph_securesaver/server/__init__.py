"""SecureSaver behind LangGraph Server (``langgraph dev`` / ``langgraph up`` / the
platform).

- :mod:`.saver` -- ``AuthTenantSaver``, ``AuthTenantGate``, ``make_checkpointer``,
  ``tenant_from_field`` (the ``checkpointer`` entry; this package imports its public names,
  so ``"path": "langgraph_securesaver.server.checkpointer"`` works).
- :mod:`.store` -- SecureStore as the server's long-term memory (the ``store`` entry).
- :mod:`.encryption` -- the server's own records encrypted (the ``encryption`` entry).
- :mod:`.records` -- ``langgraph dev``'s record file sealed at rest.
- :mod:`.settings` -- what the integrations read from the environment.

May import: anything below the CLI (the saver, :mod:`..store` and what they use).
"""

# imported here, not on first use: LangGraph Server's loader reads ``checkpointer`` (the
# ``"path": "langgraph_securesaver.server.checkpointer"`` default) from this module's __dict__
from .saver import (
    AuthTenantGate,
    AuthTenantSaver,
    TenantOf,
    checkpointer,
    make_checkpointer,
    server_auth_user,
    subject_from_field,
    tenant_from_field,
    user_field,
)

__all__ = [
    "AuthTenantGate",
    "AuthTenantSaver",
    "TenantOf",
    "checkpointer",
    "make_checkpointer",
    "server_auth_user",
    "subject_from_field",
    "tenant_from_field",
    "user_field",
]
