"""Moved to :mod:`langgraph_securesaver.server.records`; this module keeps the old path working:
``seal_server_records()`` in auth modules, ``python -m langgraph_securesaver.server_records seal
FILE``."""

from .server.records import *  # noqa: F403

if __name__ == "__main__":  # pragma: no cover - python -m langgraph_securesaver.server_records
    import sys

    from .server.records import main

    sys.exit(main())
