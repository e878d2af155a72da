"""A checkpoint's own quantization_config as the planners size it: which layers are quantized, how each weight and
its scales are stored on the GPU, and which modules stay 16-bit.

What each method stores per linear weight (in x out), as vLLM holds it after loading:
- fp8 (transformers' FineGrainedFP8 / vLLM's Fp8Config, e.g. Qwen3-*-FP8, DeepSeek-V3): 1 byte per weight and fp32
  scales: one per tensor, or with `weight_block_size` [128, 128] one per 128 x 128 tile (`weight_scale_inv`).
- compressed-tensors (llm-compressor): each `config_groups` entry's weights for its `targets`: float 8-bit (FP8,
  strategy tensor/channel/block, fp32 scales), float 4-bit in groups of 16 (NVFP4: an fp8 e4m3 scale per 16, an
  fp32 global scale per tensor), float 4-bit in groups of 32 (MXFP4: an e8m0 byte per 32), int 4/8-bit (packed,
  a 16-bit scale per group or channel, a packed zero when asymmetric); `ignore` stays 16-bit.
- mxfp4 (gpt-oss): the MoE experts only, 4-bit e2m1 with an e8m0 byte per 32 weights; `modules_to_not_convert`
  (attention, router, embeddings, lm_head) 16-bit. vLLM's Mxfp4Config quantizes FusedMoE layers only.
- fbgemm_fp8 (Meta's Llama-3.1-405B-FP8): FP8 weights with an fp32 scale per output channel.
- modelopt (NVIDIA ModelOpt, hf_quant_config.json): `quant_algo` FP8 (per tensor) or NVFP4 (as above),
  `exclude_modules` 16-bit.
- bitsandbytes 4-bit (nf4/fp4): packed 4-bit, an absmax per 64 weights; with double quantization the checkpoint
  stores it as 8-bit with an fp32 scale per 256 blocks, but vLLM's loader undoes that at load
  (BitsAndBytesModelLoader._dequantize_dq), so on the GPU it is an fp32 absmax per 64. 8-bit (LLM.int8): int8 and
  an fp32 scale per row (outliers are not stored; they are found per forward). `llm_int8_skip_modules` 16-bit;
  vLLM loads such a checkpoint only where its own match keeps the same linears 16-bit (bnb_skip).
- gptq: packed `bits`, an fp16 scale per group; vLLM's gptq_marlin drops the zeros of symmetric weights and the
  g_idx unless `desc_act`. awq: packed 4-bit, fp16 scales and packed zeros (zero_point) per group.
"""

from __future__ import annotations

from dataclasses import replace

from harness.capacity.bnb_skip import VLLM_BNB_DOTTED_SKIP_SINCE, vllm_load_problem
from harness.capacity.memory import WeightFormat
from harness.capacity.storage import (ALL_LINEAR, BNB_4BIT, BNB_4BIT_DOUBLE_QUANT, BNB_8BIT,  # noqa: F401
                                      FORMAT_STORAGE, FP8_CHANNEL, FP8_TENSOR, FP16, FP32, MXFP4, MXFP4_PADDING,
                                      NVFP4, LinearStorage, StorageRule, fp8_block, is_expert, module_matches,
                                      module_path, mxfp4_backend)
from harness.capacity.shapes import Linear, config_fields
from harness.errors import UserError
from harness.formats import FORMAT_SPECS, EngineServing, FormatSpec, scheme_spec
from harness.quant_config import WeightScheme, read_quantization


def quantization_config_of(config: dict) -> dict | None:
    """config.json's quantization_config (top level, or a multimodal model's text_config), else None."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        nested = config.get("text_config")
        quant = nested.get("quantization_config") if isinstance(nested, dict) else None
    return quant if isinstance(quant, dict) and quant else None


def checkpoint_format(config: dict, where: str = "config.json", *, undo_double_quant: bool = True,
                      compute_capability: float | None = None, mxfp4: str | None = None) -> WeightFormat | None:
    """The WeightFormat of a quantized checkpoint, from its quantization_config; None for an unquantized one.
    UserError (one line, naming the field) for a method or scheme quantgate cannot size.

    undo_double_quant: bitsandbytes 4-bit with double quantization as the vLLM versions the planners follow hold
    it (fp32 absmax, BitsAndBytesModelLoader._dequantize_dq); False keeps the checkpoint's 8-bit absmax, which is
    what vLLM 0.7's log shows (tests/test_checkpoint_sizing.py).
    compute_capability / mxfp4: the target GPU's, or the MXFP4 backend by name (MXFP4_PADDING), for the padding
    vLLM gives MXFP4 experts at load."""
    quant = quantization_config_of(config)
    if quant is None:
        return None
    where = f"{where} quantization_config"
    method = str(quant.get("quant_method") or "").lower()
    if method == "mxfp4":
        return _mxfp4(quant, mxfp4 or mxfp4_backend(compute_capability))
    if method == "fbgemm_fp8":
        return _fbgemm_fp8(quant)
    if method == "modelopt" or "quant_algo" in quant or isinstance(quant.get("quantization"), dict):
        return _modelopt(quant, where)
    info = read_quantization(quant, where)
    if info.method == "fp8":
        return _fp8(quant, info)
    if info.method == "bitsandbytes":
        return _bitsandbytes(quant, info, undo_double_quant, _decoder_layers(config))
    if info.method in ("gptq", "awq"):
        return _gptq_awq(quant, info)
    if info.method == "compressed-tensors":
        return _compressed_tensors(quant, info, where)
    raise UserError(f"{where}: quant_method {info.method!r}: quantgate sizes fp8, fbgemm_fp8, mxfp4, modelopt (FP8, "
                    "NVFP4), compressed-tensors, bitsandbytes, gptq and awq checkpoints")


def _spec(name: str, bits: int, serving: dict[str, EngineServing] | None = None) -> FormatSpec:
    """The registered format's spec (how each engine serves it), else a plan-only one with `serving`."""
    if name in FORMAT_SPECS and serving is None:
        return FORMAT_SPECS[name]
    return FormatSpec(name, engine="checkpoint", bits=bits, default=False, plan_only=True, serving=serving or {})


def _format(name: str, bits: int, rules: tuple[StorageRule, ...], unconverted, description: str, *,
            spec: FormatSpec | None = None, group_size: int | None = None, experts_only: bool = False,
            g_idx: bool = False) -> WeightFormat:
    return WeightFormat(name, bits, group_size, g_idx=g_idx, spec=spec or _spec(name, bits), rules=rules,
                        unconverted=tuple(str(m) for m in unconverted or ()), experts_only=experts_only,
                        description=description)


def _fp8(quant: dict, info) -> WeightFormat:
    block = quant.get("weight_block_size")
    storage = fp8_block(tuple(block)) if block else FP8_TENSOR
    name = "fp8-block" if block else "fp8"
    return _format(name, 8, (StorageRule(ALL_LINEAR, storage),), info.unquantized_modules,
                   f"fp8 checkpoint: {storage.label}; activations {quant.get('activation_scheme', 'dynamic')}",
                   spec=scheme_spec(name, "fp8"))  # Fp8Config's own releases, not compressed-tensors'


def _fbgemm_fp8(quant: dict) -> WeightFormat:
    """FBGEMM FP8 (Meta's Llama-3.1-405B-Instruct-FP8): per-channel FP8 weights, dynamic per-token activations
    bounded by activation_scale_ub; vLLM's FBGEMMFp8Config."""
    return _format("fp8", 8, (StorageRule(ALL_LINEAR, FP8_CHANNEL),), quant.get("modules_to_not_convert"),
                   f"fbgemm_fp8 checkpoint: {FP8_CHANNEL.label}")


def _mxfp4(quant: dict, backend: str) -> WeightFormat:
    if backend not in MXFP4_PADDING:
        raise ValueError(f"MXFP4 backend {backend!r}: one of {', '.join(MXFP4_PADDING)}")
    storage = replace(MXFP4, pad=MXFP4_PADDING[backend])
    padded = f", padded at load for vLLM's {backend} MoE kernels" if storage.pad else ""
    return _format("mxfp4", 4, (StorageRule(ALL_LINEAR, storage),), quant.get("modules_to_not_convert"),
                   f"mxfp4 checkpoint: MoE experts {MXFP4.label}{padded}; other layers 16-bit", experts_only=True)


def _modelopt(quant: dict, where: str) -> WeightFormat:
    body = quant.get("quantization") if isinstance(quant.get("quantization"), dict) else quant
    algo = str(body.get("quant_algo") or "").upper()
    excluded = body.get("exclude_modules") or body.get("ignore") or ()
    if algo == "FP8":
        return _format("fp8", 8, (StorageRule(ALL_LINEAR, FP8_TENSOR),), excluded,
                       f"ModelOpt FP8 checkpoint: {FP8_TENSOR.label}")
    if algo == "NVFP4":
        group = int(body.get("group_size") or 16)
        storage = replace(NVFP4, group_size=group)
        return _format("nvfp4", 4, (StorageRule(ALL_LINEAR, storage),), excluded,
                       f"ModelOpt NVFP4 checkpoint: {storage.label}", spec=scheme_spec("nvfp4", "modelopt"))
    raise UserError(f"{where}: quant_algo {algo or None!r}: quantgate sizes ModelOpt FP8 and NVFP4 checkpoints")


def _bitsandbytes(quant: dict, info, undo_double_quant: bool = True, layers: int = 0) -> WeightFormat:
    if info.bits == 8:
        return _format("int8", 8, (StorageRule(ALL_LINEAR, BNB_8BIT),), info.unquantized_modules,
                       f"bitsandbytes LLM.int8 checkpoint: {BNB_8BIT.label}",
                       spec=_bnb_spec(FORMAT_SPECS["int8"], info.unquantized_modules, layers))
    quant_type = info.details.get("bnb_4bit_quant_type", "nf4")
    storage = BNB_4BIT
    if info.details.get("double_quant") and not undo_double_quant:
        storage = BNB_4BIT_DOUBLE_QUANT
    double = " (double quantization in the checkpoint)" if info.details.get("double_quant") else ""
    return _format("bnb-nf4", 4, (StorageRule(ALL_LINEAR, storage),), info.unquantized_modules,
                   f"bitsandbytes 4-bit {quant_type} checkpoint{double}: {storage.label}",
                   spec=_bnb_spec(FORMAT_SPECS["bnb-nf4"], info.unquantized_modules, layers))


def _decoder_layers(config: dict) -> int:
    layers = config_fields(config).get("num_hidden_layers")
    return layers if isinstance(layers, int) and layers > 0 else 0


def _bnb_spec(spec: FormatSpec, skipped: tuple[str, ...], layers: int) -> FormatSpec:
    """The bitsandbytes format's spec with vLLM's serving as is_layer_skipped_bnb lets it load this skip list
    (harness.capacity.bnb_skip): refused where no release keeps the checkpoint's 16-bit linears 16-bit (a path to a
    module vLLM fuses), from 0.7.3 on where only the dotted-prefix match does (unsloth's dynamic 4-bit exports)."""
    newest = vllm_load_problem(skipped, layers)
    if newest is not None:
        vllm = replace(spec.serving_on("vllm"), refusal=f"vLLM {{version}}: {newest}")
    elif vllm_load_problem(skipped, layers, release=(0, 7, 2)) is not None:
        vllm = spec.serving_on("vllm")
        vllm = replace(vllm, since=VLLM_BNB_DOTTED_SKIP_SINCE,
                       note="; ".join(filter(None, (vllm.note, "vLLM keeps llm_int8_skip_modules' module paths "
                                                    "16-bit from 0.7.3 on (is_layer_skipped_bnb's prefix match, "
                                                    "vllm-project/vllm#12974)"))))
    else:
        return spec
    return replace(spec, serving={**spec.serving, "vllm": vllm})


def _gptq_awq(quant: dict, info) -> WeightFormat:
    scheme = info.main
    bits, group = scheme.bits, scheme.group_size
    grouped = bool(group and group > 0)
    if info.method == "gptq":
        # gptq_marlin keeps neither the zeros of symmetric weights nor g_idx without desc_act
        zeros, g_idx = scheme.symmetric is False, bool(quant.get("desc_act"))
    else:
        zeros, g_idx = quant.get("zero_point", True) is not False, False
    storage = LinearStorage(bits, "group" if grouped else "channel", group if grouped else None, scale_bytes=FP16,
                            zeros=zeros, g_idx=g_idx,
                            label=f"{bits}-bit {info.method}, an fp16 scale per "
                                  f"{f'{group} inputs' if grouped else 'output channel'}"
                                  f"{', packed zeros' if zeros else ''}{', g_idx (desc_act)' if g_idx else ''}")
    spec = FORMAT_SPECS[info.method] if bits == 4 else _spec(
        f"{info.method}-{bits}bit", bits, {e: EngineServing(info.method) for e in ("vllm", "sglang")})
    return _format(spec.name, bits, (StorageRule(ALL_LINEAR, storage),), info.unquantized_modules,
                   f"{info.method} checkpoint: {storage.label}", spec=spec, group_size=group if grouped else None,
                   g_idx=g_idx)


def _compressed_tensors(quant: dict, info, where: str) -> WeightFormat:
    rules = tuple(StorageRule(tuple(s.targets) or ALL_LINEAR, _scheme_storage(s, where)) for s in info.schemes)
    main = rules[0].storage
    kind = _scheme_kind(info.schemes[0])
    bits = max(int(s.bits) for s in info.schemes)
    if kind in FORMAT_STORAGE and kind in FORMAT_SPECS:
        spec = FORMAT_SPECS[kind]
    elif kind == "w8a8":
        spec = FORMAT_SPECS["w8a8"]
    else:
        # integer weight-only (WNA16): vLLM and SGLang read compressed-tensors from the checkpoint (Marlin, 8.0+)
        spec = _spec(kind, bits, {e: EngineServing(None, min_capability=8.0, note=f"{t}: reads the "
                                                   "compressed-tensors scheme from the checkpoint (no --quantization "
                                                   "flag); its WNA16 kernels (Marlin) need compute capability 8.0")
                                  for e, t in (("vllm", "vLLM"), ("sglang", "SGLang"))}
                     | {"trtllm": EngineServing(refusal="TensorRT-LLM does not load compressed-tensors integer "
                                                        "weight-only checkpoints")})
    return _format(spec.name, bits, rules, info.unquantized_modules,
                   f"compressed-tensors checkpoint: {main.label}" + (f" (+{len(rules) - 1} more groups)"
                                                                     if len(rules) > 1 else ""), spec=spec)


def _scheme_kind(scheme: WeightScheme) -> str:
    if scheme.type == "float" and scheme.bits == 8:
        return "fp8-block" if scheme.strategy == "block" else "fp8"
    if scheme.type == "float" and scheme.bits == 4:
        return "mxfp4" if scheme.group_size == 32 else "nvfp4"
    if scheme.bits == 8 and not scheme.weight_only:
        return "w8a8"
    return f"w{scheme.bits}a16"


def _scheme_storage(scheme: WeightScheme, where: str) -> LinearStorage:
    bits, strategy, group = scheme.bits, scheme.strategy or "channel", scheme.group_size
    if scheme.type == "float" and bits == 8:
        if strategy == "block":
            return fp8_block(tuple(scheme.block or (128, 128)))
        return FP8_TENSOR if strategy == "tensor" else FP8_CHANNEL
    if scheme.type == "float" and bits == 4:
        size = group or 16
        if size == 32:
            return MXFP4
        return replace(NVFP4, group_size=size, tensor_scales=2 if scheme.activations else 1)
    if scheme.type != "int" or not bits:
        raise UserError(f"{where}: a {scheme.type} {bits}-bit weight scheme quantgate cannot size")
    grouped = strategy == "group" and group
    scale = FP32 if bits == 8 and strategy == "channel" else FP16
    return LinearStorage(bits, "group" if grouped else ("tensor" if strategy == "tensor" else "channel"),
                         group if grouped else None, scale_bytes=scale, zeros=scheme.symmetric is False,
                         g_idx=scheme.actorder == "group",
                         label=f"int{bits}, a {8 * scale}-bit scale per "
                               f"{f'{group} inputs' if grouped else strategy}")


def expert_layers(fmt: WeightFormat, lin: Linear) -> bool:
    """Whether the format quantizes this layer at all (experts-only methods leave the rest 16-bit)."""
    return not fmt.experts_only or is_expert(lin)


def plan_config(config: dict) -> dict:
    """The fields the shape readers take, with the quantization_config dropped (transformers would otherwise try to
    set up the quantizer when it builds the model on the meta device)."""
    fields = {k: v for k, v in config_fields(config).items() if k != "quantization_config"}
    if isinstance(fields.get("text_config"), dict):
        fields["text_config"] = {k: v for k, v in fields["text_config"].items() if k != "quantization_config"}
    return fields


MODELOPT_CONFIG = "hf_quant_config.json"


def checkpoint_format_at(model: str, config: dict, described: str = "config.json",
                         compute_capability: float | None = None) -> WeightFormat | None:
    """checkpoint_format of `config`, or of the ModelOpt hf_quant_config.json beside it in the model directory
    `model` (NVIDIA's FP8/NVFP4 releases keep it there); None for an unquantized checkpoint."""
    import json
    from pathlib import Path

    if quantization_config_of(config) is None and model != "demo":
        path = Path(model).expanduser()
        side = (path if path.is_dir() else path.parent) / MODELOPT_CONFIG
        if side.is_file():
            try:
                quant = json.loads(side.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise UserError(f"{side}: not a readable JSON file ({exc})") from None
            return checkpoint_format({"quantization_config": {"quant_method": "modelopt", **quant}}, str(side))
    return checkpoint_format(config, described, compute_capability=compute_capability)


def block_split_problem(shape, fmt: WeightFormat, tp: int) -> str | None:
    """Why tensor parallelism over `tp` GPUs cuts a block-scaled FP8 weight inside a block (None: it does not).

    vLLM (fp8_utils.validate_fp8_block_shape, Fp8MoEMethod.create_weights) and SGLang refuse a column-parallel
    layer whose outputs per GPU, or a row-parallel one whose inputs per GPU, are not whole blocks: Qwen3-235B-A22B's
    1,536-wide experts at tensor parallel 8 are 192 per GPU against 128-wide blocks. Expert parallelism keeps
    experts whole."""
    from harness.capacity.memory import _per_gpu

    if tp == 1:
        return None
    for lin in shape.linears:
        for _, storage in fmt.storage_of(lin, shape.layers):
            if storage is None or storage.strategy != "block" or not storage.block:
                continue
            in_f, out_f = _per_gpu(lin, shape.attention, tp)
            block_n, block_k = storage.block
            outputs = out_f // 2 if "gate_up" in lin.name else out_f
            if lin.split in ("column", "kv") and outputs % block_n:
                return (f"{module_path(lin)} has {outputs} outputs per GPU at tensor parallel {tp}, not a multiple of "
                        f"the FP8 block's {block_n} (\"is not divisible by weight quantization block_n\")")
            if lin.split == "row" and in_f % block_k:
                return (f"{module_path(lin)} has {in_f} inputs per GPU at tensor parallel {tp}, not a multiple of "
                        f"the FP8 block's {block_k} (\"is not divisible by weight quantization block_k\")")
    return None


def awq_gemm_group_problem(shape, group_size: int) -> str | None:
    """Why an AutoAWQ GEMM export of this model cannot have `group_size` (None: it can). AutoAWQ's GEMM kernel runs a
    quantized layer only when its output width is a multiple of the group size ("OC is not multiple of Group size",
    awq_ext/quantization/gemm_cuda_gen.cu:gemm_forward_cuda in casper-hansen/AutoAWQ_kernels), and groups run over
    whole input widths. DeepSeek-V2/V3's kv_a_proj_with_mqa has kv_lora_rank + qk_rope_head_dim = 576 outputs, so
    their AWQ exports use groups of 64 at most (casper-hansen/AutoAWQ#508, its DeepSeek-V2 support: "q_group_size
    cannot take the commonly used 128, and the maximum is 64")."""
    for lin in shape.linears:
        if not lin.quantized:
            continue
        if lin.out_features % group_size:
            return (f"{module_path(lin)} has {lin.out_features} outputs, not a multiple of the group size "
                    f"{group_size} (AutoAWQ's GEMM kernel: \"OC is not multiple of Group size\")")
        if lin.in_features % group_size:
            return f"{module_path(lin)} has {lin.in_features} inputs, not a multiple of the group size {group_size}"
    return None
