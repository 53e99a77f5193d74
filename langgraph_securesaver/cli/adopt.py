"""``securesaver adopt``: seal the threads a raw saver wrote before wrapping, in place, under
a tenant (:mod:`..ops.adopt`; docs/guides/adopt.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import SecureSaverError
from . import common
from .common import (
    EXIT_OK,
    KeyringOption,
    UrlOption,
    app,
    database_errors,
    db_error,
    echo_json,
    fail,
    load_keyring,
    open_saver,
    progress_bar,
    shown,
    tenant_arg,
    thread_arg,
)


@app.command()
def adopt(
    url: UrlOption,
    tenant: Annotated[str, typer.Option(
        "--tenant", metavar="TENANT", help="The tenant the threads are sealed under.")],
    keyring: KeyringOption = None,
    thread: Annotated[list[str] | None, typer.Option(
        "--thread", metavar="ID",
        help="Only this thread (repeatable); default: every thread SecureSaver did not "
        "write.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="List the threads that would be adopted; change nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Seal threads written by a raw LangGraph saver (before it was wrapped) in place under
    TENANT: re-written encrypted, the clear rows deleted, a receipt each. Resumable: rerun
    after a crash. What stays in backups and dead rows: docs/guides/adopt.md.

    Exit codes: 0 done (or nothing to adopt), 2 could not run.
    """
    from ..inner_access import raw_thread_ids
    from ..ops.adopt import adopt_threads
    from ..storage.backends import open_sync_inner
    tenant = tenant_arg(tenant) or tenant
    threads = [thread_arg(t) or t for t in thread] if thread else None
    ring = load_keyring(keyring)
    with open_saver(url, ring) as saver:
        try:
            with open_sync_inner(url) as (raw, _registry_url):
                if dry_run:
                    found = threads if threads is not None else raw_thread_ids(raw)
                    if as_json:
                        echo_json({"tenant": tenant, "would_adopt": found})
                    else:
                        common.console.print(f"would adopt {len(found)} thread(s) under "
                                             f"tenant {shown(tenant)}")
                    raise typer.Exit(EXIT_OK)
                with progress_bar("adopt", quiet=as_json) as advance:
                    report = adopt_threads(saver, raw, tenant, threads,
                                           requested_by="securesaver adopt", progress=advance)
        except typer.Exit:
            raise
        except SecureSaverError as exc:
            raise fail(str(exc)) from None
        except database_errors() as exc:
            raise db_error(exc) from None
    if as_json:
        echo_json(report.as_dict())
        return
    total = sum(report.adopted.values())
    common.console.print(f"adopted {len(report.adopted)} thread(s), {total} checkpoint(s), "
                         f"under tenant {shown(tenant)}; a receipt each (action 'adopted')")
