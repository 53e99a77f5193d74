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
import regex
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
from tests.fake_agent import build_chat_graph

#: clear the screen, set the window title, print a fake all-clear in green, reverse the rest
EVIL = ("\x1b[2J\x1b[H\x1b]0;pwned\x07\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\"
        "\x1b[32mno problems\x1b[0m\u202egnp.exe\x9b31m\x9d2;title\x9c\x85\u2028\x7f\x08\r"
        "in\u2060vis\U000e0041ible\u3164")
EVIL_TENANT = "acme\x1b[8m\u2066\u200b"
#: what must never reach a terminal raw (the test's own list, not the library's)
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                     "\u2028\u2029]")
#: invisible characters, from the Unicode property (no output here holds emoji or scripts
#: that need a joiner, so any of them in an output is one that came from a forged row)
INVISIBLE = regex.compile(r"\p{Default_Ignorable_Code_Point}")

#: one of each kind the API refuses
REFUSED = ["\x00", "\x01", "\x07", "\x08", "\t", "\n", "\r", "\x1b", "\x1f", "\x7f", "\x80",
           "\x85", "\x9b", "\x9d", "\x9f", "\u061c", "\u200e", "\u200f", "\u202a", "\u202b",
           "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u2028",
           "\u2029"]
#: ids of every script, with punctuation, inner spaces, emoji and joiners: all accepted
ACCEPTED = ["用户-42", "Zoë's thread #1", "a b c", "ticket:123/αβγ", "שלום עולם", "مرحبا",
            "👩\u200d💻 dev", "naïve—dash…", "日本語のスレッド", "(parens) [brackets] {braces}",
            "tab-less \\x1b literally", "Ελληνικά", "한국어 스레드", "emoji 🎉🇫🇷",
            # joiners and variation selectors where they change what is shown: a Persian
            # word with ZWNJ, a Devanagari conjunct with ZWJ, emoji presentation, a keycap
            "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", "\u0915\u094d\u200d\u0937",
            "\u2764\ufe0f love", "\U0001f44d\U0001f3fd\u200d\U0001f4bb", "1\ufe0f\u20e3"]


def _cfg(thread: str, tenant: str = "acme", ns: str = "") -> dict:
    return {"configurable": {"thread_id": thread, "tenant_id": tenant, "checkpoint_ns": ns}}


def _raw_controls(text: str) -> set[str]:
    """Control and invisible characters present raw in printed output (line ends are the
    output's own)."""
    return {c for c in CONTROL.findall(text) if c != "\n"} | set(INVISIBLE.findall(text))


def _cli() -> object:
    from langgraph_securesaver.cli import ops as cli_ops  # noqa: F401 - registers the commands
    from langgraph_securesaver.cli.main import app
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


#: every Default_Ignorable_Code_Point, from the Unicode property (the test's own derivation)
IGNORABLE = [chr(c) for c in range(0x110000) if INVISIBLE.match(chr(c))]
#: joiners and selectors where they show nothing: between Latin letters, CJK, at an end, a
#: selector after a letter or a digit that is no keycap
INVISIBLE_OUT_OF_CONTEXT = ["ZWNJ\u200cmi", "ac\u200dme", "\u4e2d\u200d\u6587", "\U0001f469\u200d",
                            "\u200d\U0001f4bb", "a\ufe0f", "1\ufe0f", "\u0645\u200c",
                            "\u200c\u062e", "\U0001f469\u200d\u200d\U0001f4bb"]


def test_every_invisible_character_is_refused_in_ids() -> None:
    """``acme`` and ``ac<invisible>me`` would be two tenants that print alike: each of the
    property's 4,000-odd characters is refused between letters, in every kind of id, and the
    error names the code point without printing the character."""
    from langgraph_securesaver.tenancy import (
        validate_actor,
        validate_namespace,
        validate_tenant,
        validate_thread_id,
    )
    assert len(IGNORABLE) > 4000 and {"\u115f", "\u3164", "\u2060", "\ufeff", "\U000e0041"} <= \
        set(IGNORABLE)
    for char in IGNORABLE:
        for check in (validate_tenant, validate_thread_id, validate_namespace, validate_actor):
            with pytest.raises(ConfigurationError, match=f"U\\+{ord(char):04X} at position 2"
                               ) as caught:
                check(f"ac{char}me")
            assert char not in str(caught.value)
    for text in INVISIBLE_OUT_OF_CONTEXT:
        with pytest.raises(ConfigurationError, match="invisible"):
            validate_tenant(text)


@pytest.mark.parametrize("char", ["\u2060", "\u200b", "\ufeff", "\u3164", "\U000e0041"])
def test_ids_with_an_invisible_character_are_refused_by_the_saver(
        char: str, saver: SecureSaver) -> None:
    graph = build_chat_graph(saver)
    graph.invoke({"messages": [HumanMessage("hi")]}, _cfg("t1"))
    for cfg in (_cfg(f"t{char}1"), _cfg("t1", f"ac{char}me"), _cfg("t1", ns=f"n{char}")):
        with pytest.raises(ConfigurationError, match="invisible"):
            saver.get_tuple(cfg)
        with pytest.raises(ConfigurationError):
            saver.put(cfg, empty_checkpoint(), {"source": "input", "step": -1}, {})
    with pytest.raises(ConfigurationError):
        graph.invoke({"messages": [HumanMessage("hi")]}, _cfg(f"t{char}1"))
    assert saver.registry.tenants() == ["acme"]


def test_invisible_characters_are_shown_escaped() -> None:
    from langgraph_securesaver.cli.common import shown
    from langgraph_securesaver.textsafety import escape_controls, json_safe
    for char in [*IGNORABLE[::7], "\u2060", "\U000e0041"]:
        printed = shown(f"ac{char}me")
        assert char not in printed and printed != "acme", hex(ord(char))
        assert json.loads(json_safe(json.dumps(f"ac{char}me", ensure_ascii=False))) == \
            f"ac{char}me"
        assert char not in json_safe(json.dumps(f"ac{char}me", ensure_ascii=False))
    assert escape_controls("ac\U000e0041me") == "ac\\U000e0041me"
    for name in ACCEPTED:   # shown where a script or emoji sequence needs them
        assert escape_controls(name) == name


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
        conn.execute("INSERT INTO securesaver_tenant_keys (tenant, purpose, version, "
                     "master_version, wrapped, created_at) VALUES ('acme', 'index', 9, ?, "
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
    page = (tmp_path / "r.html").read_text()
    assert "pwned" in page and not INVISIBLE.findall(page)   # no id looks like another there


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
