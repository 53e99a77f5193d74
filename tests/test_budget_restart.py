"""After a restart, a long conversation keeps its old messages; the write budget still holds.

The conversation (tests/scripts/budget_restart.py) holds 24 JSON tool outputs of ~120 KB on
SQLite, written with default settings. A fresh process (cold caches) then takes one more
turn: re-analyzing the old outputs costs more than the write budget (its character bound
alone, which does not depend on the machine's speed), yet nothing stored before may be
withheld. New content of the same size, in a new thread or written over the read-back
messages, is refused whole (RedactionError, nothing stored).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from langgraph_securesaver import Keyring
from langgraph_securesaver.redaction import RedactionError, RedactionPolicy, Redactor
from langgraph_securesaver.redaction import pool as pool_mod
from langgraph_securesaver.redaction.budget import DEFAULT_WRITE_CHARS, WriteBudget, write_scope
from tests.scripts.budget_restart import TURNS, tool_output

ROOT = Path(__file__).resolve().parent.parent
WITHHELD = "<WITHHELD"
SCRIPT = [sys.executable, "-m", "tests.scripts.budget_restart"]


def _run(*args: str) -> None:
    done = subprocess.run([*SCRIPT, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def conversation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The conversation written turn by turn (one process), and its keyring."""
    base = tmp_path_factory.mktemp("conv")
    ring = base / "keyring.json"
    Keyring.generate().save(ring)
    db = base / "agent.db"
    _run(str(db), str(ring), str(base / "unused.json"), "write")
    return db, ring


def _copy(conversation: tuple[Path, Path], tmp_path: Path) -> Path:
    db, _ring = conversation
    for part in db.parent.glob(db.name + "*"):
        shutil.copy(part, tmp_path / part.name.replace(db.name, "copy.db"))
    return tmp_path / "copy.db"


def test_the_old_outputs_cost_more_than_the_budget_to_analyze_again() -> None:
    """The scenario is big enough: a cold analysis of the old outputs exceeds the write's
    character budget (deterministic) -- and its CPU cost is printed for the record."""
    pool_mod.configure_pool(0)
    try:
        redactor = Redactor(RedactionPolicy(write_budget=WriteBudget.unlimited()))
        msgs = [ToolMessage(tool_output(t), tool_call_id=f"call-{t}") for t in range(TURNS)]
        started = time.thread_time()
        with write_scope() as spend:
            out, _ = redactor.redact_value(msgs, channel="messages", token_key=b"k" * 32)
        took = time.thread_time() - started
    finally:
        pool_mod.configure_pool()
    print(f"cold analysis of the old outputs: {spend.chars} chars, {took:.2f} CPU s")
    assert spend.chars > DEFAULT_WRITE_CHARS
    assert not any(WITHHELD in m.content for m in out)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_turn_after_a_restart_keeps_every_old_message(
        conversation: tuple[Path, Path], tmp_path: Path, flavour: str) -> None:
    db = _copy(conversation, tmp_path)
    out = tmp_path / "state.json"
    _run(str(db), str(conversation[1]), str(out), "turn", flavour)
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    state = result["state"]
    assert result["after_id"] != result["before_id"]
    assert not [m["id"] for m in state if WITHHELD in json.dumps(m["content"])]
    tools = [m for m in state if m["type"] == "tool"]
    assert len(tools) == TURNS + 1  # every old output and the new one
    for turn, m in enumerate(tools):
        assert m["content"] == tool_output(turn), f"tool output {turn} changed"
    assert state[-2]["content"] == "and the next batch?"
    assert b"customer.1000@example.com" not in b"".join(
        p.read_bytes() for p in tmp_path.glob("copy.db*"))


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_new_content_of_the_same_size_is_refused(
        conversation: tuple[Path, Path], tmp_path: Path, flavour: str) -> None:
    db = _copy(conversation, tmp_path)
    out = tmp_path / "state.json"
    _run(str(db), str(conversation[1]), str(out), "hostile", flavour)
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    # a new thread; the read-back messages edited in place: both over the character budget
    assert result["fresh"] == "refused" and result["edited"] == "refused"
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("copy.db*"))
    assert b"customer.x1000@example.com" not in stored
    assert b"customer.y1000@example.com" not in stored


def _notes(n: int, salt: str = "") -> list[ToolMessage]:
    return [ToolMessage(f"note {salt}{i}: {'x' * 300} mail user{salt}{i}@example.com",
                        tool_call_id=f"c{i}", id=f"m{i}") for i in range(n)]


@pytest.mark.parametrize("attack", ["other tenant", "edited in place", "copied text",
                                    "new message"])
def test_only_what_this_tenant_read_back_is_free(attack: str) -> None:
    """A budget of one string: the read-back messages go through whole; anything else past
    the first string refuses the write -- another tenant's key, content replaced in place
    (even by an equal copy), a message that was never read."""
    pool_mod.configure_pool(0)
    try:
        redactor = Redactor(RedactionPolicy(write_budget=WriteBudget(max_parts=1)))
        read = _notes(6)
        redactor.remember_read(read, channel="messages", token_key=b"a" * 32)
        key = b"a" * 32
        if attack == "other tenant":
            key = b"b" * 32
        elif attack == "edited in place":
            for m in read:
                m.content = m.content.replace("user", "victim")
        elif attack == "copied text":
            for m in read:
                m.content = "".join(list(str(m.content)))
        else:
            read = read + _notes(3, salt="new")
        with pytest.raises(RedactionError, match="budget"):
            redactor.redact_value(read, channel="messages", token_key=key)
        # the honest case: the same messages, read back by this tenant, all go through
        honest = Redactor(RedactionPolicy(write_budget=WriteBudget(max_parts=1)))
        again = _notes(6)
        honest.remember_read(again, channel="messages", token_key=b"a" * 32)
        out, vault = honest.redact_value(again, channel="messages", token_key=b"a" * 32)
        assert not [m.id for m in out if WITHHELD in str(m.content)]
        assert all("<EMAIL_ADDRESS:" in str(m.content) for m in out) and len(vault) == 6
    finally:
        pool_mod.configure_pool()
