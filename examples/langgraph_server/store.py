"""The long-term memory store: SecureStore, one tenant per authenticated user.

langgraph.json names it: ``"store": {"path": "./store.py:store"}``. Items are sealed and
redacted in the checkpointer's database (``SECURESAVER_URL``; ``SECURESAVER_STORE_URL`` for
another one); each user sees only their own namespaces.
"""

from langgraph_securesaver.server import tenant_from_field
from langgraph_securesaver.server.store import make_store

store = make_store(tenant_of=tenant_from_field("identity"))
