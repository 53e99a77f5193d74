"""``securesaver signing-key``, ``export-subject`` and ``verify``, and the ``--signing-key``
option the commands that write evidence share (forget-subject, events, audit, prune).

A signed document is written to ``--out FILE`` with its signature beside it in ``FILE.sig``
(:mod:`..evidence.signing`); ``verify`` checks it with the public key alone.

Registered on :data:`langgraph_securesaver.cli.common.app` when imported (:mod:`.main` does).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import SecureSaverError
from . import common
from .common import (
    EXIT_FOUND,
    EXIT_OK,
    KeyringOption,
    UrlOption,
    app,
    check_url,
    fail,
    load_keyring,
    open_saver,
    shown,
    tenant_arg,
)

if TYPE_CHECKING:
    from ..evidence.signing import SigningKey

SigningKeyOption = Annotated[Path | None, typer.Option(
    "--signing-key", metavar="PEM", dir_okay=False,
    help="Sign what --out receives with this Ed25519 key (`securesaver signing-key`); the "
    "signature goes beside it, to FILE.sig, for `securesaver verify`.")]
OutOption = Annotated[Path | None, typer.Option(
    "--out", metavar="FILE", dir_okay=False,
    help="Write the document to this file (needed with --signing-key).")]


def signing_key(path: Path | None, out: Path | None) -> SigningKey | None:
    """The key of ``--signing-key`` (None without it), loaded before anything is done:
    exit 2 if it cannot be, or if there is no ``--out`` to sign."""
    if path is None:
        return None
    if out is None:
        raise fail("--signing-key needs --out FILE: the signature is written beside it, "
                   "to FILE.sig")
    from ..evidence.signing import SigningKey
    try:
        return SigningKey.load(path)
    except SecureSaverError as exc:
        raise fail(exc) from None


def open_document(out: Path, kind: str, key: SigningKey | None) -> Any:
    """``--out FILE`` to write into, signed with ``key`` when given (the signing code, and the
    cryptography it needs, load only when a file is written)."""
    from ..evidence.signing import signed_file
    return signed_file(out, kind, key)


def write_document(out: Path, kind: str, key: SigningKey | None, data: Any) -> None:
    """``data`` as JSON to ``out``, signed with ``key`` when given."""
    from ..evidence.signing import signed_file
    try:
        with signed_file(out, kind, key) as target:
            json.dump(data, target, indent=2, default=str, ensure_ascii=True)
            target.write("\n")
    except OSError as exc:
        raise fail(f"cannot write {out}: {type(exc).__name__}: {exc}") from None
    _wrote(out, key)


def _wrote(out: Path, key: SigningKey | None) -> None:
    signed = f", signed by {key.key_id} ({out}.sig)" if key is not None else ""
    common.err_console.print(f"wrote {shown(out)}{shown(signed)}", highlight=False,
                             soft_wrap=True)


class PruneDocuments:
    """``prune --out``: each sweep's report and the receipts written since the previous
    document (or the command's start), signed with ``--signing-key``; sweeps after the
    first of ``--every`` go to numbered files (``FILE-1.json``, ...)."""

    def __init__(self, signing: Path | None, out: Path | None) -> None:
        self.key = signing_key(signing, out)
        self.out = out
        self.sweep = 0
        self.since = time.time()

    def write(self, registry: Any, report: Any) -> None:
        if self.out is None:
            return
        from ..evidence.chains import receipts_between
        out, until = self.out, time.time()
        target = out if not self.sweep else out.with_name(f"{out.stem}-{self.sweep}{out.suffix}")
        write_document(target, "prune-report", self.key, {
            "format": "securesaver-prune-report/1", "report": report.as_dict(),
            "receipts": receipts_between(registry, self.since, until)})
        self.sweep, self.since = self.sweep + 1, until


def sign_events(saver: Any, filters: dict[str, Any], key: SigningKey | None, out: Path
                ) -> None:
    """``events --format json --out``: the listing, each entry with its chain position, and
    the chain heads when the listing holds whole chains (no filter but tenant and
    ``--kind receipt``), so ``verify`` can tell an entry is missing. The heads are read
    first: every entry up to them is committed, entries written since are newer."""
    from ..audit.trail import events as list_entries
    from ..evidence.chains import heads, trail_entries
    from ..registry.schema import events, receipts
    kind, tenant = filters.get("kind"), filters.get("tenant")
    whole = kind in (None, "receipt") and all(
        filters.get(k) is None for k in ("thread_id", "since", "until", "limit"))
    tables = {receipts.name} | (set() if kind == "receipt" else {events.name})
    chain_heads = [h for h in heads(saver.registry) if h["table"] in tables
                   and (tenant is None or h["chain"] == tenant)] if whole else []
    entries = list_entries(saver, **filters)
    write_document(out, "event-listing", key, {
        "format": "securesaver-event-listing/1", "filters": filters, "whole_chains": whole,
        "entries": trail_entries(saver.registry, entries), "chain_heads": chain_heads})


@app.command("signing-key")
def signing_key_command(
    out: Annotated[Path, typer.Option("--out", metavar="PEM", dir_okay=False,
                                      help="The private key (PKCS#8 PEM, mode 0600).")],
    public_out: Annotated[Path, typer.Option(
        "--public-out", metavar="PEM", dir_okay=False,
        help="The public key, for auditors (`securesaver verify --public-key`).")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
) -> None:
    """Create an Ed25519 signing key for evidence (separate from every encryption key)."""
    from ..evidence.signing import SigningKey
    for path in (out, public_out):
        if (path.exists() or path.is_symlink()) and not force:
            raise fail(f"{path} exists; pass --force to overwrite it")
    key = SigningKey.generate()
    try:
        key.save(out, public_out)
    except (SecureSaverError, OSError) as exc:
        raise fail(exc) from None
    common.console.print(f"wrote signing key {shown(out)} (mode 0600) and public key "
                         f"{shown(public_out)}; key id {key.key_id}", highlight=False,
                         soft_wrap=True)


@app.command("export-subject")
def export_subject(
    url: UrlOption,
    subject: Annotated[str, typer.Option(
        "--subject", metavar="ID|-", help="The subject id; '-' reads it from the first line "
        "of stdin (out of the process list and shell history).")],
    tenants: Annotated[list[str] | None, typer.Option(
        "--tenant", metavar="TENANT",
        help="A tenant to export from (repeatable; default: every tenant).")] = None,
    keyring: KeyringOption = None,
    out: OutOption = None,
    signing: SigningKeyOption = None,
) -> None:
    """Everything held about one person, as one JSON document (GDPR Art. 15/20): their
    threads in every tenant with personal data restored, pending interrupts, store items,
    retention, idempotency records and deletion receipts. Without --out it is printed.

    Exit codes: 0 written, 2 could not run (bad arguments, unknown tenant, no keyring, no
    database).
    """
    from ..tenancy import validate_subject
    if subject == "-":
        subject = sys.stdin.readline().rstrip("\r\n")
    try:
        subject = validate_subject(subject, "--subject")
    except SecureSaverError as exc:
        raise fail(exc) from None
    named = [tenant_arg(t) or t for t in (tenants or [])]
    key = signing_key(signing, out)
    check_url(url)
    ring = load_keyring(keyring)
    with open_saver(url, ring) as saver:
        unknown = [t for t in named if t not in set(saver.registry.tenants())]
        if unknown:
            raise fail(f"unknown tenant {unknown[0]!r}: it has no threads or keys here")
        try:
            if out is None:
                counts = saver.export_subject(subject, tenants=named or None, out=sys.stdout)
            else:
                from ..evidence.signing import signed_file
                with signed_file(out, "subject-export", key) as target:
                    counts = saver.export_subject(subject, tenants=named or None, out=target)
        except OSError as exc:
            raise fail(f"cannot write {out}: {type(exc).__name__}: {exc}") from None
    common.err_console.print(f"exported {counts['threads']} thread(s), {counts['checkpoints']} "
                             f"checkpoint(s) and {counts['store_items']} store item(s) from "
                             f"{counts['tenants']} tenant(s)", highlight=False)
    if out is not None:
        _wrote(out, key)
    raise typer.Exit(EXIT_OK)


@app.command()
def verify(
    files: Annotated[list[Path], typer.Argument(
        metavar="FILE...", help="Signed documents (each with FILE.sig beside it).")],
    public_key: Annotated[Path, typer.Option(
        "--public-key", metavar="PEM", dir_okay=False,
        help="The public key the documents must be signed with.")],
    whole: Annotated[bool, typer.Option(
        "--chain", help="The files together hold whole receipt/event chains (e.g. every "
        "receipt handed over so far): report any position missing from 1 to the newest.")]
    = False,
) -> None:
    """Check signed documents offline: no database, no keyring.

    Each file's bytes must be the ones signed, by the key given; the receipts and events
    they carry must link up (a listing of whole chains, or --chain, must miss none).

    Exit codes: 0 intact; 1 altered, unsigned, signed by another key, or a chain entry is
    missing; 2 could not run (no such file, unreadable public key).
    """
    from ..evidence.chains import chained, check
    from ..evidence.signing import PublicKey, verify_file
    try:
        public = PublicKey.load(public_key)
    except SecureSaverError as exc:
        raise fail(exc) from None
    bad = 0
    documents: list[Any] = []
    whole_listing = True
    for path in files:
        try:
            verdict = verify_file(path, public)
        except SecureSaverError as exc:
            raise fail(exc) from None
        if not verdict.ok:
            bad += 1
            common.console.print(f"[bold red]FAILED[/] {shown(path)}: {shown(verdict.reason)}",
                                 soft_wrap=True)
            continue
        common.console.print(f"[bold green]ok[/] {shown(path)}: {shown(verdict.signed['kind'])} "
                             f"signed {shown(verdict.signed['signed_at'])} by "
                             f"{shown(verdict.signed['key_id'])}", soft_wrap=True)
        if verdict.signed["kind"] in ("forget-subject", "prune-report", "event-listing"):
            document = json.loads(path.read_bytes())   # authenticated: ours
            if any(True for _ in chained(document)):
                documents.append(document)
                whole_listing = whole_listing and document.get("whole_chains") is True
    problems = check(documents, whole=whole or (bool(documents) and whole_listing))
    for problem in problems:
        common.console.print(f"[bold red]chain[/] {shown(problem)}", soft_wrap=True)
    if bad or problems:
        raise typer.Exit(EXIT_FOUND)
    raise typer.Exit(EXIT_OK)
