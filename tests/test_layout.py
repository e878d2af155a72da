"""docs/layout.md ("Code layout") names every module under harness/, and every full path it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("harness/", "benchmarks/", "scripts/", "evalsets/", "docs/", "policies/")


def _layout_section() -> str:
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    start = text.index("## Code layout")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_readme_layout_matches_the_tree():
    named = set(re.findall(r"`([\w./-]+)`", _layout_section()))
    missing = sorted(p for p in named if p.startswith(TOP) and not (ROOT / p).exists())
    assert not missing, f"docs/layout.md names paths that do not exist: {missing}"
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "harness").rglob("*.py")
                     if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts)
    folders = [n for n in named if n.endswith("/")]  # a folder named as a whole covers its modules

    def covered(module: str) -> bool:
        return (module in named or module.rsplit("/", 1)[-1] in named
                or any(module.startswith(f) or f"/{f}" in module for f in folders))

    unnamed = [m for m in modules if not covered(m)]
    assert not unnamed, f"modules docs/layout.md does not name: {unnamed}"
