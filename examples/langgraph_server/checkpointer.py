"""The LangGraph Server checkpointer: SecureSaver, one tenant per authenticated user.

langgraph.json names it: ``"checkpointer": {"backend": "custom", "path":
"./checkpointer.py:checkpointer"}``. Configured from the environment: SECURESAVER_URL and
SECURESAVER_MASTER_KEY (or SECURESAVER_KEYRING_FILE); see langgraph_securesaver/server/saver.py for
the redaction, retention and tenant options.
"""

from langgraph_securesaver.server import make_checkpointer, tenant_from_field

# The tenant is the user's identity. One tenant per organisation instead:
#     checkpointer = make_checkpointer(tenant_of=tenant_from_field("org_id"))
# or any function of the authenticated user that returns a tenant id (None refuses the call).
checkpointer = make_checkpointer(tenant_of=tenant_from_field("identity"))
