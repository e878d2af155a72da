"""What every benchmark side shares: the job/result file protocol, the child-process environment, a timer."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child_env() -> dict[str, str]:
    """The same environment for every side: offline and quiet. Each side pins its own torch threads."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore", TQDM_DISABLE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@dataclass
class ChildRun:
    wall_s: float  # process start to exit, as seen by the parent (imports and model load included)
    cpu_s: float  # user + system CPU of the process and all its descendants
    result: dict
    log_path: Path


def children_cpu_s() -> float:
    """CPU seconds used so far by this process's finished (waited-for) children and theirs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_child(module: str, job: dict, work: Path, timeout: float = 3600, env: dict[str, str] | None = None,
              base_env: dict[str, str] | None = None) -> ChildRun:
    """Run `python -m <module> job.json` in its own process; it writes job["result_path"]. Output goes to a log.
    The environment is `base_env` (default: child_env()) updated with `env`."""
    work.mkdir(parents=True, exist_ok=True)
    name = module.rsplit(".", 1)[-1]
    job = dict(job, result_path=str(work / f"{name}.result.json"))
    job_path = work / f"{name}.job.json"
    job_path.write_text(json.dumps(job, indent=1), encoding="utf-8")
    log_path = work / f"{name}.log"
    cpu_before = children_cpu_s()
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call([sys.executable, "-m", module, str(job_path)], cwd=ROOT, env={**(base_env or child_env()), **(env or {})},
                               stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    wall = time.perf_counter() - started
    cpu = children_cpu_s() - cpu_before
    if code != 0:
        tail = "".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"{module} exited with code {code}; last lines of {log_path}:\n{tail}")
    return ChildRun(wall, cpu, json.loads(Path(job["result_path"]).read_text(encoding="utf-8")), log_path)


def read_job(argv: list[str]) -> dict:
    return json.loads(Path(argv[0]).read_text(encoding="utf-8"))


def write_result(job: dict, result: dict) -> None:
    Path(job["result_path"]).write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")


def demo_cache(cache: Path, checkpoint: Path) -> Path:
    """A fresh QUANTGATE_CACHE that already holds the converted demo checkpoint (linked, not converted again)."""
    models = cache / "models"
    models.mkdir(parents=True, exist_ok=True)
    link = models / "smollm2-135m-instruct-bf16"  # where harness.source looks for the converted demo model
    if not link.exists():
        link.symlink_to(checkpoint, target_is_directory=True)
    return cache


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
