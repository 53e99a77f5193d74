"""Run LangGraph's own store tests with SecureStore wrapping each store.

Fetches the sdists of the *installed* ``langgraph-checkpoint`` (``tests/test_store.py``),
``langgraph-checkpoint-sqlite`` and ``langgraph-checkpoint-postgres`` (``tests/test_store.py``,
``tests/test_async_store.py``) with ``pip download --no-binary``, and runs each file twice in
one go: as shipped (the raw stores) and patched -- one line appended that rebinds the store
classes the module imported to SecureStore-wrapping factories (``store_patch.py``). A test that
passes raw but not wrapped is a failure unless it is listed in KNOWN_ARTIFACTS with its reason.

    python tests/upstream/run_store_suite.py                    # every suite
    python tests/upstream/run_store_suite.py --suites sqlite -- -k filter

PostgreSQL suites use ``LG_POSTGRES_URI`` (default ``postgres://postgres@127.0.0.1:5432/``),
whose user may create databases (upstream creates one per test).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PATCH_LINE = ("\n\n# appended by langgraph-securesaver's store harness\n"
              "import store_patch as _ss_store_patch  # noqa: E402\n"
              "_ss_store_patch.wrap_module(globals())\n")

#: suite -> (distribution, its package directory in the sdist, test files)
SUITES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "memory": ("langgraph-checkpoint", "langgraph", ("tests/test_store.py",)),
    "sqlite": ("langgraph-checkpoint-sqlite", "langgraph",
               ("tests/test_store.py", "tests/test_async_store.py")),
    "postgres": ("langgraph-checkpoint-postgres", "langgraph",
                 ("tests/test_store.py", "tests/test_async_store.py")),
}
UPSTREAM_PG = ("postgres://postgres:postgres@localhost:5441/", "localhost:5441")

_RAW_ROWS = ("expires or re-dates rows with raw SQL on the store table, addressing them by the "
             "caller's namespace (WHERE prefix = 'page'); SecureStore keeps every row under its "
             "tenant prefix, so the edit touches nothing and the expiry the test expects never "
             "happens")
_CONNS = ("default", "pipe", "pool")
#: "suite::file::test id": reason
KNOWN_ARTIFACTS: dict[str, str] = {
    "memory::tests.test_store::test_async_batch_store_deduplication": (
        "spies on the InMemoryStore class's batch method to count inner calls; the store the "
        "wrapper opens is an instance of the raw class, not of the spied name"),
    **{f"postgres::tests.{file}::{test}[{param}]": _RAW_ROWS
       for file in ("test_store", "test_async_store")
       for test, params in (
           ("test_omit_expired_filters_read_paths", _CONNS),
           ("test_omit_expired_refresh_ttl_only_refreshes_live_rows", _CONNS),
           ("test_omit_expired_search_pagination", _CONNS))
       for param in params},
    **{f"sqlite::tests.test_store::test_sql_injection_vulnerability[{conn}]": (
        "expects SqliteStore's ValueError for a filter key it would splice into SQL; "
        "SecureStore never hands a caller's filter key to the inner store (it sends keyed "
        "digests, or filters after decryption), so the malicious key matches nothing instead "
        "of raising -- no injection either way") for conn in ("memory", "file")},
}


def prepare(suite: str, cache: Path) -> tuple[Path, Path]:
    """(raw tree, patched tree) of the suite's sdist, downloaded and extracted once."""
    dist, package, files = SUITES[suite]
    version = importlib.metadata.version(dist)
    base = cache / f"{dist}-{version}"
    raw, patched = base / "raw", base / "secure"
    marker = base / ".prepared"
    if marker.exists():
        return raw, patched
    cache.mkdir(parents=True, exist_ok=True)
    name = dist.replace("-", "_")
    sdists = list(cache.glob(f"{name}-{version}.tar.gz")) + list(
        cache.glob(f"{dist}-{version}.tar.gz"))
    if not sdists:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", ":all:", f"{dist}=={version}", "-d", str(cache)],
                       check=True)
        sdists = list(cache.glob(f"{name}-{version}.tar.gz")) + list(
            cache.glob(f"{dist}-{version}.tar.gz"))
    if base.exists():
        shutil.rmtree(base)
    for tree in (raw, patched):
        tree.mkdir(parents=True)
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(tree, filter="data")
        (top,) = list(tree.iterdir())
        shutil.rmtree(top / package, ignore_errors=True)  # test the installed package
        for path in (top / "tests").glob("*.py"):
            text = path.read_text()
            for old in UPSTREAM_PG:
                text = text.replace(old, "postgres://postgres@127.0.0.1:5432/"
                                    if old.startswith("postgres") else "127.0.0.1:5432")
            path.write_text(text)
        (top / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    for rel in files:
        target = next(patched.iterdir()) / rel
        target.write_text(target.read_text() + PATCH_LINE)
    marker.write_text(version)
    return raw, patched


def run(tree: Path, files: tuple[str, ...], junit: Path, extra: list[str]) -> None:
    (top,) = [p for p in tree.iterdir() if p.is_dir()]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO),
                                         *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("LG_POSTGRES_URI", "postgres://postgres@127.0.0.1:5432/")
    if junit.exists():
        junit.unlink()
    subprocess.run([sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
                    f"--junitxml={junit}", "-W", "ignore::DeprecationWarning", *extra],
                   cwd=top, env=env)


def outcomes(junit: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    if not junit.exists():
        return found
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = child.tag
            elif child.tag == "skipped":
                outcome = "skipped"
        found[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return found


def _rerun(tree: Path, tests: list[str], junit: Path, extra: list[str]) -> dict[str, str]:
    """Run these tests (``tests.file::name[param]`` ids from the junit report) once more."""
    ids = []
    for test in tests:
        module, _sep, name = test.partition("::")
        ids.append(module.replace(".", "/") + ".py::" + name)
    serial: list[str] = []
    skip = False
    for arg in extra:               # the few reruns run in one process (no -n N)
        if skip or arg == "-n" or arg.startswith("-n"):
            skip = arg == "-n"
            continue
        serial.append(arg)
    run(tree, tuple(ids), junit, serial)
    return outcomes(junit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", default="memory,sqlite,postgres")
    parser.add_argument("--cache", type=Path, default=REPO / ".upstream" / "store")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    problems: list[str] = []
    for suite in [s.strip() for s in args.suites.split(",") if s.strip()]:
        raw, patched = prepare(suite, args.cache)
        files = SUITES[suite][2]
        junits = {}
        for side, tree in (("raw", raw), ("secure", patched)):
            junits[side] = args.cache / f"junit-{suite}-{side}.xml"
            run(tree, files, junits[side], args.pytest_args)
        raw_out, secure_out = outcomes(junits["raw"]), outcomes(junits["secure"])
        counts: dict[str, dict[str, int]] = {}
        for side, out in (("raw", raw_out), ("secure", secure_out)):
            for outcome in out.values():
                counts.setdefault(side, {}).setdefault(outcome, 0)
                counts[side][outcome] += 1
        artifacts = 0
        failing: list[str] = []
        for test, outcome in sorted(raw_out.items()):
            if outcome != "passed" or secure_out.get(test) == "passed":
                continue
            key = f"{suite}::{test}"
            if key in KNOWN_ARTIFACTS:
                artifacts += 1
                continue
            failing.append(test)
        # upstream's TTL tests leave 2 s of margin on a 6 s TTL: on a loaded machine a test
        # can miss it once; each such test runs once more, and counts only if it fails again
        rerun = _rerun(patched, failing, args.cache / f"junit-{suite}-rerun.xml",
                       args.pytest_args) if failing else {}
        for test in failing:
            if rerun.get(test) == "passed":
                print(f"{suite}: {test} failed wrapped once, passed on its rerun", flush=True)
                continue
            problems.append(f"{suite}::{test}: passes raw, "
                            f"{secure_out.get(test, 'missing')} wrapped (and on its rerun)")
        print(f"{suite}: " + "; ".join(
            f"{side} " + ", ".join(f"{n} {o}" for o, n in sorted(c.items()))
            for side, c in sorted(counts.items())) + f"; known artifacts {artifacts}",
            flush=True)
    for line in problems:
        print("PROBLEM", line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))



