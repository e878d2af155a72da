"""Target GPUs by name: memory as the driver reports it, compute capability, and which kernels that allows.

memory_bytes is the total nvidia-smi shows (its MiB x 2^20), which is also what torch.cuda.mem_get_info reports as
total and what vLLM multiplies by --gpu-memory-utilization: the nominal usable memory. ECC and the driver's own
reservation are already taken off; the CUDA context is not (memory.NON_TORCH_BYTES counts it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 2**20
MARLIN_MIN_CC = 8.0  # vLLM/SGLang's gptq_marlin / awq_marlin 4-bit kernels (quantization/utils/marlin_utils.py)
FP8_MIN_CC = 8.9  # FP8 tensor cores (Ada, Hopper, Blackwell): fp8 KV cache and FP8 weights
BF16_MIN_CC = 8.0  # vLLM: "Bfloat16 is only supported on GPUs with compute capability of at least 8.0"
AWQ_MIN_CC = 7.5  # vLLM's AWQConfig.get_min_capability()
GPTQ_MIN_CC = 6.0  # vLLM's GPTQConfig.get_min_capability()
# The compute capability each --quantization method's kernels need (vLLM's get_min_capability(); SGLang's are
# vLLM's); a method not named here has no floor quantgate knows.
KERNEL_MIN_CC = {"gptq": GPTQ_MIN_CC, "awq": AWQ_MIN_CC, "gptq_marlin": MARLIN_MIN_CC, "awq_marlin": MARLIN_MIN_CC}


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int
    compute_capability: float | None  # None: a GPU given by its size alone
    nominal: str = ""  # the marketed size, e.g. "80 GB HBM3"

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30

    def describe(self) -> str:
        size = f"{self.memory_gib:.2f} GiB"
        if self.compute_capability is None:
            return f"{self.name} ({size}; compute capability unknown)"
        return (f"{self.name} ({self.nominal}: {size} as the driver reports it, {self.memory_bytes // MIB:,} MiB; "
                f"compute capability {self.compute_capability:.1f})")


def _gpu(name: str, mib: int, cc: float, nominal: str) -> Gpu:
    return Gpu(name, mib * MIB, cc, nominal)


# nvidia-smi's total memory for each card (MiB).
GPUS: tuple[Gpu, ...] = (
    _gpu("T4", 15_360, 7.5, "16 GB GDDR6"),
    _gpu("A10G", 23_028, 8.6, "24 GB GDDR6"),
    _gpu("L4", 23_034, 8.9, "24 GB GDDR6"),
    _gpu("RTX-4090", 24_564, 8.9, "24 GB GDDR6X"),
    _gpu("A100-40GB", 40_960, 8.0, "40 GB HBM2"),
    _gpu("L40S", 46_068, 8.9, "48 GB GDDR6"),
    _gpu("A100-80GB", 81_920, 8.0, "80 GB HBM2e"),
    _gpu("H100-PCIe", 81_559, 9.0, "80 GB HBM2e"),
    _gpu("H100-SXM", 81_559, 9.0, "80 GB HBM3"),
    _gpu("H100-NVL", 95_830, 9.0, "94 GB HBM3"),
    _gpu("H200", 143_771, 9.0, "141 GB HBM3e"),
    _gpu("B200", 183_359, 10.0, "180 GB HBM3e"),
)
_ALIASES = {"H100": "H100-SXM", "4090": "RTX-4090", "A10": "A10G"}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", ""))


def gpu_by_name(name: str) -> Gpu:
    """A GPU of the table, by name (case, spaces and dashes ignored: "h100 sxm", "H100-SXM", "rtx4090")."""
    key = _key(_ALIASES.get(name.strip().upper(), name))
    for gpu in GPUS:
        if _key(gpu.name) == key:
            return gpu
    matches = [gpu.name for gpu in GPUS if _key(gpu.name).startswith(key)] if key else []
    hint = f"which one: {', '.join(matches)}" if len(matches) > 1 else f"known: {', '.join(g.name for g in GPUS)}"
    raise ValueError(f"unknown GPU {name!r} ({hint}); or give its size with --gpu-memory-gib")


def with_article(name: str) -> str:
    """'an L4', 'a T4', 'an H100-SXM', 'an 80 GiB GPU': the article of the name as it is read out."""
    return f"{'an' if name[:1].upper() in 'AEFHILMNORSX8' else 'a'} {name}"


def gpu_of_size(gib: float, like: Gpu | None = None) -> Gpu:
    """A GPU given by its memory in GiB; `like` keeps a named GPU's compute capability (a MIG slice, a shared card)."""
    if like is None:
        return Gpu(f"{gib:g} GiB GPU", int(gib * 2**30), None)
    return Gpu(f"{like.name} at {gib:g} GiB", int(gib * 2**30), like.compute_capability, like.nominal)


def this_gpu(name: str, total_memory_bytes: int, capability: str | None) -> Gpu:
    """The GPU a server runs on, as torch describes it: its own memory and compute capability (so the plan picks
    the kernels vLLM picks there, e.g. Marlin from 8.0)."""
    cc = float(capability) if capability else None
    return Gpu(name, int(total_memory_bytes), cc, f"{total_memory_bytes / 2**30:.1f} GiB")


def has_capability(gpu: Gpu, minimum: float) -> bool | None:
    """Whether the GPU's compute capability reaches `minimum`; None when it is not known."""
    return None if gpu.compute_capability is None else gpu.compute_capability >= minimum - 1e-9


def kernel_support(gpu: Gpu) -> dict[str, bool | None]:
    """What the GPU's compute capability allows: bf16, the Marlin 4-bit fast path, plain AWQ/GPTQ kernels, FP8."""
    return {"bf16": has_capability(gpu, BF16_MIN_CC), "marlin": has_capability(gpu, MARLIN_MIN_CC),
            "awq": has_capability(gpu, AWQ_MIN_CC), "gptq": has_capability(gpu, GPTQ_MIN_CC),
            "fp8": has_capability(gpu, FP8_MIN_CC)}
