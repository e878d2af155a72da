"""What quantgate's processes may reach and where they may write: no network, and nothing outside the output
directory and quantgate's cache.

- Offline: the Hugging Face libraries get HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE and HF_DATASETS_OFFLINE=1, in
  the CLI process and in every worker, unless the user sets QUANTGATE_ALLOW_NETWORK=1.
- Library caches and scratch space (HF_HOME, TMPDIR, Triton, TorchInductor, matplotlib, GPTQModel's kernel
  builds, XDG_CACHE_HOME) point into the cache, in the CLI process and in every worker. A user's HF_HOME is
  not used (it is often a shared hub cache); set QUANTGATE_HF_HOME to name the HF_HOME quantgate should use.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, MutableMapping

from harness.cache import cache_dir, cache_root
from harness.errors import UserError

ALLOW_NETWORK_ENV = "QUANTGATE_ALLOW_NETWORK"
HF_HOME_ENV = "QUANTGATE_HF_HOME"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def network_allowed(env: Mapping[str, str]) -> bool:
    return env.get(ALLOW_NETWORK_ENV) == "1"


def apply_offline(env: MutableMapping[str, str]) -> None:
    """Set the HF offline variables in `env` unless the user allowed the network."""
    if not network_allowed(env):
        env.update(OFFLINE)


def cache_locations(env: Mapping[str, str]) -> dict[str, str]:
    """Every library cache and scratch directory a run may write, each inside quantgate's cache (created by the
    library that uses it, except TMPDIR, which must exist)."""
    root = cache_root()
    return {
        "HF_HOME": env.get(HF_HOME_ENV) or str(root / "hf_home"),  # tokenicer would use /tmp/tokenicer_hf_home
        "TMPDIR": str(cache_dir("tmp")),  # GPTQModel offloads layers here during quantization
        "TRITON_CACHE_DIR": str(root / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"),
        "MPLCONFIGDIR": str(root / "matplotlib"),
        # GPTQModel JIT-builds a CPU packing kernel (about 30 s, once per cache) under ~/.cache/gptqmodel otherwise
        "GPTQMODEL_TORCH_EXTENSIONS_DIR": str(root / "torch_extensions"),
        "XDG_CACHE_HOME": str(root / "xdg"),
    }


def confine_process() -> None:
    """Apply the offline variables and cache locations to this process (the CLI, before any library import)."""
    apply_offline(os.environ)
    try:
        os.environ.update(cache_locations(os.environ))
    except UserError:  # no cache can be made: commands that need one say so when they do (decide needs none)
        return
    tempfile.tempdir = None  # re-read TMPDIR on the next temp file
