"""What the CLI promises a newcomer: help for every option (no ``<bool>`` type noise),
durations printed as durations, ``events`` that exits 0 when nothing matches and reads at 80
columns, a ``prune --dry-run`` that reports exactly what ``prune`` then does with the same
options, ``--active-grace 0s``, and help texts that agree with the README and the docs."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import typer.main
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, RetentionPolicy, SecureSaver, tenant_scope
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.keys.lifecycle import LEASE_FENCE
from tests.fake_agent import build_chat_graph

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
GROUP: Any = typer.main.get_command(app)
COMMANDS = sorted(GROUP.list_commands(GROUP.context_class(GROUP, info_name="securesaver")))


def _command(name: str) -> Any:
    return GROUP.get_command(GROUP.context_class(GROUP, info_name="securesaver"), name)


def _options(name: str) -> set[str]:
    return {o for p in _command(name).params for o in (*p.opts, *p.secondary_opts)
            if o.startswith("-")} | {"--help"}


# --- help ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help(name: str) -> None:
    command = _command(name)
    assert (command.help or "").strip(), name
    silent = [p.name for p in command.params if not (getattr(p, "help", "") or "").strip()]
    assert silent == [], (name, silent)


def test_the_global_options_have_help() -> None:
    silent = [p.name for p in GROUP.params if not (getattr(p, "help", "") or "").strip()]
    assert silent == [], silent


@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_help_at_80_columns_has_no_type_placeholders(name: str | None) -> None:
    args = [name, "--help"] if name else ["--help"]
    result = runner.invoke(app, args, env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output, result.output
    options = [line for line in result.output.splitlines() if line.startswith("  -")]
    assert not [o for o in options if re.search(r"<(str|int|float|path|file)\b", o)], options
    assert max(len(line) for line in result.output.splitlines()) <= 80, result.output


# --- help agrees with the README and the docs ----------------------------------------------
def _doc_texts() -> dict[str, str]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8") for f in files}


def test_the_readme_lists_exactly_the_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## CLI", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `securesaver ([a-z-]+)`", table, re.M))
    assert listed == set(COMMANDS)


def test_every_option_the_docs_show_exists() -> None:
    """Each ``securesaver CMD ... --option`` written in the README or the docs names an
    option CMD has (a renamed or dropped option fails here, not in a user's cron job)."""
    wrong = []
    for where, text in _doc_texts().items():
        text = text.replace("\\\n", " ")          # shell continuation lines
        for match in re.finditer(r"(?<![\w.-])securesaver ([a-z-]+)((?:[^`\n|])*)", text):
            name, rest = match.group(1), match.group(2)
            if name not in COMMANDS:
                wrong.append(f"{where}: unknown command {name!r}")
                continue
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                if option not in _options(name) | {"--verbose"}:
                    wrong.append(f"{where}: securesaver {name} has no {option}")
    assert wrong == [], wrong


@pytest.mark.parametrize(("name", "claim"), [
    ("prune", "authenticates the latest checkpoint"),
    ("prune", "verifies the MACs of the retention rows"),
])
def test_help_states_what_the_docs_state(name: str, claim: str) -> None:
    """The pruner guide and ``prune --help`` say the same about what prune needs the
    keyring for, in the same words."""
    help_text = " ".join((_command(name).help or "").split())
    docs = " ".join(_doc_texts()["docs/guides/pruner.md"].split())
    assert claim in help_text
    assert claim in docs and "decrypts nothing" not in help_text


# --- events --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def events_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = tmp_path_factory.mktemp("events") / "a.db"
    url = f"sqlite:///{db}"
    long_thread = "support-ticket-2026-11-29-0001-escalated"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None) as saver:
        graph = build_chat_graph(saver)
        graph.invoke({"messages": [HumanMessage("hi")]},
                     {"configurable": {"thread_id": long_thread, "tenant_id": "acme"}})
        saver.set_tenant_retention("acme", RetentionPolicy(idle_ttl="90d", max_age="1y"))
        with tenant_scope("globex"):
            with pytest.raises(PermissionError):
                saver.get_tuple({"configurable": {"thread_id": long_thread,
                                                  "tenant_id": "acme"}})
        with tenant_scope("acme"):
            saver.delete_thread(long_thread)
    return url


def test_events_exit_0_when_nothing_matches(events_db: str) -> None:
    """A known kind or tenant with no entry is exit 0; a name the database does not know is
    exit 2 (tests/test_cli_newcomer.py)."""
    for args in (["--kind", "tenant_shredded"], ["--since", "2999-01-01"],
                 ["--kind", "tenant_shredded", "--format", "json"]):
        result = runner.invoke(app, ["events", "--url", events_db, *args])
        assert result.exit_code == 0, (args, result.output)
    assert "no entries match" in runner.invoke(
        app, ["events", "--url", events_db, "--kind", "thread_copied"]).output
    assert runner.invoke(app, ["events", "--url", events_db, "--kind",
                               "no_such_kind"]).exit_code == 2


def test_events_verify_failure_is_still_exit_1(tmp_path: Path) -> None:
    import sqlite3
    db = tmp_path / "v.db"
    ring = Keyring.generate()
    ring_file = ring.save(tmp_path / "k.json")
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=ring) as saver:
        saver.set_tenant_retention("acme", RetentionPolicy(idle_ttl="90d"))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE securesaver_events SET detail = '{}'")
    result = runner.invoke(app, ["events", "--url", f"sqlite:///{db}", "--keyring",
                                 str(ring_file), "--verify"])
    assert result.exit_code == 1, result.output


def test_events_at_80_columns_are_readable(events_db: str) -> None:
    result = runner.invoke(app, ["events", "--url", events_db], env={"COLUMNS": "80"},
                           terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80, result.output
    assert "…" not in result.output                     # nothing cut
    flat = " ".join(result.output.split())
    assert "thread=support-ticket-2026-11-29-0001-escalated" in flat
    assert "by=globex" in flat and "operation=get_tuple" in flat
    assert "--format json has every field" in result.output


def test_events_print_durations_as_durations(events_db: str) -> None:
    for width in ("80", "160"):
        out = runner.invoke(app, ["events", "--url", events_db, "--kind", "retention_changed"],
                            env={"COLUMNS": width}, terminal_width=int(width)).output
        assert "idle_ttl=90d" in out and "max_age=1y" in out, out
        assert "7776000" not in out and "31536000" not in out
    raw = json.loads(runner.invoke(app, ["events", "--url", events_db, "--kind",
                                         "retention_changed", "--format", "json"]).stdout)
    assert raw[0]["detail"]["policy"]["idle_ttl"] == 7776000   # JSON keeps numbers


# --- prune --dry-run is what prune then does -------------------------------------------------
def _report_sets(report: Any) -> dict[str, set]:
    return {name: set(getattr(report, name)) for name in (
        "held", "skipped_active", "survived")} | {
        "delete": set(report.would_delete if report.dry_run else report.deleted),
        "prune": set(report.would_prune if report.dry_run else report.pruned_to_latest),
        "errors": {(t, th) for t, th, _ in report.errors}}


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("grace", [120.0, 0.0, 30.0])
def test_dry_run_reports_exactly_what_prune_does(database: Any, grace: float) -> None:
    """Threads idle past their TTL but written 60 s before the sweep's clock: with the
    default grace (2 min) the real prune skips them as in flight, and so must the dry run;
    with 0 s both delete them; a held one and a keep_latest tenant's are in both alike."""
    url, _raw = database
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=None,
                              retention=RetentionPolicy(idle_ttl="30s")) as saver:
        saver.set_tenant_retention("globex", RetentionPolicy(idle_ttl="30s",
                                                             strategy="keep_latest"))
        graph = build_chat_graph(saver)
        for tenant in ("acme", "globex"):
            for n in range(3):
                graph.invoke({"messages": [HumanMessage(f"turn {n}")]},
                             {"configurable": {"thread_id": f"t-{n}", "tenant_id": tenant}})
        with tenant_scope("acme"):
            saver.set_retention("t-2", legal_hold=True)
        now = time.time() + 60           # 60 s after the last write: idle 30 s, within 2 min
        dry = saver.prune_expired(now=now, dry_run=True, active_grace=grace)
        real = saver.prune_expired(now=now, active_grace=grace)
    assert _report_sets(dry) == _report_sets(real)
    sets = _report_sets(real)
    if grace > 60:
        assert len(sets["skipped_active"]) == 5 and not sets["delete"]
    else:
        assert sets["delete"] == {("acme", "t-0"), ("acme", "t-1")}
        assert sets["prune"] == {("globex", f"t-{n}") for n in range(3)}
    assert ("acme", "t-2") in sets["held"]


def test_cli_dry_run_agrees_with_prune_and_allows_zero_grace(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    ring = Keyring.generate()
    ring_file = ring.save(tmp_path / "k.json")
    url = f"sqlite:///{db}"
    with SecureSaver.from_url(url, keyring=ring, redaction=None,
                              retention=RetentionPolicy(idle_ttl="1s")) as saver:
        graph = build_chat_graph(saver)
        for n in range(3):
            graph.invoke({"messages": [HumanMessage("hi")]},
                         {"configurable": {"thread_id": f"t-{n}", "tenant_id": "acme"}})
    time.sleep(LEASE_FENCE + 0.2)  # expired (idle 1 s), leases run out, within the grace

    def prune(*args: str) -> dict:
        result = runner.invoke(app, ["prune", "--url", url, "--keyring", str(ring_file),
                                     "--json", *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    dry = prune("--dry-run")                     # the default grace: all three in flight
    assert len(dry["skipped_active"]) == 3 and dry["would_delete"] == []
    dry, real = prune("--dry-run", "--active-grace", "0s"), prune("--active-grace", "0s")
    assert sorted(map(tuple, dry["would_delete"])) == sorted(map(tuple, real["deleted"]))
    assert len(real["deleted"]) == 3 and real["skipped_active"] == []
    bad = runner.invoke(app, ["prune", "--url", url, "--keyring", str(ring_file),
                              "--active-grace", "-1s"])
    assert bad.exit_code == 2
