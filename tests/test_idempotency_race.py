"""Duplicates racing in two processes (4 threads each) on PostgreSQL, MariaDB and one SQLite file:
exactly one execution, every other caller gets the stored result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.idempotency import IdempotencyStore
from langgraph_securesaver.registry.schema import normalize_url

SCRIPT = Path(__file__).parent / "idem_scripts" / "race_worker.py"


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres",
                                                            marks=pytest.mark.postgres),
                                     "mariadb"])
def test_two_processes_race_for_one_key(tmp_path: Path, request: pytest.FixtureRequest,
                                        backend: str) -> None:
    url = {"sqlite": lambda: f"sqlite:///{tmp_path / 'race.db'}",
           "postgres": lambda: request.getfixturevalue("pg_url"),
           "mariadb": lambda: request.getfixturevalue("mariadb").new_database()}[backend]()
    engine = sa.create_engine(normalize_url(url))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE race_effects (pid INTEGER, token INTEGER)"))
    keyring = tmp_path / "keyring.json"
    ring = Keyring.generate()
    ring.save(keyring)
    # create the schema first: concurrent Registry.setup() on a fresh database is not what
    # this test is about (see the report: registry create_all races across processes)
    with SecureSaver.from_url(url, keyring=ring, redaction=None) as saver:
        IdempotencyStore.for_saver(saver).setup()
    key = "race-" + uuid.uuid4().hex
    ready = tmp_path / "ready"
    ready.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), url, str(keyring), key,
                               str(ready), "4"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    assert [o["errors"] for o in outputs] == [[], []]
    results = [r for o in outputs for r in o["results"]]
    assert len(results) == 8
    with engine.begin() as conn:
        effects = conn.execute(sa.text("SELECT pid, token FROM race_effects")).fetchall()
    engine.dispose()
    assert len(effects) == 1  # exactly one execution across both processes
    assert sorted(r["replayed"] for r in results) == [False] + [True] * 7
    assert {r["value"] for r in results} == {f"executed by {effects[0][0]}"}
    assert {r["token"] for r in results} == {1}
