"""A self-contained HTML audit report: inline CSS and inline SVG charts, no script, no fetch.

The file can be mailed, archived with a compliance request, or opened offline; it references
nothing outside itself.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..textsafety import escape_invisibles
from .inventory import AGE_BUCKETS, UNKNOWN_AGE, AuditReport, ThreadAudit, iso

PALETTE = ("#2563eb", "#f97316", "#16a34a", "#dc2626", "#9333ea", "#0891b2", "#ca8a04",
           "#db2777", "#4b5563", "#65a30d")

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#111827;
background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.meta{color:#6b7280;font-size:13px}
.tiles{display:flex;gap:12px;flex-wrap:wrap;margin:16px 0}
.tile{border:1px solid #e5e7eb;border-radius:8px;padding:10px 14px;min-width:110px}
.tile b{display:block;font-size:20px}.tile span{color:#6b7280;font-size:12px}
.problems{background:#fef2f2;border:1px solid #fecaca;border-radius:8px;padding:8px 14px}
.ok{background:#f0fdf4;border:1px solid #bbf7d0;border-radius:8px;padding:8px 14px}
.charts{display:flex;gap:24px;flex-wrap:wrap}
.chart{border:1px solid #e5e7eb;border-radius:8px;padding:8px}
table{border-collapse:collapse;font-size:13px;margin-top:4px}
th,td{border-bottom:1px solid #e5e7eb;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f9fafb}td.n{text-align:right;font-variant-numeric:tabular-nums}
td.n,td.d{white-space:nowrap}
tr.overdue td{background:#fef2f2}.tag{font-size:11px;padding:1px 6px;border-radius:9px;
background:#fee2e2;color:#991b1b}.held{background:#e0e7ff;color:#3730a3}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.chart svg{max-width:100%;height:auto}.wide{overflow-x:auto;max-width:100%}
td{overflow-wrap:anywhere}table{max-width:100%}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;font-size:13px;
margin:10px 0}.facts dt{color:#6b7280}.facts dd{margin:0;overflow-wrap:anywhere}
.verdict{border-radius:8px;padding:8px 14px;margin:6px 0}.pass{background:#f0fdf4;
border:1px solid #bbf7d0}.fail{background:#fef2f2;border:1px solid #fecaca}
.skip{background:#fffbeb;border:1px solid #fde68a}
dl.glossary dt{font-weight:600;margin-top:6px}dl.glossary dd{margin:0 0 0 0;font-size:13px}
@media (max-width:640px){body{margin:10px}h1{font-size:19px}
.stack table,.stack thead,.stack tbody,.stack tr,.stack td{display:block;width:auto}
.stack tr:first-child{display:none}.stack tr{border:1px solid #e5e7eb;border-radius:6px;
margin:8px 0;padding:4px 8px}.stack td{border:0;padding:2px 0;white-space:normal;text-align:left}
.stack td::before{content:attr(data-label) ": ";color:#6b7280}.tile{min-width:80px}}
@media print{body{margin:0;font-size:11px}.chart,.tile,.verdict{break-inside:avoid}
tr{break-inside:avoid}h2{break-after:avoid}.wide{overflow:visible}
a{color:inherit;text-decoration:none}.charts{display:block}}
"""


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def _e(value: Any) -> str:
    """HTML text of a value; invisible characters shown escaped (two ids never look alike)."""
    return html.escape(escape_invisibles("" if value is None else str(value)), quote=True)


def _nice_max(value: float) -> float:
    """A round axis maximum in the unit ``human_bytes`` will print (so ticks read 50 KB, not
    48.8 KB)."""
    if value <= 0:
        return 1.0
    unit = 1.0
    while value / unit >= 1024 and unit < 1024 ** 4:
        unit *= 1024
    scaled = value / unit
    exp = 10 ** math.floor(math.log10(scaled))
    for step in (1, 2, 2.5, 5, 10):
        if scaled <= step * exp:
            return step * exp * unit
    return 10 * exp * unit  # pragma: no cover


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    for unit, size in (("y", 365 * 86400), ("w", 7 * 86400), ("d", 86400), ("h", 3600),
                       ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def policy_text(policy: dict[str, Any] | None) -> str:
    """``idle 30d, max 1y, keep_latest (tenant)``; ``legal hold``; ``no expiry (default)``."""
    policy = policy or {}
    source = policy.get("source") or "default"
    if policy.get("legal_hold"):
        return f"legal hold ({source})"
    parts = []
    if policy.get("idle_ttl"):
        parts.append(f"idle {_duration(policy['idle_ttl'])}")
    if policy.get("max_age"):
        parts.append(f"max age {_duration(policy['max_age'])}")
    if not parts:
        return f"no expiry ({source})"
    if policy.get("strategy") and policy["strategy"] != "delete":
        parts.append(str(policy["strategy"]))
    return ", ".join(parts) + f" ({source})"


def colors_for(tenants: Sequence[str]) -> dict[str, str]:
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(tenants)}


def age_chart(report: Any, colors: dict[str, str], width: int = 620,
              height: int = 300) -> str:
    """Stacked bars: stored bytes per age bucket, one colour per tenant."""
    buckets = [label for label, _ in AGE_BUCKETS]
    if any(UNKNOWN_AGE in per for per in report.age_bytes.values()):
        buckets.append(UNKNOWN_AGE)
    totals = [sum(per.get(b, 0) for per in report.age_bytes.values()) for b in buckets]
    top = _nice_max(max(totals, default=0))
    left, right, upper, lower = 70, 10, 20, 40
    plot_w, plot_h = width - left - right, height - upper - lower
    slot = plot_w / len(buckets)
    bar_w = slot * 0.6
    parts = [f'<svg width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="stored data by age">']
    for i in range(5):
        value = top * i / 4
        y = upper + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                     'stroke="#e5e7eb"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
                     f'fill="#6b7280">{_e(human_bytes(value))}</text>')
    for i, bucket in enumerate(buckets):
        x = left + slot * i + (slot - bar_w) / 2
        y = upper + plot_h
        for tenant, color in colors.items():
            size = report.age_bytes.get(tenant, {}).get(bucket, 0)
            if not size:
                continue
            h = plot_h * size / top
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{color}"><title>{_e(tenant)}: {_e(bucket)}, '
                         f'{_e(human_bytes(size))}</title></rect>')
        parts.append(f'<text x="{left + slot * i + slot / 2:.1f}" y="{height - lower + 16}" '
                     f'font-size="11" text-anchor="middle" fill="#374151">{_e(bucket)}</text>')
    parts.append(f'<line x1="{left}" y1="{upper + plot_h}" x2="{width - right}" '
                 f'y2="{upper + plot_h}" stroke="#9ca3af"/>')
    parts.append("</svg>")
    return "".join(parts)


def tenant_chart(report: Any, colors: dict[str, str], width: int = 520) -> str:
    """Horizontal bars: stored bytes per tenant."""
    rows = [(t.tenant, t.stored_bytes) for t in report.tenants]
    bar_h, gap, left, right, upper = 22, 10, 120, 80, 10
    height = upper * 2 + max(1, len(rows)) * (bar_h + gap)
    top = _nice_max(max((b for _, b in rows), default=0))
    plot_w = width - left - right
    parts = [f'<svg width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="stored data by tenant">']
    for i, (tenant, size) in enumerate(rows):
        y = upper + i * (bar_h + gap)
        w = plot_w * size / top
        label = tenant if len(tenant) <= 16 else tenant[:15] + "…"
        parts.append(f'<text x="{left - 6}" y="{y + bar_h / 2 + 4:.1f}" font-size="12" '
                     f'text-anchor="end" fill="#374151">{_e(label)}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{max(w, 1):.1f}" height="{bar_h}" '
                     f'fill="{colors.get(tenant, PALETTE[0])}"><title>{_e(tenant)}: '
                     f'{_e(human_bytes(size))}</title></rect>')
        parts.append(f'<text x="{left + max(w, 1) + 6:.1f}" y="{y + bar_h / 2 + 4:.1f}" '
                     f'font-size="12" fill="#374151">{_e(human_bytes(size))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _kinds(pii: dict[str, int]) -> str:
    return ", ".join(f"{_e(k)}&nbsp;&times;&nbsp;{n}" for k, n in sorted(pii.items())) or "—"


def _dt(ts: float | None) -> str:
    value = iso(ts)
    return "—" if value is None else _e(value.replace("T", " ").replace("+00:00", " UTC"))


HTML_MAX_THREADS = 2000
#: At most this many receipts and refused-access events are listed (the counts are whole).
HTML_MAX_TRAIL = 2000


@dataclass
class ReportContext:
    """What an auditor needs around the inventory: which database, by which version, what
    was verified and how, and the deletions and refused reads of the period."""

    database_id: str | None = None
    database: str = ""                       # the URL, password hidden
    version: str = ""
    period: tuple[float | None, float | None] = (None, None)
    #: ``scan --verify`` as a dict (ScanReport.as_dict) or None when it did not run
    scan: dict[str, Any] | None = None
    #: ``events --verify`` as a dict (IntegrityReport.as_dict) or None when it did not run
    registry: dict[str, Any] | None = None
    not_verified: str = ""                   # why verification did not run
    receipts: list[Any] = field(default_factory=list)   # TrailEntry, oldest first
    denials: list[Any] = field(default_factory=list)
    #: how many receipts / refused reads the period holds (None: ``len`` of the lists above,
    #: which then hold all of them)
    receipts_total: int | None = None
    denials_total: int | None = None


def _td(label: str, value: str, cls: str = "") -> str:
    klass = f" class={cls}" if cls else ""
    return f'<td{klass} data-label="{_e(label)}">{value}</td>'


def _table(headers: Sequence[str], rows: Iterable[Sequence[tuple[str, str]]]) -> Iterator[str]:
    """A table that scrolls sideways when wide and stacks into labelled cards on a phone."""
    yield ('<div class="wide stack"><table><tr>' + "".join(f"<th>{_e(h)}</th>" for h in headers)
           + "</tr>")
    for cells in rows:
        pairs = zip(headers, cells, strict=True)
        yield "<tr>" + "".join(_td(h, v, c) for h, (v, c) in pairs) + "</tr>"
    yield "</table></div>"


def _period(ctx: ReportContext) -> str:
    since, until = ctx.period
    if since is None and until is None:
        return "everything recorded"
    return f"{_dt(since) if since is not None else 'the start'} to " \
           f"{_dt(until) if until is not None else 'now'}"


def _about(report: Any, ctx: ReportContext) -> Iterator[str]:
    facts = [("database", _e(ctx.database) or "—"),
             ("database id", _e(ctx.database_id) or "—"),
             ("backend", _e(report.backend)),
             ("generated", _dt(report.generated_at)),
             ("library", f"langgraph-securesaver {_e(ctx.version)}"),
             ("scope", _e(f"tenant {report.tenant_filter}") if report.tenant_filter
              else "every tenant"),
             ("period of the trail", _period(ctx))]
    yield '<h2>About this report</h2><dl class="facts">' + "".join(
        f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"


def _banner(problems: Sequence[str], ctx: ReportContext) -> str:
    """The verdict at the top: every problem and every failed check; "no problems" only when
    nothing failed, and then it says what was not checked."""
    failed = [f"{label}: FAIL (see Verification below)" for label, part in
              (("Checkpoints at rest", ctx.scan), ("Registry integrity", ctx.registry))
              if part is not None and not part.get("ok")]
    if problems or failed:
        return ('<div class="problems" id="verdict"><b>Problems</b><ul>' + "".join(
            f"<li>{_e(p)}</li>" for p in [*problems, *failed]) + "</ul></div>")
    inventory = "every stored thread is registered, and none is past its expiry"
    if ctx.scan is None and ctx.registry is None:
        return (f'<div class="verdict skip" id="verdict"><b>No inventory problems</b>: '
                f"{inventory}. {_e(ctx.not_verified)}</div>")
    return (f'<div class="ok" id="verdict">No problems: {inventory}, and every verification '
            "below passed.</div>")


def _verification(ctx: ReportContext) -> Iterator[str]:
    yield "<h2>Verification</h2>"
    if ctx.scan is None and ctx.registry is None:
        yield (f'<div class="verdict skip"><b>Not verified.</b> {_e(ctx.not_verified)} '
               "Run <code>securesaver audit --keyring PATH --format html</code> to include "
               "the checks below.</div>")
        return
    if ctx.scan is not None:
        s = ctx.scan
        kinds = sorted({v.get("kind", "?") for v in s.get("violations", [])})
        ok = s.get("ok")
        yield (f'<div class="verdict {"pass" if ok else "fail"}" id="verify-checkpoints">'
               f"<b>Checkpoints at rest: {'pass' if ok else 'FAIL'}.</b> "
               f"{sum(s.get('rows', {}).values()):,} rows in {len(s.get('rows', {}))} tables "
               f"scanned; {s.get('tokens', 0):,} ciphertexts found, {s.get('verified', 0):,} "
               f"authenticated against their place; {len(s.get('violations', [])):,} "
               f"violations{(' (' + _e(', '.join(kinds)) + ')') if kinds else ''}. "
               "(<code>securesaver scan --verify</code>: no clear value, no PII or secret in a "
               "clear column, every ciphertext under a known key and bound to its row.)</div>")
    if ctx.registry is not None:
        r = ctx.registry
        checked = r.get("checked", {})
        ok = r.get("ok")
        yield (f'<div class="verdict {"pass" if ok else "fail"}" id="verify-registry">'
               f"<b>Registry integrity: {'pass' if ok else 'FAIL'}.</b> "
               f"{sum(checked.values()):,} rows checked ("
               + _e(", ".join(f"{n:,} {k}" for k, n in sorted(checked.items()))) + "); "
               f"{len(r.get('problems', [])):,} problems. (<code>securesaver events --verify"
               "</code>: the MAC of every retention, policy and idempotency row and the hash "
               "chains of events and receipts.)</div>")
        if r.get("problems"):
            yield from _table(["table", "row", "problem"], (
                [(_e(p["table"]), ""), (_e(p["row"]), ""), (_e(p["problem"]), "")]
                for p in r["problems"][:HTML_MAX_TRAIL]))


def _trail(title: str, anchor: str, entries: list[Any], empty: str,
           total: int | None = None) -> Iterator[str]:
    total = len(entries) if total is None else total
    yield f'<h2 id="{anchor}">{_e(title)} ({total:,})</h2>'
    if not entries:
        yield f'<p class="meta">{_e(empty)}</p>'
        return
    shown = entries[-HTML_MAX_TRAIL:]
    if len(shown) < total:
        yield (f'<p class="meta">The latest {len(shown):,} of {total:,}; '
               "<code>securesaver events --format json</code> lists every one.</p>")
    yield from _table(["at", "kind", "tenant", "thread", "by", "detail"], (
        [(_e(str(e.as_dict()["at"]).replace("T", " ").replace("+00:00", " UTC")), "d"),
         (_e(e.kind), ""), (_e(e.tenant or "—"), ""), (_e(e.thread_id or "—"), ""),
         (_e(e.actor or "—"), ""),
         (", ".join(f"{_e(k)}: {_detail_value(k, v)}"
                    for k, v in sorted((e.detail or {}).items())), "")]
        for e in shown))


def _detail_value(key: str, value: Any) -> str:
    """A trail detail for the page: times (``expired_at``, ``erased_under``...) as dates."""
    if (str(key).endswith(("_at", "_under")) and isinstance(value, (int, float))
            and not isinstance(value, bool)):
        return _dt(float(value))
    return _e(value)


LEGEND = (
    ("tenant", "the customer or organisation a thread belongs to; data of different tenants "
     "is encrypted under different keys and never readable across them"),
    ("thread", "one conversation (LangGraph thread) and all its checkpoints"),
    ("checkpoints / stored", "saved states of a thread and the bytes they take, encrypted"),
    ("expires", "when retention deletes the thread (idle time or maximum age); legal hold: "
     "never, until the hold is lifted; past expiry: the pruner has not run"),
    ("data keys / master versions", "the versions of the tenant's encryption keys and of the "
     "master keys wrapping them; old versions in use mean a rotation is not finished"),
    ("personal data", "kinds and numbers of distinct personal values found by redaction; the "
     "values are stored encrypted in a separate vault, masked kinds (cards, secrets) nowhere"),
    ("deletion receipt", "a content-free record written when a thread was deleted, pruned or "
     "its tenant shredded: who asked, why, how many checkpoints and personal values went"),
    ("refused access", "a request that named another tenant's data than its caller's; it was "
     "refused, and the record names both tenants"),
    ("verification", "pass: every check ran and found nothing; FAIL lists what to look at; "
     "not verified: the report was made without the keyring"),
)


def _legend() -> str:
    return '<h2 id="legend">Legend</h2><dl class="glossary">' + "".join(
        f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in LEGEND) + "</dl>"


def render_html(report: AuditReport, *, title: str = "SecureSaver audit",
                max_threads: int | None = None, context: ReportContext | None = None) -> str:
    """The whole report as one HTML document (inline CSS and SVG only)."""
    shown = report.threads if max_threads is None else report.threads[:max_threads]
    return "\n".join(_page(report, shown, len(report.threads), len(report.overdue),
                            title=title, context=context))


def write_html(stream: Iterable[ThreadAudit], finish: Callable[[], Any], out: TextIO, *,
               title: str = "SecureSaver audit", max_threads: int = HTML_MAX_THREADS,
               context: ReportContext | None = None) -> Any:
    """Stream an audit (:func:`~langgraph_securesaver.audit.inventory.iter_audit`) into an HTML
    page: per-tenant summaries and charts of everything, and the first ``max_threads`` threads
    (sorted by tenant and thread) with a note saying how many more there are. Memory stays
    bounded by ``max_threads``. Returns the audit summary."""
    shown: list[ThreadAudit] = []
    hidden_overdue = 0
    for th in stream:
        if len(shown) < max_threads:
            shown.append(th)
        elif th.overdue or not th.registered:
            hidden_overdue += 1
    summary = finish()
    for chunk in _page(summary, shown, summary.threads, summary.overdue, title=title,
                       hidden_flagged=hidden_overdue, context=context):
        out.write(chunk)
        out.write("\n")
    return summary


def _page(report: Any, shown: Sequence[ThreadAudit], total_threads: int, overdue: int, *,
          title: str, hidden_flagged: int = 0,
          context: ReportContext | None = None) -> Iterator[str]:
    """The HTML document in chunks; ``report`` is an AuditReport or an AuditSummary."""
    colors = colors_for([t.tenant for t in report.tenants]
                        + sorted(k for k in report.age_bytes
                                 if k not in {t.tenant for t in report.tenants}))
    total_bytes = sum(t.stored_bytes for t in report.tenants)
    tiles = [("tenants", len(report.tenants)), ("threads", total_threads),
             ("checkpoints", sum(t.checkpoints for t in report.tenants)),
             ("stored", human_bytes(total_bytes)), ("past expiry", overdue)]
    ctx = context or ReportContext(not_verified="No verification was requested.")
    out = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{_e(title)}</h1>",
           f'<div class="meta">generated {_dt(report.generated_at)} · backend '
           f'{_e(report.backend)}' + (f" · tenant {_e(report.tenant_filter)}"
                                      if report.tenant_filter else "") + "</div>",
           '<div class="tiles">' + "".join(
               f'<div class="tile"><b>{_e(v)}</b><span>{_e(k)}</span></div>' for k, v in tiles)
           + "</div>"]
    out.append(_banner(report.problems, ctx))
    out += [*_about(report, ctx), *_verification(ctx)]
    legend = '<div class="legend">' + "".join(
        f'<span><i style="background:{c}"></i>{_e(t)}</span>' for t, c in colors.items()) + "</div>"
    out.append('<div class="charts">')
    out.append(f'<div class="chart" id="chart-age"><h2>Stored data by age</h2>{legend}'
               f"{age_chart(report, colors)}</div>")
    out.append(f'<div class="chart" id="chart-tenant"><h2>Stored data by tenant</h2>'
               f"{tenant_chart(report, colors)}</div>")
    out.append("</div>")

    out.append("<h2>Tenants</h2>")
    out += _table(["tenant", "threads", "checkpoints", "stored", "first thread",
                   "data keys (current)", "master versions",
                   "personal data (distinct values)", "retention", "past expiry", "held"], (
        [(_e(t.tenant), ""), (str(t.threads), "n"), (str(t.checkpoints), "n"),
         (_e(human_bytes(t.stored_bytes)), "n"), (_dt(t.first_created), "d"),
         (_e(", ".join(f"v{v}" for v in t.data_keys)) + " ("
          + _e("v" + str(t.current_data_key) if t.current_data_key else "—") + ")", ""),
         (_e(", ".join(t.master_versions)), ""), (_kinds(t.pii), ""),
         (_e(policy_text(t.policy)), ""), (str(t.overdue), "n"), (str(t.held), "n")]
        for t in report.tenants))
    yield from out
    out = []

    def thread_cells(th: ThreadAudit) -> list[tuple[str, str]]:
        if th.legal_hold:
            expires = '<span class="tag held">legal hold</span>'
        elif th.overdue:
            expires = f'{_dt(th.expires_at)} <span class="tag">past expiry</span>'
        elif not th.registered:
            expires = '<span class="tag">unregistered</span>'
        else:
            expires = _dt(th.expires_at) if th.expires_at is not None else "never"
        return [(_e(th.tenant), ""), (_e(th.thread_id), ""), (_dt(th.created_at), "d"),
                (_dt(th.last_activity), "d"), (expires, "d"), (str(th.checkpoints), "n"),
                (_e(human_bytes(th.stored_bytes)), "n"),
                (_e(", ".join(f"v{v}" for v in th.key_versions) or "—"), ""),
                (_kinds(th.pii), "")]

    out.append("<h2>Threads</h2>")
    for n, chunk in enumerate(_table(
            ["tenant", "thread", "created", "last activity", "expires", "checkpoints",
             "stored", "key versions", "personal data"],
            (thread_cells(th) for th in shown))):
        out.append(chunk.replace("<tr>", '<tr class="overdue">', 1)
                   if n and chunk.startswith("<tr>") and 'class="tag"' in chunk else chunk)
        if len(out) >= 500:
            yield from out
            out = []
    if total_threads > len(shown):
        flagged = (f", {hidden_flagged} of them past expiry or unregistered"
                   if hidden_flagged else "")
        out.append(f'<p class="meta" id="threads-capped">Showing the first {len(shown):,} of '
                   f"{total_threads:,} threads (sorted by tenant and thread); "
                   f"{total_threads - len(shown):,} more are counted in the tenant summaries "
                   f"above{_e(flagged)}. Run <code>securesaver audit --format json</code> (or "
                   "<code>--tenant T</code>) for every thread.</p>")
    if report.orphans:
        out.append("<h2>Stored threads of no known tenant</h2><table><tr><th>inner thread id"
                   "</th><th>checkpoints</th><th>stored</th></tr>")
        for o in report.orphans:
            out.append(f"<tr><td>{_e(o['thread_id'])}</td><td class=n>{o['checkpoints']}</td>"
                       f"<td class=n>{_e(human_bytes(o['stored_bytes']))}</td></tr>")
        out.append("</table>")
    out += _trail("Deletion receipts in the period", "receipts", ctx.receipts,
                  "No thread was deleted, pruned or shredded in the period.", ctx.receipts_total)
    out += _trail("Refused access in the period", "denials", ctx.denials,
                  "No request for another tenant's data was made in the period.",
                  ctx.denials_total)
    out.append(_legend())
    out.append("</body></html>")
    yield from out
