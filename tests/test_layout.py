"""The code's layout promises, checked from the source with ``ast``.

- The package is laid out in layers (``LAYERS``, bottom first; README "How the code is laid
  out"): a few top-level modules (the foundation, the per-turn path, the checkpointer) and one
  subpackage per concern. A module imports its own layer and the ones below, never one above.
- No import cycle among the package's modules. Every import counts: module level, inside
  functions, and under ``if TYPE_CHECKING:`` (a type-only import that points up a layer is
  still a dependency a reader has to follow).
- Every subpackage's docstring says what it holds and what it may import.
- No module other than ``saver.py`` touches a private member of ``SecureSaver``: the
  operations reach the saver through its narrow public interface (``saver.services``).
- ``SecureSaver`` stays a thin checkpointer (at most 400 lines); no module exceeds 700 lines,
  and the goal is 600.

``KNOWN_*`` below list what does not hold yet; each entry must still be a real violation (a
stale entry fails), so the lists can only shrink.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "langgraph_securesaver"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: the goal for a module's length; KNOWN_OVERSIZE lists the modules still over it
MAX_MODULE_LINES = 600
#: no module is longer, known or not
HARD_MAX_MODULE_LINES = 700
MAX_SAVER_CLASS_LINES = 400

#: The layers, bottom first: a module may import its own layer and the ones below, never one
#: above. ``"name/"`` is a subpackage with everything in it; a plain name is one module (the
#: package itself is ``""``; ``"idempotency"`` alone is that package's ``__init__``). A new
#: top-level module or subpackage must be placed.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("foundation", frozenset({"errors", "textsafety", "tenancy", "timeargs", "offthread",
                              "steps", "retention"})),
    ("keys", frozenset({"keys/"})),
    ("registry", frozenset({"registry/"})),
    ("storage", frozenset({"storage/"})),
    ("per-turn path", frozenset({"caches", "run_tenants", "seal", "gate", "pii_layer",
                                 "services", "inner_access", "listing", "reads", "writes",
                                 "redaction/"})),
    ("audit and idempotency", frozenset({"audit/", "idempotency/"})),
    ("operations", frozenset({"ops/"})),
    ("checkpointer", frozenset({"saver", "connect", "store/", "server/", "evidence/"})),
    ("cli", frozenset({"cli/"})),
    # the facades: the package and the idempotency package re-export names of every layer
    ("facades", frozenset({"", "idempotency"})),
)

#: Import cycles that still exist (each a frozenset of module names relative to the package).
KNOWN_CYCLES: set[frozenset[str]] = set()
#: Modules still over MAX_MODULE_LINES (never over HARD_MAX_MODULE_LINES).
KNOWN_OVERSIZE: set[str] = set()
#: (module, private attribute) accesses that still exist.
KNOWN_PRIVATE: set[tuple[str, str]] = set()
#: Whether SecureSaver is still over MAX_SAVER_CLASS_LINES.
SAVER_CLASS_STILL_OVERSIZE = False


@dataclass(frozen=True)
class Module:
    name: str  # dotted, relative to the package ("" for the package itself)
    path: Path
    is_package: bool
    tree: ast.Module


def _modules(root: Path = ROOT) -> dict[str, Module]:
    found: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        found[name] = Module(name, path, is_package, ast.parse(path.read_text(), str(path)))
    return found


def _absolute(name: str) -> str:
    return f"{PACKAGE}.{name}" if name else PACKAGE


def _relative(dotted: str) -> str | None:
    if dotted == PACKAGE:
        return ""
    if dotted.startswith(PACKAGE + "."):
        return dotted[len(PACKAGE) + 1:]
    return None


def _owner(target: str, modules: dict[str, Module]) -> str | None:
    """The package module a dotted (relative) name lives in: the longest existing prefix."""
    while True:
        if target in modules:
            return target
        if "." not in target:
            return "" if "" in modules and target else None
        target = target.rsplit(".", 1)[0]


def _targets(mod: Module, node: ast.Import | ast.ImportFrom,
             modules: dict[str, Module]) -> set[str]:
    """The package modules one import statement makes ``mod`` depend on."""
    named: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            rel = _relative(alias.name)
            if rel is not None:
                named.append(rel)
    else:
        if node.level:
            base = _absolute(mod.name).split(".")
            if not mod.is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            dotted = ".".join(base + ([node.module] if node.module else []))
        else:
            dotted = node.module or ""
        rel = _relative(dotted)
        if rel is None:
            return set()
        for alias in node.names:
            sub = f"{rel}.{alias.name}" if rel else alias.name
            # "from . import errors" imports the submodule; "from .x import Name" imports x
            named.append(sub if sub in modules else rel)
    out = set()
    for rel in named:
        owner = _owner(rel, modules)
        if owner is not None and owner != mod.name:
            out.add(owner)
    return out


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod in modules.values():
        deps: set[str] = set()
        for node in ast.walk(mod.tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _targets(mod, node, modules)
        graph[mod.name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.add(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


# --- private members of SecureSaver ------------------------------------------------------

def _saver_class(modules: dict[str, Module]) -> ast.ClassDef:
    for node in modules["saver"].tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "SecureSaver":
            return node
    raise AssertionError("saver.py defines no SecureSaver class")


def saver_private_names(modules: dict[str, Module]) -> set[str]:
    """Every ``_name`` SecureSaver defines: methods, class attributes, ``self._x = ...``."""
    cls = _saver_class(modules)
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
                    elif (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                          and sub.value.id == "self"):
                        names.add(sub.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _looks_like_saver(expr: ast.expr) -> bool:
    """``saver``, ``self.saver``, ``store.saver``, ``self._saver``, ``checkpointer``..."""
    if isinstance(expr, ast.Name):
        name = expr.id
    elif isinstance(expr, ast.Attribute):
        name = expr.attr
    else:
        return False
    name = name.lower().lstrip("_")
    return "saver" in name or "checkpointer" in name


def _private_accesses(mod: Module, private: set[str]) -> set[tuple[str, str]]:
    """(module, attr) for each access that reaches into a SecureSaver.

    Two rules: any ``_attr`` on an expression named like a saver (``saver._x``,
    ``self._saver._x``, ``store.saver._x``), and any attribute named like one of
    SecureSaver's own private members on anything but ``self``/``cls`` (so renaming the
    variable does not hide the access). ``getattr(obj, "_x")`` counts as ``obj._x``.
    """
    found: set[tuple[str, str]] = set()
    for node in ast.walk(mod.tree):
        target: ast.expr | None = None
        attr: str | None = None
        if isinstance(node, ast.Attribute):
            target, attr = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in {"getattr", "setattr", "hasattr", "delattr"}
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            target, attr = node.args[0], node.args[1].value
        if target is None or attr is None or not attr.startswith("_") or attr.startswith("__"):
            continue
        if _looks_like_saver(target):
            found.add((mod.name, attr))
        elif attr in private and not (isinstance(target, ast.Name)
                                      and target.id in {"self", "cls"}):
            found.add((mod.name, attr))
    return found


def private_accesses(modules: dict[str, Module]) -> set[tuple[str, str]]:
    private = saver_private_names(modules)
    found: set[tuple[str, str]] = set()
    for mod in modules.values():
        if mod.name != "saver":
            found |= _private_accesses(mod, private)
    return found


# --- sizes ---------------------------------------------------------------------------------

def _lines(mod: Module) -> int:
    return len(mod.path.read_text().splitlines())


def saver_class_lines(modules: dict[str, Module]) -> int:
    cls = _saver_class(modules)
    start = min([cls.lineno, *(d.lineno for d in cls.decorator_list)])
    assert cls.end_lineno is not None
    return cls.end_lineno - start + 1


# --- the tests -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return _modules()


def test_no_import_cycle(modules: dict[str, Module]) -> None:
    found = set(cycles(import_graph(modules)))
    new = found - KNOWN_CYCLES
    assert not new, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    stale = KNOWN_CYCLES - found
    assert not stale, f"KNOWN_CYCLES lists cycles that are gone, remove them: {stale}"


def layer_of(name: str, layers: tuple[tuple[str, frozenset[str]], ...] = LAYERS) -> int:
    """The layer index of a module: its own entry, else its top-level subpackage's ``pkg/``."""
    for index, (_label, members) in enumerate(layers):
        if name in members:
            return index
    if name:
        package = name.split(".", 1)[0] + "/"
        for index, (_label, members) in enumerate(layers):
            if package in members:
                return index
    raise KeyError(name)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for mod, deps in graph.items():
        for dep in deps:
            if layer_of(dep) > layer_of(mod):
                problems.append(f"{mod or '__init__'} ({LAYERS[layer_of(mod)][0]}) imports "
                                f"{dep} ({LAYERS[layer_of(dep)][0]})")
    return sorted(problems)


def test_every_module_has_a_layer(modules: dict[str, Module]) -> None:
    unplaced = []
    for name in modules:
        try:
            layer_of(name)
        except KeyError:
            unplaced.append(name)
    assert not unplaced, f"place these modules in LAYERS: {unplaced}"


def test_layers_point_one_way(modules: dict[str, Module]) -> None:
    assert upward_imports(import_graph(modules)) == []


def test_no_private_saver_member_outside_saver(modules: dict[str, Module]) -> None:
    found = private_accesses(modules)
    new = found - KNOWN_PRIVATE
    assert not new, "private SecureSaver members used outside saver.py: " + ", ".join(
        f"{m}: .{a}" for m, a in sorted(new))
    stale = KNOWN_PRIVATE - found
    assert not stale, f"KNOWN_PRIVATE lists accesses that are gone, remove them: {stale}"


def test_module_sizes(modules: dict[str, Module]) -> None:
    too_long = {f"{n or '__init__'} ({_lines(m)})" for n, m in modules.items()
                if _lines(m) > HARD_MAX_MODULE_LINES}
    assert not too_long, f"modules over {HARD_MAX_MODULE_LINES} lines: {sorted(too_long)}"
    over = {name for name, mod in modules.items() if _lines(mod) > MAX_MODULE_LINES}
    new = over - KNOWN_OVERSIZE
    sizes = ", ".join(f"{n or '__init__'} ({_lines(modules[n])})" for n in sorted(new))
    assert not new, f"modules over {MAX_MODULE_LINES} lines: {sizes}"
    stale = KNOWN_OVERSIZE - over
    assert not stale, f"KNOWN_OVERSIZE lists modules now small enough, remove them: {stale}"


def _subpackages(modules: dict[str, Module]) -> list[Module]:
    return [m for m in modules.values() if m.is_package and m.name]


def test_the_top_level_is_a_few_modules_and_subpackages(modules: dict[str, Module]) -> None:
    """Every top-level module and subpackage is named in LAYERS, and each ``pkg/`` entry is a
    subpackage (a stale entry fails)."""
    named = set().union(*(members for _label, members in LAYERS))
    top = {n for n in modules if "." not in n}
    packages = {m.name + "/" for m in _subpackages(modules) if "." not in m.name}
    unnamed = sorted(n for n in top if n not in named and n + "/" not in named)
    assert not unnamed, f"place these in LAYERS: {unnamed}"
    stale = sorted(n for n in named if (n.endswith("/") and n not in packages)
                   or (not n.endswith("/") and n not in top))
    assert not stale, f"LAYERS names what does not exist: {stale}"


def test_every_subpackage_says_what_it_holds_and_may_import(modules: dict[str, Module]) -> None:
    silent = sorted(m.name for m in _subpackages(modules) if "." not in m.name
                    and "May import" not in (ast.get_docstring(m.tree) or ""))
    assert not silent, f"subpackage docstrings without a 'May import' paragraph: {silent}"


def test_secure_saver_class_size(modules: dict[str, Module]) -> None:
    lines = saver_class_lines(modules)
    if SAVER_CLASS_STILL_OVERSIZE:
        assert lines > MAX_SAVER_CLASS_LINES, "SecureSaver is small enough now: clear the flag"
    else:
        assert lines <= MAX_SAVER_CLASS_LINES, f"SecureSaver is {lines} lines"


# --- the checks themselves are attacked on small synthetic packages -------------------------

def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    root = tmp_path / PACKAGE
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return _modules(root)


def test_cycle_check_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    mods = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "def f():\n    from .b import g\n    return g\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
        "c.py": "from . import d\n",
        "d.py": "import os\n",
        "sub/__init__.py": "",
        "sub/e.py": "from ..c import x\nfrom langgraph_securesaver.sub import f\n",
        "sub/f.py": "import langgraph_securesaver.sub.e\n",
    })
    graph = import_graph(mods)
    assert graph["a"] == {"b"} and graph["b"] == {"a"}
    assert graph["c"] == {"d"} and graph["d"] == set()
    assert graph["sub.e"] == {"c", "sub.f"} and graph["sub.f"] == {"sub.e"}
    assert set(cycles(graph)) == {frozenset({"a", "b"}), frozenset({"sub.e", "sub.f"})}


def test_cycle_check_passes_a_layered_package(tmp_path: Path) -> None:
    mods = _package(tmp_path, {
        "__init__.py": "from .top import T\n",
        "low.py": "X = 1\n",
        "mid.py": "from .low import X\n",
        "top.py": "def t():\n    from .mid import X\n    return X\nT = t\n",
    })
    assert cycles(import_graph(mods)) == []


def test_private_member_check_catches_each_shape(tmp_path: Path) -> None:
    saver = ("class SecureSaver:\n"
             "    def __init__(self):\n        self._ops = 1\n        self.public = 2\n"
             "    def _ref(self):\n        return self._ops\n")
    mods = _package(tmp_path, {
        "__init__.py": "",
        "saver.py": saver,
        "ok.py": ("class Own:\n    def __init__(self):\n        self._ops = 1\n"
                  "    def f(self, saver):\n        return self._ops, saver.public, saver.__dict__\n"),
        "bad1.py": "def f(saver):\n    return saver._whatever\n",
        "bad2.py": "class P:\n    def f(self):\n        return self._saver._ref()\n",
        "bad3.py": "def f(store):\n    return store.saver._ops\n",
        "bad4.py": "def f(s):\n    return s._ref()\n",  # renamed variable, known private name
        "bad5.py": "def f(x):\n    return getattr(x.saver, '_secret')\n",
    })
    assert private_accesses(mods) == {("bad1", "_whatever"), ("bad2", "_ref"), ("bad3", "_ops"),
                                      ("bad4", "_ref"), ("bad5", "_secret")}


def test_layer_check_catches_an_upward_import(tmp_path: Path) -> None:
    mods = _package(tmp_path, {"__init__.py": "", "errors.py": "def f():\n    from . import saver\n",
                               "saver.py": "from . import errors\n"})
    assert upward_imports(import_graph(mods)) == [
        "errors (foundation) imports saver (checkpointer)"]


def test_layer_check_catches_an_upward_import_between_packages(tmp_path: Path) -> None:
    """Packages are layers: a planted import from keys/ up to registry/ (relative, absolute,
    type-only) fails; imports down, inside a package and from a facade pass."""
    mods = _package(tmp_path, {
        "__init__.py": "from .registry.core import R\n",
        "errors.py": "",
        "keys/__init__.py": "",
        "keys/crypto.py": ("from typing import TYPE_CHECKING\nfrom ..errors import E\n"
                           "if TYPE_CHECKING:\n    from ..registry import core\n"),
        "keys/keyring.py": "from . import crypto\nimport langgraph_securesaver.registry.schema\n",
        "registry/__init__.py": "",
        "registry/core.py": "from ..keys.crypto import K\nfrom .schema import S\n",
        "registry/schema.py": "",
        "cli/__init__.py": "", "cli/main.py": "from ..registry import core\n",
        "idempotency/__init__.py": "def f():\n    from ..cli import main\n",
        "idempotency/store.py": "from ..keys import crypto\n",
    })
    assert upward_imports(import_graph(mods)) == [
        "keys.crypto (keys) imports registry.core (registry)",
        "keys.keyring (keys) imports registry.schema (registry)"]


def test_a_module_outside_the_layers_is_reported(tmp_path: Path) -> None:
    mods = _package(tmp_path, {"__init__.py": "", "newpkg/__init__.py": "", "newpkg/x.py": "",
                               "loose.py": "", "keys/__init__.py": "", "keys/crypto.py": ""})
    assert layer_of("keys.crypto") == layer_of("keys") == 1
    assert layer_of("idempotency") != layer_of("idempotency.store")
    for name in ("newpkg", "newpkg.x", "loose"):
        with pytest.raises(KeyError):
            layer_of(name)
    assert sorted(n for n in mods if not _placed(n)) == ["loose", "newpkg", "newpkg.x"]


def _placed(name: str) -> bool:
    try:
        layer_of(name)
    except KeyError:
        return False
    return True


def test_saver_class_size_counts_the_class_only(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(10))
    mods = _package(tmp_path, {"__init__.py": "", "saver.py":
                               "import os\n\n\nclass SecureSaver:\n" + body + "\n\nY = 1\n"})
    assert saver_class_lines(mods) == 11


# --- the paths users write down resolve, and nothing else re-exports them ------------------------

def test_the_paths_server_configurations_name_resolve() -> None:
    """langgraph.json paths and the console entry point resolve to the objects they name."""
    import importlib

    pytest.importorskip("langgraph_sdk")
    pairs = {
        ("langgraph_securesaver.server", "checkpointer"): "langgraph_securesaver.server.saver",
        ("langgraph_securesaver.server", "make_checkpointer"): "langgraph_securesaver.server.saver",
        ("langgraph_securesaver.server", "tenant_from_field"): "langgraph_securesaver.server.saver",
        ("langgraph_securesaver.server.store", "store"): "langgraph_securesaver.server.store",
        ("langgraph_securesaver.server.encryption", "encryption"):
            "langgraph_securesaver.server.encryption",
        ("langgraph_securesaver.cli", "app"): "langgraph_securesaver.cli.main",
    }
    for (old, name), new in pairs.items():
        module = importlib.import_module(old)
        # LangGraph Server's loader reads the name from the module's __dict__; the console
        # entry point imports cli.app, which is loaded on first use
        value = getattr(module, name) if old.endswith(".cli") else vars(module).get(name)
        assert value is getattr(importlib.import_module(new), name), f"{old}.{name}"


def test_no_module_is_a_re_export_shim() -> None:
    """Nothing is released yet: no module exists only to keep an old import path working (the
    two facades excepted), and no name is kept as an alias "for compatibility"."""
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT).as_posix()
        assert "import *" not in text, f"{rel} re-exports with import *"
        assert "for compatibility" not in text.lower(), f"{rel} keeps something for compatibility"
    for old in ("server_store", "server_encryption", "server_records"):
        assert not (ROOT / f"{old}.py").exists(), old


@pytest.mark.parametrize(("module", "code"), [("langgraph_securesaver.cli", 0),
                                               ("langgraph_securesaver.server.records", 2)])
def test_the_documented_python_m_commands_still_run(module: str, code: int) -> None:
    """``--help``: the CLI's help (0); the record-file converter's usage line (2)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == code and "usage" in (out.stdout + out.stderr).lower(), out.stderr
