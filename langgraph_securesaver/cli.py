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
from rich.console import Console
from rich.table import Table

from .errors import ConfigurationError, SecureSaverError
from .keyring import ENV_VAR, Keyring

app = typer.Typer(
    name="securesaver",
    help="Encrypted, tenant-isolated LangGraph checkpoints: keys, demo, and operations.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

EXIT_OK, EXIT_FOUND, EXIT_CANNOT_RUN = 0, 1, 2

KeyringOption = Annotated[
    Path | None,
    typer.Option("--keyring", help=f"Keyring file; defaults to ${ENV_VAR}.", dir_okay=False),
]


def fail(message: str, code: int = EXIT_CANNOT_RUN) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


def load_keyring(path: Path | None) -> Keyring:
    try:
        return Keyring.load(path)
    except SecureSaverError as exc:
        raise fail(str(exc)) from None


@app.callback()
def main(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


@app.command()
def keygen(
    out: Annotated[Path | None, typer.Option("--out", help="Write a keyring file (mode 0600).")]
    = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Create a new master key: a keyring file, or a value for SECURESAVER_MASTER_KEY."""
    ring = Keyring.generate()
    if out is None:
        import base64
        key = base64.urlsafe_b64encode(ring._masters[ring.current_version]).decode()
        console.print(f"export {ENV_VAR}={key}", soft_wrap=True, highlight=False)
        err_console.print("Keep this value in your secret store; losing it loses the data.")
        return
    if out.exists() and not force:
        raise fail(f"{out} exists; pass --force to overwrite (the old keys would be lost)")
    ring.save(out)
    console.print(f"wrote keyring [bold]{out}[/] (mode 0600, master version "
                  f"{ring.current_version})")


@app.command()
def demo(
    db: Annotated[Path, typer.Option("--db", help="SQLite file for the demo.")] = Path(
        "securesaver-demo.db"),
    keyring: KeyringOption = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep an existing demo database.")] = False,
) -> None:
    """Run a two-tenant support agent on SQLite and show what reaches the disk."""
    from .demo_run import run_demo
    try:
        ok = run_demo(db, keyring_path=keyring, keep=keep, console=console)
    except (SecureSaverError, ConfigurationError) as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(EXIT_OK if ok else EXIT_FOUND)


def run() -> Any:  # pragma: no cover - console entry point
    return app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
