"""Where quantgate's evaluation time goes: py-spy samples of the quantgate side and its worker, by category.

Run separately from the timed runs (sampling perturbs them). Categories are decided by the frames of each
sample, first match wins; the numbers are CPU seconds (py-spy samples only running threads).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from benchmarks.common import ROOT, child_env

RATE = 100  # samples per second
CATEGORIES = (  # (name, test on the sample's frames)
    ("imports (python modules, both processes)", lambda f: any("_find_and_load" in x for x in f)),
    ("generation: model forward (transformers/torch)", lambda f: any("generate_evalset" in x for x in f)
     and any(" (transformers/models/" in x and "forward" in x for x in f)),
    ("generation: transformers generate loop", lambda f: any("generate_evalset" in x for x in f)
     and any("(transformers/generation/" in x for x in f)),
    ("generation: harness code", lambda f: any("generate_evalset" in x for x in f)),
    ("model and tokenizer load", lambda f: any("from_pretrained" in x for x in f)),
    ("evalset loading, prompt rendering, scoring", lambda f: any(k in x for x in f for k in (
        "load_evalsets", "render_prompts", "score_item", "resolve_source"))),
    ("threads waiting (worker pipe, memory watch, progress)", lambda f: f[-1].startswith(("Condition.wait", "Event.wait"))
     or any(k in f[-1] for k in ("run_worker (", "_relay_stderr ("))),
    ("interpreter start-up and exit (native code)", lambda f: len(f) <= 2),
)


def pyspy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


def profile_child(module: str, job_path: Path, out: Path, env: dict[str, str]) -> Path:
    """Run `python -m module job_path` under py-spy (with its subprocesses); raw stacks go to `out`."""
    command = [pyspy(), "record", "--subprocesses", "--rate", str(RATE), "--format", "raw", "--output", str(out),
               "--", sys.executable, "-m", module, str(job_path)]
    log = out.with_suffix(".log")
    with open(log, "w", encoding="utf-8") as handle:
        code = subprocess.call(command, cwd=ROOT, env={**child_env(), **env}, stdout=handle, stderr=subprocess.STDOUT)
    if code != 0 or not out.is_file():
        raise RuntimeError(f"py-spy run failed (exit {code}); see {log}")
    return out


def summarize(raw: Path) -> dict[str, float]:
    """CPU seconds per category (plus "other") from py-spy's raw output: `frame;frame;... count` per line."""
    seconds: Counter[str] = Counter()
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        name = next((name for name, test in CATEGORIES if test(frames)), "other")
        seconds[name] += int(count) / RATE
    return dict(seconds.most_common())
