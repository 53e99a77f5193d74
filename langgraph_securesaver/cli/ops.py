"""Operations commands of the ``securesaver`` CLI: audit, scan, rotate-keys, events.

They are registered on :data:`langgraph_securesaver.cli.common.app` (the ``securesaver`` app,
also ``cli.app``) when this module is imported; :mod:`.main` imports it.

Exit codes (all four commands): 0 ok; 1 the command ran and found something (audit: threads
past their expiry or outside the registry; scan: violations; rotate-keys: work left or a
version still in use; events: nothing matched); 2 it could not run (bad arguments, missing
keyring, unreachable or missing database).
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import SecureSaverError
from . import common, evidence
from .audit_tables import print_audit
from .common import (
    EXIT_CANNOT_RUN,
    EXIT_FOUND,
    EXIT_OK,
    MAX_ROWS_SHOWN,
    KeyringOption,
    SaverOption,
    UrlOption,
    app,
    echo_json,
    fail,
    load_keyring,
    opened,
    opened_for_audit,
    progress_bar,
    shown,
    tenant_arg,
    thread_arg,
)
from .events import print_events


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


class AuditFormat(str, Enum):
    table = "table"
    json = "json"
    html = "html"


FormatOption = Annotated[OutputFormat, typer.Option(
    "--format", case_sensitive=False, metavar="FORMAT",
    help="table (for people) or json (for scripts).")]


# --------------------------------------------------------------------------------------------
# shared plumbing
# --------------------------------------------------------------------------------------------
def _keyring_or_none(path: str | None) -> Any:
    """The keyring from --keyring, else $SECURESAVER_MASTER_KEY, else None. Without either,
    nothing of the keyring (nor cryptography) is imported: ``audit`` and ``events`` need none."""
    if path is not None:
        return load_keyring(path)
    return common.env_keyring()


def _echo_json(data: Any) -> None:
    echo_json(data, indent=2, sort_keys=False)


def parse_when(value: str | None, *, what: str, now: float | None = None) -> float | None:
    """``2025-11-01``, ``2025-11-01T10:00:00Z``, an epoch number, or a duration ago (``7d``)."""
    if value is None:
        return None
    from ..retention import parse_duration
    now = time.time() if now is None else now
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(number):
            raise fail(f"{what} {value!r} is not a finite epoch")
        return number
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is not None:
        if parsed.tzinfo is None:
            if len(text) > 10:   # a time of day without a zone names no instant
                raise fail(f"{what} {value!r} has a time but no timezone: add Z or +hh:mm")
            parsed = parsed.replace(tzinfo=timezone.utc)   # a bare date: midnight UTC
        return parsed.timestamp()
    try:
        ago = parse_duration(text, what=what)
    except SecureSaverError:
        raise fail(f"{what} {value!r} is not a date (2025-11-01, 2025-11-01T10:00:00Z), an "
                   "epoch, or a duration ago (90m, 12h, 7d)") from None
    return now - (ago or 0.0)


# --------------------------------------------------------------------------------------------
# audit
# --------------------------------------------------------------------------------------------
@app.command()
def audit(
    url: UrlOption,
    tenant: Annotated[str | None, typer.Option("--tenant", metavar="TENANT",
                                               help="Only this tenant.")] = None,
    keyring: KeyringOption = None,
    output: Annotated[AuditFormat, typer.Option(
        "--format", case_sensitive=False, metavar="FORMAT",
        help="table, json, or html (a self-contained report with charts).")]
    = AuditFormat.table,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="FILE", help="Write the report to this file (html and json).",
        dir_okay=False)]
    = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="WHEN", help="html: list the deletion receipts and refused reads "
        "from this time on (same forms as events --since; default: all).")] = None,
    until: Annotated[str | None, typer.Option(
        "--until", metavar="WHEN", help="html: ... up to this time.")] = None,
    recount: Annotated[bool, typer.Option(
        "--recount", help="Read every stored row instead of the maintained summaries (slower "
        "on large databases; also lists stored threads without a registry row).")] = False,
    signing: evidence.SigningKeyOption = None,
) -> None:
    """What is held per tenant and thread: since when, until when, how much, under which
    keys, which personal data; threads past their expiry are flagged.

    Large databases are answered from the maintained summaries (`securesaver summaries`
    refreshes them; `scan --verify` checks them against the stored rows).

    With --format json the report is one JSON document (threads one per line, then the
    tenants, problems and ok).

    With --format html the report is one self-contained page for an auditor: the database
    and library version, the verification results (with --keyring: scan --verify and events
    --verify), the deletion receipts and refused reads of the period, and a legend.

    Exit codes: 0 ok, 1 threads past their expiry (retention not running) or stored outside
    the registry (or, with --format html and a keyring, a verification failed), 2 could not
    run.
    """
    from ..audit.inventory import audit as run_audit
    from ..registry.wrapped_keys import erasure_epoch_of
    tenant = tenant_arg(tenant)
    ring = _keyring_or_none(keyring)
    period = (parse_when(since, what="--since"), parse_when(until, what="--until"))
    source = "recount" if recount else "auto"
    key = evidence.signing_key(signing, out)
    if key is not None and output is AuditFormat.table:
        raise fail("--signing-key signs --format json or html")
    if output is not AuditFormat.table:
        _stream_audit(url, ring, tenant, output, out, period, source, key)
    with opened_for_audit(url, ring) as saver:
        try:
            with progress_bar("audit") as advance:
                report = run_audit(saver, tenant=tenant, progress=advance, source=source)
            epoch = erasure_epoch_of(saver.registry, ring) if ring is not None else None
        except SecureSaverError as exc:
            raise fail(exc) from None
    print_audit(report)
    if epoch is not None and epoch["erasures_pending"]:
        held = ", ".join(epoch["held_masters"])
        common.console.print(f"erasure epoch pending: {epoch['erasures_pending']} erasure(s) "
                             "still open from remnants and backups until `securesaver "
                             f"rotate-keys --retire-old` (master versions held: {held})")
    raise typer.Exit(EXIT_OK if report.ok else EXIT_FOUND)


def _stream_audit(url: str, ring: Any, tenant: str | None, output: AuditFormat,
                  out: Path | None, period: tuple[float | None, float | None],
                  source: str = "auto", key: Any = None) -> None:
    """json / html: written while the database is read (memory stays flat); always exits."""
    import sys

    from ..audit.inventory import audit_stream, iter_audit
    context = _report_context(url, ring, tenant, period) if output is AuditFormat.html else None
    with opened_for_audit(url, ring) as saver:
        try:
            if tenant is not None and tenant not in saver.registry.tenants():
                raise fail(f"unknown tenant {tenant!r}: it has no threads or keys here")
            with (evidence.open_document(out, f"audit-{output.value}", key) if out is not None
                  else _no_close(sys.stdout)) as target:
                if output is AuditFormat.html:
                    from ..audit.report_html import write_html
                    stream, finish = iter_audit(saver, tenant=tenant, source=source)
                    summary = write_html(stream, finish, target, context=context)
                else:
                    summary = audit_stream(saver, target, tenant=tenant, source=source)
        except SecureSaverError as exc:
            raise fail(exc) from None
    if out is not None:
        common.err_console.print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    verified = context is None or all(
        part is None or part.get("ok") for part in (context.scan, context.registry))
    raise typer.Exit(EXIT_OK if summary.ok and verified else EXIT_FOUND)


def _report_context(url: str, ring: Any, tenant: str | None,
                    period: tuple[float | None, float | None]) -> Any:
    """What the HTML report states beyond the inventory: the database's identity, the library
    version, ``scan --verify`` and ``events --verify`` (with a keyring), and the receipts and
    refused reads of the period."""
    import sqlalchemy as sa

    from ..audit.report_html import HTML_MAX_TRAIL, ReportContext
    from ..audit.scan import scan as run_scan
    from ..audit.trail import latest
    from ..registry.schema import meta_table
    since, until = period
    context = ReportContext(version=common.release(), period=period)
    with opened_for_audit(url, ring) as light:
        registry = light.registry
        context.database = registry.engine.url.render_as_string(hide_password=True)
        with registry.begin() as conn:
            context.database_id = conn.execute(sa.select(meta_table.c.value).where(
                meta_table.c.key == "database_id")).scalar()
        # the latest of each trail only: a busy period holds far more than the page shows
        context.receipts_total, context.receipts = latest(
            light, receipts=True, tenant=tenant, since=since, until=until, n=HTML_MAX_TRAIL)
        context.denials_total, context.denials = latest(
            light, receipts=False, tenant=tenant, since=since, until=until, n=HTML_MAX_TRAIL)
    if ring is None:
        context.not_verified = ("The report was made without the keyring, so ciphertexts were "
                                "not authenticated and registry MACs not checked.")
        return context
    with opened(url, ring) as saver:
        try:
            with progress_bar("verify"):
                context.scan = run_scan(saver, keyring=ring, verify=True).as_dict()
            context.registry = saver.registry.verify_integrity().as_dict()
        except SecureSaverError as exc:
            raise fail(exc) from None
    return context


@contextmanager
def _no_close(stream: Any) -> Iterator[Any]:
    yield stream
    stream.flush()


# --------------------------------------------------------------------------------------------
# scan
# --------------------------------------------------------------------------------------------
@app.command()
def scan(
    url: UrlOption,
    keyring: KeyringOption = None,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Also authenticate every ciphertext against its place (needs the "
        "keyring).")] = False,
    allow_metadata: Annotated[list[str] | None, typer.Option(
        "--allow-metadata", metavar="KEY",
        help="A metadata key your saver stores in clear (repeatable).")]
    = None,
    output: FormatOption = OutputFormat.table,
    saver_spec: SaverOption = None,
) -> None:
    """Check the raw tables at rest: nothing unencrypted, no personal data or secrets in clear
    columns, every ciphertext under a known key. Violations name the kind and place, never
    the value. With --saver (checkpoints in another saver): every stored checkpoint is read
    back through that saver and authenticated (needs the keyring).

    Exit codes: 0 clean, 1 violations found, 2 could not run.
    """
    from ..audit.scan import scan as run_scan
    from ..audit.scan_report import VIOLATIONS
    from ..saver import DEFAULT_METADATA_ALLOWLIST
    ring = _keyring_or_none(keyring)
    if verify and ring is None:
        raise fail("--verify decrypts every ciphertext: pass --keyring or set "
                   "SECURESAVER_MASTER_KEY")
    if saver_spec is not None and ring is None:
        raise fail("--saver scans through the saver's API, which opens every checkpoint: "
                   "pass --keyring or set SECURESAVER_MASTER_KEY")
    allow = set(DEFAULT_METADATA_ALLOWLIST) | set(allow_metadata or ())
    with opened(url, ring, saver_spec) as saver:
        try:
            with progress_bar("scan", quiet=output is OutputFormat.json) as advance:
                report = run_scan(saver, keyring=ring, verify=verify, allowlist=allow,
                                  progress=advance)
        except SecureSaverError as exc:
            raise fail(exc) from None
    if output is OutputFormat.json:
        _echo_json(report.as_dict())
    else:
        _print_scan(report, VIOLATIONS)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_FOUND)


def _print_scan(report: Any, meanings: dict[str, str]) -> None:
    from rich.table import Table
    summary = Table("table", "rows", title=f"Scanned ({report.backend}, "
                                           f"{report.duration:.1f}s)")
    for name, n in report.rows.items():
        summary.add_row(shown(name), str(n))
    common.console.print(summary)
    checked = (f"{report.tokens} ciphertexts checked"
               + (f", {report.verified} authenticated" if report.verified else ""))
    common.console.print(checked)
    keys = "; ".join(f"{shown(t)} (" + ", ".join(
        f"v{k}: {n} ciphertexts" for k, n in sorted(v.items())) + ")"
        for t, v in sorted(report.key_versions.items()))
    common.console.print(f"data-key versions in use: {keys or 'none'}")
    masters = ", ".join(f"v{shown(k)}: {n} key rows"
                        for k, n in sorted(report.master_versions.items()))
    common.console.print(f"master versions wrapping key rows: {masters or 'none'}"
                         + ("" if report.keyring_checked else " (not checked: no keyring)"))
    if report.ok:
        common.console.print("[bold green]clean[/]: no violations")
        return
    table = Table("kind", "table", "where", "detail", title="Violations")
    table.columns[2].overflow = "fold"       # row keys are never cut short
    for v in report.violations[:MAX_ROWS_SHOWN]:
        table.add_row(shown(v.kind), shown(v.table), shown(v.location), shown(v.detail))
    common.console.print(table)
    if len(report.violations) > MAX_ROWS_SHOWN:
        common.console.print(f"… and {len(report.violations) - MAX_ROWS_SHOWN} more "
                             "(--format json)")
    for kind, n in sorted(report.by_kind().items()):
        common.console.print(f"[bold red]{n}[/] x {kind}: {shown(meanings.get(kind, ''))}")


# --------------------------------------------------------------------------------------------
# rotate-keys
# --------------------------------------------------------------------------------------------
@app.command("rotate-keys")
def rotate_keys(
    url: UrlOption,
    keyring: Annotated[str, typer.Option(
        "--keyring", metavar="PATH|URL",
        help="Keyring file (a master version is added; the file is rewritten) or key "
        "provider URL (aws-kms://alias/NAME: a new KMS key, the alias moved; "
        "pkcs11://TOKEN/KEY?...: a new key KEY.vN generated in the token).")],
    reencrypt: Annotated[bool, typer.Option(
        "--reencrypt", help="Also rotate every tenant's data key and re-encrypt the stored "
        "data (online, resumable).")] = False,
    retire_old: Annotated[bool, typer.Option(
        "--retire-old", help="Then remove master versions that no key row uses any more.")]
    = False,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, metavar="N",
                                            help="Rows per transaction.")] = 200,
    max_rate: Annotated[float | None, typer.Option(
        "--max-rate", min=0.001, metavar="ROWS_PER_S",
        help="At most this many rows rewritten per second.")] = None,
    output: FormatOption = OutputFormat.table,
) -> None:
    """Add a master key version and rewrap every data key under it (fast, no data rewrite);
    --reencrypt also moves all stored data to new data keys. Run the same command again to
    resume an interrupted --reencrypt. Stops cleanly between batches on SIGTERM/SIGINT.

    Exit codes: 0 done, 1 work left (stopped, rows contended or unreadable) or an old master
    version still in use, 2 could not run.
    """
    from ..ops.rotation import rotate_keys as run_rotation
    ring = load_keyring(keyring)
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        common.err_console.print(f"received signal {signum}: stopping after the current batch")
        stop.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with opened(url, ring) as saver:
            try:
                with progress_bar("rotate-keys", quiet=output is OutputFormat.json) as advance:
                    report = run_rotation(
                        saver, reencrypt=reencrypt, retire_old=retire_old,
                        batch_size=batch_size, max_rate=max_rate,
                        progress=lambda _stage, d, t: advance(d, t), should_stop=stop.is_set)
            except SecureSaverError as exc:
                raise fail(exc) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if output is OutputFormat.json:
        _echo_json(report.as_dict())
    else:
        _print_rotation(report, keyring)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_FOUND)


@app.command("destroy-master-key")
def destroy_master_key(
    url: UrlOption,
    keyring: Annotated[str, typer.Option(
        "--keyring", metavar="URL", help="The key provider URL (aws-kms://... or "
        "pkcs11://...).")],
    key: Annotated[str, typer.Option(
        "--key", metavar="VERSION", help="The master version to destroy, by name: the KMS "
        "key id, or the PKCS#11 key label (rotate-keys --retire-old names it).")],
) -> None:
    """Destroy a provider master key that `rotate-keys --retire-old` stopped using (KMS:
    schedule its deletion; PKCS#11: destroy the key object). Never implied by retiring: a
    restored copy of this database shares its id and keys, so check first that no other
    database, original or copy, still uses the key.

    Exit codes: 0 destroyed, 2 refused or could not run.
    """
    ring = load_keyring(keyring)
    with opened(url, ring) as saver:
        try:
            saver.destroy_master_key(key)
        except SecureSaverError as exc:
            raise fail(str(exc)) from None
    common.console.print(f"master key {shown(key)} destroyed at the key provider")
    raise typer.Exit(EXIT_OK)


def _print_rotation(report: Any, keyring: str) -> None:
    from rich.table import Table
    verb = "resumed" if report.resumed else "added"
    common.console.print(f"master version [bold]{shown(report.master_version)}[/] {verb} (keyring "
                         f"{shown(str(keyring))} rewritten); {report.rewrapped} key rows rewrapped")
    re = report.reencrypt
    if re is not None:
        if report.rotated_tenants:
            common.console.print(f"data keys rotated for {len(report.rotated_tenants)} tenant(s)")
        table = Table("table", "rows re-encrypted", title=f"Re-encryption ({re.passes} "
                                                          f"passes, {re.duration:.1f}s)")
        for name, n in sorted(re.rewritten.items()):
            table.add_row(name, str(n))
        common.console.print(table)
        common.console.print(f"{re.tokens} ciphertexts re-sealed, {re.already_current} rows "
                             f"already under the newest data key, {re.conflicts} concurrent "
                             "writes left to their writer and revisited")
        for name, n in sorted(re.not_covered.items()):
            common.console.print(f"[yellow]not re-encrypted[/]: {n} value(s) in {shown(name)} (no "
                                 "known place; they stay readable under their data-key version)")
        for error in re.errors[:20]:
            common.console.print(f"[red]error[/]: {shown(error)}")
    in_use = ", ".join(f"v{shown(k)}: {n} key rows" for k, n in sorted(
        report.master_versions_in_use.items()))
    common.console.print(f"master versions in use: {in_use or 'none'}")
    if report.retired:
        common.console.print(f"retired master version(s): {shown(', '.join(report.retired))}")
    for problem in report.problems:
        common.console.print(f"[bold red]problem:[/] {shown(problem)}")
    if report.ok:
        common.console.print("[bold green]done[/]")


# --------------------------------------------------------------------------------------------
# events
# --------------------------------------------------------------------------------------------
@app.command()
def events(
    url: UrlOption,
    tenant: Annotated[str | None, typer.Option(
        "--tenant", metavar="TENANT",
        help="Only entries about this tenant's data (the tenant that was asked for).")] = None,
    thread: Annotated[str | None, typer.Option("--thread", metavar="THREAD",
                                               help="Thread id (as the app knows it).")] = None,
    kind: Annotated[str | None, typer.Option(
        "--kind", metavar="KIND",
        help="An event kind (access_denied, keys_rewrapped, ...), `receipt` for "
        "every deletion receipt, or `receipt:deleted|pruned|shredded|forgotten`.")] = None,
    since: Annotated[str | None, typer.Option(
        "--since", metavar="WHEN",
        help="2025-11-01, 2025-11-01T10:00:00Z, an epoch, or a duration ago (7d).")]
    = None,
    until: Annotated[str | None, typer.Option("--until", metavar="WHEN",
                                              help="Same forms as --since.")]
    = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, metavar="N",
                                              help="Only the latest N entries.")] = None,
    keyring: KeyringOption = None,
    output: FormatOption = OutputFormat.table,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Check the MACs of every registry row and the hash chains of events "
        "and receipts (needs the keyring); exit 1 naming each broken row.")] = False,
    anchor: Annotated[Path | None, typer.Option(
        "--anchor", metavar="FILE",
        help="With --verify: a JSON anchor saved by an earlier --verify (kept "
        "outside the database); detects deleted newest rows.", dir_okay=False)] = None,
    save_anchor: Annotated[Path | None, typer.Option(
        "--save-anchor", metavar="FILE",
        help="With --verify: write the verified chain heads to this file.",
        dir_okay=False)] = None,
    out: evidence.OutOption = None,
    signing: evidence.SigningKeyOption = None,
) -> None:
    """The audit trail: security events (denied access, key operations, retention changes)
    and deletion receipts, oldest first.

    Exit codes: 0 done (also when nothing matched), 2 could not run (also: --kind or
    --tenant names nothing this database knows). With --verify: 0 every
    row verifies, 1 something does not (each broken row named), 2 could not run. In a
    terminal narrower than 120 columns each entry is printed as a block instead of a table
    row; --format json has every field.
    """
    if verify:
        _verify_registry(url, keyring, anchor, save_anchor, output)
    from ..audit.trail import events as list_entries
    tenant = tenant_arg(tenant)
    thread = thread_arg(thread)
    if kind is not None and (not kind or len(kind) > 64):
        raise fail("--kind must be an event kind of at most 64 characters")
    start = parse_when(since, what="--since")
    end = parse_when(until, what="--until")
    key = evidence.signing_key(signing, out)
    if out is not None and output is not OutputFormat.json:
        raise fail("--out writes the listing as JSON: add --format json")
    with opened_for_audit(url, _keyring_or_none(keyring)) as saver:
        if out is not None:
            evidence.sign_events(saver, {
                "tenant": tenant, "thread_id": thread, "kind": kind, "since": start,
                "until": end, "limit": limit}, key, out)
            raise typer.Exit(EXIT_OK)
        entries = list_entries(saver, tenant=tenant, thread_id=thread, kind=kind, since=start,
                               until=end, limit=limit)
        if not entries:
            _refuse_unknown(saver, tenant, kind)
    if output is OutputFormat.json:
        _echo_json([e.as_dict() for e in entries])
    else:
        print_events(entries)
    raise typer.Exit(EXIT_OK)


def _refuse_unknown(saver: Any, tenant: str | None, kind: str | None) -> None:
    """Nothing matched: exit 2 if that is because ``--kind`` or ``--tenant`` names nothing
    this database knows (a typo must not read as "no such event happened")."""
    from ..audit.trail import EVENT_KINDS, RECEIPT_ACTIONS, known_kind, recorded
    if kind is not None and not known_kind(kind) and not recorded(saver, kind=kind):
        raise fail(f"unknown --kind {kind!r}: an event kind ({', '.join(sorted(EVENT_KINDS))}), "
                   "receipt, or receipt:" + "|".join(sorted(RECEIPT_ACTIONS)))
    if (tenant is not None and tenant not in saver.registry.tenants()
            and not recorded(saver, tenant=tenant)):
        raise fail(f"unknown tenant {tenant!r}: it has no threads, keys or trail entries here")


def _verify_registry(url: str, keyring: str | None, anchor: Path | None,
                     save_anchor: Path | None, output: OutputFormat) -> None:
    from ..errors import KeyringRequired, TamperedDataError
    ring = _keyring_or_none(keyring)
    if ring is None:
        raise fail("--verify needs the keyring (--keyring or $SECURESAVER_MASTER_KEY): the "
                   "registry MAC key is wrapped by it")
    mark = None
    if anchor is not None:
        try:
            mark = json.loads(anchor.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise fail(f"cannot read the anchor {anchor}: {exc}") from None
        mark = mark.get("anchor", mark) if isinstance(mark, dict) else None
        if not isinstance(mark, dict) or not isinstance(mark.get("heads"), list):
            raise fail(f"{anchor} is not a chain anchor written by --save-anchor")
    with opened(url, ring) as saver:
        try:
            report = saver.registry.verify_integrity(anchor=mark)
        except KeyringRequired as exc:
            raise fail(exc) from None
        except TamperedDataError as exc:  # the registry MAC key row itself is gone or forged
            from ..registry.verify import IntegrityReport
            report = IntegrityReport({}, [("securesaver_tenant_keys", "purpose=registry",
                                           str(exc))], [])
    data = report.as_dict()
    if save_anchor is not None and report.ok:
        save_anchor.write_text(json.dumps(data["anchor"], indent=2), encoding="utf-8")
    if output is OutputFormat.json:
        _echo_json(data)
    else:
        from rich.table import Table
        table = Table("table", "row", "problem",
                      title=f"{len(report.problems)} problem(s) in "
                            f"{sum(report.checked.values())} rows")
        for name, row, problem in report.problems[:MAX_ROWS_SHOWN]:
            table.add_row(shown(name), shown(row), shown(problem))
        if report.problems:
            common.console.print(table)
        else:
            common.console.print("[bold green]registry verifies[/]: "
                                 + ", ".join(f"{n} {t}" for t, n in sorted(report.checked.items())))
    raise typer.Exit(EXIT_OK if report.ok else EXIT_FOUND)


__all__ = ["EXIT_CANNOT_RUN", "audit", "events", "parse_when", "rotate_keys", "scan"]
