"""No import cycles among harness modules: every module's imports, read with ast (nothing is imported).

Imports inside functions count: a lazy import (of a heavy or optional library, or to keep start-up quick) still
makes the function depend on that module, and a late import that only hides a cycle leaves the cycle there. Only
imports under `if TYPE_CHECKING:` (read by type checkers, never run) are not edges.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

PACKAGE = "harness"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def harness_modules() -> dict[str, Path]:
    """Every module under harness/, by dotted name, and its file (a package's is its __init__.py).

    pkgutil.iter_modules, one directory at a time (walk_packages would import every package to find its
    submodules); it skips a directory without an __init__.py, so those (namespace packages such as
    harness/runtime/vllm) are entered here."""
    modules = {PACKAGE: ROOT / "__init__.py"}
    pending = [(ROOT, PACKAGE)]
    while pending:
        directory, package = pending.pop()
        for info in pkgutil.iter_modules([str(directory)]):
            name = f"{package}.{info.name}"
            if info.ispkg:
                modules[name] = directory / info.name / "__init__.py"
                pending.append((directory / info.name, name))
            else:
                modules[name] = directory / f"{info.name}.py"
        for sub in sorted(directory.iterdir()):
            if (sub.is_dir() and sub.name.isidentifier() and not (sub / "__init__.py").exists()
                    and any(sub.glob("*.py"))):
                pending.append((sub, f"{package}.{sub.name}"))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(body: list[ast.stmt]):
    """Every import statement in these statements and the blocks nested in them (if/try/with/for/match, class and
    function bodies), but those under `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse)
        else:
            for block in ("body", "orelse", "finalbody"):
                yield from _imports(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _imports(handler.body)
            for case in getattr(node, "cases", []):
                yield from _imports(case.body)


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The harness modules `name` imports, in functions too. `from harness.x import y` is an edge to harness.x.y
    when that is a module, else to harness.x; `import harness.x.y` to harness.x.y. Importing harness.x.y first
    runs harness.x's __init__, so that package is an edge too, unless it is one of `name`'s own packages (whose
    __init__ is already running or done by the time `name` runs)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path)).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            while target and target not in modules:  # `import harness.x.y` where y is not a module: harness.x
                target = target.rpartition(".")[0]
            while target:  # the module and the packages above it that are not name's own
                if target != name and target not in own_packages:
                    found.add(target)
                target = target.rpartition(".")[0]
    return found


def import_graph() -> dict[str, set[str]]:
    modules = harness_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Depth-first, in sorted order, so the answer is stable."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_graph_sees_every_module_and_its_imports():
    graph = import_graph()
    assert {"harness", "harness.units", "harness.report", "harness.report.view", "harness.decide"} <= set(graph)
    assert "harness.units" in graph["harness.decide"]  # `from harness import units`: the submodule
    assert "harness.units" in graph["harness.report.view"]  # `from harness.units import ...`
    assert graph["harness.units"] == set()
    assert "harness.runtime.vllm.client" in graph["harness.served"]  # a namespace package's module
    assert "harness.commands.compare.trend_html" in graph["harness.commands.compare"]  # imported in a function
    on_disk = {p.relative_to(ROOT.parent).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
               for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}
    assert on_disk == set(graph)


def test_find_cycle_names_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_relative_imports_resolve(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\nfrom .sub import c\nfrom .sub.c import name\n"
                                  "def f():\n    from . import d\n"
                                  "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.e\n")
    (package / "sub" / "__init__.py").write_text("from .. import a\nfrom . import c\n")
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "a.py",
               "pkg.d": package / "a.py", "pkg.e": package / "a.py", "pkg.sub": package / "sub" / "__init__.py",
               "pkg.sub.c": package / "a.py"}
    # pkg.sub.c's import runs pkg.sub's __init__ first; pkg's own __init__ is no edge of its submodules; the import
    # in f() is an edge, the one under TYPE_CHECKING is not
    assert imported_modules("pkg.a", package / "a.py", modules) == {"pkg.b", "pkg.d", "pkg.sub", "pkg.sub.c"}
    assert imported_modules("pkg.sub", package / "sub" / "__init__.py", modules) == {"pkg.a", "pkg.sub.c"}


def test_no_import_cycles_among_harness_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle (imports inside functions included): " + " -> ".join(cycle)
