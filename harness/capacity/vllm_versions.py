"""vLLM's memory accounting by release, as data: what each release subtracts before the KV cache and which token
budget it profiles at. Read from each release's own source (the sdist on the package registry, path:function@tag):

KV budget
  v0.6.0-v0.6.3  vllm/worker/worker.py:Worker.determine_num_available_blocks@v0.6.3.post1:
                 total x util - (free memory at start - free after the profile run), so weights, the profile's
                 reserved peak and non-torch memory allocated since the worker started (the CUDA context is not).
  v0.6.4         same function@v0.6.4.post1: total x util - torch's allocated peak (weights included) - every byte on
                 the device torch does not hold (CUDA context, cuBLAS, other processes): "non_torch_memory" 0.3-0.5 GiB.
  v0.6.5-v0.10   V0 same function@v0.6.5 (vllm/utils.py:memory_profiling): total x util - weights - torch peak
                 increase - non-torch increase since the instance started (the CUDA context is the baseline's).
  V1 v0.8.0-v0.9.0  vllm/v1/worker/gpu_worker.py:Worker.determine_available_memory@v0.9.0: the v0.6.4 arithmetic.
  V1 v0.9.1-v0.17   same function@v0.9.1: memory_profiling (v0.6.5's), requested_memory = total x util per instance
                 (init_device@v0.9.2 refuses to start when free memory is below it); @v0.10.2 --kv-cache-memory-bytes
                 sets the KV cache outright and skips profiling.
  V1 v0.18-v0.19  same function@v0.18.1: profile_cudagraph_memory() estimates the CUDA-graph pool but subtracts it
                 only with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (vllm/envs.py@v0.18.1: default "0").
  V1 v0.20-v0.33  default "1" (vllm/envs.py@v0.20.2): the estimate is subtracted; default util 0.92
                 (vllm/config/cache.py:CacheConfig.gpu_memory_utilization@v0.20.2, 0.9 before).
  V1 v0.34       vllm/config/cache.py:CacheConfig.resolved_gpu_memory_utilization@v0.34.0: util unset means 1.0 with
                 the extensible KV cache, sized after graph capture by vllm/v1/worker/extensible_kv_cache.py:
                 measure_kv_cache_bytes@v0.34.0 = total - everything resident - transient peak - max(1 GiB, 0.75 x
                 transient peak).
  No release before v0.18 subtracts CUDA graphs: they are captured after the KV cache is allocated and come out of
  the (1 - util) share.

Token budget of the profile run (max_num_batched_tokens unset)
  V0: vllm/config.py:SchedulerConfig@v0.6.4.post1: max(max_model_len, 2048); with chunked prefill 512 (v0.6.0-v0.6.4)
      or 2048 (@v0.6.5, _DEFAULT_MAX_NUM_BATCHED_TOKENS@v0.8.0). vllm/engine/arg_utils.py:
      EngineArgs.create_engine_config@v0.6.4.post1 turns chunked prefill on by itself only above 32,768 tokens
      (CUDA, no sliding window, not multimodal). The profile samples max_num_seqs rows with top_p=0.99 and
      top_k=vocab-1 (vllm/worker/model_runner.py:profile_run@v0.6.4.post1): a sort over the whole vocabulary. V1's
      dummy sampler run does the same with top_p=0.9, a torch sort up to 0.16 (V1_SORTING_SAMPLER).
  V1 (default engine from v0.8.0, vllm/envs.py VLLM_USE_V1@v0.8.0) always chunks; vllm/engine/arg_utils.py:
      EngineArgs._set_default_args_v1@v0.7.3 (get_batch_defaults later) for `vllm serve` (OPENAI_API_SERVER): 8192
      on a GPU named H100/H200 (v0.7-v0.8.4), on >= 70 GiB (@v0.8.5), not an A100 (@v0.9.0), 16384 on >= 160 GiB
      (@v0.28.0), else 2048. max_num_seqs: 1024 where the budget is 8192 or more (@v0.8.5), else 256.

GPU KV cache size (tokens) = num_blocks x block_size, num_blocks = KV bytes // (block_size x KV bytes of a token over
all layers) (V0 CacheEngine.get_cache_block_size; V1 vllm/v1/core/kv_cache_utils.py: one page per layer and group).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.formats import release_text  # noqa: F401  (re-exported: the planners import it from here)

Release = tuple[int, ...]

# Released minors (the package registry's sdists; 0.15 was never published as one)
MINORS = tuple((0, minor) for minor in range(6, 35) if minor != 15)
SOURCE = "https://github.com/vllm-project/vllm/blob/{tag}/{path}"


@dataclass(frozen=True)
class VllmRules:
    """How one range of vLLM releases sizes the KV cache (see the module docstring for the source of each field)."""

    since: Release
    engine: str  # "V0" or "V1": the engine `vllm serve` runs by default
    default_utilization: float | None  # None: unset means 1.0 and the extensible KV cache (0.34)
    non_torch: str  # "since start": memory allocated outside torch since the instance started; "device": all of it
    graphs_subtracted: bool  # the CUDA-graph pool is estimated and subtracted before the KV cache
    graphs_estimated: bool  # the estimate is logged (0.18, 0.19: subtracted only with an env var)
    chunked_budget: int  # V0: the budget with chunked prefill; V1: the default below BIG_GPU_GIB
    big_gpu_budget: int  # V1 `vllm serve` on a big GPU (big_gpu)
    big_gpu_rule: str  # "h100-h200 name", ">=70 GiB", ">=70 GiB not A100", "+ >=160 GiB"
    sampler_bytes_per_logit: int  # the profile's sampler peak per (sequence x vocabulary) entry
    kv_cache_memory_bytes: bool  # --kv-cache-memory-bytes exists
    source: str

    @property
    def label(self) -> str:
        return release_text(self.since)

    def default_token_budget(self, max_model_len: int, gpu_bytes: int, gpu_name: str, chunked: bool,
                             sliding: bool = False) -> tuple[int, bool]:
        """(max_num_batched_tokens vLLM picks for `vllm serve` when none is given, whether it chunks prefill)."""
        if self.engine == "V0":
            chunked = chunked and max_model_len > V0_LONG_CONTEXT and not sliding
            return (self.chunked_budget if chunked else max(max_model_len, V0_MIN_BUDGET)), chunked
        if not chunked:
            return max(max_model_len, V0_MIN_BUDGET), False
        return self.v1_budget(gpu_bytes, gpu_name), True

    def default_max_num_seqs(self, gpu_bytes: int, gpu_name: str) -> int:
        """--max-num-seqs unset: 1024 where V1 `vllm serve` takes the big-GPU budget (from 0.8.5:
        vllm/engine/arg_utils.py@v0.8.5.post1, get_batch_defaults@v0.34.0), else 256 (SchedulerConfig)."""
        if self.engine == "V0" or self.big_gpu_rule == "h100-h200 name":
            return 256
        return 1024 if self.v1_budget(gpu_bytes, gpu_name) > self.chunked_budget else 256

    def v1_budget(self, gpu_bytes: int, gpu_name: str) -> int:
        gib = gpu_bytes / 2**30
        name = gpu_name.lower()
        if self.big_gpu_rule == "h100-h200 name":
            big = "h100" in name or "h200" in name
        else:
            big = gib >= 70 and (self.big_gpu_rule == ">=70 GiB" or "a100" not in name)
        if self.big_gpu_rule == "+ >=160 GiB" and gib >= 160:
            return 16384
        return self.big_gpu_budget if big else self.chunked_budget


V0_LONG_CONTEXT = 32768
V0_MIN_BUDGET = 2048
V0_SAMPLER = 40  # fp32 logits, sorted copy, int64 sort indices, masks, softmax, log-softmax, sampled noise
V1_SAMPLER = 16  # fp32 logits, probabilities, sampled noise, gathered results: no sort in the dummy sampler run
# V1's dummy sampler run (vllm/v1/worker/gpu_model_runner.py:_dummy_sampler_run@v0.8.0-v0.32) samples max_num_seqs rows
# with top_p 0.9 and top_k vocab-1. Up to 0.16 the top-k/top-p step is torch's sort (vllm/v1/sample/ops/
# topk_topp_sampler.py:apply_top_k_top_p@v0.16.0): FlashInfer's sampler replaces it only where flashinfer is installed
# (an optional extra to 0.11.0, setup.py@v0.11.0) or, from 0.11.1, where VLLM_USE_FLASHINFER_SAMPLER=1 (unset means
# off, vllm/envs.py@v0.11.2). At the sort, per row x vocabulary entry: the bf16 logits the runner holds (2), their fp32
# copy (4, vllm/v1/sample/sampler.py:Sampler.forward), the sorted values (4) and int64 indices (8), and inside torch's
# CUDA sort of >= 128 rows (aten/src/ATen/native/cuda/SortStable.cu:segmented_sort_pairs) an int64 iota (8) and cub's
# alternate key and value buffers (4 + 8). From 0.17 a Triton top-k/top-p kernel takes batches of 8 rows or more
# (topk_topp_sampler.py@v0.17.1), and from 0.25 FlashInfer's sampler is on by default (vllm/envs.py@v0.25.1).
V1_SORTING_SAMPLER = 2 + 4 + 4 + 8 + 8 + 4 + 8


def _v0(since, non_torch, budget, source):
    return VllmRules(since, "V0", 0.9, non_torch, False, False, budget, budget, "", V0_SAMPLER, False, source)


def _v1(since, non_torch, rule, subtract=False, estimated=False, util=0.9, kv_bytes=False, source="",
        sampler=V1_SORTING_SAMPLER):
    return VllmRules(since, "V1", util, non_torch, subtract, estimated or subtract, 2048, 8192, rule, sampler,
                     kv_bytes, source)


_WORKER = "vllm/worker/worker.py:Worker.determine_num_available_blocks"
_V1_WORKER = "vllm/v1/worker/gpu_worker.py:Worker.determine_available_memory"
RULES: tuple[VllmRules, ...] = (
    _v0((0, 6, 0), "since start", 512, f"{_WORKER}@v0.6.3.post1"),
    _v0((0, 6, 4), "device", 512, f"{_WORKER}@v0.6.4.post1"),
    _v0((0, 6, 5), "since start", 2048, f"{_WORKER}@v0.6.5 (vllm/utils.py:memory_profiling)"),
    _v1((0, 8, 0), "device", "h100-h200 name", source=f"{_V1_WORKER}@v0.8.0; vllm/envs.py:VLLM_USE_V1@v0.8.0"),
    _v1((0, 8, 5), "device", ">=70 GiB", source=f"{_V1_WORKER}@v0.8.5.post1; vllm/engine/arg_utils.py@v0.8.5.post1"),
    _v1((0, 9, 0), "device", ">=70 GiB not A100", source=f"{_V1_WORKER}@v0.9.0"),
    _v1((0, 9, 1), "since start", ">=70 GiB not A100", source=f"{_V1_WORKER}@v0.9.1 (memory_profiling)"),
    _v1((0, 10, 2), "since start", ">=70 GiB not A100", kv_bytes=True,
        source=f"{_V1_WORKER}@v0.10.2 (kv_cache_memory_bytes)"),
    _v1((0, 17, 0), "since start", ">=70 GiB not A100", kv_bytes=True, sampler=V1_SAMPLER,
        source=f"{_V1_WORKER}@v0.10.2; vllm/v1/sample/ops/topk_topp_sampler.py@v0.17.1 (Triton top-k/top-p)"),
    _v1((0, 18, 0), "since start", ">=70 GiB not A100", estimated=True, kv_bytes=True, sampler=V1_SAMPLER,
        source=f"{_V1_WORKER}@v0.18.1; vllm/envs.py:VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS@v0.18.1 (default 0)"),
    _v1((0, 20, 0), "since start", ">=70 GiB not A100", subtract=True, util=0.92, kv_bytes=True,
        sampler=V1_SAMPLER,
        source=f"{_V1_WORKER}@v0.20.2; vllm/envs.py@v0.20.2 (default 1); vllm/config/cache.py@v0.20.2 (0.92)"),
    _v1((0, 28, 0), "since start", "+ >=160 GiB", subtract=True, util=0.92, kv_bytes=True,
        sampler=V1_SAMPLER,
        source=f"{_V1_WORKER}@v0.28.0; vllm/engine/arg_utils.py:EngineArgs.get_batch_defaults@v0.28.0"),
    _v1((0, 34, 0), "since start", "+ >=160 GiB", subtract=True, util=None, kv_bytes=True,
        sampler=V1_SAMPLER,
        source=f"{_V1_WORKER}@v0.34.0; vllm/config/cache.py:CacheConfig.resolved_gpu_memory_utilization@v0.34.0; "
               "vllm/v1/worker/extensible_kv_cache.py:measure_kv_cache_bytes@v0.34.0"),
)
# vLLM 0.7 ran V0 by default (vllm/envs.py:VLLM_USE_V1@v0.7.3 is "0"): the v0.6.5 rules hold up to 0.8.0, where V1
# became the default. V0 stayed selectable (VLLM_USE_V1=0) up to 0.10; these plans follow the default engine.
EXTENSIBLE_MARGIN_FLOOR = 1 << 30  # extensible_kv_cache.py:KV_CACHE_MARGIN_FLOOR_BYTES@v0.34.0 (CUDA)
EXTENSIBLE_MARGIN_FRACTION = 0.75  # extensible_kv_cache.py:KV_CACHE_MARGIN_FRACTION@v0.34.0


def parse_release(version: str) -> Release:
    """'0.10.1.1' -> (0, 10, 1, 1); 'v0.33.1+cu130' -> (0, 33, 1); '0.6' -> (0, 6). ValueError for anything else."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)+)", version or "")
    if not match:
        raise ValueError(f"vLLM version {version!r}: expected a version like 0.6.4 or 0.34")
    return tuple(int(part) for part in match.group(1).split("."))


def rules_for(version: str) -> tuple[VllmRules, str, str]:
    """(the rules for `version`, the version they are planned as, a note: "" when the version is known).

    A minor alone ("0.6") means its newest release's rules; a release before 0.6 or after the newest, or a minor the
    registry never published, takes the nearest known minor and the note says so."""
    release = parse_release(version)
    minor = release[:2]
    if minor in MINORS:
        return _rules_at(release if len(release) > 2 else _newest_patch(minor)), release_text(release), ""
    if minor < MINORS[0]:
        nearest = MINORS[0]
    elif minor > MINORS[-1]:
        nearest = MINORS[-1]
    else:
        nearest = min(MINORS, key=lambda known: abs(known[1] - minor[1]))
    note = (f"vLLM {version.strip()} is not a release quantgate has the rules of ({release_text(MINORS[0])} to "
            f"{release_text(MINORS[-1])}): planned with vLLM {release_text(nearest)}'s, the nearest")
    return _rules_at(_newest_patch(nearest)), release_text(nearest), note


def _newest_patch(minor: Release) -> Release:
    """Rules that change within a minor (0.6.4, 0.6.5, 0.8.5, 0.9.1, 0.10.2) take its last release's."""
    return minor + (99,)


def _rules_at(release: Release) -> VllmRules:
    chosen = RULES[0]
    for rules in RULES:
        if rules.since <= release:
            chosen = rules
    return chosen


def canonical(version: str) -> str:
    """The shortest spelling of `version` that names the same rules: the minor, unless rules change inside it
    ('0.33.1' -> '0.33', '0.6.4' -> '0.6.4')."""
    rules, planned, note = rules_for(version)
    release = parse_release(planned)
    minor = release[:2]
    if note or len(release) == 2 or _rules_at(release) == _rules_at(_newest_patch(minor)) == _rules_at(minor + (0,)):
        return release_text(minor)
    return release_text(release)


# Checkpoint storage that changed by release (harness/capacity/checkpoint.py sizes each way):
# - bitsandbytes double quantization: from vllm-project/vllm#19742 (merged 2025-06-18, first in v0.9.2) the loader
#   dequantizes the 8-bit absmax to fp32 at load (bitsandbytes_loader.py:dequantize_dq); before, it kept the
#   checkpoint's 8-bit absmax and an fp32 scale per 256 (vLLM 0.7.3's Qwen2.5-7B bnb-4bit log: 5.20 GiB).
# - MXFP4 experts (gpt-oss): model_executor/layers/quantization/mxfp4.py:get_mxfp4_backend picks FlashInfer on
#   Blackwell, Triton on Hopper only with triton_kernels and torch >= 2.8 (is_torch_equal_or_newer("2.8.0")), else
#   Marlin. Releases before v0.10.2 were built on torch 2.7.1, so Hopper ran Marlin there (vllm-project/vllm#23278's
#   marlin_utils_fp4 warning on an H100 under 0.10.1); to 0.11 triton_kernels was an optional package that neither
#   requirements/cuda.txt nor docker/Dockerfile@v0.11.0 installs (vllm/utils/__init__.py:has_triton_kernels@v0.11.0),
#   so Hopper ran Marlin there too, until v0.12.0 vendored it (vllm.third_party.triton_kernels, has_triton_kernels
#   @v0.12.0). The pre-release vllm/vllm-openai:gptoss image ("0.10.1+gptoss") did not pad the experts at all.
BNB_DOUBLE_QUANT_UNDONE_SINCE: Release = (0, 9, 2)
MXFP4_TRITON_SINCE: Release = (0, 12, 0)


def undoes_bnb_double_quant(version: str) -> bool:
    """Whether this vLLM release holds bitsandbytes double-quantized absmax as fp32 (True) or as stored."""
    return parse_release(version) >= BNB_DOUBLE_QUANT_UNDONE_SINCE


def mxfp4_backend_of(version: str, compute_capability: float | None) -> str:
    """The MXFP4 MoE backend (checkpoint.MXFP4_PADDING's names) this vLLM release picks on a GPU of that compute
    capability."""
    if "+gptoss" in version:
        return "unpadded"
    if compute_capability is None or compute_capability < 9.0:
        return "marlin"
    if compute_capability >= 10.0:
        return "flashinfer"
    return "triton" if parse_release(version) >= MXFP4_TRITON_SINCE else "marlin"


# V0's CacheEngine pads an MLA model's cache entry (the kv_lora_rank + qk_rope_head_dim latent of one token and
# layer) to a multiple of 256 bytes on CUDA (vllm/worker/cache_engine.py: align_cache for use_mla with
# VLLM_CUDA_MEM_ALIGN_KV_CACHE, on by default; get_cache_block_size sizes blocks with the padded entry). First in
# v0.7.2, the V0 engine `vllm serve` ran by default until 0.8.0: DeepSeek's 576-wide latent takes 640 elements
# (vLLM 0.7.2's DeepSeek-Coder-V2-Lite log: 34,560 bytes a token over 27 layers). V1's MLA cache is not padded.
MLA_ALIGNED_SINCE: Release = (0, 7, 2)
MLA_ALIGN_BYTES = 256


def mla_entry_align_bytes(version: str, vendor: str = "nvidia") -> int:
    """The bytes an MLA cache entry is padded to a multiple of in this release's default engine (0: not padded)."""
    rules = rules_for(version)[0]
    aligned = rules.engine == "V0" and parse_release(version) >= MLA_ALIGNED_SINCE and vendor == "nvidia"
    return MLA_ALIGN_BYTES if aligned else 0


# V0's MLA backends absorb the up-projections into extra 16-bit weights at load, 0.7.1 to 0.7.3
# (vllm/attention/backends/mla/utils.py:MLACommonImpl.process_weights_after_loading@v0.7.1 and @v0.7.3, with
# VLLM_MLA_PERFORM_MATRIX_ABSORPTION on by default, vllm/envs.py@v0.7.3): per MLA layer and GPU W_QR (the query's
# rope part), W_Q_UK (query times the key up-projection) and W_UV_O (value up-projection times o_proj), beside the
# raw weights it keeps for prefill; FP8 weights requantize the two products to FP8. Loaded inside get_model, so
# "model weights take" includes them. 0.8's MLA backends (V0 and V1) no longer absorb (no W_UV_O in @v0.8.5).
MLA_ABSORBED_RELEASES: tuple[Release, Release] = ((0, 7, 1), (0, 8, 0))


def absorbs_mla_weights(version: str, pipeline_parallel_size: int = 1) -> bool:
    """Whether this vLLM release's default engine for the deployment holds MLA's absorbed weights (above)."""
    release = parse_release(version)
    first, stop = MLA_ABSORBED_RELEASES
    return engine_rules(version, pipeline_parallel_size)[0].engine == "V0" and first <= release < stop


# V1 before 0.9 ran pipeline parallelism only on Ray (vllm/engine/arg_utils.py:EngineArgs._is_v1_supported_oracle@
# v0.8.5: "PP is supported on V1 with Ray distributed executor, but off for MP distributed executor for now"), so
# `vllm serve --pipeline-parallel-size N` fell back to V0 (vllm-project/vllm#14452's 0.8.5 log: "Initializing a V0
# LLM engine" with pipeline_parallel_size=2).
V1_PP_WITHOUT_RAY_SINCE: Release = (0, 9, 0)


def engine_rules(version: str, pipeline_parallel_size: int = 1) -> tuple[VllmRules, str]:
    """(the rules of the engine this release runs for the deployment, a note when that is not its default engine)."""
    rules = rules_for(version)[0]
    release = parse_release(version)
    if rules.engine == "V1" and pipeline_parallel_size > 1 and release < V1_PP_WITHOUT_RAY_SINCE:
        v0 = _rules_at((0, 7, 99))
        return v0, (f"vLLM {release_text(release)} runs pipeline parallelism on its V0 engine (V1 took it only with "
                    "Ray before 0.9): planned with V0's accounting")
    return rules, ""


# How get_pp_indices splits the decoder layers over pipeline stages when VLLM_PP_LAYER_PARTITION is unset
# (vllm/distributed/utils.py): L // pp a stage and the remainder on the last stage up to 0.7
# (@v0.6.6, @v0.7.2, @v0.7.3); from 0.8 (vllm-project/vllm#13839, @v0.8.5, @v0.11.0) the remainder one a stage on
# the stages before the last, from the second-to-last backwards (the middle stages while it fits there).
REMAINDER_BEFORE_LAST_SINCE: Release = (0, 8, 0)


def pp_layer_partition(layers: int, pipeline_parallel_size: int, version: str) -> tuple[int, ...]:
    """The decoder layers of each pipeline stage, first to last, as this release's get_pp_indices gives them."""
    pp = pipeline_parallel_size
    if not 1 <= pp <= layers:
        raise ValueError(f"{pp} pipeline stages for {layers} layers: between 1 and the number of layers")
    base, remainder = divmod(layers, pp)
    counts = [base] * pp
    if parse_release(version) < REMAINDER_BEFORE_LAST_SINCE:
        counts[-1] += remainder
    else:
        for i in range(2, remainder + 2):
            counts[-i] += 1
    return tuple(counts)
