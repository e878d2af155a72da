"""What a checkpoint's quantization config says, read the way each tool writes it.

- GPTQ: AutoGPTQ (`checkpoint_format` "gptq", the v1 layout; older releases wrote only quantize_config.json, some
  with `is_marlin_format`) and GPTQModel (`checkpoint_format` "gptq_v2", `dynamic` per-module overrides: a
  "+:REGEX" key (or a bare REGEX) changes bits/group_size/... of the modules it matches, "-:REGEX" leaves them
  unquantized).
- AWQ: AutoAWQ writes `zero_point` (true: asymmetric, a zero per group), `version` (gemm, gemv, gemv_fast, marlin:
  the packing) and, in its own quant_config.json, `w_bit`/`q_group_size`.
- bitsandbytes as transformers saves it: `load_in_8bit` (LLM.int8: int8 rows, outliers above
  `llm_int8_threshold` in 16-bit) or `load_in_4bit` with `bnb_4bit_quant_type` nf4/fp4 and
  `bnb_4bit_use_double_quant`; `llm_int8_skip_modules` stay 16-bit (for both).
- compressed-tensors (llm-compressor): `format` is the layout (pack-quantized, int-quantized, float-quantized,
  naive-quantized, or per config group); `version` is the compressed-tensors library's version, not a layout.
  Each `config_groups` entry quantizes its `targets`' weights (num_bits, type int/float, strategy
  channel/group/tensor/block, group_size, symmetric, actorder) and, with `input_activations`, their inputs too
  (W8A8); without, the layers are weight-only (WNA16). `ignore` stays unquantized.
- fp8 (`quant_method` "fp8", transformers' FineGrainedFP8 / vLLM's Fp8Config): 8-bit float weights, per tensor or
  in `weight_block_size` blocks, activations quantized per `activation_scheme`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from harness.errors import UserError

# bitsandbytes' Linear4bit quantizes blocks of 64 weights (Params4bit's default blocksize); the config omits it.
BNB_4BIT_BLOCKSIZE = 64


@dataclass(frozen=True)
class WeightScheme:
    """How one set of layers is quantized: the whole checkpoint's for most methods, one config group's for
    compressed-tensors."""

    bits: int | None
    type: str  # int, float (fp8), nf4 or fp4 (bitsandbytes 4-bit)
    strategy: str | None  # group, channel, tensor or block; None: the config does not say
    group_size: int | None  # inputs per scale for strategy group; None otherwise
    symmetric: bool | None  # None: the config does not say
    actorder: str | None = None  # GPTQ desc_act -> "desc_act"; compressed-tensors actorder (group, weight, static)
    activations: str | None = None  # None: weight-only; else how inputs are quantized, e.g. "int8 dynamic per-token"
    targets: tuple[str, ...] = ()  # compressed-tensors: the layers the group applies to
    layout: str | None = None  # compressed-tensors: the group's own format, else the checkpoint's
    block: tuple[int, ...] | None = None  # strategy block: the block's shape

    @property
    def weight_only(self) -> bool:
        return self.activations is None

    def as_dict(self) -> dict:
        data = asdict(self)
        data["targets"], data["block"] = list(self.targets), list(self.block) if self.block else None
        return data


@dataclass(frozen=True)
class QuantizationInfo:
    method: str  # quant_method as written (or as inferred from quantize_config.json): gptq, awq, ...
    source: str  # where it was read: "config.json quantization_config" or "quantize_config.json"
    layout: str | None  # GPTQ checkpoint_format, AWQ version, compressed-tensors format; lower case
    schemes: tuple[WeightScheme, ...]
    unquantized_modules: tuple[str, ...]  # names, or "re:REGEX" for a GPTQModel "-:" rule
    overrides: dict = field(default_factory=dict)  # GPTQModel `dynamic`: rule -> the settings it changes
    details: dict = field(default_factory=dict)  # what else the method records (double quant, lm_head, ...)

    @property
    def bits(self) -> int | None:
        """The widest quantized weights any layer has (sizing never under-counts), overrides included."""
        found = [s.bits for s in self.schemes if s.bits] + self.override_bits()
        return max(found) if found else None

    @property
    def main(self) -> WeightScheme | None:
        """The scheme of the widest weights (the first such), whose group size the capacity plan uses."""
        widest = self.bits
        return next((s for s in self.schemes if s.bits == widest), self.schemes[0] if self.schemes else None)

    def override_bits(self) -> list[int]:
        return [int(o["bits"]) for rule, o in self.overrides.items()
                if not rule.startswith("-:") and isinstance(o, dict) and o.get("bits")]

    def weight_only_int_bits(self) -> tuple[int, ...]:
        """Bits of the integer weight-only layers (GPTQ, AWQ, compressed-tensors WNA16), overrides included."""
        bits = {s.bits for s in self.schemes if s.weight_only and s.type == "int" and s.bits}
        if self.method == "gptq":
            bits.update(self.override_bits())
        return tuple(sorted(bits))

    def as_dict(self) -> dict:
        return {"method": self.method, "source": self.source, "layout": self.layout,
                "schemes": [s.as_dict() for s in self.schemes], "unquantized_modules": list(self.unquantized_modules),
                "overrides": self.overrides, **self.details}


def read_quantization(quant: dict, where: str, source: str = "config.json quantization_config") -> QuantizationInfo:
    """The QuantizationInfo of a quantization config; `where` prefixes errors (the file and flag to fix)."""
    method = str(quant.get("quant_method") or quant.get("method") or "").lower()
    if not method:
        raise UserError(f"{where}: field 'quant_method' is missing (gptq, awq, bitsandbytes, compressed-tensors, "
                        "fp8, ...)")
    reader = READERS.get(method, _other)
    return reader(quant, method, where, source)


def infer_method(quant: dict) -> str:
    """quantize_config.json / quant_config.json without quant_method: AutoAWQ's keys say awq, else AutoGPTQ."""
    if quant.get("quant_method"):
        return str(quant["quant_method"]).lower()
    return "awq" if any(k in quant for k in ("w_bit", "q_group_size", "zero_point")) else "gptq"


def _gptq(quant: dict, method: str, where: str, source: str) -> QuantizationInfo:
    dynamic = quant.get("dynamic") or {}
    if not isinstance(dynamic, dict):
        raise UserError(f"{where}: field 'dynamic' is {type(dynamic).__name__}, expected an object of "
                        "per-module rules (GPTQModel) or null")
    strategy, group = _group(quant.get("group_size"))
    scheme = WeightScheme(_bits(quant, ("bits",), where), "int", strategy, group, quant.get("sym"),
                          actorder="desc_act" if quant.get("desc_act") else None)
    layout = quant.get("checkpoint_format") or ("marlin" if quant.get("is_marlin_format") else "gptq")
    skipped = [f"re:{rule[2:]}" for rule in dynamic if rule.startswith("-:")]
    details = {"desc_act": quant.get("desc_act"), "lm_head_quantized": bool(quant.get("lm_head", False))}
    return QuantizationInfo(method, source, str(layout).lower(), (scheme,),
                            tuple(quant.get("modules_to_not_convert") or ()) + tuple(skipped), dynamic, details)


def _awq(quant: dict, method: str, where: str, source: str) -> QuantizationInfo:
    zero_point = quant.get("zero_point")
    strategy, group = _group(quant.get("group_size", quant.get("q_group_size")))
    scheme = WeightScheme(_bits(quant, ("bits", "w_bit"), where), "int", strategy, group,
                          None if zero_point is None else not zero_point)
    version = quant.get("version")
    return QuantizationInfo(method, source, str(version).lower() if version else None, (scheme,),
                            tuple(quant.get("modules_to_not_convert") or ()), {}, {"zero_point": zero_point})


def _bitsandbytes(quant: dict, method: str, where: str, source: str) -> QuantizationInfo:
    skipped = tuple(quant.get("llm_int8_skip_modules") or ())
    if quant.get("load_in_4bit") or quant.get("_load_in_4bit"):
        quant_type = str(quant.get("bnb_4bit_quant_type") or "fp4").lower()  # transformers' default is fp4
        scheme = WeightScheme(4, quant_type, "group", BNB_4BIT_BLOCKSIZE, True)
        details = {"bnb_4bit_quant_type": quant_type,
                   "double_quant": bool(quant.get("bnb_4bit_use_double_quant", False)),
                   "compute_dtype": quant.get("bnb_4bit_compute_dtype"),
                   "quant_storage": quant.get("bnb_4bit_quant_storage"),
                   "blocksize": f"{BNB_4BIT_BLOCKSIZE} (bitsandbytes' default; not in the config)"}
        return QuantizationInfo(method, source, f"bnb-4bit-{quant_type}", (scheme,), skipped, {}, details)
    if quant.get("load_in_8bit") or quant.get("_load_in_8bit"):
        threshold = quant.get("llm_int8_threshold", 6.0)
        activations = f"int8 dynamic per-token, outliers above {threshold} in 16-bit (LLM.int8)"
        scheme = WeightScheme(8, "int", "channel", None, True, activations=activations)
        details = {"llm_int8_threshold": threshold, "llm_int8_has_fp16_weight": quant.get("llm_int8_has_fp16_weight"),
                   "llm_int8_enable_fp32_cpu_offload": quant.get("llm_int8_enable_fp32_cpu_offload")}
        return QuantizationInfo(method, source, "bnb-int8", (scheme,), skipped, {}, details)
    raise UserError(f"{where}: a bitsandbytes config with neither 'load_in_8bit' nor 'load_in_4bit' true: "
                    "it does not say how the weights are stored")


def _compressed_tensors(quant: dict, method: str, where: str, source: str) -> QuantizationInfo:
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise UserError(f"{where}: field 'config_groups' is missing or empty: a compressed-tensors config names "
                        "its quantized layers there")
    layout = quant.get("format")
    schemes = tuple(scheme for name, group in groups.items()
                    if (scheme := _compressed_tensors_group(group, layout, f"{where}: config_groups.{name}")))
    if not schemes:
        raise UserError(f"{where}: no config group quantizes weights ('config_groups.*.weights' all null)")
    details = {"compressed_tensors_version": quant.get("version"),
               "quantization_status": quant.get("quantization_status"),
               "kv_cache_scheme": quant.get("kv_cache_scheme"), "sparsity": bool(quant.get("sparsity_config"))}
    return QuantizationInfo(method, source, str(layout).lower() if layout else None, schemes,
                            tuple(quant.get("ignore") or ()), {}, details)


def _compressed_tensors_group(group: dict, layout: str | None, where: str) -> WeightScheme | None:
    if not isinstance(group, dict):
        raise UserError(f"{where}: expected an object with 'weights' and 'targets'")
    weights = group.get("weights")
    if not weights:
        return None
    bits = _bits(weights, ("num_bits",), where + ".weights")
    strategy = weights.get("strategy")
    group_size = weights.get("group_size")
    block = weights.get("block_structure")
    inputs = group.get("input_activations")
    activations = None
    if inputs:
        timing = "dynamic" if inputs.get("dynamic") else "static"
        activations = f"{inputs.get('type', 'int')}{inputs.get('num_bits', '?')} {timing} per-{inputs.get('strategy')}"
    group_layout = group.get("format") or layout
    return WeightScheme(bits, str(weights.get("type") or "int"), strategy,
                        int(group_size) if strategy == "group" and group_size else None, weights.get("symmetric"),
                        actorder=weights.get("actorder") or None, activations=activations,
                        targets=tuple(group.get("targets") or ()),
                        layout=str(group_layout).lower() if group_layout else None,
                        block=tuple(block) if block else None)


def _fp8(quant: dict, method: str, where: str, source: str) -> QuantizationInfo:
    block = quant.get("weight_block_size")
    scheme = WeightScheme(8, "float", "block" if block else "tensor", None, True,
                          activations=f"float8 {quant.get('activation_scheme', 'dynamic')}",
                          block=tuple(block) if block else None)
    skipped = quant.get("modules_to_not_convert") or quant.get("ignored_layers") or ()
    return QuantizationInfo(method, source, "fp8-block" if block else "fp8", (scheme,), tuple(skipped), {}, {})


def _other(quant: dict, method: str, where: str, source: str) -> QuantizationInfo:
    """A method quantgate has no reader for: what the common keys say, the rest kept in quantization_config."""
    bits = quant.get("bits") or quant.get("w_bit") or quant.get("num_bits")
    strategy, group = _group(quant.get("group_size", quant.get("q_group_size")))
    scheme = WeightScheme(int(bits) if bits else None, "int", strategy if bits else None, group, quant.get("sym"))
    layout = quant.get("checkpoint_format") or quant.get("format") or quant.get("version")
    return QuantizationInfo(method, source, str(layout).lower() if layout else None, (scheme,),
                            tuple(quant.get("modules_to_not_convert") or ()), {}, {"recognised": False})


def _bits(config: dict, keys: tuple[str, ...], where: str) -> int:
    for key in keys:
        value = config.get(key)
        if value is not None:
            try:
                return int(value)
            except (TypeError, ValueError):
                raise UserError(f"{where}: field '{key}' is {value!r}, expected a whole number of bits") from None
    raise UserError(f"{where}: field '{keys[0]}' is missing (the weights' bits)")


def _group(value) -> tuple[str | None, int | None]:
    """GPTQ/AWQ group_size: N > 0 -> ("group", N); -1 or 0 -> ("channel", None): one scale per output column."""
    if value is None:
        return None, None
    size = int(value)
    return ("group", size) if size > 0 else ("channel", None)


READERS = {"gptq": _gptq, "awq": _awq, "bitsandbytes": _bitsandbytes, "compressed-tensors": _compressed_tensors,
           "fp8": _fp8}
