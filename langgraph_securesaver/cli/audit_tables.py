"""The ``securesaver audit`` report as terminal tables: tenants, threads and store items.

A terminal is narrower than the report is wide: columns are kept by priority, each at a
readable width, and the ones left out are named under the tables (``--format json`` and
``--format html`` have every field). :mod:`.ops` runs the command and prints through
:func:`print_audit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import common
from .common import MAX_ROWS_SHOWN, shown

if TYPE_CHECKING:  # rich.table is imported where a table is printed
    from rich.table import Table


def _dt(value: str | None) -> str:
    """``2026-11-29T09:54:15+00:00`` -> ``2026-11-29 09:54`` (tables say UTC in the header)."""
    if value is None:
        return "—"
    return value.replace("T", " ").replace("+00:00", "")[:16]


def _kinds(pii: dict[str, int]) -> str:
    return "\n".join(f"{shown(k)} {n}" for k, n in sorted(pii.items())) or "—"


# (header, priority, kind). Columns are dropped from the highest priority number down until
# every kept column has its readable width within the terminal. kind: "fixed" never wraps,
# "fold" (ids, never cut) and "wrap" may take several lines but keep a readable minimum.
_TENANT_COLUMNS = [("tenant", 0, "fold"), ("threads", 1, "fixed"), ("ckpts", 6, "fixed"),
                   ("stored", 2, "fixed"), ("first thread\n(UTC)", 8, "fixed"),
                   ("retention", 4, "wrap"), ("personal data\n(distinct values)", 5, "wrap"),
                   ("data keys\n(master)", 9, "fixed"), ("past\nexpiry", 3, "fixed"),
                   ("held", 7, "fixed")]
_THREAD_COLUMNS = [("tenant", 0, "fold"), ("thread", 1, "fold"), ("created (UTC)", 7, "fixed"),
                   ("last activity", 5, "fixed"), ("expires", 2, "fixed"), ("ckpts", 6, "fixed"),
                   ("stored", 3, "fixed"), ("keys", 8, "fixed"), ("personal data", 4, "wrap")]
_READABLE = {"fold": 18, "wrap": 16}


def _widths(header: str, kind: str, cells: list[str]) -> tuple[int, int]:
    """(readable minimum, natural) width of a column."""
    from rich.cells import cell_len
    from rich.text import Text
    widest = max((cell_len(line) for cell in cells
                  for line in Text.from_markup(cell).plain.split("\n")), default=1)
    natural = max(widest, max(cell_len(line) for line in header.split("\n")))
    if kind == "fixed":
        return natural, natural
    head = max(cell_len(word) for word in header.split())
    return max(min(widest, _READABLE[kind]), head), natural


def _fitted(title: str, columns: list[tuple[str, int, str]],
            rows: list[list[str]]) -> tuple[Table, list[str]]:
    """The table with the columns that fit ``console.width`` by priority (each at least at a
    readable width), and the headers of the columns left out."""
    sizes = [_widths(header, kind, [row[i] for row in rows])
             for i, (header, _, kind) in enumerate(columns)]
    keep = list(range(len(columns)))

    def total(which: int) -> int:  # 0: readable minimum, 1: natural; 3 = borders + padding
        return sum(sizes[i][which] + 3 for i in keep) + 1

    width: dict[int, int] = {}
    if total(1) > common.console.width:
        while len(keep) > 2 and total(0) > common.console.width:
            keep.remove(max(keep, key=lambda i: columns[i][1]))
        spare = max(0, common.console.width - total(0))
        for i in sorted(keep, key=lambda i: columns[i][1]):
            extra = min(spare, sizes[i][1] - sizes[i][0])
            width[i] = sizes[i][0] + extra
            spare -= extra
    from rich.table import Table
    table = Table(title=title)
    for i in keep:
        header, _, kind = columns[i]
        table.add_column(header, no_wrap=kind == "fixed", width=width.get(i),
                         overflow="fold" if kind == "fold" else "ellipsis")
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    dropped = [columns[i][0].replace("\n", " ") for i in range(len(columns)) if i not in keep]
    return table, dropped


def print_audit(report: Any) -> None:
    from ..audit.report_html import human_bytes, policy_text
    tenant_rows = []
    for t in report.tenants:
        keys = (",".join(f"v{v}" for v in t.data_keys) or "—") + " (" + (
            ",".join(f"m{v}" for v in t.master_versions) or "—") + ")"
        tenant_rows.append([
            shown(t.tenant), str(t.threads), str(t.checkpoints), human_bytes(t.stored_bytes),
            _dt(t.as_dict()["first_created"]), shown(policy_text(t.policy)), _kinds(t.pii),
            keys, f"[red]{t.overdue}[/]" if t.overdue else "0", str(t.held)])
    tenants, tenants_dropped = _fitted("Tenants", _TENANT_COLUMNS, tenant_rows)
    common.console.print(tenants)
    thread_rows = []
    for th in report.threads[:MAX_ROWS_SHOWN]:
        d = th.as_dict()
        if th.legal_hold:
            expires = "[blue]legal hold[/]"
        elif th.overdue:
            expires = f"[red]{_dt(d['expires_at'])}\nPAST EXPIRY[/]"
        elif not th.registered:
            expires = "[red]unregistered[/]"
        else:
            expires = _dt(d["expires_at"]) if th.expires_at is not None else "never"
        thread_rows.append([shown(th.tenant), shown(th.thread_id), _dt(d["created_at"]),
                            _dt(d["last_activity"]), expires, str(th.checkpoints),
                            human_bytes(th.stored_bytes),
                            ",".join(f"v{v}" for v in th.key_versions) or "—", _kinds(th.pii)])
    threads, threads_dropped = _fitted("Threads", _THREAD_COLUMNS, thread_rows)
    common.console.print(threads)
    if len(report.threads) > MAX_ROWS_SHOWN:
        common.console.print(f"… and {len(report.threads) - MAX_ROWS_SHOWN} more threads "
                             "(--format json or html for all)")
    if tenants_dropped or threads_dropped:
        hidden = "; ".join(f"{name}: {', '.join(cols)}" for name, cols in
                           (("tenants", tenants_dropped), ("threads", threads_dropped)) if cols)
        common.console.print(f"[dim]hidden at {common.console.width} columns: {hidden}. "
                             "--format json or --format html has every field.[/]")
    for orphan in report.orphans:
        common.console.print("[red]stored thread of no known tenant[/]: "
                             f"{shown(orphan['thread_id'])} ({orphan['checkpoints']} "
                             "checkpoints)")
    if report.store is not None:
        _print_store_audit(report.store)
    for problem in report.problems:
        common.console.print(f"[bold red]problem:[/] {shown(problem)}")
    if report.ok:   # the table is the inventory only: it says what it did not check
        common.console.print("[green]no inventory problems[/]: every stored thread is "
                             "registered, none is past its expiry. Not checked here: "
                             "ciphertexts (`securesaver scan --verify`) and registry MACs "
                             "(`securesaver events --verify`), both with the keyring.")


def _print_store_audit(store: dict[str, Any]) -> None:
    """The SecureStore items of the audit (store_audit.StoreAudit.as_dict())."""
    from rich.table import Table

    from ..audit.report_html import human_bytes
    table = Table("tenant", "items", "namespaces", "stored", "last updated", "TTL / expired",
                  "PII kinds (vault)", title="Store items (SecureStore)")
    for t in store["tenants"]:
        table.add_row(shown(t["tenant"]), str(t["items"]), str(t["namespaces"]),
                      human_bytes(t["stored_bytes"]), _dt(t["last_updated"]),
                      f"{t['with_ttl']} / " + (f"[red]{t['expired']}[/]" if t["expired"]
                                               else "0"), _kinds(t["pii"]))
    common.console.print(table)
