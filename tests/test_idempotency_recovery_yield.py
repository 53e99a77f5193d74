"""Recovery yields to the user's next turn, and a new turn on a stalled thread is reported.

A worker process runs ``agent -> tools (idempotent charge_card) -> agent -> send_receipt``
(``idem_scripts/lease_graph.py``) and dies in the tool: the thread is stalled. Then:

* a recoverer process resumes it and hangs in the tool; meanwhile the user's next turn opts
  in (``recoverable_run``, taking the lease) and finishes. When the recoverer's tool returns,
  its checkpoint writes carry a stale fencing token and are refused: it reports the thread as
  ``yielded``, and the thread's latest state is the user's finished turn (on main the
  recoverer kept writing newer checkpoints and the user's turn fell onto a side branch);
* without a recoverer, the user's next turn arrives while the thread is stalled: LangGraph
  drops the stalled run's remaining tasks, and that is reported (a warning and a dead letter)
  instead of happening silently.

Default settings throughout (``recover_main`` as ``securesaver recover`` runs it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import (
    arecoverable_run,
    dead_letters_of,
    recoverable_run,
    recovery_state,
)

from .idem_scripts.lease_graph import build
from .test_idempotency_recovery_lease import BACKENDS, THREAD, Setup, wait_until

CONFIG: Any = {"configurable": {"thread_id": THREAD, "tenant_id": "acme"}}
QUESTION = "and what is my balance now?"


@pytest.fixture(params=BACKENDS)
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> Setup:
    url = (f"sqlite:///{tmp_path / 'cp.db'}" if request.param == "sqlite"
           else str(request.getfixturevalue("pg_url")))
    return Setup(tmp_path, url)


def _stall(setup: Setup) -> None:
    worker = setup.spawn("run", THREAD, LEASE_CRASH="tool")
    worker.communicate(timeout=120)
    assert worker.returncode == 1 and setup.charges() == (0, 0)  # died in the tool


def _user_turn(setup: Setup, use_async: bool) -> list[Any]:
    """The user's next turn in this process, opted in as documented; its final messages."""
    ring = Keyring.load(str(setup.keyring))
    if not use_async:
        with SecureSaver.from_url(setup.url, keyring=ring, redaction=None) as saver:
            graph = build(saver)
            with recoverable_run(CONFIG, saver=saver):
                out = graph.invoke({"messages": [HumanMessage(QUESTION)]}, CONFIG)
            return list(out["messages"])

    async def turn() -> list[Any]:
        async with SecureSaver.afrom_url(setup.url, keyring=ring, redaction=None) as saver:
            graph = build(saver)
            async with arecoverable_run(CONFIG, saver=saver):
                out = await graph.ainvoke({"messages": [HumanMessage(QUESTION)]}, CONFIG)
            return list(out["messages"])

    return asyncio.run(turn())


def _latest_messages(setup: Setup) -> list[Any]:
    with setup.saver() as saver:
        return list(build(saver).get_state(CONFIG).values["messages"])


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_the_users_next_turn_wins_over_a_recoverer(setup: Setup, use_async: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASE_DOWNSTREAM", setup.ds_path)
    monkeypatch.delenv("LEASE_TOOL_GATE", raising=False)
    _stall(setup)
    gate = setup.tmp / "gate"
    recoverer = setup.spawn("sweep", LEASE_TOOL_GATE=str(gate),
                            LEASE_ASYNC="1" if use_async else "0")
    wait_until(lambda: recoverer.pid in setup.pids("tool_started"), proc=recoverer)

    answered = _user_turn(setup, use_async)  # takes the lease while the recoverer runs
    assert answered[-1].content == "receipt sent"
    gate.touch()  # the recoverer's tool returns; its next write carries a stale token
    out, err = recoverer.communicate(timeout=120)
    assert recoverer.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["yielded"] == [["acme", THREAD]], report
    assert report["resumed"] == [] and report["failed"] == [], report

    # the thread's latest state is the user's finished turn, question and answer
    latest = _latest_messages(setup)
    assert [m.id for m in latest] == [m.id for m in answered]
    assert any(m.content == QUESTION for m in latest)
    # the recoverer recorded no attempt against the thread, and a later sweep finds it done
    again = setup.sweep()
    assert again["resumed"] == [] and again["failed"] == [] and again["yielded"] == []
    assert [m.id for m in _latest_messages(setup)] == [m.id for m in answered]
    with setup.saver() as saver:
        assert recovery_state(saver, "acme", THREAD)["state"] == "done"  # type: ignore[index]
        assert dead_letters_of(saver, tenant="acme") == []


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_new_turn_on_a_stalled_thread_is_reported(setup: Setup, use_async: bool,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("LEASE_DOWNSTREAM", setup.ds_path)
    monkeypatch.delenv("LEASE_TOOL_GATE", raising=False)
    _stall(setup)
    with caplog.at_level(logging.WARNING, logger="langgraph_securesaver"):
        answered = _user_turn(setup, use_async)
    assert answered[-1].content == "receipt sent"
    warned = [r for r in caplog.records if "previous run had stalled" in r.getMessage()]
    assert len(warned) == 1 and THREAD in warned[0].getMessage()
    with setup.saver() as saver:
        (letter,) = dead_letters_of(saver, tenant="acme")
        assert (letter.thread_id, letter.error_type) == (THREAD, "StalledRunSuperseded")
        assert letter.error is not None and "remaining tasks" in letter.error
    # a turn on a thread whose last run ended is not reported
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="langgraph_securesaver"):
        _user_turn(setup, use_async)
    assert not [r for r in caplog.records if "stalled" in r.getMessage()]
    with setup.saver() as saver:
        assert len(dead_letters_of(saver, tenant="acme")) == 1


def test_a_recoverer_in_the_serving_process_yields_too(setup: Setup,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that runs recover_stalled in a background thread of its own process, on its
    one saver: the user's turn served there takes the lease over all the same."""
    import os
    import threading

    from langgraph_securesaver.idempotency import recover_stalled
    gate = setup.tmp / "gate"
    monkeypatch.setenv("LEASE_DOWNSTREAM", setup.ds_path)
    monkeypatch.setenv("LEASE_TOOL_GATE", str(gate))   # every charge here waits for the gate
    _stall(setup)
    reports: list[Any] = []
    here = os.getpid()

    def mine() -> int:   # charges begun in this process
        return sum(1 for (pid,) in setup.ds.rows(
            "SELECT pid FROM effects WHERE label = ?", f"tool_started:{THREAD}") if pid == here)

    with setup.saver() as saver:
        graph = build(saver)
        recoverer = threading.Thread(target=lambda: reports.append(recover_stalled(graph)))
        recoverer.start()
        wait_until(lambda: mine() == 1)     # the resume is in the tool (the worker's was 1st)

        def open_gate() -> None:   # once the user's turn is in its own charge too
            wait_until(lambda: mine() == 2)
            gate.touch()

        opener = threading.Thread(target=open_gate)
        opener.start()
        with recoverable_run(CONFIG, saver=saver):
            answered = graph.invoke({"messages": [HumanMessage(QUESTION)]}, CONFIG)["messages"]
        opener.join(60)
        recoverer.join(60)
        assert not recoverer.is_alive()
    (report,) = reports
    assert report.yielded == [("acme", THREAD)] and report.resumed == [], report
    assert [m.id for m in _latest_messages(setup)] == [m.id for m in answered]
