"""Group the flat modules of ``langgraph_securesaver/`` into subpackages by concern.

Run once on a clean checkout, from anywhere::

    python tools/relayout.py            # apply (git mv, new __init__ files, rewrites)
    python tools/relayout.py --dry-run  # print the plan, change nothing

What it does, in order:

1. Checks the checkout: clean work tree, every module of ``MOVES`` present, no target
   subpackage present yet (so it refuses to run twice), and every top-level module placed
   (in ``MOVES`` or ``KEEP``; a module added since the table was written must be placed first).
2. ``git mv`` of each module of ``MOVES`` to its new place; creates each new subpackage's
   ``__init__.py`` (its docstring says what it holds and what it may import), the facades of
   ``cli`` and ``server`` (the ``securesaver`` entry point ``cli:app``, ``python -m
   langgraph_securesaver.cli``, ``langgraph_securesaver.server.checkpointer`` keep working) and
   the shims of ``COMPAT_SHIMS`` (module paths users put in ``langgraph.json`` or run with
   ``python -m``).
3. Rewrites, in the package, tests/, benchmarks/, examples/, tools/, docs/, README.md,
   pyproject.toml, mkdocs.yml, MANIFEST.in, .ci/run and every langgraph.json:

   - relative imports of the package's own modules, recomputed from each file's new place
     (``from .registry_schema import x`` in ``pruner.py`` becomes
     ``from ..registry.schema import x`` in ``ops/pruner.py``), function-level and
     ``TYPE_CHECKING`` imports included; ``from . import registry`` style imports of moved
     modules get an ``as`` name when the file uses the old name;
   - absolute dotted names anywhere in the text (imports, ``mock.patch("...")`` and
     ``monkeypatch.setattr("...")`` strings, ``importlib.import_module`` strings, ``-m``
     module names, logger names, docs): ``langgraph_securesaver.<old>[.attr]``;
   - file paths ``langgraph_securesaver/<old>.py``; in the package, bare ``<old>.py``
     mentions in comments and docstrings;
   - relative Sphinx references in docstrings (``:mod:`.pkcs11_provider```);
   - the lazy-export tables that name modules as relative strings (``_EXPORTS`` of the
     package and of ``idempotency``, ``SCHEMES`` of the key-provider URLs).

   In user-facing text (README, docs, examples, pyproject's entry point) a documented path
   that a facade keeps (``langgraph_securesaver.server.make_checkpointer``,
   ``langgraph_securesaver.cli:app``) is left as it is. CHANGELOG.md is history: untouched.
4. Sorts the imports of the changed Python files (``ruff check --select I --fix``) and parses
   every changed Python file again; prints what it did.

Nothing is committed: review with ``git status`` / ``git diff --stat -M`` and commit.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "langgraph_securesaver"

#: old top-level module -> new dotted module (relative to the package)
MOVES: dict[str, str] = {
    # keys/: key material, master keys and providers, field-level encryption
    "keymaterial": "keys.material",
    "keyring_file": "keys.keyring_file",
    "keyring": "keys.keyring",
    "aws_kms": "keys.aws_kms",
    "pkcs11_pool": "keys.pkcs11_pool",
    "pkcs11_provider": "keys.pkcs11_provider",
    "key_urls": "keys.urls",
    "crypto": "keys.crypto",
    # registry/: SecureSaver's own tables and what they hold
    "registry": "registry.core",
    "registry_schema": "registry.schema",
    "registry_claims": "registry.claims",
    "registry_keys": "registry.wrapped_keys",
    "registry_verify": "registry.verify",
    "integrity": "registry.integrity",
    "direct_reads": "registry.direct_reads",
    "denials": "registry.denials",
    "pii_vault": "registry.pii_vault",
    "subjects": "registry.subjects",
    "thread_keys": "registry.thread_keys",
    # storage/: the inner saver's storage, reached natively and row by row
    "storage_ops": "storage.ops",
    "storage_sql": "storage.sql",
    "storage_flush": "storage.flush",
    "raw_tables": "storage.raw_tables",
    "raw_sql": "storage.raw_sql",
    "backends": "storage.backends",
    "strict_serde": "storage.strict_serde",
    "store_format": "storage.store_format",
    "sealed_columns": "storage.sealed_columns",  # on branch cli-startup
    # audit/: the inventory, the trail, the summaries, the at-rest scan, the reports
    "audit": "audit.inventory",
    "audit_db": "audit.db",
    "audit_report": "audit.report",
    "audit_sql": "audit.sql",
    "audit_statements": "audit.statements",
    "audit_trail": "audit.trail",
    "report_html": "audit.report_html",
    "scan": "audit.scan",
    "store_audit": "audit.store_items",
    "summaries": "audit.summaries",
    # ops/ (exists): the retention sweep and key rotation join the other operations
    "pruner": "ops.pruner",
    "pruner_emptied": "ops.pruner_emptied",
    "rotation": "ops.rotation",
    # cli/: the securesaver command, the demo, recover as a function
    "cli": "cli.main",
    "cli_common": "cli.common",
    "cli_ops": "cli.ops",
    "cli_events": "cli.events",
    "cli_subjects": "cli.subjects",
    "cli_summaries": "cli.summaries",
    "cli_params": "cli.params",  # on branch cli-startup
    "demo": "cli.demo",
    "demo_run": "cli.demo_run",
    "recover": "cli.recover",
    # server/: LangGraph Server integration
    "server": "server.saver",
    "server_encryption": "server.encryption",
    "server_records": "server.records",
    "server_settings": "server.settings",
    "server_store": "server.store",
}

#: top-level modules that stay where they are: the foundation and the per-turn path
KEEP: frozenset[str] = frozenset({
    "__init__",
    # foundation
    "errors", "textsafety", "tenancy", "timeargs", "offthread", "steps", "retention",
    # the per-turn path of the checkpointer
    "caches", "run_tenants", "seal", "gate", "pii_layer", "services", "inner_access",
    "listing", "reads", "writes",
    # the checkpointer
    "saver", "connect",
})

#: old module path -> (new module, why): tiny modules left at the old path, re-exporting the
#: new one (paths users write in langgraph.json or run with ``python -m``)
COMPAT_SHIMS: dict[str, str] = {
    "server_store": '``"store": {"path": "langgraph_securesaver.server_store.store"}`` in '
                    "langgraph.json",
    "server_encryption": '``"encryption": {"path": '
                         '"langgraph_securesaver.server_encryption:encryption"}`` in '
                         "langgraph.json",
    "server_records": "``seal_server_records()`` in auth modules, ``python -m "
                      "langgraph_securesaver.server_records seal FILE``",
}

#: modules that become a package whose __init__ re-exports the public names the old module
#: defined at its top level (``FACADE_NAMES`` overrides the computed list). ``server``'s are
#: imported by the __init__ (LangGraph Server's loader reads ``checkpointer`` from the module's
#: ``__dict__``); ``cli``'s ``app`` is loaded on first use (importing ``cli.demo`` does not load
#: every command)
FACADES: dict[str, str] = {"server": "server.saver", "cli": "cli.main"}
FACADE_NAMES: dict[str, tuple[str, ...]] = {"cli": ("app",)}
LAZY_FACADES = frozenset({"cli"})

#: the docstrings of the new subpackages (what each holds and what it may import; the layers
#: are checked by tests/test_layout.py)
PACKAGE_DOCS: dict[str, str] = {
    "keys": """Key handling: key material as a type, master keys and key providers, and
field-level encryption under per-tenant data keys.

- :mod:`.material` -- ``SecretBytes`` and friends: key material whose repr reveals nothing.
- :mod:`.keyring` / :mod:`.keyring_file` -- master keys (``Keyring``, ``KeyProvider``) and
  keyring files on disk.
- :mod:`.aws_kms`, :mod:`.pkcs11_provider` / :mod:`.pkcs11_pool` -- providers whose master
  keys never leave AWS KMS or a PKCS#11 token; :mod:`.urls` names them by URL.
- :mod:`.crypto` -- AES-GCM sealing, the token format, associated data, ``KeyManager`` and
  ``TenantKeys``.

May import: the foundation modules (``errors``, ``textsafety``, ``tenancy`` ...) only; the
registry, the storage, the saver and the operations import this package, never the reverse.
""",
    "registry": """SecureSaver's own tables (SQLAlchemy Core) and what they hold.

- :mod:`.core` -- ``Registry``: wrapped keys, thread rows, policies, receipts, events.
- :mod:`.schema` -- the tables, row types and engines; :mod:`.claims` -- the pruner's claims
  and fenced deletes; :mod:`.verify` -- MAC and hash-chain verification; :mod:`.integrity` --
  the registry MAC key and row MACs; :mod:`.wrapped_keys` -- the wrapped key rows;
  :mod:`.direct_reads` -- one hot read without the pool's per-checkout work.
- :mod:`.denials` -- refused attempts, coalesced before they reach the registry.
- :mod:`.thread_keys` -- per-thread data keys (what deletion destroys); :mod:`.pii_vault` --
  the sealed originals of redacted PII; :mod:`.subjects` -- the keyed subject of a thread.

May import: the foundation modules and :mod:`..keys`. Nothing here imports the inner saver's
storage, the saver, an operation or the CLI.
""",
    "storage": """The inner saver's own storage, reached below the BaseCheckpointSaver API.

- :mod:`.backends` -- opening an inner saver and its registry from a URL.
- :mod:`.strict_serde` -- the inner savers' serializer: nothing stored is evaluated.
- :mod:`.ops` / :mod:`.sql` / :mod:`.flush` -- native keep-latest, whole-thread and per-run
  deletes on each backend, their SQL, and SQLite's deletion hygiene.
- :mod:`.raw_tables` / :mod:`.raw_sql` -- raw rows of the inner tables and the registry (for
  audit, scan, rotation), their SQL and pager.
- :mod:`.store_format` -- a SecureStore item's stored form, for code that never opens it.

May import: the foundation modules, :mod:`..keys` and :mod:`..registry`. The per-turn path,
the operations and the CLI import this package, never the reverse.
""",
    "audit": """What is stored, what happened, and what the disk shows: the operations that read.

- :mod:`.inventory` -- the inventory (``audit``, ``audit_stream``, ``iter_audit``) and the
  trail (``events``); :mod:`.report` -- the report types; :mod:`.report_html` -- the HTML
  report.
- :mod:`.statements` -- the inventory as one grouped statement per dialect; :mod:`.sql` --
  runs it and folds the totals; :mod:`.db` -- ``AuditDatabase`` (a database opened by URL);
  :mod:`.trail` -- security events and deletion receipts.
- :mod:`.summaries` -- maintained per-thread and per-tenant totals.
- :mod:`.scan` -- the at-rest scan of the raw tables; :mod:`.store_items` -- SecureStore
  items in the audit and the scan.

May import: everything below the operations (foundation, :mod:`..keys`, :mod:`..registry`,
:mod:`..storage`, the per-turn path, :mod:`..redaction`). :mod:`..ops`, the saver and the CLI
import this package, never the reverse.
""",
    "cli": """The ``securesaver`` command line (the entry point is ``cli:app``; ``python -m
langgraph_securesaver.cli`` runs it too).

- :mod:`.common` -- the Typer app, consoles, exit codes, options, opening a saver on
  ``--url``.
- :mod:`.main` -- ``keygen``, ``demo``, ``prune``, ``shred-tenant``, ``recover``; it loads
  :mod:`.ops` (``audit``, ``scan``, ``rotate-keys``, ``events``, printed by :mod:`.events`),
  :mod:`.subjects` (``forget-subject``) and :mod:`.summaries` (``summaries``).
- :mod:`.demo` -- the demo graph with a scripted chat model (the examples use it);
  :mod:`.demo_run` -- ``securesaver demo``.
- :mod:`.recover` -- ``securesaver recover`` as a function.

May import: anything; nothing but the package facades imports it.
""",
    "server": """SecureSaver behind LangGraph Server (``langgraph dev`` / ``langgraph up`` / the
platform).

- :mod:`.saver` -- ``AuthTenantSaver``, ``AuthTenantGate``, ``make_checkpointer``,
  ``tenant_from_field`` (the ``checkpointer`` entry; this package imports its public names,
  so ``"path": "langgraph_securesaver.server.checkpointer"`` works).
- :mod:`.store` -- SecureStore as the server's long-term memory (the ``store`` entry).
- :mod:`.encryption` -- the server's own records encrypted (the ``encryption`` entry).
- :mod:`.records` -- ``langgraph dev``'s record file sealed at rest.
- :mod:`.settings` -- what the integrations read from the environment.

May import: anything below the CLI (the saver, :mod:`..store` and what they use).
""",
}

#: (module, variable): lazy-export tables whose string values name modules relative to the
#: module's package (``importlib.import_module(f".{value}", __package__)``)
RELATIVE_STRING_TABLES: tuple[tuple[str, str], ...] = (
    ("", "_EXPORTS"), ("idempotency", "_EXPORTS"), ("key_urls", "SCHEMES"))

#: text the rewrite leaves alone (regular expressions): tests and tools that check a path the
#: facades and shims keep (``python -m langgraph_securesaver.cli``, the server's dotted path)
PRESERVE: tuple[str, ...] = (
    r"(?<=[\"'])langgraph_securesaver\.cli(?=[\"'])",  # "-m", "...cli"; run_module("...cli")
    r"python -m langgraph_securesaver\.cli\b(?!\.)",
    r"langgraph_securesaver\.server\.checkpointer\b",
    r"import langgraph_securesaver\.server as s\b",
)

PYTHON_DIRS = ("langgraph_securesaver", "tests", "benchmarks", "examples", "tools")
TEXT_FILES = ("README.md", "pyproject.toml", "mkdocs.yml", "MANIFEST.in", ".ci/run")
TEXT_DIRS = ("docs", "examples", "tests", "tools", "benchmarks")
TEXT_SUFFIXES = (".md", ".json", ".toml", ".cfg", ".ini", ".yml", ".yaml", ".txt", ".sh")
SKIP = ("CHANGELOG.md", "docs/changelog.md", "benchmarks/data/", "tools/relayout.py")
#: files written for users: a path a facade keeps is left as it is
PUBLIC_PREFIXES = ("README.md", "docs/", "examples/", "pyproject.toml")
SPHINX_REF = re.compile(r":(mod|class|func|meth|attr|data|exc|obj):`(~?)(\.+)([A-Za-z_][\w.]*)`")
DOTTED = re.compile(rf"(?<![\w.]){PACKAGE}((?:\.[A-Za-z_]\w*)+)(:[A-Za-z_]\w*)?")
PATHFORM = re.compile(rf"(?<![\w]){PACKAGE}/([A-Za-z_]\w*)\.py\b")


class Refused(Exception):
    pass


# --- names -----------------------------------------------------------------------------------

def new_parts(parts: list[str]) -> list[str]:
    """The new place of an old dotted name (relative to the package)."""
    if parts and parts[0] in MOVES:
        return MOVES[parts[0]].split(".") + parts[1:]
    return list(parts)


def relative_spec(from_pkg: list[str], target: list[str]) -> str:
    common = 0
    while (common < len(from_pkg) and common < len(target)
           and from_pkg[common] == target[common]):
        common += 1
    return "." * (len(from_pkg) - common + 1) + ".".join(target[common:])


def absolute(parts: list[str]) -> str:
    return ".".join([PACKAGE, *parts])


@dataclass
class Tree:
    """The package's modules before the move (dotted, relative; "" is the package)."""
    modules: set[str]
    packages: set[str]
    facade_names: dict[str, frozenset[str]] = field(default_factory=dict)

    def is_module(self, parts: list[str]) -> bool:
        return ".".join(parts) in self.modules or ".".join(parts) in self.packages

    def longest_module(self, parts: list[str]) -> int:
        """How many leading parts name a module or package (0: none)."""
        for n in range(len(parts), 0, -1):
            if self.is_module(parts[:n]):
                return n
        return 0


def scan_tree(root: Path) -> Tree:
    pkg = root / PACKAGE
    modules: set[str] = set()
    packages: set[str] = {""}
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg).with_suffix("").parts
        if rel[-1] == "__init__":
            packages.add(".".join(rel[:-1]))
        else:
            modules.add(".".join(rel))
    tree = Tree(modules, packages)
    for name in FACADES:
        names = FACADE_NAMES.get(name) or public_names(pkg / f"{name}.py")
        tree.facade_names[name] = frozenset(names)
    return tree


def public_names(path: Path) -> list[str]:
    """Names a module defines at its top level (not the ones it imports), public only."""
    names: list[str] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in dict.fromkeys(names) if not n.startswith("_") and n != "logger"]


# --- one file -----------------------------------------------------------------------------

@dataclass
class Place:
    """Where a package file was and where it goes (module dotted names split in parts)."""
    old_pkg: list[str]      # the package its relative imports resolve against, before
    new_pkg: list[str]      # ... and after
    in_package: bool


def place_of(rel_path: str) -> Place:
    parts = Path(rel_path).with_suffix("").parts
    if parts[0] != PACKAGE:
        return Place([], [], False)
    inner = list(parts[1:])
    if inner[-1] == "__init__":
        return Place(inner[:-1], inner[:-1], True)
    old_pkg = inner[:-1]
    if len(inner) == 1 and inner[0] in MOVES:
        return Place(old_pkg, MOVES[inner[0]].split(".")[:-1], True)
    return Place(old_pkg, old_pkg, True)


class Edits:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[tuple[int, int, str]] = []
        self.line_starts = [0]
        for line in text.splitlines(keepends=True):
            self.line_starts.append(self.line_starts[-1] + len(line))
        self._lines = text.splitlines(keepends=True)

    def offset(self, lineno: int, col_bytes: int) -> int:
        line = self._lines[lineno - 1] if lineno - 1 < len(self._lines) else ""
        col = len(line.encode("utf-8")[:col_bytes].decode("utf-8", errors="ignore"))
        return self.line_starts[lineno - 1] + col

    def add(self, start: int, end: int, new: str) -> None:
        if self.text[start:end] != new:
            self.items.append((start, end, new))

    def overlaps(self, start: int, end: int, spans: list[tuple[int, int]]) -> bool:
        return any(s < end and start < e for s, e in spans)

    def apply(self) -> str:
        out = self.text
        for start, end, new in sorted(self.items, reverse=True):
            out = out[:start] + new + out[end:]
        return out


def _uses_name(tree: ast.AST, name: str, skip: ast.AST) -> bool:
    skipped = {id(n) for n in ast.walk(skip)}
    return any(isinstance(n, ast.Name) and n.id == name and id(n) not in skipped
               for n in ast.walk(tree))


def _module_span(edits: Edits, node: ast.ImportFrom) -> tuple[int, int, list[str]]:
    """Offsets of the dotted module between ``from`` and ``import``, and the comments."""
    start = edits.offset(node.lineno, node.col_offset)
    end = edits.offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
    segment = edits.text[start:end]
    tokens = list(tokenize.generate_tokens(io.StringIO(segment).readline))
    span_start = span_end = None
    comments = [t.string for t in tokens if t.type == tokenize.COMMENT]
    for index, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.string == "from" and span_start is None:
            nxt = tokens[index + 1]
            span_start = _seg_offset(segment, nxt.start)
        elif tok.type == tokenize.NAME and tok.string == "import" and span_start is not None:
            prev = tokens[index - 1]
            span_end = _seg_offset(segment, prev.end)
            break
    if span_start is None or span_end is None:
        raise Refused(f"cannot find the module of an import at line {node.lineno}")
    return start + span_start, start + span_end, comments


def _seg_offset(segment: str, pos: tuple[int, int]) -> int:
    lines = segment.splitlines(keepends=True)
    return sum(len(line) for line in lines[: pos[0] - 1]) + pos[1]


def _public(rel_path: str) -> bool:
    return rel_path.startswith(PUBLIC_PREFIXES)


def _facade_keeps(tree: Tree, parts: list[str], attrs: list[str]) -> bool:
    """``langgraph_securesaver.server`` (+ names it re-exports) in user-facing text."""
    return (len(parts) == 1 and parts[0] in FACADES
            and all(a in tree.facade_names[parts[0]] for a in attrs))


def rewrite_python(rel_path: str, text: str, tree: Tree, notes: list[str]) -> str:
    place = place_of(rel_path)
    module = ast.parse(text)
    edits = Edits(text)
    handled: list[tuple[int, int]] = []
    public = _public(rel_path)

    # 1. from-imports of the package's modules, relative or absolute
    for node in ast.walk(module):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            if not place.in_package:
                continue
            cut = len(place.old_pkg) - (node.level - 1)
            base = place.old_pkg[:cut]
            target = base + (node.module.split(".") if node.module else [])
        elif node.module == PACKAGE or (node.module or "").startswith(PACKAGE + "."):
            target = (node.module or "").split(".")[1:]
        else:
            continue
        stmt_start = edits.offset(node.lineno, node.col_offset)
        stmt_end = edits.offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
        handled.append((stmt_start, stmt_end))
        if not node.level and public and _facade_keeps(
                tree, target, [a.name for a in node.names]):
            continue
        groups: dict[tuple[str, ...], list[tuple[str, str | None, str]]] = {}
        renamed = False
        submodule_groups: set[tuple[str, ...]] = set()
        for alias in node.names:
            full = [*target, alias.name]
            if alias.name != "*" and tree.is_module(full):
                moved = new_parts(full)
                parent, leaf = moved[:-1], moved[-1]
                as_name = alias.asname
                if leaf != alias.name:
                    renamed = True
                    if as_name is None:
                        # outside the package the old name stays bound (a test may patch it);
                        # inside, only when the module uses it
                        keep = not place.in_package or _uses_name(module, alias.name, node)
                        as_name = alias.name if keep else None
                groups.setdefault(tuple(parent), []).append((leaf, as_name, alias.name))
                submodule_groups.add(tuple(parent))
            else:
                groups.setdefault(tuple(new_parts(target)), []).append(
                    (alias.name, alias.asname, alias.name))

        def spec(parts: tuple[str, ...], relative: bool = bool(node.level)) -> str:
            if relative:
                return relative_spec(place.new_pkg, list(parts))
            return absolute(list(parts))

        span_start, span_end, comments = _module_span(edits, node)
        if len(groups) == 1 and not renamed:
            (parts,) = groups
            edits.add(span_start, span_end, spec(parts))
            continue
        line_start = edits.line_starts[node.lineno - 1]
        indent = text[line_start:stmt_start]
        lines = []
        commented = submodule_groups or {next(iter(groups))}
        for parts, names in groups.items():
            joined = ", ".join(n if a is None else f"{n} as {a}" for n, a, _old in names)
            line = f"from {spec(parts)} import {joined}"
            if comments and parts in commented:  # comments go with the submodule imports
                line += "  " + " ".join(comments)
            lines.append(line)
        edits.add(stmt_start, stmt_end, ("\n" + indent).join(lines))
        notes.append(f"{rel_path}:{node.lineno}: import split or renamed: "
                     + "; ".join(lines))

    # 2. lazy-export tables: module names as relative strings
    for table_module, variable in RELATIVE_STRING_TABLES:
        if rel_path != _path_of(table_module):
            continue
        found = False
        for stmt in ast.walk(module):
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                continue
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if not any(isinstance(t, ast.Name) and t.id == variable for t in targets):
                continue
            value = stmt.value
            if not isinstance(value, ast.Dict):
                continue
            found = True
            for item in value.values:
                candidates = [item]
                if (isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute)
                        and item.func.attr == "fromkeys" and len(item.args) == 2):
                    candidates = [item.args[1]]
                for cand in candidates:
                    for const in ast.walk(cand):
                        if isinstance(const, ast.Constant) and isinstance(const.value, str):
                            _rewrite_relative_string(edits, const, place, tree)
        if not found:
            notes.append(f"WARNING {rel_path}: no dict assigned to {variable}: check the "
                         "modules it names by hand")

    # 3. dotted names, file paths, Sphinx references, bare file names
    _rewrite_text(rel_path, text, edits, handled, tree, python=True)
    new_text = edits.apply()
    if rel_path.startswith(WRAP_PREFIXES) and new_text != text:
        new_text = wrap_long_lines(new_text, text, notes, rel_path)
    return new_text


MAX_LINE = 100
#: Python files whose long lines ruff refuses (pyproject's per-file-ignores spare the others)
WRAP_PREFIXES = (f"{PACKAGE}/", "examples/", "tools/")


def _wrap(text: str, indent: str, width: int = MAX_LINE - 4) -> str:
    """Prose in lines of at most ``width`` characters, continuation lines indented."""
    out: list[str] = []
    line = ""
    for word in text.split(" "):
        if line and len(indent) + len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    out.append(line)
    return ("\n" + indent).join(out)


def _string_lines(text: str) -> set[int]:
    """Line numbers (1-based) inside multi-line strings: docstrings and other prose."""
    lines: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                lines.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        pass
    return lines


def _split_code(line: str) -> str | None:
    """A long code line broken after the last ``, `` that fits, inside brackets."""
    depth_cols: list[int] = []
    best: tuple[int, int] | None = None
    quote: str | None = None
    for col, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
            continue
        if char == "#":
            break
        if char in "\"'":
            quote = char
        elif char in "([{":
            depth_cols.append(col + 1)
        elif char in ")]}" and depth_cols:
            depth_cols.pop()
        elif char == "," and depth_cols and col + 1 < MAX_LINE and line[col + 1:col + 2] == " ":
            best = (col + 1, depth_cols[-1])
    if best is None:
        return None
    cut, column = best
    return line[:cut] + "\n" + " " * column + line[cut + 1:]


def _split_prose(body: str, head_len: int) -> tuple[str, str] | None:
    """``body`` cut at the last space that keeps it within MAX_LINE (after ``head_len``)."""
    cut = body.rfind(" ", head_len + 1, MAX_LINE + 1)
    if cut <= head_len:
        return None
    return body[:cut], body[cut + 1:]


#: a prose line that opens something (a list item, a field, a directive): it takes no carry
_OPENS = ("-", "*", ":", "..", ">>>", '"""', "'''", "|")


def wrap_long_lines(text: str, before: str, notes: list[str], rel_path: str) -> str:
    """Lines the rewrite made longer than ruff allows, wrapped: banners lose dashes, comments
    and docstrings reflow (the words pushed off a line open the next line of the same
    paragraph), code breaks after a comma inside brackets."""
    old_lines = set(before.splitlines())
    strings = _string_lines(text)
    out: list[str] = []
    carry = ""
    carry_prefix = ""   # "# ", "#: " or "" (a docstring)
    carry_indent = ""

    def flush() -> None:
        nonlocal carry
        if carry:
            out.append(carry_indent + carry_prefix + carry + "\n")
            carry = ""

    for number, line in enumerate(text.splitlines(keepends=True), 1):
        body = line.rstrip("\n")
        ending = line[len(body):]
        indent = body[: len(body) - len(body.lstrip())]
        stripped = body[len(indent):]
        comment = stripped.startswith("#")
        prefix = ("#: " if stripped.startswith("#:") else "# ") if comment else ""
        prose = comment or number in strings
        words = stripped[len(prefix.rstrip()):].strip() if comment else stripped
        if carry:
            joins = (prose and prefix == carry_prefix and indent == carry_indent
                     and bool(words) and not words.startswith(_OPENS)
                     and not re.match(r"\d+\.\s", words))
            if joins:
                words = f"{carry} {words}"
                body = indent + prefix + words
                carry = ""
            else:
                flush()
        if len(body) <= MAX_LINE or body in old_lines or stripped.startswith(
                ("from ", "import ")):  # imports: ruff's isort wraps them
            out.append(body + ending)
            continue
        notes.append(f"{rel_path}:{number}: long line wrapped")
        banner = re.match(r"^(\s*#.*?)\s-{3,}$", body)
        if banner:
            room = MAX_LINE - len(banner.group(1)) - 1
            body = banner.group(1) + (" " + "-" * room if room >= 3 else "")
        if len(body) <= MAX_LINE:
            out.append(body + ending)
            continue
        if prose:
            parts = _split_prose(body, len(indent) + len(prefix))
            if parts is not None:
                out.append(parts[0] + ending)
                carry, carry_prefix, carry_indent = parts[1], prefix, indent
                continue
        split = _split_code(body)
        if split is None:
            notes.append(f"{rel_path}:{number}: line over {MAX_LINE} characters: wrap it")
            out.append(body + ending)
        else:
            out.append(split + ending)
    flush()
    return "".join(out)


def _path_of(module: str) -> str:
    if module in ("", "idempotency"):
        return f"{PACKAGE}/{module + '/' if module else ''}__init__.py"
    return f"{PACKAGE}/{module.replace('.', '/')}.py"


def _rewrite_relative_string(edits: Edits, const: ast.Constant, place: Place,
                             tree: Tree) -> None:
    spec = "." + str(const.value)
    level = len(spec) - len(spec.lstrip("."))
    rest = spec.lstrip(".")
    if not rest or not re.fullmatch(r"[A-Za-z_][\w.]*", rest):
        return
    base = place.old_pkg[: len(place.old_pkg) - (level - 1)]
    target = base + rest.split(".")
    if not tree.is_module(target):
        return
    new = relative_spec(place.new_pkg, new_parts(target))[1:]
    start = edits.offset(const.lineno, const.col_offset)
    end = edits.offset(const.end_lineno or const.lineno, const.end_col_offset or 0)
    quote = edits.text[start]
    edits.add(start, end, f"{quote}{new}{quote}")


def _rewrite_text(rel_path: str, text: str, edits: Edits, handled: list[tuple[int, int]],
                  tree: Tree, *, python: bool) -> None:
    public = _public(rel_path)
    place = place_of(rel_path)
    line_starts = edits.line_starts
    handled = handled + [m.span() for pattern in PRESERVE for m in re.finditer(pattern, text)]

    def in_directive(pos: int) -> bool:
        line = text[line_starts[_line_index(line_starts, pos)]:pos]
        return line.lstrip().startswith(":::")

    for match in DOTTED.finditer(text):
        start, end = match.span()
        if edits.overlaps(start, end, handled):
            continue
        parts = match.group(1)[1:].split(".")
        if parts[0] not in MOVES:
            continue
        attrs = parts[1:2]
        if match.group(2):
            attrs = [match.group(2)[1:]] if len(parts) == 1 else attrs
        if public and not in_directive(start) and _facade_keeps(tree, parts[:1], attrs):
            continue
        new = absolute(new_parts(parts)) + (match.group(2) or "")
        edits.add(start, end, new)
    for match in PATHFORM.finditer(text):
        name = match.group(1)
        if name in MOVES:
            edits.add(match.start(), match.end(),
                      f"{PACKAGE}/{MOVES[name].replace('.', '/')}.py")
    if not (python and place.in_package):
        return
    for ref in SPHINX_REF.finditer(text):
        new_ref = _sphinx_ref(ref, place, tree)
        if new_ref is not None:
            edits.add(ref.start(), ref.end(), new_ref)
    bare = re.compile(r"(?<![\w/.\-])(" + "|".join(sorted(MOVES, key=len, reverse=True))
                      + r")\.py\b")
    for match in bare.finditer(text):
        if edits.overlaps(match.start(), match.end(), handled):
            continue
        edits.add(match.start(), match.end(), MOVES[match.group(1)].replace(".", "/") + ".py")


def _line_index(line_starts: list[int], pos: int) -> int:
    lo, hi = 0, len(line_starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if line_starts[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _sphinx_ref(match: re.Match[str], place: Place, tree: Tree) -> str | None:
    role, tilde, dots, rest = match.groups()
    parts = rest.split(".")
    level = len(dots)
    base = place.old_pkg[: len(place.old_pkg) - (level - 1)] if level - 1 <= len(
        place.old_pkg) else None
    target: list[str] | None = None
    if base is not None and tree.longest_module(base + parts) > len(base):
        target = base + parts
    elif tree.is_module(parts[:1]):   # Sphinx's suffix search: the name of a top module
        target = parts
    if target is None:
        return None
    moved = new_parts(target)
    if moved == target and place.new_pkg == place.old_pkg:
        return None
    n = tree.longest_module(target)
    module_new = new_parts(target[:n])
    spec = relative_spec(place.new_pkg, module_new)
    tail = ".".join(moved[len(module_new):])
    ref = spec + ("." + tail if tail and not spec.endswith(".") else tail)
    return f":{role}:`{tilde}{ref}`"


# --- the checkout -------------------------------------------------------------------------

def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True,  # noqa: S603,S607
                          capture_output=True, text=True).stdout


def check(root: Path, *, allow_dirty: bool) -> None:
    pkg = root / PACKAGE
    present = {p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    new_packages = {m.split(".")[0] for m in MOVES.values()} - {"ops"}
    already = sorted(present & new_packages)
    if already:
        raise Refused(f"already laid out: {', '.join(already)}/ exist (run once, on a checkout "
                      "with the flat modules)")
    if not allow_dirty and git(root, "status", "--porcelain", "--untracked-files=no").strip():
        raise Refused("the work tree has uncommitted changes (commit or stash them, or pass "
                      "--allow-dirty)")
    missing = sorted(m for m in MOVES if not (pkg / f"{m}.py").exists())
    needed = sorted(set(missing) & (set(COMPAT_SHIMS) | set(FACADES)))
    if needed or len(missing) == len(MOVES):
        raise Refused(f"modules of MOVES missing: {', '.join(needed or missing)}")
    unplaced = sorted(p.stem for p in pkg.glob("*.py")
                      if p.stem not in MOVES and p.stem not in KEEP)
    if unplaced:
        raise Refused(f"place these top-level modules in MOVES or KEEP first: "
                      f"{', '.join(unplaced)}")
    targets = list(MOVES.values())
    if len(set(targets)) != len(targets):
        raise Refused("two modules move to the same place")
    for new in targets:
        if ".".join(new.split(".")[:1]) in KEEP:
            raise Refused(f"{new}: its package is the name of a module that stays")


def files_to_rewrite(root: Path) -> list[str]:
    tracked = git(root, "ls-files").splitlines()
    out = []
    for rel in tracked:
        if rel.startswith(SKIP) or rel in SKIP:
            continue
        top = rel.split("/")[0]
        if rel.endswith(".py") and top in PYTHON_DIRS:
            out.append(rel)
        elif rel in TEXT_FILES or rel.endswith("langgraph.json"):
            out.append(rel)
        elif top in TEXT_DIRS and rel.endswith(TEXT_SUFFIXES):
            out.append(rel)
    return sorted(set(out))


def facade_text(name: str, module: str, names: list[str]) -> str:
    doc = PACKAGE_DOCS[name].rstrip("\n")
    leaf = module.split(".")[-1]
    if name not in LAZY_FACADES:
        imported = "\n".join(f"    {n}," for n in names)
        listed = "\n".join(f'    "{n}",' for n in names)
        return f'''"""{doc}
"""

# imported here, not on first use: LangGraph Server's loader reads ``checkpointer`` (the
# ``"path": "langgraph_securesaver.server.checkpointer"`` default) from this module's __dict__
from .{leaf} import (
{imported}
)

__all__ = [
{listed}
]
'''
    if len(names) != 1:
        raise Refused(f"{name}: a lazy facade re-exports one name")
    (only,) = names
    return f'''"""{doc}
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .{leaf} import {only} as {only}


def __getattr__(name: str) -> Any:
    """``{only}``, loaded on first use (importing a sibling module does not load it)."""
    if name != "{only}":
        raise AttributeError(f"module {{__name__!r}} has no attribute {{name!r}}")
    from .{leaf} import {only}
    return {only}


__all__ = ["{only}"]
'''


def shim_text(old: str, why: str, *, runnable: bool) -> str:
    new = MOVES[old]
    doc = _wrap(f"Moved to :mod:`{PACKAGE}.{new}`; this module keeps the old path working: {why}.",
                "")
    text = f'''"""{doc}"""

from .{new} import *  # noqa: F403
'''
    if runnable:
        text += f'''
if __name__ == "__main__":  # pragma: no cover - python -m {PACKAGE}.{old}
    import sys

    from .{new} import main

    sys.exit(main())
'''
    return text


def main_text() -> str:
    return '''"""``python -m langgraph_securesaver.cli``: the ``securesaver`` command."""

import sys

from .main import app

sys.exit(app())
'''


def ruff_path(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    sibling = Path(sys.executable).with_name("ruff")
    if sibling.exists():
        return str(sibling)
    return shutil.which("ruff")


def run(root: Path, *, dry_run: bool, allow_dirty: bool, ruff: str | None) -> int:
    check(root, allow_dirty=allow_dirty)
    absent = [m for m in MOVES if not (root / PACKAGE / f"{m}.py").exists()]
    for name in absent:  # a module of the table not in this checkout (not merged, or gone)
        del MOVES[name]
    if absent:
        print(f"not in this checkout, left out of the table: {', '.join(absent)}")
    tree = scan_tree(root)
    pkg = root / PACKAGE
    for old in COMPAT_SHIMS:
        if old not in MOVES:
            raise Refused(f"shim for {old}: not in MOVES")
    shims_with_main = {old for old in COMPAT_SHIMS
                       if "main" in public_names(pkg / f"{old}.py")}

    print(f"{len(MOVES)} modules move, {len(KEEP) - 1} stay at the top level:")
    for old, new in MOVES.items():
        print(f"  {old:18} -> {new}")

    # rewrite every file's text first (from the old tree), then move
    notes: list[str] = []
    changed: dict[str, str] = {}
    for rel in files_to_rewrite(root):
        path = root / rel
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if rel.endswith(".py"):
            new_text = rewrite_python(rel, text, tree, notes)
        else:
            edits = Edits(text)
            _rewrite_text(rel, text, edits, [], tree, python=False)
            new_text = edits.apply()
        if new_text != text:
            changed[rel] = new_text

    moved_paths = {f"{PACKAGE}/{old}.py": f"{PACKAGE}/{new.replace('.', '/')}.py"
                   for old, new in MOVES.items()}
    print(f"\n{len(changed)} files rewritten:")
    for rel in sorted(changed):
        print(f"  {rel}" + (f" (-> {moved_paths[rel]})" if rel in moved_paths else ""))
    for note in notes:
        print(f"  note: {note}")
    if dry_run:
        print("\n--dry-run: nothing changed")
        return 0

    for rel, new_text in changed.items():
        (root / rel).write_text(new_text, encoding="utf-8")
    created: list[str] = []
    for name in sorted({m.split(".")[0] for m in MOVES.values()}):
        init = pkg / name / "__init__.py"
        if init.exists():
            continue
        init.parent.mkdir(parents=True, exist_ok=True)
    for old, new in MOVES.items():
        git(root, "mv", f"{PACKAGE}/{old}.py", f"{PACKAGE}/{new.replace('.', '/')}.py")
    for name in sorted({m.split(".")[0] for m in MOVES.values()}):
        init = pkg / name / "__init__.py"
        if init.exists():
            continue
        if name in FACADES:
            text = facade_text(name, FACADES[name], sorted(tree.facade_names[name]))
        else:
            text = f'"""{PACKAGE_DOCS[name].rstrip()}\n"""\n'
        init.write_text(text, encoding="utf-8")
        created.append(str(init.relative_to(root)))
    (pkg / "cli" / "__main__.py").write_text(main_text(), encoding="utf-8")
    created.append(f"{PACKAGE}/cli/__main__.py")
    for old, why in COMPAT_SHIMS.items():
        text = shim_text(old, why, runnable=old in shims_with_main)
        (pkg / f"{old}.py").write_text(text, encoding="utf-8")
        created.append(f"{PACKAGE}/{old}.py")
    git(root, "add", *created)
    print(f"\n{len(created)} files created:")
    for rel in created:
        print(f"  {rel}")

    python_files = sorted({moved_paths.get(rel, rel) for rel in changed if rel.endswith(".py")}
                          | {c for c in created if c.endswith(".py")})
    tool = ruff_path(ruff)
    if tool is None:
        print("\nruff not found: sort the imports with `ruff check --select I --fix`")
    else:
        command = [tool, "check", "--select", "I", "--fix", "--quiet", *python_files]
        result = subprocess.run(command, cwd=root, capture_output=True, text=True)  # noqa: S603
        print(f"\nimports sorted with ruff ({len(python_files)} files)"
              + (f": {result.stdout.strip()}" if result.stdout.strip() else ""))
    broken = []
    for rel in python_files:
        try:
            ast.parse((root / rel).read_text(encoding="utf-8"))
        except SyntaxError as exc:
            broken.append(f"{rel}: {exc}")
    if broken:
        print("\nFILES THAT NO LONGER PARSE:\n  " + "\n  ".join(broken))
        return 1
    print("\ndone: review with `git status` and `git diff --cached --stat -M`, then commit")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout (default: the one holding this tool)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="run on a work tree with uncommitted changes")
    parser.add_argument("--ruff", help="the ruff executable (default: beside python, or PATH)")
    args = parser.parse_args(argv)
    try:
        return run(args.root.resolve(), dry_run=args.dry_run, allow_dirty=args.allow_dirty,
                   ruff=args.ruff)
    except Refused as exc:
        print(f"relayout: refused: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
