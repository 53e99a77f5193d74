"""The ``securesaver`` command line.

Exit codes: 0 success; 1 the command ran and found a problem (e.g. a failed check);
2 it could not run (bad arguments, missing keyring, unreachable database).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ENV_VAR, ConfigurationError, SecureSaverError
from . import common
from .common import (
    EXIT_FOUND,
    EXIT_OK,
    KeyringOption,
    SaverOption,
    UrlOption,
    app,
    check_url,
    database_errors,
    db_error,
    echo_json,
    fail,
    load_keyring,
    open_saver,
    progress_bar,
    shown,
    tenant_arg,
)

# rich.table and the keyring (cryptography) are imported where used: --help and the JSON
# outputs need neither.

@app.command()
def keygen(
    out: Annotated[Path | None, typer.Option("--out", metavar="PATH",
                                             help="Write a keyring file (mode 0600).")]
    = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
    provider: Annotated[str | None, typer.Option(
        "--keyring", metavar="URL",
        help="Create the first master key in an HSM instead: a pkcs11:// URL (the key is "
        "generated inside the token, non-extractable).")] = None,
) -> None:
    """Create a new master key: a keyring file, a value for SECURESAVER_MASTER_KEY, or a key
    in an HSM token (--keyring pkcs11://...)."""
    if provider is not None:
        _keygen_in_provider(provider)
        return
    from ..keys.keyring import Keyring
    ring = Keyring.generate()
    if out is None:
        common.console.print(f"export {ENV_VAR}={ring.env_value().reveal()}", soft_wrap=True,
                             highlight=False)
        common.err_console.print("Keep this value in your secret store; losing it loses the data.")
        return
    if (out.exists() or out.is_symlink()) and not force:
        raise fail(f"{out} exists; pass --force to overwrite (the old keys would be lost)")
    try:
        ring.save(out, overwrite=force)
    except ConfigurationError as exc:   # a symlink, or a file of other keys serving databases
        raise fail(exc) from None
    common.console.print(f"wrote keyring [bold]{shown(out)}[/] (mode 0600, master version "
                         f"{ring.current_version})")


def _keygen_in_provider(url: str) -> None:
    from ..keys.urls import is_provider_url
    if not is_provider_url(url) or not url.lower().startswith("pkcs11://"):
        raise fail("--keyring for keygen takes a pkcs11:// URL (create AWS KMS keys with AWS's "
                   "own tools, then name the alias: aws-kms://alias/NAME)")
    from ..keys.pkcs11_provider import Pkcs11KeyProvider
    try:
        made = Pkcs11KeyProvider.create_from_url(url)
    except SecureSaverError as exc:
        raise fail(exc) from None
    common.console.print(f"generated AES-256 key [bold]{shown(made.current_version)}[/] in "
                         f"token [bold]{shown(made.token_label)}[/] (non-extractable; it never "
                         "leaves the token)")


@app.command()
def demo(
    db: Annotated[Path, typer.Option("--db", metavar="PATH", help="SQLite file for the demo; "
                                     "its keyring is written beside it.")] = Path(
        "securesaver-demo.db"),
    keyring: KeyringOption = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep an existing demo database.")] = False,
) -> None:
    """Run a two-tenant support agent on SQLite and show what reaches the disk."""
    from .demo_run import run_demo
    if db.exists() and not db.is_file():
        raise fail(f"--db {db} is not a file")
    try:
        ok = run_demo(db, keyring_path=Path(keyring) if keyring else None, keep=keep,
                      console=common.console,
                      quiet_logs=not logging.getLogger().isEnabledFor(logging.INFO))
    except (SecureSaverError, ConfigurationError) as exc:
        raise fail(exc) from None
    except OSError as exc:
        raise fail(f"{type(exc).__name__}: {exc}") from None
    raise typer.Exit(EXIT_OK if ok else EXIT_FOUND)


@app.command()
def prune(
    url: UrlOption,
    keyring: KeyringOption = None,
    tenant: Annotated[str | None, typer.Option("--tenant", metavar="TENANT",
                                               help="Only this tenant.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Report what this command would do with the same options (the same "
        "checks, --active-grace included); delete nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    every: Annotated[str | None, typer.Option(
        "--every", metavar="DURATION",
        help="Keep running, one sweep per interval (e.g. 10m); stops on SIGTERM.")]
    = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, metavar="N",
                                              help="At most this many threads per sweep.")]
    = None,
    active_grace: Annotated[str | None, typer.Option(
        "--active-grace", metavar="DURATION",
        help="Skip threads written this recently (a run may be in flight, a process may still "
             "cache the thread's key). Default: the key cache lifetime plus the activity "
             "resolution (6m). Threads whose key a write holds are skipped whatever this says.")]
    = None,
    document: evidence.OutOption = None,
    signing: evidence.SigningKeyOption = None,
    saver_spec: SaverOption = None,
) -> None:
    """Execute retention policies: delete or prune expired threads, leaving receipts.
    --out writes each sweep's report and receipts as a document (--signing-key signs it).

    Needs the keyring: it verifies the MACs of the retention rows, and authenticates the
    latest checkpoint of a thread whose time would keep it (a forged time keeps nothing).
    Exit codes: 0 done (also when nothing expired), 1 some threads failed or their registry
    row did not verify (see the report), 2 could not run (bad duration, unknown tenant, no
    keyring, unreachable database).
    """
    import signal
    import threading

    from ..keys.lifecycle import DEFAULT_ACTIVE_GRACE
    from ..keys.provider import NoKeys
    from ..retention import parse_duration

    tenant = tenant_arg(tenant)
    try:
        interval = parse_duration(every, what="--every") if every else None
        grace = DEFAULT_ACTIVE_GRACE if active_grace is None else (
            parse_duration(active_grace, what="--active-grace", allow_zero=True) or 0.0)
    except SecureSaverError as exc:
        raise fail(exc) from None
    if interval is not None and interval <= 0:
        raise fail("--every must be a positive duration (e.g. 10m)")
    ring: Any = load_keyring(keyring) if keyring else common.env_keyring() or NoKeys()
    if isinstance(ring, NoKeys):  # checked before connecting: nothing is touched
        raise fail("prune needs the keyring (--keyring PATH or $SECURESAVER_MASTER_KEY): it "
                   "verifies the MACs of the retention rows and authenticates the checkpoints "
                   "whose time would keep a thread, before it deletes anything")
    documents = evidence.PruneDocuments(signing, document)
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        common.err_console.print(f"received signal {signum}: finishing the current thread")
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    failed = False
    try:
        with open_saver(url, ring, saver_spec) as saver:
            if tenant is not None and tenant not in saver.registry.tenants():
                raise fail(f"unknown tenant {tenant!r}: it has no threads or keys here")
            while True:
                # the bar is drawn on a terminal's stderr only: cron gets nothing on stderr
                with progress_bar("retention sweep") as advance:
                    report = saver.prune_expired(limit=limit, dry_run=dry_run, tenant=tenant,
                                                 should_stop=stop.is_set, progress=advance,
                                                 active_grace=grace)
                failed = failed or not report.ok
                documents.write(saver.registry, report)
                if as_json:
                    echo_json(report.as_dict(), indent=2)
                else:
                    _print_report(report)
                if interval is None or stop.wait(interval):
                    break
    except typer.Exit:
        raise
    except SecureSaverError as exc:
        raise fail(exc) from None
    except database_errors() as exc:  # an unreachable database or a broken registry
        raise db_error(exc) from None
    raise typer.Exit(EXIT_FOUND if failed else EXIT_OK)


def _print_report(report: Any) -> None:
    from rich.table import Table
    table = Table("outcome", "threads")
    for label, rows in (("deleted", report.deleted), ("pruned to latest", report.pruned_to_latest),
                        ("held (legal hold)", report.held),
                        ("skipped (run in flight)", report.skipped_active),
                        ("survived re-check", report.survived),
                        ("would delete (dry run)", report.would_delete),
                        ("would prune (dry run)", report.would_prune)):
        if rows:
            table.add_row(label, str(len(rows)))
    for tenant, thread, error in report.errors:
        table.add_row(f"[red]error[/] {shown(tenant)}/{shown(thread)}", shown(error))
    if not table.rows:
        table.add_row("nothing expired", "0")
    common.console.print(table)


@app.command("shred-tenant")
def shred_tenant(
    tenant: Annotated[str, typer.Argument(metavar="TENANT", help="The tenant to crypto-shred.")],
    url: UrlOption,
    keyring: Annotated[str, typer.Option(
        "--keyring", metavar="PATH|URL",
        help="Keyring file (it is rewritten) or key provider URL.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    requested_by: Annotated[str | None, typer.Option(
        "--requested-by", metavar="WHO",
        help="Who asked for it (recorded in the receipt; no personal data).")] = None,
) -> None:
    """Destroy a tenant's keys (backups included) and delete its data. Irreversible."""
    tenant = tenant_arg(tenant, "tenant") or tenant
    from ..tenancy import validate_actor
    try:
        validate_actor(requested_by, "--requested-by")
    except SecureSaverError as exc:
        raise fail(exc) from None
    check_url(url)
    ring = load_keyring(keyring)
    with open_saver(url, ring) as saver:
        if tenant not in saver.registry.tenants():
            raise fail(f"unknown tenant {tenant!r}: nothing to shred")
        if not yes and not typer.confirm(
                f"Crypto-shred tenant {tenant!r}? Its data becomes unreadable everywhere, "
                "including backups", default=False):
            raise fail("aborted", EXIT_FOUND)
        threads = saver.shred_tenant(tenant, requested_by=requested_by)
    common.console.print(f"tenant [bold]{shown(tenant)}[/] shredded: {threads} threads "
                         f"deleted, keyring {shown(keyring)} rewritten. Replace every copy of the "
                         "old keyring file.")


@app.command()
def recover(
    url: UrlOption,
    graph: Annotated[str | None, typer.Option(
        "--graph", metavar="MODULE:ATTR", help="module:attr of the graph (compiled graph, "
        "StateGraph, or factory(saver)); needed to sweep.")] = None,
    keyring: KeyringOption = None,
    older_than: Annotated[str | None, typer.Option(
        "--older-than", metavar="DURATION", help="A floor on top of the recovery lease: time "
        "since the thread's last recorded activity (database clock) before it is resumed "
        "(default: none; a live run is never resumed whatever this says).")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", metavar="TENANT",
                                               help="Only this tenant's threads.")] = None,
    max_attempts: Annotated[int, typer.Option(
        "--max-attempts", min=1, metavar="N",
        help="Resume attempts per thread before it goes to the dead letters.")] = 3,
    worker_id: Annotated[str | None, typer.Option(
        "--worker-id", metavar="ID",
        help="This worker's name in the recovery records (default: host and pid).")] = None,
    use_async: Annotated[bool, typer.Option("--async", help="Open an async saver and sweep "
                                            "with arecover_stalled (implied by "
                                            "sqlite+aiosqlite:// and "
                                            "postgresql+psycopg_async:// URLs).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]
    = False,
    list_dead: Annotated[bool, typer.Option("--dead-letters", help="List the dead-lettered "
                                            "threads instead of sweeping.")] = False,
    rearm: Annotated[str | None, typer.Option("--rearm", metavar="THREAD",
                                              help="With --dead-letters and "
                                              "--tenant: re-arm this dead-lettered thread "
                                              "(a fresh attempt budget).")] = None,
) -> None:
    """Resume stalled threads that opted in (mark_recoverable), each by exactly one worker.

    A thread is resumed only when no live process holds its recovery lease (the worker
    running it, or another recoverer).

    An async URL (or --async) resumes through the async saver API (aget_state / ainvoke), for
    graphs whose nodes or checkpointer are async-only.

    Exit codes: 0 done, 1 some threads failed or were dead-lettered, 2 could not run.
    """

    from ..retention import parse_duration
    from .recover import recover_main
    tenant = tenant_arg(tenant)
    from ..idempotency.recovery import async_url
    check_url(async_url(url) or url)  # the async drivers' names open the same database
    if list_dead or rearm is not None:
        _dead_letters(url, keyring, tenant, rearm, as_json)
        return
    if graph is None:
        raise fail("--graph is needed to sweep (or use --dead-letters)")
    try:
        idle = (parse_duration(older_than, what="--older-than") or 0.0
                if older_than not in (None, "0", "0s") else 0.0)
        report = recover_main(url, graph, keyring=str(keyring) if keyring else None,
                              older_than=idle, tenant=tenant, max_attempts=max_attempts,
                              worker_id=worker_id, use_async=use_async or None,
                              redaction=None)
    except SecureSaverError as exc:
        raise fail(exc) from None
    except (ImportError, AttributeError) as exc:
        raise fail(f"cannot load graph {graph!r}: {exc}") from None
    except database_errors() as exc:
        raise db_error(exc) from None
    summary = {"worker": report.worker_id, "examined": report.examined,
               "resumed": len(report.resumed), "failed": len(report.failed),
               "dead_lettered": len(report.dead_lettered), "yielded": len(report.yielded)}
    if as_json:
        echo_json(summary, indent=2)
    else:
        from rich.table import Table
        table = Table("outcome", "threads")
        for key, value in summary.items():
            table.add_row(key, str(value))
        common.console.print(table)
    raise typer.Exit(EXIT_FOUND if report.failed or report.dead_lettered else EXIT_OK)


def _dead_letters(url: str, keyring: str | None, tenant: str | None, rearm: str | None,
                  as_json: bool) -> None:
    import json

    from .recover import dead_letters_main
    try:
        letters, rearmed = dead_letters_main(url, keyring=str(keyring) if keyring else None,
                                             tenant=tenant, rearm=rearm, redaction=None)
    except SecureSaverError as exc:
        raise fail(exc) from None
    except database_errors() as exc:
        raise db_error(exc) from None
    rows = [{"tenant": d.tenant, "thread_id": d.thread_id, "attempts": d.attempts,
             "at": d.at, "worker": d.worker, "error_type": d.error_type} for d in letters]
    if as_json:
        common.console.print_json(json.dumps({"dead_letters": rows, "rearmed": rearmed}))
    else:
        from rich.table import Table
        table = Table("tenant", "thread", "attempts", "worker", "error")
        for row in rows:
            table.add_row(str(row["tenant"]), str(row["thread_id"]), str(row["attempts"]),
                          str(row["worker"] or ""), str(row["error_type"] or ""))
        common.console.print(table)
        if rearm is not None:
            common.console.print(f"thread {rearm!r} " + ("re-armed" if rearmed else
                                                         "is not dead-lettered: nothing re-armed"))
    if rearm is not None and not rearmed:
        raise typer.Exit(EXIT_FOUND)


def run() -> Any:  # pragma: no cover - console entry point
    return app()


def __getattr__(name: str) -> Any:
    """``console`` and ``err_console`` as before (:func:`.common.get_console`: made on first
    use, so a JSON report imports no rich)."""
    if name in ("console", "err_console"):
        return getattr(common, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# operations commands live in their own module and register themselves on `app`
from . import adopt, evidence, ops, subjects, summaries  # noqa: E402,F401

if __name__ == "__main__":  # pragma: no cover
    # `python -m` runs this file as __main__, a second copy of the module: use the real one
    from langgraph_securesaver.cli.main import app as _app
    sys.exit(_app())
