"""LangGraph Server's own records (threads, runs, assistants, crons) encrypted with SecureSaver.

langgraph.json names it: ``"encryption": {"path": "./encryption.py:encryption"}``. Same keys,
tenants (one per authenticated user) and redactor as the checkpointer. ``clear_fields`` are
the keys the ``@auth.on`` handler in auth.py filters on: the server compares them as stored,
so they stay in clear (here the owner's identity); every other value is sealed.
"""

from langgraph_securesaver.server import tenant_from_field
from langgraph_securesaver.server.encryption import make_encryption

encryption = make_encryption(tenant_of=tenant_from_field("identity"), clear_fields=["owner"])
