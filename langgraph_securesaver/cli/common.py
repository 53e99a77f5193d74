"""What every ``securesaver`` command shares: the Typer app, the consoles, exit codes, option
types, one-line failures, argument checks and opening a saver on ``--url``.

The command modules (:mod:`.main` for keys, demo, prune, shred-tenant and recover;
:mod:`.ops` for audit, scan, rotate-keys and events) import this module and register
their commands on :data:`app`; this module imports neither of them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import ENV_VAR, SecureSaverError
from ..textsafety import escape_controls, json_safe

if TYPE_CHECKING:
    from rich.console import Console

    #: the consoles on stdout and stderr, made on first use (see :func:`get_console`)
    console: Console
    err_console: Console

app = typer.Typer(
    name="securesaver",
    help="Encrypted, tenant-isolated LangGraph checkpoints: keys, demo, and operations.\n\n"
         "Exit codes of every command: 0 success, 1 the command ran and found a problem, 2 it "
         "could not run (one line on stderr, nothing changed).",
    no_args_is_help=True,
    add_completion=False,
    # plain Click help: flags show no "<bool>" type, every value option names its metavar
    rich_markup_mode=None,
)


def get_console(stderr: bool = False) -> Console:
    """The rich console on stdout (``stderr``: on stderr), made on first use; also the module
    attributes ``console`` and ``err_console``. A command that writes JSON (``typer.echo``)
    and fails on nothing does not import rich."""
    name = "err_console" if stderr else "console"
    made: Console | None = globals().get(name)
    if made is None:
        from rich.console import Console
        made = globals()[name] = Console(stderr=stderr)
    return made


def __getattr__(name: str) -> Any:
    if name in ("console", "err_console"):
        return get_console(stderr=name == "err_console")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

EXIT_OK, EXIT_FOUND, EXIT_CANNOT_RUN = 0, 1, 2
#: rows a table prints at most (``--format json`` has every row)
MAX_ROWS_SHOWN = 200

KeyringOption = Annotated[
    str | None,
    typer.Option("--keyring", metavar="PATH|URL",
                 help=f"Keyring file or key provider URL (aws-kms://alias/NAME, "
                 "pkcs11://TOKEN/KEY?module=...&pin-env=VAR); "
                 f"defaults to ${ENV_VAR}."),
]


def shown(value: object) -> str:
    """A value for a table cell or a printed line: control characters escaped (ids and rows
    come from the database: see :mod:`..textsafety`), rich markup escaped."""
    from rich.markup import escape
    return escape(escape_controls(str(value)))


def echo_json(data: Any, **options: Any) -> None:
    """JSON on stdout with every control character escaped (``json.dumps`` leaves DEL, and
    C1/bidi controls without ``ensure_ascii``)."""
    typer.echo(json_safe(json.dumps(data, default=str, **options)))


def reason(exc: BaseException) -> str:
    """An exception as the CLI words it: the library's message, except that a missing keyring
    names the CLI's own flags, not the Python API's ``keyring=`` argument."""
    from ..errors import KeyringRequired
    if isinstance(exc, KeyringRequired):
        hint = (f"no keyring: pass --keyring PATH|URL or set {ENV_VAR} (create one with "
                "`securesaver keygen --out keyring.json`)")
        return hint + (f": {exc.detail}" if exc.detail else "")
    return str(exc)


def fail(message: str | BaseException, code: int = EXIT_CANNOT_RUN) -> typer.Exit:
    """Print ONE line on stderr (never wrapped, never markup, control characters escaped)
    and return the exit to raise. An exception is worded by :func:`reason`."""
    if isinstance(message, BaseException):
        message = reason(message)
    line = " ".join(str(message).split())
    get_console(stderr=True).print(f"[bold red]error:[/] {shown(line)}", soft_wrap=True,
                                   highlight=False)
    return typer.Exit(code)


def db_error(exc: BaseException) -> typer.Exit:
    """An unusable database, in one line (the driver's message, without SQLAlchemy's
    background-link paragraph)."""
    inner = getattr(exc, "orig", None) or exc
    first = str(inner).strip().splitlines()[0] if str(inner).strip() else ""
    return fail(f"cannot use the database: {type(inner).__name__}: {first}")


def tenant_arg(value: str | None, what: str = "--tenant") -> str | None:
    """A tenant id given on the command line, validated before anything is opened."""
    if value is None:
        return None
    from ..tenancy import validate_tenant
    try:
        return validate_tenant(value)
    except SecureSaverError as exc:
        raise fail(f"{what}: {exc}") from None


def thread_arg(value: str | None, what: str = "--thread") -> str | None:
    if value is None:
        return None
    from ..tenancy import validate_thread_id
    try:
        return validate_thread_id(value, what)
    except SecureSaverError as exc:
        raise fail(exc) from None


def check_url(url: str) -> str | None:
    """Refuse a URL that names no usable database before anything is opened or created.
    Returns the SQLite file path (None for PostgreSQL and MySQL)."""
    from ..storage.backends import is_mysql, sqlite_path
    if not isinstance(url, str) or not url.strip():
        raise fail("--url is empty: use sqlite:///path.db or postgresql://user@host/db")
    try:
        path = sqlite_path(url)
    except SecureSaverError as exc:
        raise fail(exc) from None
    if path is None and is_mysql(url):   # LangGraph's MySQL saver, or --saver's registry
        return None
    if path is None and not url.startswith(("postgresql://", "postgres://",
                                            "postgresql+psycopg://")):
        raise fail(f"unsupported URL {url!r}: use sqlite:///path.db, postgresql://... or "
                   "mysql://...")
    if path is not None and path != ":memory:":
        p = Path(path)
        if not p.exists():
            raise fail(f"no database at {path}")
        if not p.is_file():
            raise fail(f"{path} is not a database file")
    return path


def load_keyring(path: str | Path | None) -> Any:
    from ..keys.urls import load_provider  # not at import: --help need not load cryptography
    try:
        return load_provider(path)
    except SecureSaverError as exc:
        raise fail(exc) from None


def env_keyring() -> Any:
    """The keyring of ``$SECURESAVER_MASTER_KEY``, or None when the variable is unset or
    empty. A value that is set but unusable (not base64, wrong length) is an error naming
    that cause, never taken for "no keyring"."""
    import os
    if not os.environ.get(ENV_VAR, "").strip():
        return None
    return load_keyring(None)



class EscapingFormatter(logging.Formatter):
    """Log lines with control characters escaped line by line: library log lines name
    tenants and threads read from the database (see :mod:`..textsafety`)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(escape_controls(line) for line in super().format(record).split("\n"))


def release() -> str:
    """The installed version of the package."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("langgraph-securesaver")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "(not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"securesaver (langgraph-securesaver) {release()}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def main(verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Log what the library does (INFO) on stderr; without it only "
        "warnings and errors are logged.")] = False,
        version: Annotated[bool, typer.Option(
            "--version", is_eager=True, callback=_print_version,
            help="Print the version and exit.")] = False) -> None:
    """Set up logging for every command (``--verbose``: INFO)."""
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        handlers=[handler])
    if not verbose:  # the pool logs each failed connection attempt with a traceback
        logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)


UrlOption = Annotated[str, typer.Option("--url", metavar="URL",
                                         help="The database: sqlite:///path.db or "
                                              "postgresql://user@host/db or "
                                              "mysql://user@host/db (with --saver, the "
                                              "registry's database).")]


SaverOption = Annotated[str | None, typer.Option(
    "--saver", metavar="MODULE:FACTORY",
    help="The inner saver of a deployment whose checkpoints are not in --url (MySQL, Redis, "
    "LMDB, object storage, your own): FACTORY() in MODULE returns it, set up; --url is then "
    "the registry's database (docs/savers.md).")]


def inner_from_spec(spec: str) -> Any:
    """The saver ``module:factory`` names, made by calling the factory (exit 2 otherwise)."""
    import importlib
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise fail(f"--saver {spec!r}: use MODULE:FACTORY (a function returning the saver)")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise fail(f"--saver {spec!r}: {type(exc).__name__}: {exc}") from None
    from langgraph.checkpoint.base import BaseCheckpointSaver
    inner = factory()
    if not isinstance(inner, BaseCheckpointSaver):
        raise fail(f"--saver {spec!r} returned a {type(inner).__name__}, not a LangGraph saver")
    return inner


@contextmanager
def open_saver(url: str, keyring: Any, saver: str | None = None) -> Iterator[Any]:
    """A SecureSaver on an existing database for an operations command; exit 2 with one line
    if the URL or the database is unusable (also when that surfaces half-way). ``saver``
    (``--saver MODULE:FACTORY``): the inner saver comes from that factory and ``url`` is the
    registry's database."""
    from ..keys.provider import NoKeys
    from ..saver import SecureSaver
    check_url(url)
    try:
        if saver is not None:
            opened_saver = SecureSaver(inner_from_spec(saver), keyring=keyring or NoKeys(),
                                       registry=url, redaction=None)
            opened_saver.registry.setup()  # its tables only: the inner saver is the user's
            yield opened_saver
            return
        require_checkpoint_tables(url)
        with SecureSaver.from_url(url, keyring=keyring or NoKeys(), redaction=None) as opened:
            yield opened
    except typer.Exit:
        raise
    except SecureSaverError as exc:
        raise fail(exc) from None
    except database_errors() as exc:
        raise db_error(exc) from None


def require_checkpoint_tables(url: str) -> None:
    """Refuse a database without the inner saver's tables (a registry-only file of a
    deployment whose checkpoints live in MySQL, Redis, LMDB or object storage): a command there
    would report on nothing, as if clean, and create empty tables. Nothing is created."""
    import sqlalchemy as sa

    from ..audit.db import AuditDatabase
    from ..registry.schema import create_registry_engine
    from ..storage.backends import registry_url_for
    engine = create_registry_engine(registry_url_for(url))
    try:
        inspector = sa.inspect(engine)
        missing = [t for t in AuditDatabase.inner_tables(engine.dialect.name)
                   if not inspector.has_table(t)]
    finally:
        engine.dispose()
    if missing:
        raise fail(
            f"this database holds no checkpoint tables ({', '.join(missing)} missing): it is "
            "not where the checkpoints are, so this command would see nothing and report it "
            "as clean. If your checkpoints are in another saver, name it with --saver "
            "MODULE:FACTORY (scan, prune, forget-subject) or use the SecureSaver API "
            "in-process (docs/savers.md)")


def database_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean 'the database could not be used' (exit code 2)."""
    import sqlite3

    import sqlalchemy.exc
    errors: list[type[BaseException]] = [sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, OSError]
    try:
        import psycopg
        import psycopg_pool
        errors += [psycopg.Error, psycopg_pool.PoolTimeout]
    except ImportError:  # the postgres extra is optional
        pass
    return tuple(errors)


# opening for the operations commands (audit, scan, events, rotate-keys) ---------------------
@contextmanager
def opened(url: str, ring: Any, saver: str | None = None) -> Iterator[Any]:
    """A SecureSaver on ``url`` for an operations command; exit 2 with the reason if the
    database is missing or unusable (also when that surfaces half-way)."""
    with open_saver(url, ring, saver) as opened_saver:
        yield opened_saver


@contextmanager
def opened_for_audit(url: str, ring: Any) -> Iterator[Any]:
    """What ``audit`` and ``events`` read: the registry's engine on ``url`` alone
    (:class:`~langgraph_securesaver.audit.inventory.AuditDatabase`) when the database already holds
    the inner saver's tables -- no inner saver, no LangGraph import, a second less to start.
    Otherwise (a database SecureSaver never set up) a full SecureSaver, as :func:`opened`."""
    check_url(url)
    from ..storage.backends import is_mysql
    if is_mysql(url):   # the audit's grouped statements are SQLite's and PostgreSQL's
        with opened(url, ring) as saver:
            yield saver
        return
    try:
        from ..audit.db import AuditDatabase
        from ..registry.core import Registry
        from ..storage.backends import registry_url_for
        registry = Registry(registry_url_for(url))
        try:
            inner = AuditDatabase.inner_tables(registry.dialect)
            if registry.ready_for_reading(inner):   # current schema: no DDL, no migration
                yield AuditDatabase(registry)
                return
            registry.setup()
            light = AuditDatabase(registry)
            if light.has_inner_tables():
                yield light
                return
        finally:
            registry.dispose()
    except typer.Exit:
        raise
    except SecureSaverError as exc:
        raise fail(exc) from None
    except database_errors() as exc:
        raise db_error(exc) from None
    with opened(url, ring) as saver:
        yield saver


@contextmanager
def progress_bar(label: str, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """A progress callback ``(done, total)`` drawing a transient bar on stderr (only when
    stderr is a terminal: logs and pipes get no control characters)."""
    err = get_console(stderr=True)
    if quiet or not err.is_terminal:
        yield lambda done, total: None
        return
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )
    with Progress(TextColumn(f"[bold]{escape(label)}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, done))

        yield advance
