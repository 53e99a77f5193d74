"""Run LangGraph's own checkpointer-parametrized tests with SecureSaver as the checkpointer.

Fetches the sdist of the *installed* langgraph version from PyPI (``pip download --no-binary``),
appends ``checkpointer_patch.py`` to its ``tests/conftest_checkpointer.py`` (SecureSaver variants
over InMemorySaver, SqliteSaver, AsyncSqliteSaver, PostgresSaver, AsyncPostgresSaver) and
``conftest_patch.py`` to its ``tests/conftest.py`` (the checkpointer fixtures take their params
from ``LG_SYNC_CKPTS``/``LG_ASYNC_CKPTS``), then runs every upstream test file that uses a
checkpointer fixture, one pytest process per backend.

    python tests/upstream/run_langgraph_suite.py                      # all three backends
    python tests/upstream/run_langgraph_suite.py --backends sqlite,postgres
    python tests/upstream/run_langgraph_suite.py --backends memory --compare   # raw side by side
    python tests/upstream/run_langgraph_suite.py --backends sqlite -- -k interrupt
    python tests/upstream/run_langgraph_suite.py --backends sqlite --tenancy scope,config

``--tenancy`` says how the tests name their tenant: ``default`` (the saver's
``default_tenant``), ``scope`` (no default tenant; every test runs inside ``tenant_scope``) or
``config`` (no default tenant; ``tenant_id`` only in the configs that test code passes to graph
entry points and checkpointer methods; see ``checkpointer_patch.py``). Each mode is its own
pytest process per backend.

Without ``--compare`` only the SecureSaver variants run, and any test that does not pass is a
failure unless it is listed in KNOWN_ARTIFACTS below (with its reason; the README repeats them).
With ``--compare`` the raw saver runs in the same pytest process and the script fails when a test
passes raw but not wrapped. Needs the ``upstream`` extra (``pip install -e ".[postgres,upstream]"``)
and, for postgres, a server at ``LG_POSTGRES_URI`` (default ``postgresql://postgres@127.0.0.1:5432/``)
whose user may create databases.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PATCH_MARK = "appended by langgraph-securesaver's upstream harness"

BACKENDS = {
    # backend: (sync secure, async secure, sync raw, async raw)
    "memory": ("secure_memory", "secure_memory", "memory", "memory"),
    "sqlite": ("secure_sqlite", "secure_sqlite_aio", "sqlite", "sqlite_aio"),
    # raw PostgreSQL in a schema per test, like the wrapped one (upstream's own fixtures, a
    # database per test, are "postgres"/"postgres_aio": seconds per test on a busy machine)
    "postgres": ("secure_postgres", "secure_postgres_aio", "postgres_schema",
                 "postgres_aio_schema"),
}

# Tests whose wrapped variant cannot pass for a reason that is the harness's, not SecureSaver's.
# backend -> {"file::test name, the checkpointer param shown as <ckpt>": reason}
_IMMUTABLE = (
    "MemorySaverAssertImmutable (the upstream in-memory fixture) compares the raw stored bytes "
    "of a checkpoint before and after a later put; this test re-puts saved checkpoints with "
    "every channel marked new, SecureSaver seals the same (channel, version) again with a "
    "fresh nonce, so the stored bytes differ although they open to the same value (passes "
    "over a plain InMemorySaver: variant secure_plain_memory)")
KNOWN_ARTIFACTS: dict[str, dict[str, str]] = {"memory": {
    f"tests/test_checkpoint_migration::{name}[<ckpt>-{version}]": _IMMUTABLE
    for name in ("test_saved_checkpoint_state_graph", "test_saved_checkpoint_state_graph_async")
    for version in ("3", "2-start:*", "2-quadratic")
}}

TENANCY_MODES = ("default", "scope", "config")
#: artifacts of one tenancy mode only: (mode, backend) -> {test key: reason}
_CONFIG_RAW_TOO = (
    "fails with the raw saver too when run side by side on the same configs (--compare): the "
    "tenant_id the harness adds to the test's configurable is copied by LangGraph into checkpoint "
    "metadata, stream/debug events and run metadata, which the test compares exactly")
#: config mode: the tests that fail with the raw saver too (measured with --compare on SQLite;
#: every one of them fails wrapped and raw with a tenant_id in the compared value)
CONFIG_MODE_RAW_FAILURES = (
    "tests/test_checkpoint_migration::test_latest_checkpoint_state_graph[<ckpt>]",
    "tests/test_checkpoint_migration::test_latest_checkpoint_state_graph_async[<ckpt>]",
    "tests/test_checkpoint_migration::test_saved_checkpoint_state_graph[<ckpt>-2-quadratic]",
    "tests/test_checkpoint_migration::test_saved_checkpoint_state_graph[<ckpt>-2-start:*]",
    "tests/test_checkpoint_migration::test_saved_checkpoint_state_graph[<ckpt>-3]",
    "tests/test_checkpoint_migration::test_saved_checkpoint_state_graph_async[<ckpt>-2-quadratic]",
    "tests/test_checkpoint_migration::test_saved_checkpoint_state_graph_async[<ckpt>-2-start:*]",
    "tests/test_checkpoint_migration::test_saved_checkpoint_state_graph_async[<ckpt>-3]",
    "tests/test_large_cases::test_conditional_state_graph[<ckpt>]",
    "tests/test_large_cases::test_doubly_nested_graph_state[<ckpt>]",
    "tests/test_large_cases::test_dynamic_interrupt[<ckpt>]",
    "tests/test_large_cases::test_dynamic_interrupt_subgraph[<ckpt>]",
    "tests/test_large_cases::test_fork_always_re_runs_nodes[<ckpt>]",
    "tests/test_large_cases::test_invoke_two_processes_in_out_interrupt[<ckpt>]",
    "tests/test_large_cases::test_message_graph[<ckpt>]",
    "tests/test_large_cases::test_nested_graph_state[<ckpt>]",
    "tests/test_large_cases::test_partial_pending_checkpoint[<ckpt>]",
    "tests/test_large_cases::test_root_graph[<ckpt>]",
    "tests/test_large_cases::test_send_dedupe_on_resume[<ckpt>-async]",
    "tests/test_large_cases::test_send_dedupe_on_resume[<ckpt>-exit]",
    "tests/test_large_cases::test_send_dedupe_on_resume[<ckpt>-sync]",
    "tests/test_large_cases::test_send_react_interrupt[<ckpt>]",
    "tests/test_large_cases::test_send_react_interrupt_control[<ckpt>]",
    "tests/test_large_cases::test_state_graph_packets[<ckpt>]",
    "tests/test_large_cases::test_weather_subgraph[<ckpt>]",
    "tests/test_large_cases_async::test_conditional_graph_state[<ckpt>]",
    "tests/test_large_cases_async::test_doubly_nested_graph_state[<ckpt>]",
    "tests/test_large_cases_async::test_fork_always_re_runs_nodes[<ckpt>]",
    "tests/test_large_cases_async::test_invoke_two_processes_in_out_interrupt[<ckpt>]",
    "tests/test_large_cases_async::test_message_graph[<ckpt>]",
    "tests/test_large_cases_async::test_nested_graph_state[<ckpt>]",
    "tests/test_large_cases_async::test_state_graph_packets[<ckpt>]",
    "tests/test_large_cases_async::test_weather_subgraph[<ckpt>]",
    "tests/test_pregel::test_debug_retry[<ckpt>]",
    "tests/test_pregel::test_debug_subgraphs[<ckpt>-async]",
    "tests/test_pregel::test_debug_subgraphs[<ckpt>-exit]",
    "tests/test_pregel::test_debug_subgraphs[<ckpt>-sync]",
    "tests/test_pregel::test_falsy_return_from_task[<ckpt>]",
    "tests/test_pregel::test_in_one_fan_out_state_graph_defer_node[<ckpt>-False]",
    "tests/test_pregel::test_in_one_fan_out_state_graph_defer_node[<ckpt>-True]",
    "tests/test_pregel::test_in_one_fan_out_state_graph_waiting_edge[<ckpt>]",
    "tests/test_pregel::test_interrupt_after_streams_the_checkpoint_it_pauses_on[<ckpt>]",
    "tests/test_pregel::test_parent_command[<ckpt>-False]",
    "tests/test_pregel::test_parent_command[<ckpt>-True]",
    "tests/test_pregel::test_pending_writes_resume[<ckpt>-async]",
    "tests/test_pregel::test_pending_writes_resume[<ckpt>-exit]",
    "tests/test_pregel::test_pending_writes_resume[<ckpt>-sync]",
    "tests/test_pregel::test_recursion_limit_streams_the_last_checkpoint_saved[<ckpt>]",
    "tests/test_pregel_async::test_cancel_graph_astream[<ckpt>]",
    "tests/test_pregel_async::test_cancel_graph_astream_events_v2[<ckpt>]",
    "tests/test_pregel_async::test_debug_retry[<ckpt>]",
    "tests/test_pregel_async::test_debug_subgraphs[<ckpt>-async]",
    "tests/test_pregel_async::test_debug_subgraphs[<ckpt>-exit]",
    "tests/test_pregel_async::test_debug_subgraphs[<ckpt>-sync]",
    "tests/test_pregel_async::test_dynamic_interrupt[<ckpt>]",
    "tests/test_pregel_async::test_dynamic_interrupt_subgraph[<ckpt>]",
    "tests/test_pregel_async::test_in_one_fan_out_state_graph_waiting_edge_custom_state_class[<ckpt>]",
    "tests/test_pregel_async::test_interrupt_after_streams_the_checkpoint_it_pauses_on[<ckpt>]",
    "tests/test_pregel_async::test_parent_command[<ckpt>-False]",
    "tests/test_pregel_async::test_parent_command[<ckpt>-True]",
    "tests/test_pregel_async::test_partial_pending_checkpoint[<ckpt>]",
    "tests/test_pregel_async::test_pending_writes_resume[<ckpt>-async]",
    "tests/test_pregel_async::test_pending_writes_resume[<ckpt>-exit]",
    "tests/test_pregel_async::test_pending_writes_resume[<ckpt>-sync]",
    "tests/test_pregel_async::test_recursion_limit_streams_the_last_checkpoint_saved[<ckpt>]",
    "tests/test_pregel_async::test_send_dedupe_on_resume[<ckpt>-async]",
    "tests/test_pregel_async::test_send_dedupe_on_resume[<ckpt>-exit]",
    "tests/test_pregel_async::test_send_dedupe_on_resume[<ckpt>-sync]",
    "tests/test_pregel_async::test_send_react_interrupt[<ckpt>]",
    "tests/test_pregel_async::test_send_react_interrupt_control[<ckpt>]",
)
KNOWN_MODE_ARTIFACTS: dict[tuple[str, str], dict[str, str]] = {
    ("config", backend): dict.fromkeys(CONFIG_MODE_RAW_FAILURES, _CONFIG_RAW_TOO)
    for backend in ("memory", "sqlite", "postgres")
}


def known_artifacts(backend: str, tenancy: str, compare: bool = False) -> dict[str, str]:
    """The listed artifacts of a run. With ``--compare`` the mode's list (tests that fail raw
    too) is not used: the raw run side by side decides, test by test."""
    if compare:
        return dict(KNOWN_ARTIFACTS.get(backend, {}))
    return {**KNOWN_ARTIFACTS.get(backend, {}),
            **KNOWN_MODE_ARTIFACTS.get((tenancy, backend), {})}


_FIXTURE_USE = re.compile(r"\b(a?sync_checkpointer)\b")


def langgraph_version() -> str:
    return importlib.metadata.version("langgraph")


def prepare(version: str, cache: Path) -> Path:
    """The patched sdist tree for ``version`` (downloaded and patched once, then reused)."""
    root = cache / f"langgraph-{version}"
    marker = root / ".securesaver-patched"
    stamp = f"{version} {patch_digest()}"
    if marker.exists() and marker.read_text() == stamp:
        return root
    cache.mkdir(parents=True, exist_ok=True)
    sdist = cache / f"langgraph-{version}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", f"langgraph=={version}", "-d", str(cache)],
            check=True)
    if root.exists():
        shutil.rmtree(root)
    with tarfile.open(sdist) as tar:
        tar.extractall(cache, filter="data")
    # test the installed package, never the sdist's copy of its source
    shutil.rmtree(root / "langgraph")
    tests = root / "tests"
    for target, patch in (("conftest_checkpointer.py", "checkpointer_patch.py"),
                          ("conftest.py", "conftest_patch.py")):
        path = tests / target
        text = path.read_text()
        if PATCH_MARK not in text:
            path.write_text(text + "\n\n" + (HERE / patch).read_text())
    marker.write_text(stamp)
    return root


def patch_digest() -> str:
    """Changes when a patch file changes (the cached tree is then patched again)."""
    import hashlib
    digest = hashlib.sha256()
    for name in ("checkpointer_patch.py", "conftest_patch.py"):
        digest.update((HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def test_files(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in (root / "tests").glob("test_*.py")
        if _FIXTURE_USE.search(p.read_text()))


def run_backend(root: Path, backend: str, compare: bool, workers: int, extra: list[str],
                out: Path, targets: list[str] | None = None, tag: str = "",
                tenancy: str = "default"
                ) -> tuple[dict[str, dict[str, str]], dict[str, str], float, int]:
    """One pytest process for ``backend`` over ``targets`` (default: every checkpointer file).
    Returns (results, node ids of the wrapped tests by key, seconds, pytest exit code)."""
    sync_s, async_s, sync_r, async_r = BACKENDS[backend]
    sync_names, async_names = [sync_s], [async_s]
    if compare:
        sync_names.insert(0, sync_r)
        async_names.insert(0, async_r)
    shim = out / "pythonpath"
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / "langgraph_securesaver"
    if not link.exists():
        link.symlink_to(REPO / "langgraph_securesaver")
    env = dict(os.environ)
    env.update({
        "LG_SYNC_CKPTS": ",".join(sync_names),
        "LG_ASYNC_CKPTS": ",".join(async_names),
        "NO_DOCKER": "true",  # no redis, in-memory stores; checkpointers come from LG_*_CKPTS
        "LG_POSTGRES_URI": os.environ.get("LG_POSTGRES_URI",
                                          "postgresql://postgres@127.0.0.1:5432/"),
        "PYTHONPATH": os.pathsep.join(
            [str(shim), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS": "",
        "SS_TENANCY": tenancy,
    })
    junit = out / f"junit-{backend}-{tenancy}{tag}.xml"
    if junit.exists():
        junit.unlink()
    cmd = [sys.executable, "-m", "pytest", *(targets or test_files(root)), "-q",
           "-p", "no:cacheprovider", "-o", "addopts=--strict-markers --snapshot-warn-unused",
           f"--junitxml={junit}", "-W", "ignore::DeprecationWarning"]
    if workers:
        cmd += ["-n", str(workers)]
    cmd += extra
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=root, env=env)
    elapsed = time.monotonic() - started
    variants = {n: "raw" for n in (sync_r, async_r)}
    variants.update({n: "secure" for n in (sync_s, async_s)})
    results, nodeids = parse_junit(junit, variants)
    return results, nodeids, elapsed, proc.returncode


def rerun_failures(root: Path, backend: str, results: dict[str, dict[str, str]],
                   nodeids: dict[str, str], out: Path, tenancy: str = "default") -> list[str]:
    """Run the wrapped tests that did not pass once more, alone and serially. Some upstream
    tests order their output by sleeping a few milliseconds; on a loaded machine (xdist, other
    jobs) an extra millisecond of encryption or redaction in a write can reorder them. A test
    that passes alone is reported as "passed on rerun", never silently."""
    artifacts = known_artifacts(backend, tenancy)
    failed = [k for k, by in results.items() if by.get("secure") in ("failure", "error")
              and k not in artifacts and k in nodeids]
    if not failed or len(failed) > 20:  # many failures are not flakes: report them as they are
        return []
    again, _ids, _t, _code = run_backend(root, backend, False, 0, [], out,
                                         targets=[nodeids[k] for k in failed], tag="-rerun",
                                         tenancy=tenancy)
    passed = []
    for key in failed:
        if again.get(key, {}).get("secure") == "passed":
            results[key]["secure"] = "passed on rerun"
            passed.append(key)
    return passed


def parse_junit(path: Path, variants: dict[str, str]
                ) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """{test id with the checkpointer param replaced by the backend: {variant: outcome}};
    ``variants`` maps this run's checkpointer names to "raw" or "secure"."""
    results: dict[str, dict[str, str]] = {}
    nodeids: dict[str, str] = {}
    if not path.exists():
        return results, nodeids
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        file = (case.get("classname") or "").split(".")
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = child.tag
            elif child.tag == "skipped":
                outcome = "skipped"
        m = re.search(r"^(.*)\[(.*)\]$", name)
        side, key_name = "raw", name
        if m:
            params = m.group(2).split("-")
            # the checkpointer param: a wrapped variant's name, else the first raw one (other
            # fixtures have params like "memory"/"sqlite" too, e.g. the cache fixture)
            hits = [i for i, p in enumerate(params) if variants.get(p) == "secure"] or [
                i for i, p in enumerate(params) if variants.get(p) == "raw"][:1]
            for i in hits[:1]:
                side = variants[params[i]]
                params[i] = "<ckpt>"
            key_name = f"{m.group(1)}[{'-'.join(params)}]"
        key = f"{'/'.join(file[:2])}::{key_name}"
        results.setdefault(key, {})[side] = outcome
        if side == "secure":
            nodeids[key] = f"{'/'.join(file[:-1])}/{file[-1]}.py::{name}" if len(file) > 1 \
                else name
    return results, nodeids


def summarize(backend: str, results: dict[str, dict[str, str]], compare: bool,
              tenancy: str = "default") -> tuple[list[str], str]:
    problems: list[str] = []
    artifacts = known_artifacts(backend, tenancy, compare)
    counts: dict[str, dict[str, int]] = {}
    for key, by_variant in sorted(results.items()):
        secure = [o for v, o in by_variant.items() if v == "secure"]
        if not secure:
            continue  # not parametrized by the checkpointer fixtures
        for variant, outcome in by_variant.items():
            side = "securesaver" if variant == "secure" else "raw"
            if side == "securesaver" and outcome != "passed" and key in artifacts:
                outcome += " (known artifact)"
            counts.setdefault(side, {}).setdefault(outcome, 0)
            counts[side][outcome] += 1
        ok = all(o in ("passed", "skipped", "passed on rerun") for o in secure)
        if compare:
            raw = by_variant.get("raw")
            if raw == "passed" and not ok and key not in artifacts:
                problems.append(f"{key}: passes raw, {secure[0]} wrapped")
        elif not ok and key not in artifacts:
            problems.append(f"{key}: {secure[0]}")
    line = f"{backend} ({tenancy}): " + "; ".join(
        f"{side} " + ", ".join(f"{n} {o}" for o, n in sorted(c.items()))
        for side, c in sorted(counts.items()))
    return problems, line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="memory,sqlite,postgres")
    parser.add_argument("--compare", action="store_true",
                        help="also run the raw savers and compare test by test")
    parser.add_argument("-n", "--workers", type=int, default=0,
                        help="pytest-xdist workers per backend (0: no xdist)")
    parser.add_argument("--tenancy", default="default",
                        help="comma-separated tenancy modes: default, scope, config")
    parser.add_argument("--cache", type=Path, default=REPO / ".upstream")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    version = langgraph_version()
    root = prepare(version, args.cache)
    print(f"langgraph {version}: {len(test_files(root))} checkpointer-parametrized test files",
          flush=True)
    out = args.cache / "results"
    out.mkdir(parents=True, exist_ok=True)
    all_problems: list[str] = []
    all_results: list[tuple[str, str, dict[str, dict[str, str]]]] = []
    lines: list[str] = []
    modes = [m.strip() for m in args.tenancy.split(",") if m.strip()]
    for mode in modes:
        if mode not in TENANCY_MODES:
            parser.error(f"unknown tenancy mode {mode!r}; use {TENANCY_MODES}")
    for mode in modes:
        for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
            if backend not in BACKENDS:
                parser.error(f"unknown backend {backend!r}; use {sorted(BACKENDS)}")
            results, nodeids, elapsed, code = run_backend(
                root, backend, args.compare, args.workers, args.pytest_args, out,
                tenancy=mode)
            if not results:
                all_problems.append(f"{backend} ({mode}): no results (pytest exit {code})")
                continue
            for key in rerun_failures(root, backend, results, nodeids, out, mode):
                print(f"passed on rerun ({backend}, {mode}, alone, serially): {key}",
                      flush=True)
            all_results.append((backend, mode, results))
            problems, line = summarize(backend, results, args.compare, mode)
            lines.append(f"{line}  ({elapsed:.0f} s)")
            all_problems += [f"({mode}) {p}" for p in problems]
    print("\n== LangGraph's own suite with SecureSaver ==")
    for line in lines:
        print(line)
    for backend, mode, results in all_results:
        for key, reason in known_artifacts(backend, mode, args.compare).items():
            if key in results:
                print(f"known harness artifact ({backend}, {mode}): {key}: {reason}")
    for problem in all_problems:
        print("FAIL", problem)
    return 1 if all_problems else 0


if __name__ == "__main__":
    sys.exit(main())
