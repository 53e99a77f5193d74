"""``securesaver demo``: two tenants, a paused-and-resumed tool call, redaction (a value
replaced in storage, restored for its tenant), and a raw-disk check.

Everything shown is measured during the run: the conversation strings are searched for in the
SQLite files byte by byte, and the cross-tenant read is really attempted.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from ..errors import ENV_VAR, AccessDenied
from ..keys.keyring import Keyring
from ..saver import SecureSaver
from ..tenancy import tenant_scope

CONVERSATIONS = {
    "acme": [
        "Hi, I'm Alice (alice.liu@acme-mail.com). My card was charged twice last week.",
        "Can you check order ACME-7731 please?",
        "Thanks! Also my phone changed to +1 415 555 0199.",
    ],
    "globex": [
        "Hello, Bob here, bob.k@globex-corp.net. Our invoice looks wrong.",
        "The order is GLX-4410, shipped to 12 Harbour Road.",
    ],
}
THREAD = "support-1"
EMAIL = "alice.liu@acme-mail.com"


def _config(tenant: str) -> RunnableConfig:
    return {"configurable": {"thread_id": THREAD, "tenant_id": tenant,
                             "customer_tier": f"{tenant}-gold-tier"}}


def _db_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*") if p.is_file())


def _secrets_on_disk(db: Path) -> list[str]:
    raw = _db_bytes(db)
    needles = [s for texts in CONVERSATIONS.values() for s in texts]
    needles += ["alice.liu@acme-mail.com", "ACME-7731", "bob.k@globex-corp.net", "GLX-4410",
                "acme-gold-tier", "globex-gold-tier", "shipped yesterday"]
    return [n for n in needles if n.encode() in raw]


def _talk(saver: SecureSaver, tenant: str, texts: list[str], console: Console) -> None:
    from .demo import build_support_graph
    graph = build_support_graph(saver, pause_before_tools=True)
    for text in texts:
        graph.invoke({"messages": [HumanMessage(text)]}, _config(tenant))
        state = graph.get_state(_config(tenant))
        if state.next:
            console.print(f"  [yellow]{tenant}[/]: paused before [bold]{state.next[0]}[/] "
                          "(process 'restarts' here)")
            return


def _resume(saver: SecureSaver, tenant: str, texts: list[str], console: Console) -> None:
    from .demo import build_support_graph
    graph = build_support_graph(saver, pause_before_tools=True)
    state = graph.get_state(_config(tenant))
    if state.next:
        result = graph.invoke(None, _config(tenant))
        console.print(f"  [green]{tenant}[/]: resumed from the encrypted checkpoint → "
                      f"{escape(str(result['messages'][-1].content))}")
    done = sum(isinstance(m, HumanMessage) for m in graph.get_state(_config(tenant))
               .values["messages"])
    for text in texts[done:]:
        result = graph.invoke({"messages": [HumanMessage(text)]}, _config(tenant))
        if graph.get_state(_config(tenant)).next:
            result = graph.invoke(None, _config(tenant))
        console.print(f"  [green]{tenant}[/]: {escape(str(result['messages'][-1].content))}")


def run_demo(db: Path, *, keyring_path: Path | None, keep: bool, console: Console,
             quiet_logs: bool = True) -> bool:
    """Returns True when every check held. Replies are printed whole (the console wraps
    them); with ``quiet_logs`` the library's own warnings (the refused cross-tenant read is
    one) stay out of the report, which states each outcome itself."""
    package = logging.getLogger("langgraph_securesaver")
    level = package.level
    if quiet_logs:
        package.setLevel(logging.ERROR)
    try:
        return _run(db.resolve(), keyring_path, keep, console)
    finally:
        package.setLevel(level)


def _run(db: Path, keyring_path: Path | None, keep: bool, console: Console) -> bool:
    if not keep:
        for stale in db.parent.glob(db.name + "*"):
            stale.unlink()
    ring_file = keyring_path
    if ring_file is None:
        if os.environ.get(ENV_VAR, "").strip():   # set but unusable: an error, not a new key
            ring = Keyring.from_env()
            source = ENV_VAR
        else:
            ring_file = db.with_name(db.name + ".keyring.json")
            if not ring_file.exists():
                Keyring.generate().save(ring_file)
            ring = Keyring.from_file(ring_file)
            source = str(ring_file)
    else:
        ring = Keyring.from_file(ring_file)
        source = str(ring_file)
    url = f"sqlite:///{db}"
    console.print(Panel.fit(f"database [bold]{db}[/]\nkeyring  [bold]{source}[/]",
                            title="securesaver demo"))

    console.print("[bold]1. Two tenants talk to the support agent[/] (same thread id!)")
    with SecureSaver.from_url(url, keyring=ring) as saver:   # redaction on, as by default
        for tenant, texts in CONVERSATIONS.items():
            _talk(saver, tenant, texts, console)

    console.print("[bold]2. A new saver (as after a restart) resumes both threads[/]")
    with SecureSaver.from_url(url, keyring=Keyring.load(ring_file) if ring_file else ring
                              ) as saver:
        for tenant, texts in CONVERSATIONS.items():
            _resume(saver, tenant, texts, console)
        states = {t: saver.get_tuple(_config(t)) for t in CONVERSATIONS}
        resumed = all(s is not None and len(s.checkpoint["channel_values"]["messages"]) >= 4
                      for s in states.values())

        console.print("[bold]3. globex tries to read acme's thread[/]")
        denied = False
        with tenant_scope("globex"):
            try:
                saver.get_tuple(_config("acme"))
            except AccessDenied as exc:
                denied = True
                console.print(f"  [green]AccessDenied[/]: {exc}")
            own = saver.get_tuple(RunnableConfig(configurable={"thread_id": THREAD}))
        isolated = own is not None and not any(
            "alice" in str(m.content).lower() for m in own.checkpoint["channel_values"]["messages"])
        console.print(f"  globex's own '{THREAD}' holds only globex messages: {isolated}")
        denials = len(saver.registry.list_events(kind="access_denied"))
        with tenant_scope("acme"):
            restored = _first_message(saver)

    console.print("[bold]4. Redaction: personal data is replaced before encryption[/]")
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as without_vault:
        stored = _first_message(without_vault)   # decrypted, but the vault not consulted
    console.print(f"  in storage (decrypted, vault not read): {escape(stored)}")
    console.print(f"  acme reads back: {escape(restored)}")
    redacted = (EMAIL not in stored and "<EMAIL_ADDRESS:" in stored
                and EMAIL in restored)

    console.print("[bold]5. What an attacker with the database file sees[/]")
    leaked = _secrets_on_disk(db)
    table = Table("check", "result")
    table.add_row("threads resumed after restart", _mark(resumed))
    table.add_row("cross-tenant read refused and recorded", _mark(denied and denials == 1))
    table.add_row("same thread id, separate tenants", _mark(isolated))
    table.add_row("e-mail redacted in storage, restored for its tenant", _mark(redacted))
    table.add_row("conversation strings found in raw SQLite files",
                  "[green]none[/]" if not leaked else f"[red]{len(leaked)}: {leaked}[/]")
    console.print(table)
    ok = resumed and denied and isolated and redacted and not leaked
    console.print("[bold green]all checks passed[/]" if ok else "[bold red]a check failed[/]")
    return ok


def _first_message(saver: SecureSaver) -> str:
    """acme's first message as ``saver`` returns it."""
    state = saver.get_tuple(_config("acme"))
    return str(state.checkpoint["channel_values"]["messages"][0].content) if state else ""


def _mark(ok: bool) -> str:
    return "[green]yes[/]" if ok else "[red]NO[/]"
