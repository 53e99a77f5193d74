"""The scenario of the issue, with a real crash: one AIMessage calls send_email and charge_card;
the process dies (os._exit) inside the charge after the email went out; a new process resumes.

Without idempotency the resumed ToolNode task sends the email again (the control). With it the
email is sent once, the charge completes once, and the payment API sees the same key on every
attempt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from langgraph_securesaver import Keyring

from .idem_scripts.scenario import Downstream

SCRIPT = Path(__file__).parent / "idem_scripts" / "crash_run.py"


def _run(phase: str, tmp: Path, mode: str, durability: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(SCRIPT), phase, str(tmp / "checkpoints.db"),
            str(tmp / "keyring.json"), str(tmp / "downstream.db"), mode, durability]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)


def _crash_and_resume(tmp: Path, mode: str, durability: str) -> tuple[Downstream, list[dict]]:
    Keyring.generate().save(tmp / "keyring.json")
    crashed = _run("crash", tmp, mode, durability)
    assert crashed.returncode == 1, (crashed.stdout, crashed.stderr)
    assert "NOT REACHED" not in crashed.stdout
    downstream = Downstream(str(tmp / "downstream.db"))
    # the crash happened after the email and during the charge, in the first process
    assert downstream.rows("SELECT service FROM requests ORDER BY id") == [("email",),
                                                                        ("charge",)]
    resumed = _run("resume", tmp, mode, durability)
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    messages = json.loads(resumed.stdout.strip().splitlines()[-1])
    return downstream, messages


@pytest.mark.parametrize(("mode", "durability"), [("decorator", "sync"), ("wrapper", "async")])
def test_crash_during_charge_resumes_exactly_once(tmp_path: Path, mode: str,
                                                  durability: str) -> None:
    downstream, messages = _crash_and_resume(tmp_path, mode, durability)

    emails = downstream.rows("SELECT key, recipient FROM emails")
    assert len(emails) == 1, emails  # the email was not sent again
    charges = downstream.rows("SELECT key, amount FROM charges")
    assert len(charges) == 1 and charges[0][1] == 4200  # the charge took effect once

    charge_requests = downstream.rows(
        "SELECT key, pid FROM requests WHERE service='charge' ORDER BY id")
    assert len(charge_requests) == 2  # attempted in the crashed and in the resuming process
    assert charge_requests[0][1] != charge_requests[1][1]
    assert {k for k, _ in charge_requests} == {charges[0][0]}  # same key on every attempt
    assert charges[0][0].startswith("ssik1_") and emails[0][0] != charges[0][0]

    tools = {m["name"]: m for m in messages if m["type"] == "tool"}
    assert tools["send_email"]["replayed"] is True  # served from the store, marked
    assert tools["charge_card"]["replayed"] is False  # executed (lease taken over)
    assert tools["charge_card"]["content"] == "charged 4200"
    assert messages[-1]["content"] == "done"


def test_control_without_idempotency_sends_the_email_twice(tmp_path: Path) -> None:
    """The failure the component exists for: the ToolNode task re-runs the finished sibling."""
    downstream, messages = _crash_and_resume(tmp_path, "plain", "sync")
    assert len(downstream.rows("SELECT 1 FROM emails")) == 2
    assert messages[-1]["content"] == "done"
