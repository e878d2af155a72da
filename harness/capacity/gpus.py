"""Target GPUs by name: memory as torch reports it, compute capability (or AMD architecture), and which kernels
that allows.

memory_bytes is the device total torch reports (torch.cuda.get_device_properties().total_memory, the total of
torch.cuda.mem_get_info()), which is what vLLM multiplies by --gpu-memory-utilization and what a CUDA out-of-memory
message calls "total capacity". It sits below nvidia-smi's MiB (recent drivers keep a reservation nvidia-smi still
counts: an H100 SXM shows 81,559 MiB = 79.65 GiB and logs 79.11 GiB) and further below the marketed GB. Each figure
is a logged one with its source, or marked `estimated` with the reason; the CUDA context is not taken off
(memory.NON_TORCH_BYTES counts it).

Names are matched as people type them: case, spaces, dashes, "NVIDIA", "GeForce", "Tesla", "AMD", "Instinct" are
ignored, so nvidia-smi's own names ("NVIDIA H100 80GB HBM3", "Tesla T4") resolve as well as "rtx4090" or "3090". A
name that stands for several cards ("A100", "H100") takes the common one and the match says so (GpuMatch.note).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

MIB = 2**20
GIB = 2**30
MARLIN_MIN_CC = 8.0  # vLLM/SGLang's gptq_marlin / awq_marlin 4-bit kernels (quantization/utils/marlin_utils.py)
FP8_MIN_CC = 8.9  # FP8 tensor cores (Ada, Hopper, Blackwell): fp8 KV cache and FP8 weights
BF16_MIN_CC = 8.0  # vLLM: "Bfloat16 is only supported on GPUs with compute capability of at least 8.0"
AWQ_MIN_CC = 7.5  # vLLM's AWQConfig.get_min_capability()
GPTQ_MIN_CC = 6.0  # vLLM's GPTQConfig.get_min_capability()
# The compute capability each --quantization method's kernels need (vLLM's get_min_capability(); SGLang's are
# vLLM's); a method not named here has no floor quantgate knows.
KERNEL_MIN_CC = {"gptq": GPTQ_MIN_CC, "awq": AWQ_MIN_CC, "gptq_marlin": MARLIN_MIN_CC, "awq_marlin": MARLIN_MIN_CC}
# AMD Instinct architectures with FP8 (MI300 series on): vLLM on ROCm has no Marlin kernels on any of them.
AMD_FP8_ARCHS = frozenset({"gfx942", "gfx950"})


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int
    compute_capability: float | None  # None: a GPU given by its size alone, or an AMD GPU (see arch)
    nominal: str = ""  # the marketed size, e.g. "80 GB HBM3"
    vendor: str = "nvidia"  # "nvidia" or "amd"
    arch: str = ""  # AMD: the gfx target torch reports (gcnArchName), e.g. "gfx942"
    aliases: tuple[str, ...] = field(default=(), compare=False, repr=False)  # nvidia-smi's names and typed forms
    source: str = field(default="", compare=False, repr=False)  # where memory_bytes was logged
    estimated: str = field(default="", compare=False, repr=False)  # why memory_bytes is derived, not logged

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def describe(self) -> str:
        size = f"{self.memory_gib:.2f} GiB"
        if self.vendor == "amd":
            return f"{self.name} ({self.nominal}: {size} as torch reports it; AMD {self.arch})"
        if self.compute_capability is None:
            return f"{self.name} ({size}; compute capability unknown)"
        return (f"{self.name} ({self.nominal}: {size} as torch reports it, {self.memory_bytes // MIB:,} MiB; "
                f"compute capability {self.compute_capability:.1f})")


@dataclass(frozen=True)
class GpuMatch:
    """A name resolved: the GPU, and a note to print where the name stood for several cards ("" when exact)."""

    gpu: Gpu
    note: str = ""


def _gpu(name: str, gib: float, cc: float | str, nominal: str, aliases: tuple[str, ...], source: str = "",
         estimated: str = "") -> Gpu:
    memory = round(gib * 1024) * MIB  # logs print GiB to 2 decimals: whole MiB is as exact as they are
    if isinstance(cc, str):
        return Gpu(name, memory, None, nominal, "amd", cc, aliases, source, estimated)
    return Gpu(name, memory, cc, nominal, "nvidia", "", aliases, source, estimated)


_H100_GAP = "the 0.54 GiB torch reports below nvidia-smi on the H100 SXM (81,559 MiB = 79.65 GiB, logged 79.11)"

# A figure without `estimated` is the total a log printed (torch's "total capacity of X GiB", vLLM's
# "total_gpu_memory (X GiB)", or cudaMemGetInfo's total), on the card named in that log. GPUS is smallest first.
_TABLE: tuple[Gpu, ...] = (
    _gpu("RTX-3060", 11.76, 8.6, "12 GB GDDR6", ("NVIDIA GeForce RTX 3060", "RTX 3060", "3060"),
         "https://github.com/TencentARC/PhotoMaker/issues/47"),
    _gpu("T4", 14.56, 7.5, "16 GB GDDR6", ("Tesla T4",),
         "https://github.com/Zheng-Chong/CatVTON/issues/133 (GCP; Colab's driver logs 14.75: "
         "https://github.com/hpcaitech/Open-Sora/issues/697)"),
    _gpu("RTX-5070-Ti", 15.45, 12.0, "16 GB GDDR7", ("NVIDIA GeForce RTX 5070 Ti", "RTX 5070 Ti", "5070 Ti"),
         estimated="no 5070 Ti log found; the RTX 5060 Ti, the same 16 GB GDDR7 Blackwell board, logs 15,816 MiB "
                   "CUDA-visible (https://github.com/Luce-Org/lucebox/issues/407)"),
    _gpu("RTX-4080", 15.64, 8.9, "16 GB GDDR6X",
         ("NVIDIA GeForce RTX 4080", "NVIDIA GeForce RTX 4080 SUPER", "RTX 4080", "4080", "RTX 4080 Super"),
         estimated="no 4080 log found; nvidia-smi's 16,376 MiB (15.99 GiB) less the 0.35 GiB torch reports below "
                   "nvidia-smi on the RTX 4090 (24,564 MiB = 23.99 GiB, logged 23.64)"),
    _gpu("V100-16GB", 15.78, 7.0, "16 GB HBM2",
         ("Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB", "V100 16GB", "V100-SXM2-16GB", "V100-PCIE-16GB"),
         estimated="no 16 GB V100 log found; nvidia-smi's 16,160 MiB, which torch matches on the V100 (the 32 GB "
                   "card logs 31.74 GiB against nvidia-smi's 32,510 MiB = 31.75)"),
    _gpu("A10", 22.09, 8.6, "24 GB GDDR6", ("NVIDIA A10",),
         "vLLM start-up logs (docs/serving.md corpus); torch OOMs on an A10 log 21.99 "
         "(https://github.com/zai-org/CogVLM/issues/236) and 22.18 (https://github.com/OpenBMB/MiniCPM-V/issues/640)"),
    _gpu("A10G", 22.09, 8.6, "24 GB GDDR6", ("NVIDIA A10G",),
         estimated="no A10G total in a log found; AWS's A10G is the A10's board (24 GB GDDR6, nvidia-smi 23,028 MiB, "
                   "compute capability 8.6), so the A10's logged 22.09 GiB (\"A10G reports ~22GB\": "
                   "https://github.com/huggingface/local-gemma/pull/25)"),
    _gpu("RTX-A4000", 15.61, 8.6, "16 GB GDDR6", ("NVIDIA RTX A4000", "RTX A4000", "A4000"),
         "https://github.com/DengKaiCQ/VGGT-Long/issues/6"),
    _gpu("A30", 23.53, 8.0, "24 GB HBM2", ("NVIDIA A30",), "https://github.com/google/RB-Modulation/issues/5"),
    _gpu("L4", 22.03, 8.9, "24 GB GDDR6", ("NVIDIA L4",), "https://github.com/ArcInstitute/evo2/issues/190"),
    _gpu("RTX-3090", 23.58, 8.6, "24 GB GDDR6X", ("NVIDIA GeForce RTX 3090", "RTX 3090", "3090"),
         "https://github.com/vllm-project/vllm/pull/14447 (vLLM's total_gpu_memory on RTX 3090s)"),
    _gpu("RTX-4090", 23.64, 8.9, "24 GB GDDR6X", ("NVIDIA GeForce RTX 4090", "RTX 4090", "4090"),
         "https://github.com/ali-vilab/VGen/issues/104"),
    _gpu("RTX-5090", 31.37, 12.0, "32 GB GDDR7", ("NVIDIA GeForce RTX 5090", "RTX 5090", "5090"),
         "https://github.com/Wan-Video/Wan2.1/issues/465"),
    _gpu("V100-32GB", 31.74, 7.0, "32 GB HBM2",
         ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB", "V100 32GB", "V100-SXM2-32GB",
          "V100S"), "https://github.com/liucongg/ChatGLM-Finetuning/issues/73"),
    _gpu("A100-40GB", 39.50, 8.0, "40 GB HBM2",
         ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100 40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"),
         "https://github.com/TianheWu/CoSeR/issues/10"),
    _gpu("L40", 44.40, 8.9, "48 GB GDDR6", ("NVIDIA L40",), "https://github.com/QwenLM/Qwen3-VL/issues/2097"),
    _gpu("L40S", 44.40, 8.9, "48 GB GDDR6", ("NVIDIA L40S",),
         "vLLM start-up logs (docs/serving.md corpus); a torch OOM on an L40S logs 44.53 "
         "(https://github.com/Wan-Video/Wan2.1/issues/205)"),
    _gpu("L20", 44.40, 8.9, "48 GB GDDR6", ("NVIDIA L20",),
         estimated="no L20 total in a log found; the L40's board (48 GB GDDR6, nvidia-smi 46,068 MiB), so the L40's "
                   "logged 44.40 GiB"),
    _gpu("A40", 44.40, 8.6, "48 GB GDDR6", ("NVIDIA A40",),
         estimated="no A40 total in a log found; nvidia-smi shows the L40's 46,068 MiB "
                   "(https://github.com/guqiong96/Lvllm/issues/35), so the L40's logged 44.40 GiB"),
    _gpu("RTX-6000-Ada", 44.43, 8.9, "48 GB GDDR6",
         ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", "6000 Ada", "RTX 6000 Ada Generation"),
         "https://github.com/DINGYANB/MTVCrafter/issues/21"),
    _gpu("RTX-A6000", 47.43, 8.6, "48 GB GDDR6", ("NVIDIA RTX A6000", "RTX A6000", "A6000"),
         estimated="no A6000 total in a log found; nvidia-smi's 49,140 MiB (47.99 GiB) less the 0.56 GiB torch "
                   "reports below nvidia-smi on the RTX 6000 Ada (46,068 MiB = 44.99 GiB, logged 44.43)"),
    _gpu("MI50-16GB", 15.98, "gfx906", "16 GB HBM2", ("AMD Instinct MI50 16GB", "Radeon Instinct MI50 16GB"),
         estimated="no MI50 total in a log found; 16 GiB less the 0.02 GiB ROCm keeps on the 64 GB Instinct"),
    _gpu("MI50-32GB", 31.98, "gfx906", "32 GB HBM2", ("AMD Instinct MI50 32GB", "Radeon Instinct MI50 32GB"),
         estimated="no MI50 total in a log found (the vllm-gfx906 threads print none); 32 GiB less the 0.02 GiB "
                   "ROCm keeps on the 64 GB Instinct"),
    _gpu("MI60", 31.98, "gfx906", "32 GB HBM2", ("AMD Instinct MI60", "Radeon Instinct MI60"),
         estimated="no MI60 total in a log found; 32 GiB less the 0.02 GiB ROCm keeps on the 64 GB Instinct"),
    _gpu("MI100", 31.98, "gfx908", "32 GB HBM2", ("AMD Instinct MI100",),
         estimated="no MI100 total in a log found; 32 GiB less the 0.02 GiB ROCm keeps on the 64 GB Instinct"),
    _gpu("MI210", 63.98, "gfx90a", "64 GB HBM2e", ("AMD Instinct MI210",),
         estimated="a HIP out-of-memory message from a 64 GB Instinct logs 63.98 GiB "
                   "(https://github.com/RooCodeInc/Roo-Code/issues/6541), the card not named there"),
    _gpu("MI250X", 63.98, "gfx90a", "64 GB HBM2e per GCD (128 GB card)", ("AMD Instinct MI250X", "MI250X/MI250"),
         estimated="each of its two GCDs is a 64 GB device to torch; the 64 GB Instinct HIP figure, 63.98 GiB "
                   "(https://github.com/RooCodeInc/Roo-Code/issues/6541)"),
    _gpu("A100-80GB", 79.15, 8.0, "80 GB HBM2e",
         ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "A100 80GB", "A100-SXM4-80GB", "A100-PCIE-80GB",
          "A100 80GB PCIe", "A100 SXM4 80GB"),
         "https://github.com/vllm-project/vllm/issues/4408 (torch; vLLM start-up logs show 79.15-79.35)"),
    _gpu("A800-80GB", 79.15, 8.0, "80 GB HBM2e",
         ("NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe", "A800-SXM4-80GB", "A800 80GB"),
         estimated="the A100-80GB for export (same 80 GB HBM2e, nvidia-smi 81,920 MiB), so the A100-80GB's logged "
                   "79.15 GiB"),
    _gpu("H100-PCIe", 79.11, 9.0, "80 GB HBM2e", ("NVIDIA H100 PCIe", "H100 PCIe 80GB"),
         estimated="no H100 PCIe total in a log found; nvidia-smi shows the SXM card's 81,559 MiB, so its logged "
                   "79.11 GiB"),
    _gpu("H100-SXM", 79.11, 9.0, "80 GB HBM3", ("NVIDIA H100 80GB HBM3", "H100 SXM5", "H100 80GB", "H100 SXM 80GB"),
         "https://github.com/vllm-project/vllm/issues/27508"),
    _gpu("H800", 79.11, 9.0, "80 GB HBM3", ("NVIDIA H800", "H800 80GB HBM3", "NVIDIA H800 80GB HBM3"),
         estimated="the H100 SXM for export (80 GB HBM3, nvidia-smi 81,559 MiB), so the H100's logged 79.11 GiB"),
    _gpu("H100-NVL", 93.00, 9.0, "94 GB HBM3", ("NVIDIA H100 NVL", "H100 NVL 94GB"),
         "https://github.com/ali-vilab/VACE/issues/56 (RunPod H100 NVL)"),
    _gpu("RTX-PRO-6000", 94.97, 12.0, "96 GB GDDR7",
         ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA RTX PRO 6000 Blackwell Server Edition",
          "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX PRO 6000 Blackwell", "RTX PRO 6000",
          "PRO 6000"),
         "https://github.com/antirez/ds4/issues/431 (cudaMemGetInfo total; nvidia-smi 97,887 MiB)"),
    _gpu("H20", 95.00, 9.0, "96 GB HBM3", ("NVIDIA H20", "H20 96GB"),
         "https://github.com/modelscope/DiffSynth-Studio/issues/1238"),
    _gpu("GH200-96GB", 95.00, 9.0, "96 GB HBM3", ("NVIDIA GH200 480GB", "GH200 480GB", "GH200 96GB"),
         estimated="no GH200 480GB total in a log found; its GPU carries the H20's 96 GB HBM3, logged 95.00 GiB"),
    _gpu("H200", 150_121_545_728 / GIB, 9.0, "141 GB HBM3e",
         ("NVIDIA H200", "H200 141GB", "H200 SXM", "H200 SXM 141GB"),
         "quantgate's own H200 run: torch total_memory 150,121,545,728 bytes (tests/test_vllm_backend.py); "
         "vLLM start-up logs show up to 140.06 GiB (docs/serving.md corpus)"),
    _gpu("GH200-144GB", 142.78, 9.0, "144 GB HBM3e", ("NVIDIA GH200 144G HBM3e", "GH200 144GB"),
         estimated="no GH200 144GB total in a log found; the H200's logged 139.81 GiB scaled by 144/141 GB"),
    _gpu("B200", 178.52, 10.0, "180 GB HBM3e", ("NVIDIA B200", "B200 180GB"),
         estimated="no B200 torch total in a log found; nvidia-smi's 183,359 MiB "
                   "(https://github.com/NVIDIA/TensorRT-LLM/issues/10278) less " + _H100_GAP),
    _gpu("GB200", 184.49, 10.0, "186 GB HBM3e", ("NVIDIA GB200", "GB200 NVL72"),
         estimated="no GB200 total in a log found; 186 GB per GPU (NVIDIA's GB200 NVL72 figure, 13.4 TB / 72), "
                   "185.03 GiB, less " + _H100_GAP),
    _gpu("MI300X", 191.98, "gfx942", "192 GB HBM3", ("AMD Instinct MI300X", "AMD Instinct MI300X VF"),
         estimated="rocminfo's GPU pool, 201,310,208 KB = 191.98 GiB "
                   "(https://github.com/ROCm/rocm-examples/issues/187), which HIP reports as the device total"),
    _gpu("MI325X", 255.98, "gfx942", "256 GB HBM3e", ("AMD Instinct MI325X",),
         estimated="no MI325X log found; 256 GiB less the 0.02 GiB ROCm keeps on the MI300X (192 -> 191.98) and "
                   "the 64 GB Instinct (64 -> 63.98)"),
    _gpu("B300", 267.78, 10.3, "288 GB HBM3e", ("NVIDIA B300", "NVIDIA B300 SXM6 AC", "B300 288GB"),
         estimated="no B300 log found; the B200's 178.52 GiB scaled by 288/192 GB of HBM3e"),
    _gpu("MI355X", 287.98, "gfx950", "288 GB HBM3e", ("AMD Instinct MI355X",),
         estimated="no MI355X log found; 288 GiB less the 0.02 GiB ROCm keeps on the MI300X (192 -> 191.98)"),
)
GPUS: tuple[Gpu, ...] = tuple(sorted(_TABLE, key=lambda gpu: gpu.memory_bytes))

_IGNORED_WORDS = re.compile(r"nvidia|geforce|tesla|instinct|\bamd\b|\(r\)|®|™")


def _key(name: str) -> str:
    """A name as people type it, reduced: lower case, no vendor or brand words, only letters and digits, a size
    "80G" as "80gb" (not the "10G" of "A10G")."""
    spelled = re.sub(r"(?<![a-z0-9])(\d+)\s*g(?![a-z0-9])", r"\1gb", _IGNORED_WORDS.sub("", name.lower()))
    return re.sub(r"[^a-z0-9]", "", spelled)


# A name that stands for several cards: the common one, and why (printed where the name is used).
_AMBIGUOUS: dict[str, tuple[str, str]] = {
    "a100": ("A100-80GB", "the A100 comes with 40 GB and 80 GB; the 80 GB SXM4 card is the common one "
                          "(--target-gpu A100-40GB for the other)"),
    "a100sxm4": ("A100-80GB", "the SXM4 A100 comes with 40 GB and 80 GB; the 80 GB card is the common one "
                              "(--target-gpu A100-40GB for the other)"),
    "a100sxm": ("A100-80GB", "the SXM4 A100 comes with 40 GB and 80 GB; the 80 GB card is the common one "
                             "(--target-gpu A100-40GB for the other)"),
    "a100pcie": ("A100-40GB", "the PCIe A100 comes with 40 GB and 80 GB; the 40 GB card, the smaller, is assumed "
                              "(--target-gpu 'A100 80GB PCIe' for the other)"),
    "h100": ("H100-SXM", "the H100 comes as SXM (80 GB HBM3), PCIe (80 GB) and NVL (94 GB); the SXM card is the "
                         "common one (--target-gpu H100-NVL or H100-PCIe for the others)"),
    "h100sxm": ("H100-SXM", ""),
    "v100": ("V100-16GB", "the V100 comes with 16 GB and 32 GB; the 16 GB card is the common one "
                          "(--target-gpu V100-32GB for the other)"),
    "v100sxm2": ("V100-16GB", "the V100 comes with 16 GB and 32 GB; the 16 GB card is the common one "
                              "(--target-gpu V100-32GB for the other)"),
    "v100pcie": ("V100-16GB", "the V100 comes with 16 GB and 32 GB; the 16 GB card is the common one "
                              "(--target-gpu V100-32GB for the other)"),
    "a800": ("A800-80GB", "the A800 comes with 40 GB (PCIe) and 80 GB; the 80 GB card is the common one"),
    "gh200": ("GH200-96GB", "the GH200 comes with 96 GB (GH200 480GB) and 144 GB of GPU memory; the 96 GB one is "
                            "assumed (--target-gpu GH200-144GB for the other)"),
    "rtx6000": ("RTX-6000-Ada", "'RTX 6000' names the RTX 6000 Ada (48 GB), the Turing Quadro RTX 6000 (24 GB, not in "
                                "the table) and the RTX PRO 6000 Blackwell (96 GB); the RTX 6000 Ada is assumed"),
    "mi50": ("MI50-32GB", "the MI50 comes with 16 GB and 32 GB; the 32 GB card, the one sold on for local "
                          "serving (vllm-gfx906), is assumed (--target-gpu MI50-16GB for the other)"),
    "mi250": ("MI250X", "the MI250 has the MI250X's 64 GB per GCD, each GCD one GPU to torch"),
    "mi300": ("MI300X", "the MI300X (192 GB) is assumed; the MI300A shares its memory with the CPU"),
}


def _index() -> dict[str, Gpu]:
    index: dict[str, Gpu] = {}
    for gpu in GPUS:
        for name in (gpu.name, *gpu.aliases):
            index.setdefault(_key(name), gpu)
    return index


_BY_KEY = _index()
_BY_NAME = {gpu.name: gpu for gpu in GPUS}
_EXAMPLES = ("T4", "L4", "RTX-4090", "L40S", "A100-80GB", "H100-SXM", "H200", "B200", "MI300X")


def find_gpu(name: str) -> GpuMatch:
    """The GPU of the table a name stands for, with a note where it stands for several cards. Raises ValueError
    naming the nearest known names for a name it does not know."""
    key = _key(name)
    if key in _BY_KEY:
        return GpuMatch(_BY_KEY[key])
    if key in _AMBIGUOUS:
        canonical, note = _AMBIGUOUS[key]
        return GpuMatch(_BY_NAME[canonical], f"{name.strip()!r} taken as {canonical}: {note}" if note else "")
    near = nearest_gpus(name)
    hint = (f"nearest: {', '.join(near)}" if near else
            f"no known name is close; {len(GPUS)} are known, e.g. {', '.join(_EXAMPLES)}")
    raise ValueError(f"unknown GPU {name.strip()!r}; {hint}; or give its size with --gpu-memory-gib")


def nearest_gpus(name: str, n: int = 4) -> list[str]:
    """The table's names closest to `name` as typed (difflib over every name and alias), most alike first; [] when
    none is close."""
    key = _key(name)
    names = {**{k: gpu.name for k, gpu in _BY_KEY.items()}, **{k: c for k, (c, _) in _AMBIGUOUS.items()}}
    close = difflib.get_close_matches(key, list(names), n=4 * n, cutoff=0.4)
    found = list(dict.fromkeys(names[k] for k in close))
    if len(found) < n:  # a name sharing the typed digits ("3080" -> RTX-3060, RTX-3090) counts too
        digits = re.findall(r"\d{2,}", key)
        found += [g.name for g in GPUS if g.name not in found and any(d[:2] in _key(g.name) for d in digits)]
    return found[:n]


def gpu_names_help() -> str:
    """The table's names, smallest first, for a --help line."""
    return ", ".join(gpu.name for gpu in GPUS)


def gpu_by_name(name: str) -> Gpu:
    """A GPU of the table, by any of its names (see find_gpu; the note of an ambiguous name is dropped here)."""
    return find_gpu(name).gpu


def gpus_by_names(names: str) -> tuple[GpuMatch, ...]:
    """A comma-separated list of GPU names ('RTX 5070 Ti,RTX 5090'), each resolved, in order."""
    parts = [part for part in (p.strip() for p in names.split(",")) if part]
    if not parts:
        raise ValueError(f"no GPU named in {names!r}")
    return tuple(find_gpu(part) for part in parts)


def with_article(name: str) -> str:
    """'an L4', 'a T4', 'an H100-SXM', 'an MI300X', 'an 80 GiB GPU': the article of the name as it is read out."""
    return f"{'an' if name[:1].upper() in 'AEFHILMNORSX8' else 'a'} {name}"


def gpu_of_size(gib: float, like: Gpu | None = None) -> Gpu:
    """A GPU given by its memory in GiB; `like` keeps a named GPU's compute capability (a MIG slice, a shared card)."""
    if like is None:
        return Gpu(f"{gib:g} GiB GPU", int(gib * GIB), None)
    return Gpu(f"{like.name} at {gib:g} GiB", int(gib * GIB), like.compute_capability, like.nominal, like.vendor,
               like.arch)


def larger_gpus(gpu: Gpu) -> tuple[Gpu, ...]:
    """The table's GPUs of the same vendor with more memory than `gpu`, smallest first (what a "use a bigger GPU"
    suggestion should choose from: an AMD card is no upgrade for a CUDA deployment)."""
    return tuple(g for g in GPUS if g.vendor == gpu.vendor and g.memory_bytes > gpu.memory_bytes)


def this_gpu(name: str, total_memory_bytes: int, capability: str | None) -> Gpu:
    """The GPU a server runs on, as torch describes it: its own memory and compute capability (so the plan picks
    the kernels vLLM picks there, e.g. Marlin from 8.0)."""
    cc = float(capability) if capability else None
    return Gpu(name, int(total_memory_bytes), cc, f"{total_memory_bytes / GIB:.1f} GiB")


def has_capability(gpu: Gpu, minimum: float) -> bool | None:
    """Whether the GPU's compute capability reaches `minimum`; None when it is not known (a GPU by size, an AMD
    GPU: ROCm kernels do not follow CUDA's numbers)."""
    return None if gpu.compute_capability is None else gpu.compute_capability >= minimum - 1e-9


def kernel_support(gpu: Gpu) -> dict[str, bool | None]:
    """What the GPU allows: bf16, the Marlin 4-bit fast path, plain AWQ/GPTQ kernels, FP8 (None: not known)."""
    if gpu.vendor == "amd":  # every Instinct in the table has bf16; vLLM's ROCm build has no Marlin
        return {"bf16": True, "marlin": False, "awq": None, "gptq": None, "fp8": gpu.arch in AMD_FP8_ARCHS}
    return {"bf16": has_capability(gpu, BF16_MIN_CC), "marlin": has_capability(gpu, MARLIN_MIN_CC),
            "awq": has_capability(gpu, AWQ_MIN_CC), "gptq": has_capability(gpu, GPTQ_MIN_CC),
            "fp8": has_capability(gpu, FP8_MIN_CC)}
