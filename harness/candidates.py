"""Checkpoints quantgate did not make (--candidate NAME=PATH): what they are, and whether they can stand in for
the baseline.

A candidate is a local checkpoint directory some tool already quantized (AutoGPTQ, AutoAWQ, GPTQModel,
llm-compressor, bitsandbytes saved by transformers, any compressed-tensors checkpoint). Its quantization config
(config.json's `quantization_config`, or an older AutoGPTQ/AutoAWQ quantize_config.json / quant_config.json;
harness.quant_config reads each tool's keys) becomes its recipe and provenance; it is then measured, evaluated,
decided and reported like a built-in format, without being quantized again.

What vLLM 0.32 does with each layout (its source: model_executor/layers/quantization/auto_gptq.py, auto_awq.py,
compressed_tensors/, utils/marlin_utils.py, utils/gptq_utils.py; kernels/linear/):
- GPTQ (gptq, gptq_marlin and auto_gptq all load through AutoGPTQConfig): it never reads `checkpoint_format`; it
  reads the qweight/qzeros/scales of the gptq (v1) layout, and gptq_v2 alike since only symmetric weights are
  taken (the zeros are implied), and repacks them for its own kernel at load (gptq_marlin_repack for Marlin on a
  GPU, CPUWNA16's own packing on a CPU). A checkpoint saved already Marlin- or BitBLAS-packed has none of those
  tensors. Only (4 or 8 bits, sym=true), group size -1/32/64/128 (verify_marlin_supported, every platform), and no
  desc_act with groups ("GPTQ group activation ordering ... is no longer supported").
- AWQ: AutoAWQConfig never reads `version`: it takes the GEMM packing (4-bit only) and converts it at load; GEMV,
  GEMV-fast and Marlin-packed checkpoints store other shapes. "exllama" is a load-time kernel choice over GEMM
  weights, so vLLM reads those.
- On a CPU, integer weight-only layers go to CPUWNA16LinearKernel (4-bit types only; its op cpu_gemm_wna16 is not
  in the AVX2 build), FP8 weight-only ones have no CPU kernel, block-FP8 ones need AMX, and W8A8 int8 runs on
  oneDNN int8 (any x86 CPU); W8A8 FP8 has torch._scaled_mm kernels there (not refused; not tried on this CPU).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.formats import VLLM_BNB_PLUGIN, EngineServing, FormatSpec
from harness.quant_config import QuantizationInfo, infer_method, read_quantization

# The fields a candidate must share with the baseline to be judged against it (config.json).
SHAPE_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size")
# method -> vLLM's --quantization name for it (None: vLLM has no such method)
# benchmarks/rtn_ladder.py's and decoys.py's rungs: 16-bit weights with simulated damage, marked so by a
# quant_method no engine knows (transformers skips it and loads the weights as stored).
SIMULATED_METHOD = "quantgate-simulated"
VLLM_METHODS = {"gptq": "gptq", "awq": "awq", "bitsandbytes": "bitsandbytes",
                "compressed-tensors": "compressed-tensors", "fp8": "fp8"}
# Storage layouts whose transformers/GPTQModel kernels are CUDA-only (GPTQModel 7.6: gemv_awq.py and
# gemv_fast_awq.py list CUDA and ROCm devices only; marlin, exllama, bitblas are GPU kernels).
CUDA_ONLY_LAYOUTS = {("gptq", "marlin"), ("awq", "marlin"), ("awq", "exllama"), ("awq", "gemv_fast"),
                     ("awq", "gemv"), ("gptq", "exllama"), ("gptq", "bitblas")}
# AutoGPTQ/AutoAWQ checkpoints from before transformers integration keep their config in one of these.
LEGACY_CONFIG_FILES = ("quantize_config.json", "quant_config.json")
CANDIDATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MARLIN_GROUP_SIZES = (32, 64, 128)  # and -1 (per channel): vLLM's MARLIN_SUPPORTED_GROUP_SIZES
CONFIG_SOURCE = "config.json quantization_config"


@dataclass(frozen=True)
class ExternalCheckpoint:
    name: str
    path: Path  # the directory that is loaded: the user's, or a copy whose config.json carries the legacy config
    source_path: Path  # the directory the user named
    fingerprint: str
    quantization: QuantizationInfo
    quantization_config: dict = field(default_factory=dict)  # as read, from whichever file held it
    files: dict[str, str] = field(default_factory=dict)  # config/tokenizer/weight file -> sha256

    @property
    def method(self) -> str:
        return self.quantization.method

    @property
    def bits(self) -> int | None:
        return self.quantization.bits

    @property
    def group_size(self) -> int | None:
        main = self.quantization.main
        return main.group_size if main else None

    @property
    def layout(self) -> str | None:
        return self.quantization.layout

    @property
    def unquantized_modules(self) -> tuple[str, ...]:
        return self.quantization.unquantized_modules

    @property
    def kind(self) -> str | None:
        """The built-in format with the same storage (capacity planning); None: none."""
        from harness.quantize.w8a8 import is_int8_w8a8

        if self.method in ("gptq", "awq"):
            return self.method
        if is_int8_w8a8(self.quantization_config):
            return "w8a8"
        if self.method == "bitsandbytes" and self.bits == 8:
            return "int8"
        from harness.capacity.checkpoint import FORMAT_STORAGE

        stored = self._stored_format()
        return stored.name if stored is not None and stored.name in FORMAT_STORAGE else None

    def _stored_format(self):
        from harness.capacity.checkpoint import checkpoint_format

        try:
            return checkpoint_format({"quantization_config": self.quantization_config}, f"--candidate {self.name}")
        except UserError:
            return None

    def weight_format(self):
        """The storage the capacity planners size, read from the checkpoint's quantization_config
        (harness.capacity.checkpoint: FP8 per tensor/channel/block, NVFP4, MXFP4, bitsandbytes, GPTQ/AWQ,
        compressed-tensors, the modules it leaves unconverted), named for the candidate. A format the engines read
        from the checkpoint (FP8, FP4) is served as its registered spec says; any other as format_spec() says.
        None when the config says nothing the planners can size."""
        from dataclasses import replace

        fmt = self._stored_format()
        if fmt is None:
            return None
        from harness.capacity.checkpoint import FORMAT_STORAGE

        spec = (replace(fmt.spec, name=self.name, engine="external") if fmt.name in FORMAT_STORAGE
                else self.format_spec())
        return replace(fmt, name=self.name, spec=spec)

    def recipe_extra(self) -> dict:
        main = self.quantization.main
        return {"external": True, "kind": self.kind, "sym": main.symmetric if main else None,
                "weight_type": main.type if main else None, **self.quantization.as_dict()}

    def format_spec(self) -> FormatSpec:
        method, refusal = VLLM_METHODS.get(self.method, self.method), vllm_refusal(self.quantization)
        four_bit = 4 in self.quantization.weight_only_int_bits()
        # Only GPTQ and AWQ have a "<method>_marlin" --quantization value; compressed-tensors picks Marlin itself.
        marlin = four_bit and method in ("gptq", "awq")
        serving = {"vllm": EngineServing(method, marlin=marlin, refusal=refusal),
                   "sglang": EngineServing(method, marlin=marlin)} if method else {}
        bnb = method == "bitsandbytes"  # served through the vllm-bnb-plugin package (harness.formats' int8)
        return FormatSpec(self.name, engine="external", bits=self.bits or 16, vllm_quantization=method,
                          vllm_refusal=refusal, four_bit_kernel=four_bit and not bnb, serving=serving,
                          vllm_plugin=VLLM_BNB_PLUGIN if bnb else None,
                          vllm_load_format="bitsandbytes" if bnb else None,
                          recipe_extra={"vllm_linear_kernels": vllm_linear_kernels(self.quantization)})

    def provenance(self) -> dict:
        loaded = {} if self.path == self.source_path else {"loaded_from": str(self.path)}
        return {"engine": "external", "format": self.name, "source_path": str(self.source_path), **loaded,
                "fingerprint": self.fingerprint, "quantization_source": self.quantization.source,
                "quantization_config": self.quantization_config, "files": self.files}


def check_candidate_name(name: str, where: str, known_formats: tuple[str, ...]) -> None:
    """A candidate's name becomes a report row, a directory and logs/NAME.log: letters, digits, '-', '_', '.'
    (not first), and not a format's name."""
    if not CANDIDATE_NAME.fullmatch(name):
        raise UserError(f"{where}: candidate name '{name}' may hold only letters, digits, '-', '_' and '.' (not "
                        "first); it names the report row and logs/NAME.log, e.g. hub-awq")
    if name.lower() == "baseline":
        raise UserError(f"{where}: 'baseline' is the full-precision model's row; call the candidate something else "
                        "(e.g. baseline-hub)")
    if name.lower() in known_formats:
        raise UserError(f"{where}: '{name}' is a built-in format's name; call the candidate something else "
                        f"(e.g. {name}-hub)")


def parse_candidates(given: list[str], known_formats: tuple[str, ...]) -> dict[str, str]:
    """--candidate NAME=PATH (repeatable) -> {name: path}; a name may not shadow a built-in format."""
    found: dict[str, str] = {}
    for text in given:
        name, sep, path = text.partition("=")
        name = name.strip()
        if not sep or not name or not path.strip():
            raise UserError(f"--candidate {text}: expected NAME=PATH, e.g. hub-awq=/models/Qwen2.5-7B-AWQ")
        check_candidate_name(name, f"--candidate {text}", known_formats)
        if name in found:
            raise UserError(f"--candidate {name} is given twice")
        found[name] = path.strip()
    return found


def read_candidate(name: str, path_text: str) -> ExternalCheckpoint:
    from harness.source import file_hashes, fingerprint, weight_files

    path = Path(path_text).expanduser()
    if not path.is_dir():
        raise UserError(f"--candidate {name}={path_text}: no such directory (give a checkpoint directory)")
    config = _config(path, name)
    if not weight_files(path):
        raise UserError(f"--candidate {name}: {path} has config.json but no weights (*.safetensors or "
                        "pytorch_model*.bin)")
    quant, file = quantization_config_of(path, config, name)
    where = f"--candidate {name}: {path / file}" + (" quantization_config" if file == "config.json" else "")
    info = read_quantization(quant, where, CONFIG_SOURCE if file == "config.json" else file)
    digest = fingerprint(path)
    loaded = path.resolve() if file == "config.json" else _with_quantization_config(path, config, quant, digest)
    return ExternalCheckpoint(name=name, path=loaded, source_path=path.resolve(), fingerprint=digest,
                              quantization=info, quantization_config=quant,
                              files={k: "sha256:" + v for k, v in file_hashes(path).items()})


def quantization_config_of(path: Path, config: dict, name: str) -> tuple[dict, str]:
    """(the quantization config, the file it is in): config.json's quantization_config, else an AutoGPTQ
    quantize_config.json or AutoAWQ quant_config.json (their quant_method inferred when absent)."""
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        return quant, "config.json"
    for file in LEGACY_CONFIG_FILES:
        if (path / file).is_file():
            legacy = _json_object(path / file, name)
            return {**legacy, "quant_method": infer_method(legacy)}, file
    raise UserError(f"--candidate {name}: {path / 'config.json'} has no quantization_config (and there is no "
                    f"{' or '.join(LEGACY_CONFIG_FILES)}): it is not a quantized checkpoint (to judge it as the "
                    "baseline, give it as --model)")


def _with_quantization_config(path: Path, config: dict, quant: dict, digest: str) -> Path:
    """A directory that loads like `path` with the legacy config moved into config.json, where transformers reads
    it (without, transformers would load the packed weights as a plain model). Its other files are symlinks;
    cached by the checkpoint's fingerprint."""
    from harness.cache import atomic_write_json, cache_dir, remove_tree

    target = cache_dir("candidates") / digest.removeprefix("sha256:")[:24]
    if (target / "config.json").is_file():
        return target
    tmp = target.with_name(target.name + ".part")
    remove_tree(tmp)
    tmp.mkdir(parents=True)
    for item in path.iterdir():
        if item.name != "config.json" and not item.name.startswith("."):
            (tmp / item.name).symlink_to(item.resolve())
    atomic_write_json(tmp / "config.json", {**config, "quantization_config": transformers_quantization_config(quant)})
    remove_tree(target)
    tmp.rename(target)
    return target


def transformers_quantization_config(quant: dict) -> dict:
    """A legacy quantize_config.json / quant_config.json in the keys transformers' GPTQConfig/AwqConfig read."""
    if quant["quant_method"] == "awq":
        version = str(quant.get("version") or "gemm").lower()
        return {"quant_method": "awq", "bits": quant.get("bits", quant.get("w_bit")),
                "group_size": quant.get("group_size", quant.get("q_group_size")),
                "zero_point": quant.get("zero_point", True), "version": version,
                "modules_to_not_convert": quant.get("modules_to_not_convert")}
    layout = quant.get("checkpoint_format") or ("marlin" if quant.get("is_marlin_format") else "gptq")
    return {**quant, "checkpoint_format": layout}


def _config(path: Path, name: str) -> dict:
    return _json_object(path / "config.json", name)


def _json_object(file: Path, name: str) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"--candidate {name}: {file} is missing or not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"--candidate {name}: {file} is not a JSON object")
    return data


def vllm_refusal(info: QuantizationInfo) -> str | None:
    """Why no vLLM device can load the checkpoint (vLLM 0.32's readers; see the module notes); None: it may."""
    if info.method == SIMULATED_METHOD:
        return (f"a {SIMULATED_METHOD} rung (16-bit weights with simulated rounding, built by the fidelity bench) "
                "has a quant_method vLLM does not know: judge it with the transformers backend, or serve its weights "
                "as a plain 16-bit checkpoint without the quantization_config")
    if info.method == "gptq":
        return _gptq_refusal(info)
    if info.method == "awq":
        return _awq_refusal(info)
    if info.method == "compressed-tensors":
        for scheme in info.schemes:
            if scheme.weight_only and scheme.type == "int" and scheme.layout != "pack-quantized":
                return (f"compressed-tensors weight-only {scheme.bits}-bit integer layers in the {scheme.layout} "
                        "layout: vLLM reads weight-only integer layers only pack-quantized (CompressedTensorsWNA16); "
                        "re-export with llm-compressor's default (pack-quantized) format")
    return None


def _gptq_refusal(info: QuantizationInfo) -> str | None:
    scheme = info.schemes[0]
    if info.layout not in ("gptq", "gptq_v2"):
        return (f"a GPTQ checkpoint in the {info.layout} layout: vLLM reads GPTQ's gptq/gptq_v2 tensors (qweight, "
                "qzeros, scales) and repacks them for its own kernels at load (Marlin on a GPU); it cannot read "
                "weights saved already repacked; use the gptq-layout checkpoint this one was converted from")
    if scheme.bits not in (4, 8):
        return f"{scheme.bits}-bit GPTQ: vLLM's GPTQ reader (AutoGPTQConfig) takes 4- or 8-bit weights only"
    if scheme.symmetric is None:
        return "field 'sym' is missing from the GPTQ config: vLLM's GPTQ reader requires it (add \"sym\": true if so)"
    if not scheme.symmetric:
        return ("asymmetric GPTQ (sym=false): vLLM's GPTQ reader takes symmetric weights only (uint4b8/uint8b128); "
                "serve it with transformers, or quantize with sym=true")
    if scheme.group_size is not None and scheme.group_size not in MARLIN_GROUP_SIZES:
        return (f"GPTQ group size {scheme.group_size}: vLLM takes -1 (per channel), 32, 64 or 128 "
                "(verify_marlin_supported, on every device)")
    ordered = [rule for rule, o in info.overrides.items() if isinstance(o, dict) and o.get("desc_act")
               and o.get("group_size", scheme.group_size or -1) != -1 and not rule.startswith("-:")]
    if (scheme.actorder and scheme.group_size) or ordered:
        return ("GPTQ with desc_act=true and groups" + (f" (dynamic rule {ordered[0]!r})" if ordered else "")
                + ": vLLM 0.32 refuses group activation ordering ('no longer supported'); use a desc_act=false "
                "checkpoint (GPTQModel's act_group_aware keeps most of its benefit)")
    return None


def _awq_refusal(info: QuantizationInfo) -> str | None:
    scheme = info.schemes[0]
    if scheme.bits != 4:
        return f"{scheme.bits}-bit AWQ: vLLM's AWQ reader (AutoAWQConfig) takes 4-bit weights only"
    if info.layout in ("gemv", "gemv_fast", "marlin"):
        return (f"an AWQ checkpoint in the {info.layout} layout: vLLM never reads AWQ's `version` and takes the "
                "GEMM packing, which it converts at load for its kernels; re-export it with version gemm")
    return None


def vllm_linear_kernels(info: QuantizationInfo) -> tuple[str, ...]:
    """The kinds of vLLM linear kernel the checkpoint's quantized layers need, for the per-device check of
    harness.runtime.vllm.launch_plan: "wna16:BITS" (integer weight-only), "w8a8-int8", "w8a16-fp8" (FP8
    weight-only), "w8a8-fp8", "w8a8-fp8-block", "w4a4-nvfp4" and "w4a16-nvfp4" (4-bit floats in groups of 16),
    "w4-mxfp4" (4-bit floats in groups of 32)."""
    if VLLM_METHODS.get(info.method, info.method) is None:
        return ()
    needs = {f"wna16:{bits}" for bits in info.weight_only_int_bits()}
    for scheme in info.schemes:
        if scheme.type == "float" and scheme.bits == 4:
            needs.add("w4-mxfp4" if scheme.group_size == 32 else
                      "w4a16-nvfp4" if scheme.weight_only else "w4a4-nvfp4")
        elif scheme.type == "float":
            block = "-block" if scheme.strategy == "block" else ""
            needs.add("w8a16-fp8" if scheme.weight_only else f"w8a8-fp8{block}")
        elif not scheme.weight_only and scheme.type == "int":
            needs.add("w8a8-int8")
    return tuple(sorted(needs))


def check_against_baseline(candidate: ExternalCheckpoint, baseline_config: dict, baseline_path: Path, *,
                           allow_tokenizer_mismatch: bool) -> list[str]:
    """Refuse a candidate that is not the baseline's model (architecture, shape, vocabulary); a different
    tokenizer only with allow_tokenizer_mismatch. Returns the notes the report carries."""
    config = _config(candidate.path, candidate.name)
    ours = (config.get("architectures") or ["?"])[0]
    theirs = (baseline_config.get("architectures") or ["?"])[0]
    if ours != theirs:
        raise UserError(f"--candidate {candidate.name}: field 'architectures' is {ours}, the baseline's is "
                        f"{theirs}: not the same model")
    for name in SHAPE_FIELDS:
        if name in baseline_config and config.get(name) != baseline_config.get(name):
            raise UserError(f"--candidate {candidate.name}: field '{name}' is {config.get(name)}, the baseline's "
                            f"is {baseline_config.get(name)}: not the same model")
    problem = tokenizer_difference(candidate.path, baseline_path)
    if problem is None:
        return []
    if not allow_tokenizer_mismatch:
        raise UserError(f"--candidate {candidate.name}: its tokenizer differs from the baseline's ({problem}); "
                        "scores would not compare like for like (--allow-tokenizer-mismatch runs anyway, and the "
                        "report says so)")
    return [f"tokenizer differs from the baseline's ({problem}); run with --allow-tokenizer-mismatch"]


def tokenizer_difference(candidate_path: Path, baseline_path: Path) -> str | None:
    from harness.quiet import quiet_imports

    with quiet_imports():
        from transformers import AutoTokenizer

        try:
            theirs = AutoTokenizer.from_pretrained(candidate_path)
        except (OSError, ValueError) as exc:
            return f"it has no loadable tokenizer: {str(exc).splitlines()[0][:160]}"
        ours = AutoTokenizer.from_pretrained(baseline_path)
    if theirs.get_vocab() != ours.get_vocab():
        return f"vocabulary of {len(theirs)} tokens against {len(ours)}, or the same size with other ids"
    for attribute in ("eos_token_id", "bos_token_id"):
        if getattr(theirs, attribute) != getattr(ours, attribute):
            return f"{attribute} {getattr(theirs, attribute)} against {getattr(ours, attribute)}"
    if getattr(theirs, "chat_template", None) != getattr(ours, "chat_template", None):
        return "another chat template"
    return None


def not_runnable_here(candidate: ExternalCheckpoint, *, cuda: bool) -> str | None:
    """Why this device cannot run the checkpoint in transformers at all; None when it can (or may: a load
    failure in the worker is reported as the format's failure)."""
    if cuda:
        return None
    if (candidate.method, candidate.layout) in CUDA_ONLY_LAYOUTS:
        return (f"a {candidate.method} checkpoint in the {candidate.layout} layout: only CUDA kernels read it; "
                "run quantgate on a GPU for it, or convert it to the gptq/gemm layout")
    on_a_gpu = (f"judge it on a GPU machine (quantgate run --model BASELINE --candidate "
                f"{candidate.name}={candidate.source_path})")
    floats = [s for s in candidate.quantization.schemes if s.type == "float"]
    if candidate.method in ("compressed-tensors", "compressed_tensors") and floats:
        # transformers decompresses compressed-tensors FP8 and FP4 on a CPU (as it does quantgate's own fp8 and
        # nvfp4): the numerics are the format's, its memory is planned at the stored size
        if any(s.strategy == "block" for s in floats):
            return ("a block-FP8 compressed-tensors checkpoint: compressed-tensors cannot run its per-128 activation "
                    f"quantization in transformers on a CPU; {on_a_gpu}")
        return None
    if candidate.method in ("fp8", "fbgemm_fp8", "mxfp4", "modelopt") or floats:
        return (f"a {candidate.method} checkpoint of {'FP4' if candidate.method == 'mxfp4' else 'FP8'} weights: "
                "transformers runs it with GPU kernels only (compute capability 8.9 or later for FP8); "
                f"{on_a_gpu}")
    return None


def check_baseline_is_full_precision(model_config: dict, config_path: Path, baseline_is_quantized: bool) -> None:
    """A --model with a quantization config (config.json's, or a legacy AutoGPTQ/AutoAWQ file next to it) is refused
    unless the user said it is meant."""
    if baseline_is_quantized:
        return
    quant = model_config.get("quantization_config")
    legacy = [config_path.parent / f for f in LEGACY_CONFIG_FILES if (config_path.parent / f).is_file()]
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        found = f"{config_path} carries a quantization_config ({method})"
    elif legacy:
        found = f"{legacy[0]} is there (an AutoGPTQ/AutoAWQ quantized checkpoint)"
    else:
        return
    raise UserError(f"--model: {found}: the baseline must be full precision; give the quantized checkpoint as "
                    "--candidate NAME=PATH next to its original, or pass --baseline-is-quantized to compare against "
                    "it anyway")


def read_candidates(paths: dict[str, str], model_config: dict, baseline_path: Path, *, trust_remote_code: bool = False,
                    allow_tokenizer_mismatch: bool = False) -> tuple[dict[str, ExternalCheckpoint], dict[str, list[str]]]:
    """Each --candidate read and checked against the baseline before anything expensive runs."""
    from harness import progress
    from harness.source import check_remote_code

    candidates, notes = {}, {}
    for name, path in paths.items():
        candidate = read_candidate(name, path)
        check_remote_code(candidate.path, trust_remote_code)
        notes[name] = check_against_baseline(candidate, model_config, baseline_path,
                                             allow_tokenizer_mismatch=allow_tokenizer_mismatch)
        candidates[name] = candidate
        progress.say(f"{name}: external {candidate.method} checkpoint"
                     + (f", {candidate.bits}-bit" if candidate.bits else "")
                     + (f", group {candidate.group_size}" if candidate.group_size else "")
                     + (f", {candidate.layout} layout" if candidate.layout else "") + f" ({candidate.path})")
    return candidates, notes
