"""Formats written in compressed-tensors' checkpoint format, llm-compressor's schemes without llm-compressor: INT8
W8A8, FP8 (per channel or in 128x128 blocks) and NVFP4 (with 16-bit or FP4 activations).

Every Linear layer but lm_head (and MoE routers) gets the scheme's weight quantization from its own min/max, the
memoryless min-max observer llm-compressor uses for these presets:
- a scale per output channel (W8A8 int8, FP8_DYNAMIC e4m3), per 128x128 block (FP8_BLOCK, as DeepSeek and Qwen
  publish), or per group of 16 inputs in FP8 under an fp32 global scale per tensor (NVFP4, NVFP4A16);
- activations: dynamic per token (W8A8, FP8_DYNAMIC) need no data; NVFP4's activations are quantized per 16 at run
  time under a static global scale per layer, which is calibrated here: the largest absolute input each layer sees
  over the calibration texts (llm-compressor's static min-max observer), in float32 on any CPU.
The checkpoint's config.json carries the quantization_config llm-compressor writes for the scheme (its
`format`, `config_groups`, `ignore`), which is how vLLM and SGLang recognise it: no --quantization flag.

transformers loads these checkpoints through compressed-tensors by decompressing the weights to 16-bit (and, for
schemes with quantized activations, fake-quantizing each layer's input): the numerics are the format's, the speed
and memory are not (the report says so).
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from harness.quantize.base import Recipe, package_versions

DEFAULT_IGNORE = ("lm_head", r"re:.*mlp\.gate$")  # llm-compressor's examples: lm_head and MoE routers stay 16-bit
CALIBRATION_TOKENS = 512  # per text, for NVFP4's activation global scales
STATIC_INPUT_SCHEMES = frozenset({"NVFP4"})  # schemes whose activation scale is calibrated


class CompressedTensorsQuantizer:
    engine = "compressed-tensors"
    scheme = ""  # compressed-tensors' preset name; a recipe's extra["scheme"] wins

    def __init__(self, name: str) -> None:
        from harness.formats import FORMAT_SPECS

        self.name = name
        spec = FORMAT_SPECS.get(name)
        self.scheme = self.scheme or (spec.recipe_extra.get("scheme", "") if spec else "")

    def versions(self) -> dict[str, str]:
        return package_versions("compressed-tensors", "transformers", "torch")

    def calibration_dtype(self, source_path: Path) -> str:
        # the weight scales come from the weights; NVFP4's activation scales from float32 forwards on any CPU
        return "float32" if self.scheme in STATIC_INPUT_SCHEMES else "none"

    def quantize(self, source_path: Path, recipe: Recipe, calibration: list[str], out_dir: Path, *,
                 trust_remote_code: bool = False) -> None:
        import torch
        from compressed_tensors.compressors import ModelCompressor, compress_module
        from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus,
                                                     apply_quantization_config, preset_name_to_scheme)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from harness.runtime.device import device_map

        scheme_name = recipe.extra.get("scheme", self.scheme)
        tokenizer = AutoTokenizer.from_pretrained(source_path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(source_path, dtype="auto", device_map=device_map(),
                                                     trust_remote_code=trust_remote_code)
        store_dtype = model.dtype
        ignore = list(recipe.extra.get("ignore", DEFAULT_IGNORE))
        input_amax = {}
        if scheme_name in STATIC_INPUT_SCHEMES:
            if not calibration:
                raise UserError(f"{self.name}: {scheme_name} calibrates its activation scales on calibration "
                                "texts and got none; pass --calibration FILE or keep the bundled corpus")
            input_amax = _input_amax(model, tokenizer, calibration)
        config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(scheme_name, ["Linear"])},
                                    ignore=ignore, quantization_status=QuantizationStatus.INITIALIZED)
        apply_quantization_config(model, config)  # attaches the scheme and empty scales to each layer
        compressor = ModelCompressor.from_pretrained_model(model)  # the checkpoint format per layer
        with torch.no_grad():
            for name, module in model.named_modules():
                scheme = getattr(module, "quantization_scheme", None)
                if scheme is None:
                    continue
                # One layer at a time in float32: in bf16, weight / scale would be rounded before it is quantized.
                module.float()
                _set_weight_qparams(module, scheme.weights, store_dtype)
                if hasattr(module, "input_global_scale"):
                    _set_input_global_scale(module, input_amax, name)
                compress_module(module)
                _store_scales(module, store_dtype)
        compressor.quantization_config.quantization_status = QuantizationStatus.COMPRESSED
        model.save_pretrained(out_dir)
        compressor.update_config(str(out_dir))  # config.json's quantization_config
        tokenizer.save_pretrained(out_dir)


def _set_weight_qparams(module, args, store_dtype) -> None:
    """The layer's weight scale (and FP4's global scale) from its own min/max, per the scheme's strategy. The scale
    is rounded to the dtype it is stored in first, so that the stored scale is the one the weights are divided by."""
    import torch
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    weight = module.weight
    strategy = str(getattr(args.strategy, "value", args.strategy))
    global_scale = None
    if strategy == "channel":
        low, high = weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True)
    elif strategy == "block":
        rows, cols = args.block_structure
        out_features, in_features = weight.shape
        tiles = weight.reshape(out_features // rows, rows, in_features // cols, cols)
        low, high = tiles.amin(dim=(1, 3)), tiles.amax(dim=(1, 3))
    elif strategy in ("group", "tensor_group"):
        groups = weight.reshape(weight.shape[0], -1, args.group_size)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        if strategy == "tensor_group":
            global_scale = generate_gparam(weight.amin(), weight.amax())
            module.weight_global_scale.copy_(global_scale)
    elif strategy == "tensor":
        low, high = weight.amin().reshape(1), weight.amax().reshape(1)
    else:
        raise ValueError(f"weight strategy {strategy!r} is not one quantgate writes")
    scale, zero_point = calculate_qparams(low, high, args, global_scale=global_scale)
    with torch.no_grad():
        module.weight_scale.copy_(scale.to(store_dtype))
        module.weight_zero_point.copy_(zero_point.to(module.weight_zero_point.dtype))


def _store_scales(module, store_dtype) -> None:
    """After compression: the float32 scales (and bias) in the checkpoint's dtype, as llm-compressor stores them;
    the packed or FP8 weights, FP8 group scales and FP4's fp32 global scales as they are (a module-wide .to(dtype)
    would turn FP8 weights back into 16-bit ones)."""
    import torch

    for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
        if tensor.dtype == torch.float32 and not name.endswith("global_scale"):
            tensor.data = tensor.data.to(store_dtype)


def _set_input_global_scale(module, input_amax: dict[str, float], name: str) -> None:
    import torch
    from compressed_tensors.quantization.utils import generate_gparam

    amax = torch.tensor(input_amax.get(name, 0.0), dtype=torch.float32)
    module.input_global_scale.copy_(generate_gparam(-amax, amax))


def _input_amax(model, tokenizer, texts: list[str]) -> dict[str, float]:
    """The largest absolute input of each Linear layer over the calibration texts, in float32 forwards."""
    import torch

    found: dict[str, float] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def record(_module, inputs, _output, name=name):
                found[name] = max(found.get(name, 0.0), float(inputs[0].detach().abs().amax()))
            hooks.append(module.register_forward_hook(record))
    dtype = model.dtype
    model.float()
    try:
        with torch.no_grad():
            for text in texts:
                encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=CALIBRATION_TOKENS)
                model(**encoded.to(model.device))
    finally:
        for hook in hooks:
            hook.remove()
        model.to(dtype)
    return found


def block_problem(config: dict, block: int = 128) -> str | None:
    """Why FP8_BLOCK's square blocks cannot tile this model's Linear weights, or None (vLLM requires each weight's
    output and input width to be whole blocks, as does the scheme here)."""
    text = config.get("text_config", config)
    hidden, heads = text.get("hidden_size"), text.get("num_attention_heads")
    if not isinstance(hidden, int) or not isinstance(heads, int):
        return "the config has no hidden_size / num_attention_heads to check the layer widths against"
    head_dim = text.get("head_dim") or hidden // heads
    kv = (text.get("num_key_value_heads") or heads) * head_dim
    widths = {"hidden_size": hidden, "q_proj width": heads * head_dim, "k/v_proj width": kv,
              "intermediate_size": text.get("intermediate_size") or 4 * hidden}
    bad = [f"{name} {width}" for name, width in widths.items() if width % block]
    return f"{', '.join(bad)} not a multiple of {block}" if bad else None
