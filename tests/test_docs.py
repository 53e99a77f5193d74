"""The documentation a newcomer reads: a short README, and text about the software rather
than about its development.

Checked files: README.md, CHANGELOG.md, every page under docs/, and every module, class and
function docstring of the package. The phrases refused (case-insensitive regular
expressions) are listed in ``JOURNAL_PHRASES``; each names a development-journal habit --
issue and ticket numbers, work sessions and rounds, reviews, comparisons with former code,
"latest run" benchmark history -- chosen narrowly enough that ordinary technical words pass
(a PostgreSQL *session* lock, the *previous* data-key version, a key *used to* seal).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 180

JOURNAL_PHRASES: dict[str, str] = {
    "issue number": r"\bissues? ?#?\d+",
    "ticket reference": r"(?<![\w&/`])#\d+\b",
    "work session": r"\b(this|that|previous|earlier|last|next|same|one|a later|the final) "
                    r"session('s)?\b",
    "session's": r"\bsession's\b",
    "round": r"\bthis round\b",
    "previously": r"\bpreviously\b",
    "former code": r"\bthe previous (version|code|run|measurement|one|build|session|statement|"
                   r"machine)\b",
    "used to": r"\b(it|we|this|that|they|which) used to\b",
    "review": r"\b(reviews? found|attacker reviews?|review clean-up|found by (this|the|a) "
              r"\w* ?review)\b",
    "before this": r"\bbefore this (change|release|fix|work|version|session|rule|round)\b",
    "an earlier build": r"\ban earlier (version|build|run|work|code)\b",
    "benchmark history": r"\b(latest|last|fresh|final) (benchmark )?run\b",
    "earlier in time": r"\b(half an hour earlier|in the same hour|until the previous)\b",
    "old and new code": r"\b(old|new) and (old|new) code\b|\bthe (old|previous) code\b",
    "the fix": r"\bwithout the fix(es)?\b|\bfail(s|ed)? on the previous\b",
    "colleagues": r"\bother engineers\b|\bthe lead\b",
    "history section": r"^History:",
    "we": r"\bwe\b",
}
PATTERN = re.compile("|".join(f"(?P<p{i}>{p})" for i, p in enumerate(JOURNAL_PHRASES.values())),
                     re.IGNORECASE | re.MULTILINE)
NAMES = list(JOURNAL_PHRASES)


def _text_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _docstrings() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "langgraph_securesaver").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}"
                    found.append((where, doc))
    return found


def _hits(text: str) -> list[str]:
    hits = []
    for match in PATTERN.finditer(text):
        kind = NAMES[int(next(k for k, v in match.groupdict().items() if v)[1:])]
        hits.append(f"{kind}: {match.group(0)!r}")
    return hits


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


@pytest.mark.parametrize("path", _text_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_write_about_the_software(path: Path) -> None:
    bad = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        bad += [f"line {number}: {hit}" for hit in _hits(line)]
    assert not bad, bad


def test_docstrings_write_about_the_software() -> None:
    bad = [f"{where}: {hit}" for where, doc in _docstrings() for hit in _hits(doc)]
    assert not bad, bad


@pytest.mark.parametrize("sample", [
    "fixed in issue 12", "see #31", "this session's attacker review", "previously it failed",
    "Last run (200 turns)", "the previous code took 6 s", "History: it was slow",
    "found by the attacker review", "we measured",
])
def test_the_check_catches_journal_wording(sample: str) -> None:
    assert _hits(sample), sample


@pytest.mark.parametrize("sample", [
    "a session advisory lock", "the previous data-key version", "the key used to seal it",
    "`IdempotencyStore(session_lock=False)`", "a database session", "HTML entity &#39;",
    "the run's configurable", "issued", "run it twice",
])
def test_the_check_passes_technical_wording(sample: str) -> None:
    assert not _hits(sample), sample


def test_every_markdown_link_into_the_repository_resolves() -> None:
    """README and docs links to files of the repository point at files that exist."""
    link = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
    missing = []
    for path in _text_files():
        for target, _anchor in link.findall(path.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                missing.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not missing, missing


def test_the_getting_started_snippet_runs_as_written(tmp_path: Path, monkeypatch) -> None:
    """The first graph of docs/getting-started.md defines everything it uses (``builder``
    too) and runs in a directory holding only a keyring file."""
    from langgraph_securesaver import Keyring
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    snippet = page.split("## The first graph", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    Keyring.generate().save(tmp_path / "keyring.json")
    scope: dict[str, object] = {}
    exec(compile(snippet, "getting-started.md", "exec"), scope)
    assert scope["threads"]


def test_configuration_lists_every_securesaver_option() -> None:
    import inspect

    from langgraph_securesaver import SecureSaver
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8")
    options = [n for n, p in inspect.signature(SecureSaver.__init__).parameters.items()
               if p.kind is p.KEYWORD_ONLY]
    missing = [n for n in options if f"| `{n}` |" not in page]
    assert options and not missing, missing


PUBLIC_SUBPACKAGES = ("store", "redaction", "idempotency", "server", "evidence")


def test_the_api_reference_lists_every_public_name() -> None:
    """docs/reference/api.md has a ``:::`` entry for every name of the package's ``__all__``
    and of its public subpackages' (under the top-level path when it is the same object)."""
    import importlib
    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^::: (langgraph_securesaver[\w.]*)$", page, re.M))
    top = importlib.import_module("langgraph_securesaver")
    missing = [n for n in top.__all__ if n != "__version__"
               and f"langgraph_securesaver.{n}" not in listed]
    for sub in PUBLIC_SUBPACKAGES:
        module = importlib.import_module(f"langgraph_securesaver.{sub}")
        for n in module.__all__:
            same = n in top.__all__ and getattr(top, n) is getattr(module, n)
            if f"langgraph_securesaver.{sub}.{n}" not in listed and not (
                    same and f"langgraph_securesaver.{n}" in listed):
                missing.append(f"{sub}.{n}")
    assert not missing, missing
    for name in ("SecureStore", "secure_pair", "asecure_pair", "Redactor", "IdempotencyStore",
                 "idempotent_tool_node"):
        assert re.search(rf"^::: langgraph_securesaver(\.\w+)?\.{name}$", page, re.M), name


def test_the_api_reference_renders_google_docstrings_without_sphinx_roles() -> None:
    """The docstrings are Google style (``Args:``): the site parses them as such, and the
    Sphinx roles they use to name objects become inline code instead of literal text."""
    import sys
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "docstring_style: google" in config and "docstring_style: sphinx" not in config
    assert "tools/griffe_roles.py:SphinxRolesAsCode" in config
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from griffe_roles import plain_roles
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert plain_roles("a :class:`~.keys.keyring.Keyring` or :func:`.tenancy.tenant_scope`, "
                       ":meth:`SecureSaver.prune`") == \
        "a `Keyring` or `tenancy.tenant_scope`, `SecureSaver.prune`"
    api = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    internal = re.search(r"filters: \[.*\]", api).group(0)
    assert "gate_class" in internal and "keys" in internal


REPO_URL = "https://github.com/langgraph-securesaver/langgraph-securesaver/"


def test_readme_links_work_on_the_package_index() -> None:
    """The README is also the package index page, where a relative link resolves against the
    index, not the repository: every link is absolute, and every link into this repository
    (``blob/main/PATH``, ``tree/main/PATH``) names a file or folder that exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    targets += re.findall(r"^\[[^]]+\]:\s*(\S+)", readme, re.M)
    assert targets
    relative = [t for t in targets if "://" not in t and not t.startswith("#")]
    assert not relative, relative
    missing = [t for t in targets if t.startswith(REPO_URL)
               and not (ROOT / re.sub(r"^(blob|tree)/main/", "", t[len(REPO_URL):])
                        .split("#")[0]).exists()]
    assert not missing, missing
    used = set(re.findall(r"\]\[([^]]+)\]", readme))
    defined = set(re.findall(r"^\[([^]]+)\]:", readme, re.M))
    assert used <= defined, used - defined


def test_pyproject_urls_match_the_readme_links() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'Repository = "{REPO_URL.rstrip("/")}"' in text


# --- every public name documented --------------------------------------------------------------
def _own_doc(klass: type, name: str) -> str | None:
    """The docstring of the definition of ``name`` that ``klass`` uses (an override without a
    docstring has none, whatever the base class it overrides says)."""
    for base in klass.__mro__:
        if name in vars(base):
            value = vars(base)[name]
            value = getattr(value, "__func__", value)
            if isinstance(value, property):
                value = value.fget
            return getattr(value, "__doc__", None)
    return None


def test_every_public_name_has_a_docstring() -> None:
    import inspect

    import langgraph_securesaver as package
    missing = []
    for name in package.__all__:
        value = getattr(package, name)
        if inspect.isclass(value) or inspect.isfunction(value) or callable(value):
            if not (value.__doc__ or "").strip():
                missing.append(name)
    assert missing == [], missing


def test_every_public_securesaver_method_has_its_own_docstring() -> None:
    from langgraph_securesaver import SecureSaver
    names = [n for n in dir(SecureSaver) if not n.startswith("_")
             and callable(getattr(SecureSaver, n))
             and not isinstance(getattr(SecureSaver, n), type)]
    assert len(names) >= 60, names          # put, list, get_tuple, ... and the async twins
    missing = [n for n in names if not (_own_doc(SecureSaver, n) or "").strip()]
    assert missing == [], missing


def test_from_url_names_its_parameters() -> None:
    """Type checkers and IDEs see the constructor's options on from_url / afrom_url, and the
    LangGraph names are the same constructors."""
    import inspect

    from langgraph_securesaver import SecureSaver
    ctor = set(inspect.signature(SecureSaver.__init__).parameters) - {"self", "inner",
                                                                        "registry"}
    for factory in (SecureSaver.from_url, SecureSaver.afrom_url):
        params = inspect.signature(factory).parameters
        assert not any(p.kind is p.VAR_KEYWORD for p in params.values()), factory
        assert ctor <= set(params), ctor - set(params)
    assert SecureSaver.from_conn_string.__func__ is SecureSaver.from_url.__func__
    assert SecureSaver.afrom_conn_string.__func__ is SecureSaver.afrom_url.__func__


# --- the README's commands are what CI runs ----------------------------------------------------
def _quick_start_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines()]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """The README's second quick-start line installs the test extra and runs the suite; CI
    (.ci/run) installs the same extras into its venv and runs the same command."""
    install, run = (part.strip() for part in _quick_start_commands()[1].split("&&"))
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert run in ci, run
    extras = re.search(r'"\.\[([^]]+)\]"', install).group(1)
    installs = [line for line in ci[:ci.index(run)] if "pip install" in line and ".[" in line]
    assert installs and f'".[{extras}]"' in installs[-1], (extras, installs)


def test_the_quick_start_demo_needs_no_extra() -> None:
    first = _quick_start_commands()[0]
    assert 'pip install -e . ' in first + " " and "securesaver demo" in first


def test_ci_builds_the_docs_strictly_and_checks_the_package() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "mkdocs build --strict" in ci and "tests/packaging_check.py" in ci
