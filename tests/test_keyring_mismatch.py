"""A keyring the database was not created with: one clear typed error, at start-up, never a
tamper traceback naming an internal tenant -- sync, async, CLI, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from typer.testing import CliRunner

from langgraph_securesaver import (
    Keyring,
    KeyringMismatch,
    SecureSaver,
    TamperedDataError,
)
from langgraph_securesaver.cli.main import app
from tests.fake_agent import build_chat_graph

CFG = {"configurable": {"thread_id": "t-1", "tenant_id": "acme"}}


def _write_one_turn(url: str, ring: Keyring) -> None:
    with SecureSaver.from_url(url, keyring=ring) as saver:
        build_chat_graph(saver).invoke({"messages": [HumanMessage("hello")]}, CFG)


def _assert_clear(exc: BaseException) -> None:
    text = str(exc)
    assert isinstance(exc, KeyringMismatch) and isinstance(exc, TamperedDataError)
    assert text.startswith("this database was created with another keyring")
    assert "\n" not in text and "securesaver-registry" not in text


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
def test_a_new_keyring_on_an_existing_database_is_named_at_start(database) -> None:
    url, _raw = database
    _write_one_turn(url, Keyring.generate())
    with pytest.raises(KeyringMismatch) as caught, \
            SecureSaver.from_url(url, keyring=Keyring.generate()):
        pass
    _assert_clear(caught.value)


@pytest.mark.parametrize("database", ["sqlite", "postgres"], indirect=True)
async def test_async_open_names_it_too(database) -> None:
    url, _raw = database
    _write_one_turn(url, Keyring.generate())
    with pytest.raises(KeyringMismatch) as caught:
        async with SecureSaver.afrom_url(url, keyring=Keyring.generate()):
            pass
    _assert_clear(caught.value)


def test_a_keyring_missing_the_master_version_is_named(tmp_path: Path) -> None:
    ring = Keyring.generate()
    ring.add_version()
    ring.add_version()          # the database's keys are wrapped under version 3
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _write_one_turn(url, ring)
    with pytest.raises(KeyringMismatch) as caught, \
            SecureSaver.from_url(url, keyring=Keyring.generate()):
        pass
    _assert_clear(caught.value)
    assert "master version 3 is not in it" in str(caught.value)


def test_the_right_keyring_still_opens_it(tmp_path: Path) -> None:
    ring = Keyring.generate()
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _write_one_turn(url, ring)
    with SecureSaver.from_url(url, keyring=ring) as saver:
        assert saver.get_tuple(CFG) is not None


@pytest.mark.parametrize("command", [["prune"], ["scan", "--verify"], ["events", "--verify"]])
def test_cli_prints_one_line_and_exits_2(tmp_path: Path, command: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _write_one_turn(url, Keyring.generate())
    other = tmp_path / "other.json"
    Keyring.generate().save(other)
    result = CliRunner().invoke(app, [*command, "--url", url, "--keyring", str(other)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "this database was created with another keyring" in lines[0]
    assert "Traceback" not in result.output
