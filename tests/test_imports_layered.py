"""The import graph: no cycle (imports inside functions and under TYPE_CHECKING included), and no module imports
one of a layer above its own. Each package or module has one layer; a new module must be given one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Lowest first. A module may import its own layer and those below.
LAYERS = (
    ("harness", "harness.errors", "harness.units", "harness.cache", "harness.progress", "harness.quiet", "harness.flags",
     "harness.logtext",
     "harness.jsonl", "harness.sandbox"),
    # the report's schema: the typed blocks the stages build (it imports only harness.errors and pydantic)
    ("harness.metrics*", "harness.stats", "harness.report.schema"),
    ("harness.evalsets*", "harness.formats", "harness.quant_config", "harness.calibration", "harness.source",
     "harness.jobs", "harness.plugins"),
    ("harness.runtime*", "harness.quantize*", "harness.measure*", "harness.capacity*", "harness.launcher", "harness.policy"),
    ("harness.fidelity*", "harness.diagnose*"),
    ("harness.config", "harness.executors*", "harness.environment", "harness.candidates", "harness.served", "harness.decide",
     "harness.evaluate", "harness.format_plans", "harness.records", "harness.cachekeys", "harness.worker", "harness.artifacts",
     "harness.device_plan", "harness.collect", "harness.serving"),
    ("harness.report*",),
    ("harness.review*",),
    ("harness.pipeline",),
    ("harness.commands*", "harness.cli", "harness.__main__"),
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "harness").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _layer(module: str) -> int | None:
    for index, patterns in enumerate(LAYERS):
        for pattern in patterns:
            stem = pattern.rstrip("*")
            if module == stem or (pattern.endswith("*") and module.startswith(stem + ".")):
                return index
    return None


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.append((full if full in modules else node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "harness"]
    return [(name, line) for name, line in found if name in modules]


def test_every_module_has_a_layer_and_imports_none_above_it():
    modules = _modules()
    unlayered = sorted(m for m in modules if _layer(m) is None)
    assert not unlayered, f"give these modules a layer in LAYERS: {unlayered}"
    upward = [f"{m}:{line} imports {target} (layer {_layer(target)} above {_layer(m)})"
              for m, path in modules.items() for target, line in _imports(path, modules) if _layer(target) > _layer(m)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    modules = _modules()
    graph = {m: {t for t, _ in _imports(p, modules)} - {m} for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert not cycles, cycles


def test_the_schema_imports_no_renderer():
    """The stages build the report's blocks as schema objects: importing the schema (and so harness/report/__init__)
    must not load the renderers, which sit above the stages."""
    import subprocess
    import sys

    code = ("import sys, harness.report.schema; "
            "print(sorted(m for m in sys.modules if m.startswith('harness.') and m not in "
            "('harness.report', 'harness.report.schema', 'harness.errors')))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout
