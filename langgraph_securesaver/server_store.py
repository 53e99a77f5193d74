"""Moved to :mod:`langgraph_securesaver.server.store`; this module keeps the old path working:
``"store": {"path": "langgraph_securesaver.server_store.store"}`` in langgraph.json."""

from .server.store import *  # noqa: F403
