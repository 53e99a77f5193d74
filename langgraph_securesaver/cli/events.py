"""How ``securesaver events`` prints the audit trail for people: a table in a wide terminal,
one block per entry in a narrow one (80 columns), details as ``key=value`` pairs with
durations as durations. ``--format json`` is printed by :mod:`.ops` and has every field.
"""

from __future__ import annotations

import json
from typing import Any

from ..textsafety import escape_controls
from . import common
from .common import shown

#: Below this terminal width ``events`` prints one block per entry instead of a table.
EVENTS_TABLE_MIN_WIDTH = 120
_DURATION_KEYS = ("idle_ttl", "max_age", "active_grace", "lease", "older_than")


def detail_text(detail: Any, prefix: str = "") -> str:
    """An event's detail as ``key=value`` pairs (nested keys dotted, durations as ``90d``),
    shorter than JSON and wrapping between pairs."""
    from ..retention import format_duration
    if not isinstance(detail, dict):
        return json.dumps(detail, default=str)
    parts = []
    for key in sorted(detail, key=str):
        value, name = detail[key], f"{prefix}{key}"
        if isinstance(value, dict) and value:
            parts.append(detail_text(value, f"{name}."))
            continue
        if (str(key).endswith(_DURATION_KEYS) and isinstance(value, (int, float))
                and not isinstance(value, bool) and value > 0):
            shown = format_duration(float(value))
        elif isinstance(value, str):
            shown = value
        else:
            shown = json.dumps(value, default=str)
        parts.append(f"{name}={shown}")
    return " ".join(parts)


def print_events(entries: list[Any]) -> None:
    if not entries:
        common.console.print("no entries match")
        return
    if common.console.width >= EVENTS_TABLE_MIN_WIDTH:
        from rich.table import Table
        table = Table("at (UTC)", "kind", "tenant", "thread", "actor / by", "detail",
                      title=f"{len(entries)} entries")
        for column in table.columns[:2]:
            column.no_wrap = True
        for column in table.columns[2:5]:
            column.overflow = "fold"      # ids wrap, never cut
        for e in entries:
            table.add_row(when_text(e.as_dict()["at"]), shown(e.kind), shown(e.tenant or "—"),
                          shown(e.thread_id or "—"), shown(e.actor or "—"),
                          shown(detail_text(e.detail)))
        common.console.print(table)
        return
    from rich.padding import Padding
    from rich.text import Text
    common.console.print(f"{len(entries)} entries (one block each; --format json has every field)")
    for e in entries:
        head = Text(f"{when_text(e.as_dict()['at'])}  ")
        head.append(escape_controls(e.kind), style="bold")
        common.console.print(head, overflow="fold")
        where = [f"tenant={e.tenant}" if e.tenant else "", f"thread={e.thread_id}"
                 if e.thread_id else "", f"by={e.actor}" if e.actor else ""]
        where = [escape_controls(w) for w in where]
        common.console.print(Padding(Text("  ".join(w for w in where if w), overflow="fold"),
                                     (0, 0, 0, 2), expand=False))
        text = escape_controls(detail_text(e.detail))
        if text:
            common.console.print(Padding(Text(text, overflow="fold"), (0, 0, 0, 2), expand=False))



def when_text(value: str | None) -> str:
    """An ISO time as ``YYYY-MM-DD HH:MM`` (UTC), as the other tables print it."""
    if not value:
        return "—"
    return value.replace("T", " ").replace("+00:00", "")[:16]
