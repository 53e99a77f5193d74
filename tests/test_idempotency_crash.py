"""The scenario of the issue, with a real crash: one AIMessage calls send_email and charge_card;
the process dies (os._exit) inside the charge after the email went out; a new process resumes
at once, as a user's next message would.

Everything runs on the DEFAULT policy (no lease, timeout or heartbeat override). Without
idempotency the resumed ToolNode task sends the email again (the control). With it the resume
completes without a conflict, the email is sent once, the charge completes once, and the
payment API sees the same key on every attempt: the dead worker's claim is taken over at once
because its process is gone (same host) / its database session is gone (PostgreSQL).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import IdempotencyStore

from .idem_scripts.scenario import Downstream

SCRIPT = Path(__file__).parent / "idem_scripts" / "crash_run.py"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _url(backend: str, tmp: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp / 'checkpoints.db'}"
    return str(request.getfixturevalue("pg_url"))


def _run(phase: str, url: str, tmp: Path, mode: str, durability: str, resume: str = "sync",
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(SCRIPT), phase, url, str(tmp / "keyring.json"),
            str(tmp / "downstream.db"), mode, durability, resume]
    full_env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=full_env)


def crash(url: str, tmp: Path, mode: str, durability: str,
          env: dict[str, str] | None = None) -> Downstream:
    Keyring.generate().save(tmp / "keyring.json")
    crashed = _run("crash", url, tmp, mode, durability, env=env)
    assert crashed.returncode == 1, (crashed.stdout, crashed.stderr)
    assert "NOT REACHED" not in crashed.stdout
    downstream = Downstream(str(tmp / "downstream.db"))
    # the crash happened after the email and during the charge, in the first process
    assert downstream.rows("SELECT service FROM requests ORDER BY id") == [("email",),
                                                                        ("charge",)]
    return downstream


def resume(url: str, tmp: Path, mode: str, durability: str, how: str = "sync",
           env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    resumed = _run("resume", url, tmp, mode, durability, how, env=env)
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    assert "IdempotencyConflict" not in resumed.stderr
    return list(json.loads(resumed.stdout.strip().splitlines()[-1]))


def assert_exactly_once(downstream: Downstream, messages: list[dict[str, Any]]) -> None:
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
    assert tools["charge_card"]["replayed"] is False  # executed (dead holder taken over)
    assert tools["charge_card"]["content"] == "charged 4200"
    assert messages[-1]["content"] == "done"


def charge_record(url: str, tmp: Path) -> Any:
    with SecureSaver.from_url(url, keyring=Keyring.from_file(tmp / "keyring.json"),
                              redaction=None) as saver:
        records = IdempotencyStore.for_saver(saver).list_records("acme", "order-1")
    return next(r for r in records if r.name == "charge_card")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("mode", "durability", "how"), [
    ("decorator", "sync", "sync"), ("wrapper", "async", "async"), ("decorator", "sync", "async"),
])
def test_crash_during_charge_resumes_exactly_once_with_defaults(
        tmp_path: Path, request: pytest.FixtureRequest, backend: str, mode: str,
        durability: str, how: str) -> None:
    url = _url(backend, tmp_path, request)
    downstream = crash(url, tmp_path, mode, durability)
    messages = resume(url, tmp_path, mode, durability, how)  # right after the crash
    assert_exactly_once(downstream, messages)
    rec = charge_record(url, tmp_path)
    assert (rec.state, rec.fencing_token, rec.attempts) == ("completed", 2, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_holder_is_taken_over_without_waiting_for_its_lease(
        tmp_path: Path, request: pytest.FixtureRequest, backend: str) -> None:
    """The crashed worker held a 10-minute lease: the resume can only finish (well inside the
    subprocess timeout) if it took the claim over because the holder is dead, not expired."""
    url = _url(backend, tmp_path, request)
    downstream = crash(url, tmp_path, "decorator", "sync", env={"IDEM_LEASE": "600"})
    rec = charge_record(url, tmp_path)
    assert rec.state == "in_progress" and rec.fencing_token == 1
    messages = resume(url, tmp_path, "decorator", "sync")
    assert_exactly_once(downstream, messages)


@pytest.mark.postgres
def test_postgres_other_host_crash_is_taken_over_when_its_session_dies(
        tmp_path: Path, pg_url: str) -> None:
    """A holder on ANOTHER host (its pid means nothing here) with a 10-minute lease: on
    PostgreSQL its claim is tied to its database session, which died with the process."""
    downstream = crash(pg_url, tmp_path, "decorator", "sync",
                       env={"IDEM_HOST_ID": "other-host", "IDEM_LEASE": "600"})
    messages = resume(pg_url, tmp_path, "decorator", "sync")
    assert_exactly_once(downstream, messages)


def test_sqlite_other_host_crash_is_taken_over_after_the_default_lease(tmp_path: Path) -> None:
    """A holder on ANOTHER host (its pid cannot be checked here) sharing the SQLite file: with
    the default policy the resume waits for the crashed claim's lease (10 s, no heartbeat any
    more), then takes it over and completes - within the default wait, without a conflict.
    (SQLite's clock is this machine's, so the request time and the lease compare directly.)"""
    url = f"sqlite:///{tmp_path / 'checkpoints.db'}"
    downstream = crash(url, tmp_path, "decorator", "sync", env={"IDEM_HOST_ID": "other-host"})
    crashed = charge_record(url, tmp_path)
    assert crashed.state == "in_progress" and crashed.lease_expires_at is not None
    messages = resume(url, tmp_path, "decorator", "sync")
    assert_exactly_once(downstream, messages)
    (first_at, second_at) = [at for (at,) in downstream.rows(
        "SELECT at FROM requests WHERE service='charge' ORDER BY id")]
    assert first_at < crashed.lease_expires_at <= second_at  # taken over only after the lease


def test_control_without_idempotency_sends_the_email_twice(tmp_path: Path) -> None:
    """The failure the component exists for: the ToolNode task re-runs the finished sibling."""
    url = f"sqlite:///{tmp_path / 'checkpoints.db'}"
    downstream = crash(url, tmp_path, "plain", "sync")
    messages = resume(url, tmp_path, "plain", "sync")
    assert len(downstream.rows("SELECT 1 FROM emails")) == 2
    assert messages[-1]["content"] == "done"
