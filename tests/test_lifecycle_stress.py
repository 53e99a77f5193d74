"""The key lifecycle under a multi-process stress (issue 39): writer processes with their own
savers and caches, while other processes rotate keys (SIGKILLed at random points, rerun with
--retire-old), prune, delete threads and forget a subject. After each round every turn a writer
saw return (on a thread not deleted on purpose since) reads back, `scan --verify` is clean and
one master version is in use. Three rounds per backend here; benchmarks/lifecycle_stress.py
runs twenty and more and reports them. SQLite, PostgreSQL, and MariaDB (LangGraph's MySQL saver
with the registry beside it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .lifecycle_helpers import Deletions, Turn, new_keyring, stress_round

ROUNDS = 3


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres",
                                                            marks=pytest.mark.postgres),
                                     "mariadb"])
def test_rounds_of_rotation_pruning_and_deletion_beside_writers(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """On MariaDB: LangGraph's MySQL saver with the registry in the same database, and the
    rotations rewrap keys without re-encrypting (docs/savers.md)."""
    url = {"sqlite": lambda: f"sqlite:///{tmp_path / 'agent.db'}",
           "postgres": lambda: str(request.getfixturevalue("pg_url")),
           "mariadb": lambda: str(request.getfixturevalue("mariadb").new_database()),
           }[backend]()
    ring_path = new_keyring(url, tmp_path / "keyring.json")
    deletions = Deletions()
    history: dict[str, list[Turn]] = {}
    # on MariaDB the final scan of each round reads every checkpoint through LangGraph's MySQL
    # saver (its list query aggregates the blobs per checkpoint): two rounds keep the test
    # within minutes; benchmarks/lifecycle_stress.py runs more
    for number in range(ROUNDS if backend != "mariadb" else 2):
        report = stress_round(url, ring_path, tmp_path / f"round{number}", number,
                              seed=1000 + number, deletions=deletions, history=history)
        assert report.turns_ok >= 27 and report.protected_checked >= 15, report
        assert report.threads_deleted >= 1
