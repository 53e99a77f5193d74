"""`securesaver audit` as a table stays readable in narrow terminals: no line wider than the
terminal, no collapsed (empty) columns, ids never cut, low-priority columns dropped with a
note that --format json/html has everything."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver, tenant_scope
from langgraph_securesaver.cli import main as cli_module
from langgraph_securesaver.cli.main import app
from tests.fake_agent import build_chat_graph

runner = CliRunner()
UUID = "6df46436-3525-4994-9e08-200fd169c427"
ALL_THREAD_HEADERS = ["tenant", "thread", "created (UTC)", "last activity", "expires", "ckpts",
                      "stored", "keys", "personal data"]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    from langgraph_securesaver.redaction import Redactor
    url = f"sqlite:///{tmp_path_factory.mktemp('audit80') / 'a.db'}"
    with SecureSaver.from_url(url, keyring=Keyring.generate(), redaction=Redactor()) as saver:
        graph = build_chat_graph(saver)
        for tenant, thread, text in (
                ("acme", UUID, "I am li.na@example.com, call +1 415 555 0199"),
                ("acme", "t-2", "hello"),
                ("a-rather-long-organisation-name", "t-1", "hi"),
                ("globex", "g-expired", "old")):
            graph.invoke({"messages": [HumanMessage(text)]},
                         {"configurable": {"thread_id": thread, "tenant_id": tenant}})
        with tenant_scope("globex"):
            saver.set_retention("g-expired", idle_ttl=0.001)
    time.sleep(0.01)
    return url


def _render(db: str, width: int, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    monkeypatch.setattr(cli_module.console, "width", width)
    monkeypatch.delenv("SECURESAVER_MASTER_KEY", raising=False)
    result = runner.invoke(app, ["audit", "--url", db, *args])
    assert result.exit_code == 1, result.output      # g-expired is past its expiry
    return result.output


def _table(output: str, title: str) -> tuple[list[str], list[list[str]]]:
    """One rendered table: its column headers (multi-line headers joined) and body lines."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    head: list[list[str]] = []
    body: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("└"):
            break
        if line.startswith(("┃", "│")):
            cells = [c.strip() for c in re.split(r"[┃│]", line)[1:-1]]
            (head if line.startswith("┃") else body).append(cells)
    headers = [" ".join(r[i] for r in head if r[i]) for i in range(len(head[0]))]
    return headers, body


def _column(output: str, title: str, header: str) -> str:
    """Everything one column shows, top to bottom (folded cells joined)."""
    headers, body = _table(output, title)
    return "".join(r[headers.index(header)] for r in body)


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_narrow_terminals_keep_a_readable_table(db: str, width: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = _render(db, width, monkeypatch)
    assert max(len(line) for line in out.splitlines()) <= width
    for title in ("Tenants", "Threads"):
        headers, _ = _table(out, title)
        assert all(headers), (title, out)     # no collapsed column: every one has a header
        assert headers[0] == "tenant"
    assert UUID in _column(out, "Threads", "thread"), out    # ids fold, never cut
    assert "a-rather-long-organisation-name" in _column(out, "Tenants", "tenant")
    assert "past their expiry" in out                         # the finding stays visible
    if width >= 80:
        assert "PAST EXPIRY" in out
    assert "…" not in _column(out, "Threads", "thread")
    if width < 120:
        assert "--format json or --format html has every field" in " ".join(out.split())


def test_wide_terminals_show_every_column(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _render(db, 250, monkeypatch)
    assert _table(out, "Threads")[0] == ALL_THREAD_HEADERS
    assert "hidden at" not in out
    assert "EMAIL_ADDRESS 1" in out and "li.na@example.com" not in out


def test_the_note_names_what_was_hidden(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    out = " ".join(_render(db, 80, monkeypatch).split())
    note = out[out.index("hidden at 80 columns"):]
    shown = set(_table(_render(db, 80, monkeypatch), "Threads")[0])
    hidden = set(note.split("threads: ", 1)[1].split(". --format")[0].split(", "))
    assert hidden and shown | hidden == set(ALL_THREAD_HEADERS) and not shown & hidden


def test_html_and_json_still_have_everything(db: str, monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    import json
    monkeypatch.setattr(cli_module.console, "width", 80)
    data = json.loads(runner.invoke(app, ["audit", "--url", db, "--format", "json"]).stdout)
    assert {"created_at", "last_activity", "checkpoints", "key_versions", "pii"} <= set(
        data["threads"][0])
