"""Build the sdist and the wheel as a release would and fail on any warning: the build's
own output must hold no "warning", ``twine check`` must pass, and the sdist must ship the
license, changelog, docs and examples.

Run: python tests/packaging_check.py      (needs the ``release`` extra: build, twine)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUST_SHIP = ("LICENSE", "CHANGELOG.md", "README.md", "docs/index.md", "docs/concepts/keys.md",
             "examples/quickstart_sqlite.py", "examples/langgraph_server/langgraph.json",
             "mkdocs.yml")


def main() -> int:
    with tempfile.TemporaryDirectory() as out:
        # PYTHONDONTWRITEBYTECODE makes setuptools warn that it skips byte-compiling: that is
        # this environment, not the package
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        built = subprocess.run([sys.executable, "-m", "build", "--outdir", out, str(ROOT)],
                               capture_output=True, text=True, env=env)
        log = built.stdout + built.stderr
        if built.returncode != 0:
            print(log)
            print("build failed")
            return 1
        warnings = [line for line in log.splitlines() if re.search(r"warn", line, re.I)]
        if warnings:
            print("\n".join(warnings))
            print(f"build printed {len(warnings)} warning line(s)")
            return 1
        dists = sorted(str(p) for p in Path(out).iterdir())
        check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *dists],
                               capture_output=True, text=True)
        if check.returncode != 0:
            print(check.stdout + check.stderr)
            print("twine check failed")
            return 1
        sdist = next(Path(out).glob("*.tar.gz"))
        with tarfile.open(sdist) as tar:
            names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        missing = [name for name in MUST_SHIP if name not in names]
        if missing:
            print(f"the sdist lacks {missing}")
            return 1
        print(f"built {', '.join(Path(d).name for d in dists)}: no warnings, twine check "
              f"passed, sdist ships {len(names)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
