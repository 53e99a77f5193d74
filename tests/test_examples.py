"""Every example runs, as a user would run it (``python examples/<file>.py``), and does what
its header says -- twice in a row in the same directory (a rerun must not meet the first
run's data with a new keyring), from a directory that is not the repository, and writing
only under ``./.securesaver-examples/<name>/``. The LangGraph Server example is started by
tests/test_server.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
COVERED_HERE = {"quickstart_sqlite.py", "async_postgres_service.py", "starlette_app.py",
                "react_agent_idempotent.py", "retention_pruner.py", "key_rotation.py",
                "react_agent_store.py", "fastapi_postgres.py"}
COVERED_BY_TEST_SERVER = {"langgraph_server"}


def run_example(name: str, cwd: Path, *args: str, **env: str) -> str:
    """Run the example twice in ``cwd``; both runs must succeed and print the same distinct
    lines (apart from the line saying where the data is); returns the second run's output."""
    first = _run_once(name, cwd, *args, **env)
    second = _run_once(name, cwd, *args, **env)
    assert "Traceback" not in first + second
    assert _comparable(first) == _comparable(second), (first, second)
    stem = name.removesuffix(".py")
    written = {p.name for p in cwd.iterdir()}
    assert written <= {".securesaver-examples"}, written       # nothing beside its own dir
    mine = {p.name for p in (cwd / ".securesaver-examples").iterdir()}
    assert all(m.startswith(stem) for m in mine), mine
    return second


def _comparable(out: str) -> set[str]:
    """The distinct lines of a run (the retention example's background pruner sweeps a
    number of times that depends on the machine's speed; each sweep prints a line, and a
    sweep with nothing left to delete may or may not come before the run ends)."""
    return {line for line in out.splitlines()
            if not line.startswith(("data: ", "keyring: ", "sweep: deleted 0, "))}


def _run_once(name: str, cwd: Path, *args: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SECURESAVER_")}
    environ.update(env)
    environ["PYTHONWARNINGS"] = "error::DeprecationWarning"   # no example on a deprecated API
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def test_every_example_is_tested() -> None:
    present = {p.name for p in EXAMPLES.iterdir() if not p.name.startswith((".", "_"))
               and p.name != "README.md"}
    assert present == COVERED_HERE | COVERED_BY_TEST_SERVER


def test_examples_use_the_current_agent_api_and_their_own_fake_model() -> None:
    """No example imports the package's internals (its demo's scripted model), silences a
    warning, or builds on the deprecated ``create_react_agent``; the agent examples use
    ``langchain.agents.create_agent``."""
    sources = {p.relative_to(EXAMPLES).as_posix(): p.read_text(encoding="utf-8")
               for p in EXAMPLES.rglob("*.py")}
    for name, text in sources.items():
        assert not re.search(r"^\s*(from|import) langgraph_securesaver\.cli", text, re.M), name
        assert "catch_warnings" not in text and "simplefilter" not in text, name
        assert "create_react_agent" not in text, name
    assert {n for n, t in sources.items() if "from langchain.agents import create_agent" in t} \
        >= {"react_agent_idempotent.py", "react_agent_store.py"}


@pytest.mark.parametrize("name", sorted(COVERED_HERE))
def test_every_example_has_a_header(name: str) -> None:
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    header = text.split('"""')[1]
    assert "Shows:" in header and "Run:" in header, name


def test_quickstart_sqlite(tmp_path: Path) -> None:
    out = run_example("quickstart_sqlite.py", tmp_path)
    assert "messages in the thread: 4" in out
    assert "first message, decrypted: my locker code is 4417-blue" in out
    assert "plaintext on disk: False" in out
    assert "(old run removed, starting clean)" in out
    data = tmp_path / ".securesaver-examples" / "quickstart_sqlite"
    assert (data / "keyring.json").exists()
    raw = (data / "quickstart.db").read_bytes()
    assert b"4417-blue" not in raw and b"what did I tell you" not in raw


@pytest.mark.postgres
def test_async_postgres_service_on_a_given_database(tmp_path: Path, pg_url: str) -> None:
    """A database of the user's: kept between runs, with the keyring kept beside the data."""
    out = run_example("async_postgres_service.py", tmp_path, pg_url)
    assert "replies: 10" in out
    assert "acme sees 5 threads" in out and "globex sees 5 threads" in out
    assert (tmp_path / ".securesaver-examples" / "async_postgres_service" / "keyring.json").exists()


@pytest.mark.postgres
def test_async_postgres_service_default_uses_its_own_schema(tmp_path: Path, pg_url: str) -> None:
    """Without a URL: its own schema, recreated on each run; the public schema is untouched."""
    import psycopg

    from tests.conftest import PG_URL, new_pg_schema
    schema = new_pg_schema()       # the example's schema name, unique to this test run
    try:
        out = run_example("async_postgres_service.py", tmp_path,
                          SECURESAVER_EXAMPLE_SCHEMA=schema)
        assert f"schema: {schema} (starting clean)" in out and "replies: 10" in out
        with psycopg.connect(PG_URL) as conn:
            tables = {r[0] for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,))}
        assert "checkpoints" in tables and "securesaver_threads" in tables
    finally:
        from tests.conftest import drop_pg_schema
        drop_pg_schema(schema)


def test_starlette_app(tmp_path: Path) -> None:
    out = run_example("starlette_app.py", tmp_path, "--demo")
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["no token"] == "401"
    assert "'turns': 2" in lines["acme"] and "'turns': 4" in lines["acme again"]
    assert "'turns': 2" in lines["globex, same thread id"]     # its own thread t1
    assert lines["globex naming acme"] == "403"
    assert lines["acme threads"] == "{'threads': ['t1']}"
    assert lines["denials recorded"] == "[('globex', 'acme')]"


def test_react_agent_idempotent(tmp_path: Path) -> None:
    out = run_example("react_agent_idempotent.py", tmp_path)
    assert "first attempt failed: payment API timed out" in out
    assert "agent: done" in out
    assert "e-mails sent: 1" in out
    assert "charge attempts: 2 same key: True" in out


def test_retention_pruner(tmp_path: Path) -> None:
    out = run_example("retention_pruner.py", tmp_path)
    assert out.count("sweep: ") >= 1
    assert "sweep: deleted 1, pruned to latest 0, held 1, errors 0" in out
    assert "receipt: globex/g-1 deleted (retention:idle_ttl)" in out
    assert "acme keeps: ['a-1']" in out           # 90 days idle not reached
    assert "globex keeps: ['g-2']" in out         # 30 days passed; g-2 is on legal hold


def test_key_rotation(tmp_path: Path) -> None:
    out = run_example("key_rotation.py", tmp_path)
    # one tenant's (data, index, KEK) key rows + the registry MAC key row + the thread's own key
    assert "in use: {'1': 5}" in out
    assert "after rewrap: {'2': 5}" in out
    assert "retired master versions: ['1', '2'] ok: True" in out
    # with per-thread keys nothing needs rewriting, and the example says so (not "0 rows")
    assert "rows already under their thread's key: " in out and "rewritten: 0" in out
    assert "re-encrypted rows: 0" not in out
    assert "still readable: ['written under master v1', 'written under data key v2']" in out
    assert "keyring versions now: ['3']" in out


def test_react_agent_store(tmp_path: Path) -> None:
    """Runs twice in a row in one directory, each run clean in its own directory; every run
    remembers and recalls the fact in acme only and keeps it off the disk. Given a database
    path, a second run opens the first run's keys and memories and recalls both runs' facts."""
    out = run_example("react_agent_store.py", tmp_path)
    assert "acme: (remember) remembered" in out
    assert "acme, another thread: (recall) prefers invoices" in out
    assert "globex: (recall) nothing remembered" in out
    assert "fact on disk: False" in out
    assert "e-mail shown to the embedder: False" in out
    assert out.count("prefers invoices") == 1
    kept = tmp_path / "kept"
    kept.mkdir()
    first = _run_once("react_agent_store.py", kept, str(kept / "memory.db"))
    second = _run_once("react_agent_store.py", kept, str(kept / "memory.db"))
    assert first.count("prefers invoices") == 1 and second.count("prefers invoices") == 2
    assert "fact on disk: False" in second


@pytest.mark.postgres
def test_fastapi_postgres_recipe(tmp_path: Path, pg_url: str) -> None:
    """The production recipe: FastAPI, async PostgreSQL, SecureSaver and SecureStore, tenants
    from the token, an idempotent tool, the pruner as cron runs it -- twice in a row."""
    from tests.conftest import drop_pg_schema, new_pg_schema
    schema = new_pg_schema()
    try:
        out = run_example("fastapi_postgres.py", tmp_path, "--demo",
                          SECURESAVER_EXAMPLE_SCHEMA=schema)
    finally:
        drop_pg_schema(schema)
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["no token"] == "401"
    assert lines["refund, first try"] == "503"
    assert lines["refund, retried"] == "done: refunded A-17"
    assert lines["provider calls"] == "2 refunds made: 1"       # one refund, one key
    assert lines["globex reads t1"] == "{'messages': []}"
    assert lines["acme memories"] == "['invoices to li.wei@example.com']"
    assert lines["globex memories"] == "[]"
    assert lines["e-mail stored in clear"] == "False"
    assert lines["pruner exit code"] == "0 threads deleted: 0 stderr bytes: 0"
