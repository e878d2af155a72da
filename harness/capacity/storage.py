"""How a quantized linear weight is stored (LinearStorage), which layers a storage applies to (StorageRule and the
module-name matching of targets and ignore lists), and the storage of each registered weight format: the part of
the memory model that both the generic weight sizing (memory.py) and the checkpoint reader (checkpoint.py) use.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import TypeVar

from harness.capacity.shapes import Linear
from harness.quant_config import BNB_4BIT_BLOCKSIZE

FP32, FP16, FP8 = 4, 2, 1
ALL_LINEAR = ("Linear",)
Format = TypeVar("Format")  # memory.WeightFormat, which sits above this module
_ATTENTION = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                        "kv_b_proj"})
_PREFIX = re.compile(r"^(model\.)?(language_model\.)?(model\.)?")
_LAYER = re.compile(r"^(?:layers|h|blocks)\.(\d+|\*)\.(.*)$")


@dataclass(frozen=True)
class LinearStorage:
    """How an engine holds one quantized linear weight (in x out on one GPU), as the checkpoint stores it:
    `bits` per weight (packed), and its scales by `strategy`:
      tensor: one fp32 scale per weight tensor; channel: one per output row; group: one per `group_size` inputs of
      each row; block: one per `block` (rows, inputs) tile; flat: one per `group_size` consecutive weights
      (bitsandbytes' blocks over the flattened tensor).
    `scale_bytes` is one scale's size (fp16/bf16 2, fp32 4, fp8/e8m0 1), `zeros` a packed `bits`-wide zero per
    scale (asymmetric GPTQ/AWQ), `g_idx` GPTQ's int32 per input channel, `tensor_scales` further fp32 scalars per
    tensor (NVFP4's global scale, static input scales)."""

    bits: float
    strategy: str = "channel"
    group_size: int | None = None
    block: tuple[int, int] | None = None
    scale_bytes: float = 2
    zeros: bool = False
    g_idx: bool = False
    tensor_scales: int = 0
    label: str = ""
    # (hidden, inner) multiples an engine pads an MoE expert's dimensions to at load (vLLM's MXFP4 backends:
    # checkpoint.MXFP4_PADDING); None: stored as shaped
    pad: tuple[int, int] | None = None

    def nbytes(self, in_features: int, out_features: int, *, row: bool = False, fused: int = 1) -> float:
        """Bytes of one in x out weight; `row`: the input is the inner (intermediate) side (a down projection),
        else the output is, `fused` inner projections wide (a fused gate_up: 2)."""
        if self.pad:
            hidden, inner = self.pad
            if row:
                in_features, out_features = _round_up(in_features, inner), _round_up(out_features, hidden)
            else:
                in_features = _round_up(in_features, hidden)
                out_features = fused * _round_up(math.ceil(out_features / fused), inner)
        packed = in_features * out_features * self.bits / 8
        if self.strategy == "tensor":
            scales = 1
        elif self.strategy == "block" and self.block:
            scales = math.ceil(out_features / self.block[0]) * math.ceil(in_features / self.block[1])
        elif self.strategy == "flat" and self.group_size:
            scales = math.ceil(in_features * out_features / self.group_size)
        elif self.strategy == "group" and self.group_size and self.group_size > 0:
            scales = math.ceil(in_features / self.group_size) * out_features
        else:
            scales = out_features
        zeros = scales * self.bits / 8 if self.zeros else 0
        return (packed + scales * self.scale_bytes + zeros + (in_features * 4 if self.g_idx else 0)
                + self.tensor_scales * 4)


def _round_up(value: int, multiple: int) -> int:
    return math.ceil(value / multiple) * multiple if multiple else value


@dataclass(frozen=True)
class StorageRule:
    """The layers a storage applies to: `targets` are module paths or "re:REGEX" (checkpoint.module_matches);
    ("Linear",) is every linear layer."""

    targets: tuple[str, ...]
    storage: LinearStorage


def is_expert(lin: Linear) -> bool:
    """A routed expert's weight (an MoE layer's experts, not its shared expert)."""
    return "experts" in lin.name and "shared_expert" not in lin.name


FP8_TENSOR = LinearStorage(8, "tensor", scale_bytes=FP32, label="float8 e4m3, one fp32 scale per tensor")
FP8_CHANNEL = LinearStorage(8, "channel", scale_bytes=FP32, label="float8 e4m3, an fp32 scale per output channel")
NVFP4 = LinearStorage(4, "group", 16, scale_bytes=FP8, tensor_scales=2,
                      label="float4 e2m1, an fp8 scale per 16, fp32 global scales")
MXFP4 = LinearStorage(4, "group", 32, scale_bytes=FP8, label="float4 e2m1, an e8m0 scale per 32")
BNB_4BIT = LinearStorage(4, "flat", BNB_4BIT_BLOCKSIZE, scale_bytes=FP32,
                         label="4-bit, an fp32 absmax per 64 (double quantization undone at load)")
# double quantization as stored: the absmax in 8 bits, with an fp32 scale per 256 of them
BNB_4BIT_DOUBLE_QUANT = replace(BNB_4BIT, scale_bytes=1 + FP32 / 256,
                                label="4-bit, an 8-bit absmax per 64 and an fp32 scale per 256 absmax")
BNB_8BIT = LinearStorage(8, "channel", scale_bytes=FP32, label="int8, an fp32 scale per row")


# vLLM pads gpt-oss's MXFP4 expert weights at load to what its MoE kernels take, (hidden, inner) multiples by backend
# (model_executor/layers/quantization/mxfp4.py create_weights): Marlin (weight-only, compute capability 8.x and
# where FP4 is not native) rounds the hidden size to 256 and the intermediate to 128; Triton (Hopper) the hidden to
# 256; FlashInfer (Blackwell) both to 256. gpt-oss's 2880 becomes 3072 (and 2944): +9% on the experts under Marlin
# (vllm-project/vllm#23278: 65.97 GiB logged for gpt-oss-120b), +6.7% under Triton (#33155: 64.38 GiB). The first
# gpt-oss image (0.10.1+gptoss) did not pad (#22331: 12.88 GiB for gpt-oss-20b on an RTX 3090): "unpadded".
MXFP4_PADDING: dict[str, tuple[int, int] | None] = {"marlin": (256, 128), "triton": (256, 64),
                                                    "flashinfer": (256, 256), "unpadded": None}


def mxfp4_backend(compute_capability: float | None) -> str:
    """The MXFP4 MoE backend vLLM picks by compute capability: FlashInfer on Blackwell, Triton on Hopper, Marlin
    below (and for an unknown GPU, the padding the most GPUs get)."""
    if compute_capability is None:
        return "marlin"
    return "flashinfer" if compute_capability >= 10.0 else "triton" if compute_capability >= 9.0 else "marlin"


def fp8_block(block: tuple[int, int] = (128, 128)) -> LinearStorage:
    return LinearStorage(8, "block", block=(int(block[0]), int(block[1])), scale_bytes=FP32,
                         label=f"float8 e4m3, an fp32 scale per {block[0]}x{block[1]} tile")


# The registered plan-only formats (harness.formats) as a bf16 model quantized to them would be stored.
FORMAT_STORAGE: dict[str, dict] = {
    "fp8": {"rules": (StorageRule(ALL_LINEAR, FP8_CHANNEL),)},
    "fp8-block": {"rules": (StorageRule(ALL_LINEAR, fp8_block()),)},
    "nvfp4": {"rules": (StorageRule(ALL_LINEAR, NVFP4),)},
    "nvfp4a16": {"rules": (StorageRule(ALL_LINEAR, replace(NVFP4, tensor_scales=1)),)},  # weight-only
    "mxfp4": {"rules": (StorageRule(ALL_LINEAR, MXFP4),), "experts_only": True},
    "bnb-nf4": {"rules": (StorageRule(ALL_LINEAR, BNB_4BIT),)},
}


def with_storage(fmt: Format) -> Format:
    """A registered format (memory.WeightFormat) with its storage rules (FORMAT_STORAGE); any other unchanged."""
    storage = FORMAT_STORAGE.get(fmt.name)
    return replace(fmt, **storage) if storage and not fmt.rules else fmt


def module_path(lin: Linear) -> str:
    """The module path of a linear layer inside a decoder layer, as checkpoints and engines name it
    ('self_attn.q_proj', 'mlp.experts.gate_up_proj', 'mlp.gate' for a router)."""
    name = lin.name
    if name in _ATTENTION:
        return f"self_attn.{name}"
    if name == "router":
        return "mlp.gate"
    if name.startswith(("experts.", "shared_experts.")):
        return f"mlp.{name}"
    return name


def _matches(entry: str, path: str) -> tuple[bool, str | None]:
    """(whether a module-list entry names the layer at `path`, the decoder layer index it is limited to or None)."""
    if entry.startswith("re:"):
        pattern = entry[3:]
        return bool(re.fullmatch(pattern, f"model.layers.0.{path}") or re.search(pattern, path)), None
    if entry in ("Linear", "*"):
        return True, None
    rest = _PREFIX.sub("", entry)
    layer = None
    match = _LAYER.match(rest)
    if match:
        layer, rest = (None if match.group(1) == "*" else match.group(1)), match.group(2)
    wanted, parts = rest.split("."), path.split(".")
    found = any(parts[i:i + len(wanted)] == wanted for i in range(len(parts) - len(wanted) + 1))
    return found, layer


def module_matches(entry: str, lin: Linear) -> bool:
    """Whether a targets/ignore entry (a module name, a path with layer index or '*', or 're:REGEX') names `lin`
    in any layer."""
    return _matches(entry, module_path(lin))[0]


def rule_for(rules: tuple[StorageRule, ...], lin: Linear) -> StorageRule | None:
    """The first rule whose targets name the layer (compressed-tensors' config_groups order); None: none does."""
    return next((rule for rule in rules if any(module_matches(t, lin) for t in rule.targets)), None)


def unconverted_copies(entries: tuple[str, ...], lin: Linear, layers: int) -> int:
    """How many of `lin`'s copies a modules_to_not_convert / ignore list keeps 16-bit: all of them when an entry
    names the module in every layer, else those of the layers the entries list one by one (Qwen's FP8 checkpoints
    list each layer's router, unsloth's dynamic bnb exports some layers' MLPs): of the listed layers `lin` is placed
    on (Linear.at: a pipeline stage's own), or where it is not placed their share of its layers."""
    listed: set[str] = set()
    for entry in entries:
        found, layer = _matches(entry, module_path(lin))
        if found and layer is None:
            return lin.count
        if found:
            listed.add(layer)
    if not listed:
        return 0
    if lin.at:
        return lin.count // len(lin.at) * sum(str(i) in listed for i in lin.at)
    held = lin.layers or layers
    return min(lin.count, round(lin.count * len(listed) / held))


