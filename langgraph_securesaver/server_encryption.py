"""Moved to :mod:`langgraph_securesaver.server.encryption`; this module keeps the old path working:
``"encryption": {"path": "langgraph_securesaver.server_encryption:encryption"}`` in
langgraph.json."""

from .server.encryption import *  # noqa: F403
