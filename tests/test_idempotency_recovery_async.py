"""arecover_stalled on async savers (AsyncSqliteSaver / AsyncPostgresSaver inside SecureSaver)
with async-only nodes, and ``securesaver recover`` choosing it for async URLs."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from langgraph_securesaver import Keyring, SecureSaver
from langgraph_securesaver.cli.main import app
from langgraph_securesaver.idempotency import (
    arecover_stalled,
    arecoverable_run,
    dead_letters_of,
    recovery_state,
)
from langgraph_securesaver.idempotency.recovery import async_url

from .idem_scripts.recovery_graph import abuild
from .idem_scripts.scenario import Downstream

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def cfg(thread: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread, "tenant_id": "acme", **extra}}


def _url(backend: str, tmp: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp / 'cp.db'}"
    return str(request.getfixturevalue("pg_url"))


async def _stall(url: str, ring: Keyring, ds_path: str, flag: Path,
                 threads: list[str]) -> None:
    flag.touch()
    async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as saver:
        graph = abuild(saver, ds_path, str(flag))
        for t in threads:
            async with arecoverable_run(cfg(t, user_plan="gold"), saver=saver):
                with pytest.raises(RuntimeError):
                    await graph.ainvoke({"log": []}, cfg(t), durability="sync")
            assert (await graph.aget_state(cfg(t))).next == ("work",)
    flag.unlink()


@pytest.mark.parametrize("backend", BACKENDS)
def test_arecover_stalled_resumes_async_only_graphs(tmp_path: Path,
                                                    request: pytest.FixtureRequest,
                                                    backend: str) -> None:
    url, ring = _url(backend, tmp_path, request), Keyring.generate()
    ds_path, flag = str(tmp_path / "ds.db"), tmp_path / "fail.flag"
    threads = ["a-1", "a-2", "a-3"]

    async def scenario() -> Any:
        await _stall(url, ring, ds_path, flag, threads)
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as saver:
            graph = abuild(saver, ds_path, str(flag))
            report = await arecover_stalled(graph, saver, older_than=0, worker_id="aw")
            again = await arecover_stalled(graph, saver, older_than=0, worker_id="aw")
            states = [await graph.aget_state(cfg(t)) for t in threads]
            rows = [await asyncio.to_thread(recovery_state, saver, "acme", t) for t in threads]
        return report, again, states, rows

    report, again, states, rows = asyncio.run(scenario())
    assert sorted(t for _, t in report.resumed) == threads and report.failed == []
    assert again.examined == 0  # done threads are not listed again
    assert all(s.next == () and s.values["log"] == ["prepared", "worked"] for s in states)
    assert {r["state"] for r in rows} == {"done"}
    effects = Downstream(ds_path).rows("SELECT label, count(*) FROM effects GROUP BY label")
    assert dict(effects) == {f"work:{t}": 1 for t in threads}


def test_arecover_stalled_caps_attempts_into_dead_letters(tmp_path: Path) -> None:
    url, ring = f"sqlite:///{tmp_path / 'cp.db'}", Keyring.generate()
    ds_path, flag = str(tmp_path / "ds.db"), tmp_path / "fail.flag"

    async def scenario() -> Any:
        await _stall(url, ring, ds_path, flag, ["doomed"])
        flag.touch()  # keeps failing
        async with SecureSaver.afrom_url(url, keyring=ring, redaction=None) as saver:
            graph = abuild(saver, ds_path, str(flag))
            first = await arecover_stalled(graph, saver, older_than=0, max_attempts=2)
            second = await arecover_stalled(graph, saver, older_than=0, max_attempts=2)
            letters = await asyncio.to_thread(dead_letters_of, saver, tenant="acme")
        return first, second, letters

    first, second, letters = asyncio.run(scenario())
    assert first.failed == [("acme", "doomed")]
    assert second.dead_lettered == [("acme", "doomed")]
    (letter,) = letters
    assert letter.attempts == 2 and "token=abc123" in (letter.error or "")


def test_async_url_detection() -> None:
    assert async_url("sqlite+aiosqlite:///x.db") == "sqlite:///x.db"
    assert async_url("postgresql+psycopg_async://u@h/db") == "postgresql://u@h/db"
    assert async_url("sqlite:///x.db") is None
    assert async_url("postgresql://u@h/db") is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_cli_recover_uses_the_async_path_for_async_urls(tmp_path: Path,
                                                        request: pytest.FixtureRequest,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        backend: str) -> None:
    url, ring = _url(backend, tmp_path, request), Keyring.generate()
    ring.save(tmp_path / "keyring.json")
    ds_path, flag = str(tmp_path / "ds.db"), tmp_path / "fail.flag"
    asyncio.run(_stall(url, ring, ds_path, flag, ["c-1", "c-2"]))
    time.sleep(1.1)  # the CLI's smallest --older-than is one second
    monkeypatch.setenv("IDEM_RECOVERY_DOWNSTREAM", ds_path)
    graph_ref = "tests.idem_scripts.recovery_graph:afactory"
    common = ["--graph", graph_ref, "--keyring", str(tmp_path / "keyring.json"),
              "--older-than", "1s", "--json"]
    # the sync path cannot run these async-only nodes: nothing is resumed
    sync = CliRunner().invoke(app, ["recover", "--url", url, *common])
    assert sync.exit_code != 0 or json.loads(sync.stdout)["resumed"] == 0
    scheme = ("sqlite+aiosqlite:" if backend == "sqlite" else "postgresql+psycopg_async:")
    async_form = scheme + url.split(":", 1)[1]
    result = CliRunner().invoke(app, ["recover", "--url", async_form, *common])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["resumed"] == 2
    effects = Downstream(ds_path).rows("SELECT label FROM effects ORDER BY label")
    assert effects == [("work:c-1",), ("work:c-2",)]
    assert os.environ["IDEM_RECOVERY_DOWNSTREAM"] == ds_path
