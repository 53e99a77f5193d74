"""The CLI on a deployment whose checkpoints are in another saver (MySQL here): named with
``--saver MODULE:FACTORY``, ``scan`` finds a ciphertext corrupted in the backend and ``prune``
removes the rows it reports; without it, a command pointed at a registry file refuses instead
of reporting clean. With the registry in the MySQL database itself, ``--url mysql://...``
alone opens LangGraph's MySQL saver there."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, RetentionPolicy, SecureSaver
from langgraph_securesaver.cli import app
from langgraph_securesaver.keys.lifecycle import LEASE_FENCE
from langgraph_securesaver.tenancy import inner_thread_id

from .test_thirdparty import run_chat

runner = CliRunner()

FACTORY = '''
import os
import pymysql
from langgraph.checkpoint.mysql.pymysql import PyMySQLSaver


def make():
    url = os.environ["ANYSAVER_TEST_MYSQL"]
    conn = pymysql.connect(**PyMySQLSaver.parse_conn_string(url), autocommit=True)
    return PyMySQLSaver(conn)
'''


def _mysql(url: str, sql: str, *args: Any) -> list[Any]:
    import pymysql
    from langgraph.checkpoint.mysql.pymysql import PyMySQLSaver
    conn = pymysql.connect(**PyMySQLSaver.parse_conn_string(url), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


@pytest.fixture(params=["sqlite-registry", "mariadb-registry"])
def deployment(request: pytest.FixtureRequest, mariadb: Any, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, Path]:
    """Checkpoints in MariaDB; the registry in a SQLite file or in the same MariaDB database."""
    url = mariadb.new_database()
    (tmp_path / "mysql_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ANYSAVER_TEST_MYSQL", url)
    sys.modules.pop("mysql_factory", None)
    registry = url if request.param == "mariadb-registry" else \
        f"sqlite:///{tmp_path / 'registry.db'}"
    return url, registry, tmp_path


async def test_scan_and_prune_act_on_the_real_backend(deployment: tuple[str, str, Path]
                                                      ) -> None:
    from mysql_factory import make  # type: ignore[import-not-found]
    url, registry, tmp = deployment
    ring = Keyring.generate()
    ring_path = ring.save(tmp / "keyring.json")
    saver = SecureSaver(make(), keyring=ring, registry=registry, redaction=None,
                        default_tenant="acme", retention=RetentionPolicy(idle_ttl=1))
    saver.setup()
    for thread in ("t1", "t2"):
        await run_chat(saver, False, thread)
    if registry.startswith("sqlite"):
        # without --saver: the registry file has no checkpoints: refused, nothing created
        blind = runner.invoke(app, ["scan", "--url", registry, "--keyring", str(ring_path),
                                    "--verify", "--format", "json"])
        assert blind.exit_code == 2 and "no checkpoint tables" in blind.output
        blind = runner.invoke(app, ["prune", "--url", registry, "--keyring", str(ring_path)])
        assert blind.exit_code == 2
        import sqlite3
        tables = {r[0] for r in sqlite3.connect(registry.removeprefix("sqlite:///")).execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert not tables & {"checkpoints", "writes"}
    else:
        # the registry beside the checkpoints: --url mysql:// alone opens LangGraph's MySQL
        # saver on that database, as from_url does
        alone = runner.invoke(app, ["scan", "--url", registry, "--keyring", str(ring_path),
                                    "--format", "json"])
        assert alone.exit_code == 0, alone.output
        assert json.loads(alone.stdout)["backend"] == "PyMySQLSaver"

    clean = runner.invoke(app, ["scan", "--url", registry, "--keyring", str(ring_path),
                                "--saver", "mysql_factory:make", "--format", "json"])
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.stdout)["ok"] is True
    # one ciphertext of t1 corrupted in MariaDB
    t1 = inner_thread_id("acme", "t1")
    ((blob,),) = _mysql(url, "SELECT `blob` FROM checkpoint_blobs WHERE thread_id = %s AND "
                        "type = 'bytes' ORDER BY version DESC LIMIT 1", t1)
    _mysql(url, "UPDATE checkpoint_blobs SET `blob` = %s WHERE thread_id = %s AND `blob` = %s",
           blob[:-1] + bytes([blob[-1] ^ 1]), t1, blob)
    found = runner.invoke(app, ["scan", "--url", registry, "--keyring", str(ring_path),
                                "--saver", "mysql_factory:make", "--format", "json"])
    assert found.exit_code == 1, found.output
    violations = json.loads(found.stdout)["violations"]
    assert violations and {v["kind"] for v in violations} == {"refused"}
    assert all("'t1'" in v["location"] for v in violations)

    time.sleep(LEASE_FENCE + 0.2)  # both threads idle past their 1 s TTL and write lease
    pruned = runner.invoke(app, ["prune", "--url", registry, "--keyring", str(ring_path),
                                 "--saver", "mysql_factory:make", "--active-grace", "0s",
                                 "--json"])
    report = json.loads(pruned.stdout)
    assert {"tenant": "acme", "thread_id": "t2"} in report["deleted"]
    t2 = inner_thread_id("acme", "t2")
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        assert _mysql(url, f"SELECT COUNT(*) FROM {table} WHERE thread_id = %s", t2) == [(0,)]
    assert "t2" in {r.thread_id for r in saver.receipts()}
