"""``securesaver summaries``: refresh the audit summaries that are due, outside the sweep.

Registered on :data:`langgraph_securesaver.cli.common.app` when imported (:mod:`.main` does).
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import SecureSaverError
from . import common
from .common import (
    EXIT_OK,
    UrlOption,
    app,
    fail,
    opened_for_audit,
    progress_bar,
    tenant_arg,
)


@app.command("summaries")
def refresh_summaries(
    url: UrlOption,
    tenant: Annotated[str | None, typer.Option("--tenant", metavar="TENANT",
                                               help="Only this tenant.")] = None,
) -> None:
    """Refresh the audit summaries that are due (threads written or changed since their last
    refresh) from the stored rows; on a database whose summaries were never built, build
    them. The retention sweep (`securesaver prune`) does this too, a bounded number a run.

    Exit codes: 0 done, 2 could not run.
    """
    from ..audit import summaries
    tenant = tenant_arg(tenant)
    with opened_for_audit(url, None) as source:
        try:
            if tenant is not None and tenant not in source.registry.tenants():
                raise fail(f"unknown tenant {tenant!r}: it has no threads or keys here")
            with progress_bar("summaries") as advance:
                n = summaries.refresh(source, tenant=tenant, progress=advance)
        except SecureSaverError as exc:
            raise fail(exc) from None
    common.err_console.print(f"{n} thread summaries refreshed")
    raise typer.Exit(EXIT_OK)
