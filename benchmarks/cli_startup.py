"""Start-up of the ``securesaver`` read commands: time from launching the process to its first
database query.

Builds a small SQLite database with ``securesaver demo`` (two tenants, a few threads, one
refused read) unless ``--db`` names one, then runs each command as a user does
(``python -m langgraph_securesaver.cli ...``, stdout to /dev/null) ``--repeat`` times after one
warm-up run, and prints per command the medians (and min-max) of:

* the wall time from launching the process to its first ``sqlite3.connect`` (seen by an audit
  hook installed through a ``sitecustomize`` in a temporary directory: nothing of the package
  is changed or imported early),
* the CPU time of the process at that moment (less sensitive to a busy machine),
* the wall time of the whole process (the query, the output, the interpreter's exit).

The package is imported from bytecode, as installed (``pip`` compiles it): bytecode is written
to a temporary cache (``PYTHONPYCACHEPREFIX``) on the warm-up run. ``--source`` compiles the
package's modules on every run instead (``PYTHONDONTWRITEBYTECODE=1``, an editable checkout
without ``__pycache__``). ``--compare DIR`` runs every command also with the package from
another source tree, alternating runs, so both see the same machine load. ``--importtime``
prints, per tree, the median ``-X importtime`` of the first command: the largest top-level
imports (cumulative) and the self time per top-level package.

    python benchmarks/cli_startup.py [--repeat 5] [--db PATH] [--compare DIR] [--source]
                                     [--importtime]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_HOOK = """\
import os, sys, time
_out = os.environ.get("CLI_STARTUP_OUT")
if _out:
    _t0 = float(os.environ["CLI_STARTUP_T0"])
    def _first_query(event, args, _done=[]):
        if not _done and event == "sqlite3.connect":
            _done.append(1)
            with open(_out, "a") as f:
                f.write(f"{time.time() - _t0} {time.process_time()}\\n")
    sys.addaudithook(_first_query)
"""


def _commands(url: str) -> list[list[str]]:
    return [["events", "--url", url, "--tenant", "acme"],
            ["events", "--url", url, "--tenant", "acme", "--format", "json"],
            ["audit", "--url", url, "--tenant", "acme"],
            ["audit", "--url", url, "--tenant", "acme", "--format", "json"],
            ["audit", "--url", url]]


def _env(tree: Path, work: Path, source: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SECURESAVER_MASTER_KEY"}
    env.update(PYTHONPATH=f"{tree}{os.pathsep}{work / 'hook'}", COLUMNS="200",
               CLI_STARTUP_WORK=str(work))
    if source:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / f"pycache-{abs(hash(str(tree)))}")
    return env


def _run(args: list[str], env: dict[str, str], work: Path) -> tuple[float, float, float, int]:
    out = work / "first-query"
    out.unlink(missing_ok=True)
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "langgraph_securesaver.cli", *args],
                          env={**env, "CLI_STARTUP_OUT": str(out), "CLI_STARTUP_T0": repr(t0)},
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False,
                          cwd=work)   # `python -m` puts the working directory first on sys.path
    wall = time.time() - t0
    if not out.exists():
        raise SystemExit(f"no query seen: {' '.join(args)}: {proc.stderr.decode()[-500:]}")
    first, cpu = map(float, out.read_text().split()[:2])
    return first, cpu, wall, proc.returncode


def _importtime(args: list[str], env: dict[str, str], repeat: int) -> str:
    top: dict[str, list[int]] = collections.defaultdict(list)
    own: dict[str, list[int]] = collections.defaultdict(list)
    for _ in range(repeat):
        err = subprocess.run([sys.executable, "-X", "importtime", "-m",
                              "langgraph_securesaver.cli", *args], env=env,
                             capture_output=True, text=True, check=False,
                             cwd=env["CLI_STARTUP_WORK"]).stderr
        per_top: collections.Counter[str] = collections.Counter()
        per_pkg: collections.Counter[str] = collections.Counter()
        for line in err.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
            if m:
                if len(m[3]) == 1:
                    per_top[m[4]] += int(m[2])
                per_pkg[m[4].split(".")[0]] += int(m[1])
        for name, us in per_top.items():
            top[name].append(us)
        for name, us in per_pkg.items():
            own[name].append(us)

    def med(values: list[int]) -> float:
        return statistics.median(values + [0] * (repeat - len(values))) / 1000

    total = sum(med(v) for v in own.values())
    largest = sorted(top, key=lambda k: -med(top[k]))[:10]
    packages = sorted(own, key=lambda k: -med(own[k]))[:10]
    return (f"  imports: {total:.0f} ms (sum of self times)\n"
            "  largest top-level imports (cumulative ms): "
            + ", ".join(f"{k} {med(top[k]):.1f}" for k in largest) + "\n"
            "  self time per package (ms): "
            + ", ".join(f"{k} {med(own[k]):.1f}" for k in packages))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db", type=Path, help="an existing SecureSaver SQLite database")
    parser.add_argument("--compare", type=Path, metavar="DIR",
                        help="also run the package of this source tree (alternating runs)")
    parser.add_argument("--source", action="store_true",
                        help="compile the package on every run (no bytecode cache)")
    parser.add_argument("--importtime", action="store_true")
    opts = parser.parse_args()
    trees = [ROOT, *([opts.compare.resolve()] if opts.compare else [])]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "hook").mkdir()
        (work / "hook" / "sitecustomize.py").write_text(_HOOK)
        db = opts.db
        if db is None:
            db = work / "demo.db"
            subprocess.run([sys.executable, "-m", "langgraph_securesaver.cli", "demo", "--db",
                            str(db)], env=_env(ROOT, work, True), check=True,
                           stdout=subprocess.DEVNULL, cwd=work)
        url = f"sqlite:///{db.resolve()}"
        envs = {tree: _env(tree, work, opts.source) for tree in trees}
        for tree, env in envs.items():       # each run imports the package of its own tree
            found = subprocess.run([sys.executable, "-c", "import langgraph_securesaver as p; "
                                    "print(p.__file__)"], env=env, cwd=work, check=True,
                                   capture_output=True, text=True).stdout.strip()
            if not Path(found).resolve().is_relative_to(tree):
                raise SystemExit(f"{tree}: the package is imported from {found}")
        print(f"python {sys.version.split()[0]}, {'source' if opts.source else 'bytecode'}, "
              f"median of {opts.repeat} (min-max), load average "
              f"{os.getloadavg()[0]:.1f}")
        for args in _commands(url):
            runs: dict[Path, list[tuple[float, float, float, int]]] = {t: [] for t in trees}
            for i in range(opts.repeat + 1):
                for tree in trees:
                    result = _run(args, envs[tree], work)
                    if i:                               # the first run is a warm-up
                        runs[tree].append(result)
            shown = " ".join(a if not a.startswith("sqlite:") else "URL" for a in args)
            print(f"securesaver {shown}")
            for tree in trees:
                first, cpu, wall, codes = zip(*runs[tree], strict=True)
                print(f"  {tree.name:>12}: first query {statistics.median(first):.3f} s "
                      f"({min(first):.3f}-{max(first):.3f}), CPU {statistics.median(cpu):.3f} "
                      f"s, process {statistics.median(wall):.3f} s, exit {sorted(set(codes))}")
        if opts.importtime:
            for tree in trees:
                print(f"-X importtime, securesaver {' '.join(_commands('URL')[0])}, "
                      f"{tree.name}:")
                print(_importtime(_commands(url)[0], envs[tree], opts.repeat))
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
