"""Reading JSON that a database writer can craft (PostgreSQL's jsonb columns, the SecureStore's
values), for the readers that must never stop on one row: the audit, ``scan``, rotation's
pages. Imports nothing but ``json``: the audit on PostgreSQL reads through it without the raw
tables' decoders (and LangGraph's serializer behind them).
"""

from __future__ import annotations

import json
from typing import Any


def _int_or_float(text: str) -> int | float:
    # Python refuses to read an integer of more than 4,300 digits (sys.int_info); a JSONB
    # number can have 131,072 before its point
    return int(text) if len(text) <= 4000 else float(text)


def lenient_json_loads(data: str | bytes) -> Any:
    """``json.loads`` for rows a database writer can craft: an integer too long for Python
    (over 4,000 digits) reads as a float (``inf``) instead of raising ValueError from deep in
    the driver. What SecureSaver reads stored JSON with where a row must never stop the
    whole read (the audit, ``scan``, rotation's pages: PostgreSQL's jsonb columns)."""
    return json.loads(data, parse_int=_int_or_float)
