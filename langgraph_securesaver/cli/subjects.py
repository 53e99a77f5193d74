"""``securesaver forget-subject``: forget one person (their threads, store items and,
optionally, their identifiers' values) with one receipt.

Registered on :data:`langgraph_securesaver.cli.common.app` when imported (:mod:`.main` does).
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer

from ..errors import SecureSaverError
from . import common, evidence
from .common import (
    EXIT_FOUND,
    EXIT_OK,
    KeyringOption,
    SaverOption,
    UrlOption,
    app,
    check_url,
    echo_json,
    fail,
    load_keyring,
    open_saver,
    shown,
    tenant_arg,
)


@app.command("forget-subject")
def forget_subject(
    url: UrlOption,
    subject: Annotated[str | None, typer.Option(
        "--subject", metavar="ID|-",
        help="The subject id (the end user threads were written for); '-' reads it from "
        "the first line of stdin, which keeps it out of the process list and shell "
        "history.")] = None,
    tenants: Annotated[list[str] | None, typer.Option(
        "--tenant", metavar="TENANT",
        help="A tenant to forget the subject in (repeatable; default: every tenant).")]
    = None,
    identifiers: Annotated[list[str] | None, typer.Option(
        "--identifier", metavar="VALUE",
        help="Also erase this value (an e-mail, phone, name) wherever the tenant holds it "
        "(repeatable).")] = None,
    store_namespace: Annotated[str | None, typer.Option(
        "--store-namespace", metavar="LABELS",
        help="Store items to delete: namespaces starting with these dot-separated labels "
        "(default: the subject id; 'none' deletes no store item).")] = None,
    store_urls: Annotated[list[str] | None, typer.Option(
        "--store-url", metavar="URL",
        help="A SecureStore database other than --url (sqlite:///file.db, postgresql://...) "
        "whose items of the subject are deleted too (repeatable). Without it, the command "
        "refuses when SecureStores wrote items outside --url.")] = None,
    keyring: KeyringOption = None,
    requested_by: Annotated[str | None, typer.Option(
        "--requested-by", metavar="WHO",
        help="Who asked for it (recorded in the receipt; no personal data).")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")]
    = False,
    out: evidence.OutOption = None,
    signing: evidence.SigningKeyOption = None,
    saver_spec: SaverOption = None,
) -> None:
    """Delete every thread recorded for a subject (keys destroyed: crypto-erasure), their
    store items (in --url and each --store-url) and, with --identifier, those values in the
    tenant's other threads; one receipt with counts, never values. Irreversible. --out
    writes the receipt, with its chain position, as a document (--signing-key signs it).

    Exit codes: 0 done (also when nothing of the subject was stored), 1 aborted at the
    prompt, 2 could not run (bad arguments, unknown tenant, no keyring, no database, store
    items in a store not given by --store-url: nothing is deleted).
    """
    from ..tenancy import validate_actor, validate_subject
    if subject == "-":
        subject = sys.stdin.readline().rstrip("\r\n")
    named = [tenant_arg(t) or t for t in (tenants or [])]
    values = list(identifiers or [])
    try:
        if subject is not None:
            subject = validate_subject(subject, "--subject")
        validate_actor(requested_by, "--requested-by")
    except SecureSaverError as exc:
        raise fail(exc) from None
    if subject is None and not values:
        raise fail("name a --subject, or at least one --identifier")
    namespace: object = ... if store_namespace is None else (
        None if store_namespace == "none" else tuple(store_namespace.split(".")))
    key = evidence.signing_key(signing, out)
    check_url(url)
    for store_url in store_urls or []:
        path = check_url(store_url)
        if path is not None and (path == ":memory:" or not Path(path).is_file()):
            raise fail("--store-url names no SQLite file: a store in memory or a file that "
                       "does not exist holds nothing to delete")
    ring = load_keyring(keyring)
    with open_saver(url, ring, saver_spec) as saver, ExitStack() as opened:
        known = set(saver.registry.tenants())
        unknown = [t for t in named if t not in known]
        if unknown:
            raise fail(f"unknown tenant {unknown[0]!r}: it has no threads or keys here")
        where = ", ".join(repr(t) for t in named) if named else "every tenant"
        if not yes and not typer.confirm(
                f"Forget this subject in {where}? Their threads are deleted and their keys "
                "destroyed", default=False):
            raise fail("aborted", EXIT_FOUND)
        options: dict[str, object] = {"tenants": named or None, "identifiers": values,
                                      "requested_by": requested_by}
        if namespace is not ...:
            options["store_namespace"] = namespace
        try:
            if store_urls:
                from ..store import SecureStore
                options["stores"] = [opened.enter_context(SecureStore.from_url(u, saver=saver))
                                     for u in store_urls]
            report = saver.forget_subject(subject, **options)
        except SecureSaverError as exc:
            raise fail(exc) from None
        if out is not None:   # the receipt, with its chain position
            from ..evidence.chains import receipts_by_id
            evidence.write_document(out, "forget-subject", key, {
                "format": "securesaver-forget-subject/1", "tenants": report.tenants,
                "counts": report.detail, "stores": report.stores,
                "receipts": receipts_by_id(saver.registry, [report.receipt_id])})
    if as_json:
        echo_json({"tenants": report.tenants, "counts": report.detail,
                   "stores": report.stores})
        raise typer.Exit(EXIT_OK)
    from rich.table import Table
    table = Table("tenant", "threads", "checkpoints", "PII values", "store items")
    for tenant in report.tenants:
        counts = report.detail[tenant]
        table.add_row(shown(tenant), str(counts["threads"]), str(counts["checkpoints"]),
                      str(report.pii_values[tenant]), str(counts["store_items"]))
    common.console.print(table)
    common.console.print("one receipt written (`securesaver events --kind receipt:forgotten`); "
                         "copies in backups become unreadable at the next `rotate-keys "
                         "--retire-old`")
    raise typer.Exit(EXIT_OK)
