"""Nothing raw on an operator's terminal.

Ids holding control characters (C0/C1, DEL, bidi controls, line separators) are refused at the
API; ids of every script still work; and rows that already hold such characters (written by
an older version, or by someone with database access) are printed escaped by every command,
in tables, JSON and error lines.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from typer.testing import CliRunner

from langgraph_securesaver import (
    AccessDenied,
    ConfigurationError,
    Keyring,
    SecureSaver,
    tenant_scope,
)
from langgraph_securesaver.demo import build_chat_graph

#: clear the screen, set the window title, print a fake all-clear in green, reverse the rest
EVIL = ("\x1b[2J\x1b[H\x1b]0;pwned\x07\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\"
        "\x1b[32mno problems\x1b[0m\u202egnp.exe\x9b31m\x9d2;title\x9c\x85\u2028\x7f\x08\r")
EVIL_TENANT = "acme\x1b[8m\u2066"
#: what must never reach a terminal raw (the test's own list, not the library's)
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                     "\u2028\u2029]")

#: one of each kind the API refuses
REFUSED = ["\x00", "\x01", "\x07", "\x08", "\t", "\n", "\r", "\x1b", "\x1f", "\x7f", "\x80",
           "\x85", "\x9b", "\x9d", "\x9f", "\u061c", "\u200e", "\u200f", "\u202a", "\u202b",
           "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u2028",
           "\u2029"]
#: ids of every script, with punctuation, inner spaces, emoji and joiners: all accepted
ACCEPTED = ["用户-42", "Zoë's thread #1", "a b c", "ticket:123/αβγ", "שלום עולם", "مرحبا",
            "👩\u200d💻 dev", "naïve—dash…", "日本語のスレッド", "(parens) [brackets] {braces}",
            "ZWNJ\u200cmi", "tab-less \\x1b literally", "Ελληνικά", "한국어 스레드", "emoji 🎉🇫🇷"]


def _cfg(thread: str, tenant: str = "acme", ns: str = "") -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant, "checkpoint_ns": ns}}


def _raw_controls(text: str) -> set[str]:
    """Control characters present raw in printed output (line ends are the output's own)."""
    return {c for c in CONTROL.findall(text) if c != "\n"}


def _cli() -> object:
    from langgraph_securesaver import cli_ops  # noqa: F401 - registers the commands
    from langgraph_securesaver.cli import app
    return app


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[SecureSaver]:
    with SecureSaver.from_url(f"sqlite:///{tmp_path / 'db.sqlite'}",
                              keyring=Keyring.generate()) as s:
        yield s


# --------------------------------------------------------------------------------------------
# the API
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("char", REFUSED, ids=[f"U+{ord(c):04X}" for c in REFUSED])
def test_ids_with_a_control_character_are_refused(char: str, saver: SecureSaver) -> None:
    graph = build_chat_graph(saver)
    for cfg in (_cfg(f"t{char}x"), _cfg("t", f"acme{char}x"), _cfg("t", ns=f"n{char}x")):
        named = "NUL" if char == "\x00" else f"U\\+{ord(char):04X}"
        with pytest.raises(ConfigurationError, match=named):
            saver.get_tuple(cfg)
        with pytest.raises(ConfigurationError):
            saver.put(cfg, empty_checkpoint(), {"source": "input", "step": -1}, {})
        with pytest.raises(ConfigurationError):
            list(saver.list(cfg))
        if cfg["configurable"]["checkpoint_ns"] == "":   # a root graph sets its own namespace
            with pytest.raises(ConfigurationError):
                graph.invoke({"messages": [HumanMessage("hi")]}, cfg)
    with pytest.raises(ConfigurationError):
        with tenant_scope(f"acme{char}"):
            pass
    assert saver.registry.tenants() == []


async def test_async_ids_with_a_control_character_are_refused(tmp_path: Path) -> None:
    async with SecureSaver.afrom_url(f"sqlite:///{tmp_path / 'a.sqlite'}",
                                     keyring=Keyring.generate()) as s:
        with pytest.raises(ConfigurationError):
            await s.aget_tuple(_cfg(EVIL))
        with pytest.raises(ConfigurationError):
            await build_chat_graph(s).ainvoke({"messages": [HumanMessage("hi")]}, _cfg(EVIL))


def test_a_cross_tenant_read_with_escapes_is_refused_and_recorded_without_them(
        saver: SecureSaver, caplog: pytest.LogCaptureFixture) -> None:
    """Still a cross-tenant attempt (recorded, refused), but the id that no printed column may
    hold is left out of the event and the log line."""
    build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _cfg("t1"))
    with tenant_scope("globex"), caplog.at_level("WARNING"):
        with pytest.raises(AccessDenied):
            saver.get_tuple(_cfg(EVIL))
    (denied,) = [e for e in saver.registry.list_events() if e.kind == "access_denied"]
    assert denied.tenant == "acme" and denied.actor == "globex" and denied.thread_id is None
    assert "pwned" not in repr(saver.registry.list_events())
    assert not _raw_controls(caplog.text)
    with tenant_scope("acme"):                    # the owner's own call: refused as malformed
        with pytest.raises(ConfigurationError, match="U\\+001B"):
            saver.get_tuple(_cfg(EVIL))


@pytest.mark.parametrize("name", ACCEPTED)
def test_ids_of_every_script_still_work(name: str, saver: SecureSaver) -> None:
    graph = build_chat_graph(saver)
    cfg = _cfg(name, tenant=name.replace("\\", "/")[:40].strip())
    graph.invoke({"messages": [HumanMessage("hello")]}, cfg)
    tup = saver.get_tuple(cfg)
    assert tup is not None and tup.config["configurable"]["thread_id"] == name
    assert [c.config["configurable"]["thread_id"] for c in saver.list(cfg)][:1] == [name]
    with tenant_scope(cfg["configurable"]["tenant_id"]):
        assert saver.get_tuple({"configurable": {"thread_id": name}}) is not None


def test_escape_and_json_helpers() -> None:
    from langgraph_securesaver.textsafety import CONTROL_CHARS, escape_controls, json_safe
    assert re.compile(f"[{CONTROL_CHARS}]").pattern == CONTROL.pattern
    shown = escape_controls(EVIL)
    assert not _raw_controls(shown) and "\\x1b[2J" in shown and "\\u202e" in shown
    assert escape_controls("用户 Zoë 👩\u200d💻") == "用户 Zoë 👩\u200d💻"
    for ensure_ascii in (True, False):
        text = json_safe(json.dumps({"id": EVIL, "中": "文"}, ensure_ascii=ensure_ascii))
        assert not _raw_controls(text) and json.loads(text) == {"id": EVIL, "中": "文"}


# --------------------------------------------------------------------------------------------
# rows already in the database, printed by the CLI
# --------------------------------------------------------------------------------------------
def _forged_database(tmp_path: Path) -> tuple[str, Path]:
    """Events, registry threads and a raw checkpoint whose ids hold escape sequences, as an
    older version (or anyone with database access) could have written them."""
    ring_path = Keyring.generate().save(tmp_path / "keyring.json")
    url = f"sqlite:///{tmp_path / 'forged.sqlite'}"
    with SecureSaver.from_url(url, keyring=ring_path) as saver:
        build_chat_graph(saver).invoke({"messages": [HumanMessage("hi")]}, _cfg("t1"))
        registry = saver.registry           # below the API's checks, like an older version
        registry.record_event("access_denied", tenant=EVIL_TENANT, thread_id=EVIL,
                              actor=EVIL, requested=EVIL)
        registry.record_event(EVIL, tenant="acme", thread_id="t1")
        registry.touch_thread("acme", EVIL)
        registry.touch_thread(EVIL_TENANT, "t2")
        inner = saver.inner
        inner.put({"configurable": {"thread_id": EVIL, "checkpoint_ns": ""}},
                  empty_checkpoint(), {"source": "input", "step": -1}, {})
    with sqlite3.connect(tmp_path / "forged.sqlite") as conn:   # and a forged key row
        conn.execute("INSERT INTO securesaver_tenant_keys VALUES ('acme', 'index', 9, ?, "
                     "x'00', 0)", (EVIL[:30],))
    return url, ring_path


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(_cli(), list(args))
    return result.exit_code, result.stdout, result.stderr


def test_events_prints_stored_escapes_escaped(tmp_path: Path) -> None:
    url, ring_path = _forged_database(tmp_path)
    code, out, err = _run("events", "--url", url)
    assert code == 0, err
    assert not _raw_controls(out + err), _raw_controls(out + err)
    assert "\\x1b[2J" in out and "pwned" in out          # shown, not dropped
    code, out, err = _run("events", "--url", url, "--format", "json")
    assert code == 0 and not _raw_controls(out + err), _raw_controls(out + err)
    entries = json.loads(out)
    assert {e["thread_id"] for e in entries} >= {EVIL} and any(e["kind"] == EVIL
                                                                for e in entries)
    code, out, err = _run("events", "--url", url, "--keyring", str(ring_path), "--verify")
    assert not _raw_controls(out + err), (code, out, err)


def test_audit_prints_stored_escapes_escaped(tmp_path: Path) -> None:
    url, _ = _forged_database(tmp_path)
    for fmt in ("table", "json"):
        code, out, err = _run("audit", "--url", url, "--format", fmt)
        assert code in (0, 1), err
        assert not _raw_controls(out + err), (fmt, _raw_controls(out + err))
        assert "pwned" in out
    data = json.loads(_run("audit", "--url", url, "--format", "json")[1])
    assert EVIL in {t["thread_id"] for t in data["threads"]}
    assert EVIL_TENANT in {t["tenant"] for t in data["tenants"]}
    code, out, err = _run("audit", "--url", url, "--format", "html", "--out",
                          str(tmp_path / "r.html"))
    assert not _raw_controls(out + err)


def test_scan_rotation_and_errors_print_stored_escapes_escaped(tmp_path: Path) -> None:
    url, ring_path = _forged_database(tmp_path)
    for args in (["scan", "--url", url], ["scan", "--url", url, "--format", "json"],
                 ["scan", "--url", url, "--keyring", str(ring_path), "--verify"],
                 ["rotate-keys", "--url", url, "--keyring", str(ring_path)],
                 ["prune", "--url", url, "--keyring", str(ring_path), "--dry-run", "--json"],
                 ["events", "--url", url, "--tenant", EVIL_TENANT],
                 ["events", "--url", url, "--thread", EVIL],
                 ["audit", "--url", f"sqlite:///{tmp_path}/{EVIL}.db"],
                 ["scan", "--url", url, "--keyring", str(tmp_path / f"{EVIL}.json")]):
        code, out, err = _run(*args)
        assert not _raw_controls(out + err), (args[0], code, _raw_controls(out + err), out, err)
