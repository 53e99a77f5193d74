"""``python -m langgraph_securesaver.cli``: the ``securesaver`` command."""

import sys

from .main import app

sys.exit(app())
