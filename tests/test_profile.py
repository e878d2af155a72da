"""The profile forward (harness.measure.profile): the activation peak at vLLM's token budget, measured on a tiny
random Llama through the transformers runtime on this CPU (QUANTGATE_PROFILE_ON_CPU=1), carried by the measure
task, and used by the serving plans, which say where their activation reserve comes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config import CapacitySettings, RunSpec
from harness.evalsets import Prompt
from harness.jobs import DeviceJob, MeasureTask
from harness.capacity import Target, Workload, gpu_by_name, model_shape, plan_engines, weight_format
from harness.capacity.common import measured_activation
from harness.measure.profile import PROFILE_ON_CPU_ENV, measure_profile, profile_shape, profile_wanted
from harness.measure.probe import Measurement
from harness.cachekeys import measure_key
from harness.device_plan import profile_request
from harness.records import FormatRun
from harness.policy import Policy, ServingTarget
from records import run_inputs
from tests.test_model_configs import LLAMA3_8B

VOCAB = 65_536  # full fp32 logits of 8,192 tokens would take 2 GiB; one row per sequence (256) takes 64 MiB
WORDS = ["<unk>", "</s>", "what", "is", "the", "capital", "of", "france", "paris", "answer", "?", "."]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random Llama (float32) with a word-level tokenizer of its own, saved as a checkpoint directory."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=1, bos_token_id=1, pad_token_id=1, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(path)
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="</s>").save_pretrained(path)
    return path


@pytest.fixture()
def on_cpu(monkeypatch):
    """This CPU, with the profile forced on as the tests force it."""
    from harness.runtime import device

    monkeypatch.setattr(device, "is_cuda", lambda: False)
    monkeypatch.setenv(PROFILE_ON_CPU_ENV, "1")


# --- the profile forward on a real model ---------------------------------------------------------


def test_the_profile_forward_runs_the_budget_with_last_token_logits_only(tiny_llama, on_cpu):
    from harness.runtime.transformers_backend import LoadedModel

    model = LoadedModel.load(tiny_llama)
    shapes = []
    hook = model.model.lm_head.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.shape)))
    try:
        record = measure_profile(model, 8192, 256)
    finally:
        hook.remove()
    assert record["profile_tokens"] == 8192 and record["profile_sequences"] == 256
    assert shapes == [(256, 1, VOCAB)]  # logits_to_keep=1: one row per sequence, not one per token
    activation = record["activation_profile_bytes"]
    full_logits = 8192 * VOCAB * 4
    assert 0 < activation < full_logits // 4, activation  # last-token logits: a modest peak, nowhere near 2 GiB
    assert "profile_error" not in record


def test_a_profile_after_freed_work_still_measures_its_activations(tiny_llama, on_cpu):
    """Earlier work left freed memory that glibc keeps resident (the state a long run, or pytest, is in): without
    malloc_trim at the phase start the forward reused it, raised no RSS and read 0 (the CI failure of stop 18)."""
    import ctypes

    from harness.runtime.transformers_backend import LoadedModel

    model = LoadedModel.load(tiny_llama)
    first = measure_profile(model, 1024, 64)["activation_profile_bytes"]
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    big = libc.malloc(24 << 20)  # freeing a mapped 24 MiB block raises glibc's mmap threshold past the logits
    libc.free(big)
    blocks = [libc.malloc(64 << 10) for _ in range(2048)]  # 128 MiB on the heap, touched, then freed ...
    guard = libc.malloc(64)  # ... under a live block, so that free() cannot hand it back by itself
    for block in blocks:
        ctypes.memset(block, 1, 64 << 10)
    for block in blocks:
        libc.free(block)
    try:
        after = measure_profile(model, 1024, 64)["activation_profile_bytes"]
    finally:
        libc.free(guard)
    assert first > 0 and after > first // 3, (first, after)


def test_the_budget_spreads_over_at_most_max_num_seqs_sequences():
    assert profile_shape(8192, 256) == (256, 32)
    assert profile_shape(100, 256) == (100, 1)  # fewer tokens than sequences: one token each
    assert profile_shape(10_000, 256) == (256, 40)  # a padded batch: ceil, recorded as 10,240 tokens


def test_a_runtime_without_a_profile_forward_records_why():
    class NoProfile:
        """A runtime that offers no ProfileForward (optional: harness.runtime.base)."""

    record = measure_profile(NoProfile(), 8192, 256)
    assert record["activation_profile_bytes"] is None and "no profile_forward" in record["profile_error"]


def test_a_failing_profile_keeps_the_measurement_and_says_why():
    class TooSmall:
        def profile_forward(self, sequences, width):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    record = measure_profile(TooSmall(), 8192, 256)
    assert record["activation_profile_bytes"] is None and record["profile_error"].startswith("RuntimeError: CUDA out")


def test_the_worker_measures_the_profile_after_the_generations(tiny_llama, on_cpu, tmp_path):
    """worker.run_device_job with a measure task that asks for a profile: the measurement carries it, and the job's
    memory timeline ended before it (its peaks stay the evaluated workload's)."""
    from harness import worker

    measure = MeasureTask(str(tmp_path / "measure.json"), (("what is the capital of france ?", 4),),
                          ("what is the capital of france ?",), 4, warmup=1, profile_tokens=1024,
                          profile_sequences=64)
    job = DeviceJob(artifact_path=str(tiny_llama), batch_size=2, measure=measure)
    worker.run_device_job(DeviceJob.from_json(json.loads(json.dumps(job.to_json()))))
    result = json.loads(Path(measure.result_path).read_text(encoding="utf-8"))
    profile = result["profile"]
    assert (profile["profile_tokens"], profile["profile_sequences"]) == (1024, 64)
    assert profile["activation_profile_bytes"] > 0
    assert result["memory"]["activation_peak_bytes"] is not None  # the generation's peak stays where it was
    assert [s["stage"] for s in result["memory_timeline"]["stages"]] == ["load", "warm-up", "latency",
                                                                         "measure batch"]
    read = Measurement(result=result).profile
    assert (read.tokens, read.sequences, read.activation_bytes, read.error) == (1024, 64,
                                                                              profile["activation_profile_bytes"], None)


# --- the budget the pipeline asks for ------------------------------------------------------------


def _inputs(policy: Policy = Policy(), **spec):
    prompts = {"faq": [Prompt("faq", "q1", "what is the capital ?", 500, 100)]}
    return run_inputs(spec=RunSpec(**spec), prompts=prompts, policy=policy)


def test_the_measure_task_asks_for_vllms_token_budget(monkeypatch):
    from harness.runtime import device

    monkeypatch.setattr(device, "is_cuda", lambda: False)
    monkeypatch.delenv(PROFILE_ON_CPU_ENV, raising=False)
    assert not profile_wanted() and profile_request(_inputs()) is None  # a CPU: no profile by default
    monkeypatch.setattr(device, "is_cuda", lambda: True)
    # vLLM V1 chunks prefill: `vllm serve` batches 8,192 tokens on a GPU of 70 GiB or more (the report's default
    # 80 GiB target), 2,048 on a smaller one, whatever --max-model-len (VllmRules.default_token_budget)
    assert profile_wanted() and profile_request(_inputs()) == (8192, 256)
    assert profile_request(_inputs(capacity=CapacitySettings(max_model_len=20_000))) == (8192, 256)
    assert profile_request(_inputs(max_num_seqs=8)) == (8192, 8)
    long_context = Policy(serving=ServingTarget(target_gpu="H100-SXM", max_model_len=32_768))
    assert profile_request(_inputs(long_context)) == (8192, 256)
    small_gpu = Policy(serving=ServingTarget(target_gpu="L4", max_model_len=32_768))
    assert profile_request(_inputs(small_gpu)) == (2048, 256)
    monkeypatch.setattr(device, "is_cuda", lambda: False)
    monkeypatch.setenv(PROFILE_ON_CPU_ENV, "1")
    assert profile_request(_inputs()) == (8192, 256)


def test_the_profile_is_part_of_the_measurement_key():
    workload = ([["p", 4]], ["p"], 4)
    plain = measure_key("sha256:a", {}, workload, 2)
    assert measure_key("sha256:a", {}, workload, 2, None) == plain  # no profile: the key it always had
    profiled = measure_key("sha256:a", {}, workload, 2, (8192, 256))
    assert profiled != plain and profiled != measure_key("sha256:a", {}, workload, 2, (16384, 256))
    task = MeasureTask("/m.json", (("p", 4),), ("p",), 4, 1, profile_tokens=8192, profile_sequences=256)
    assert MeasureTask.from_json(json.loads(json.dumps(task.to_json()))) == task


# --- the plans: a profiled figure, labelled, scaled to each engine's budget ----------------------


def test_the_planners_use_the_profile_and_scale_it_to_their_own_budget():
    shape = model_shape(LLAMA3_8B)
    workload = Workload(max_model_len=4096, activation_bytes=1_000_000_000, activation_tokens=8192,
                        activation_sequences=256)
    plans = plan_engines(shape, weight_format("baseline"), Target(gpu_by_name("L4")), workload)
    label = "measured (profile forward of 8,192 tokens over 256 sequences)"
    vllm, sglang, trtllm = (plans[e] for e in ("vllm", "sglang", "trtllm"))
    assert trtllm.token_budget == 8192 and trtllm.memory.activation_bytes == 1_000_000_000
    assert trtllm.memory.activation_source == label
    # vLLM V1 and SGLang prefill 2,048-token chunks on an L4: a quarter of the tokens, a quarter of the activations
    for plan in (vllm, sglang):
        assert plan.token_budget == 2048 and plan.memory.activation_bytes == 250_000_000
        assert plan.memory.activation_source == label[:-1] + ", scaled linearly to 2,048 tokens)"
    assert measured_activation(Workload(max_model_len=1, activation_bytes=7), 100) == (7, "measured")


def _run(profile: dict | None, compute_dtype: str = "bfloat16") -> FormatRun:
    result = {"memory": {"weights_bytes": 269_030_016, "activation_peak_bytes": 30 * 2**20}, "latency": {},
              "compute_dtype": compute_dtype}
    if profile is not None:
        result["profile"] = profile
    return FormatRun("baseline", measurement=Measurement(result=result))


def _vllm_memory(run: FormatRun, max_model_len: int = 600):
    from harness.format_plans import serving_plans
    from harness.capacity.vllm import NEWEST_VERSION
    from harness.measure.kv import DEMO_CONFIG

    inputs = run_inputs(spec=RunSpec(capacity=CapacitySettings(vllm_version=NEWEST_VERSION)),
                        model_config=DEMO_CONFIG, recipes={}, candidates={}, prompts={})
    return serving_plans(inputs, run, Target(gpu_by_name("L4")), max_model_len)["vllm"].memory


def test_cpu_plans_without_a_profile_estimate_from_the_config_not_from_the_generation_peak():
    from harness.capacity import activation_peak_bytes
    from harness.measure.kv import DEMO_CONFIG

    from harness.capacity.vllm import NEWEST_VERSION
    from harness.capacity.vllm_versions import rules_for

    memory = _vllm_memory(_run(None, "float32"))
    assert memory.activation_source == "estimated from the config"
    sampler = rules_for(NEWEST_VERSION)[0].sampler_bytes_per_logit  # V1's sampler, at L4's 2,048-token budget
    assert memory.activation_bytes == activation_peak_bytes(model_shape(DEMO_CONFIG), 2048, 256,
                                                            sampler_bytes_per_logit=sampler) != 30 * 2**20
    failed = {"profile_tokens": 8192, "profile_sequences": 256, "activation_profile_bytes": None,
              "profile_error": "RuntimeError: CUDA out of memory"}
    assert _vllm_memory(_run(failed)).activation_source == "estimated from the config"


def test_a_profiled_run_plans_with_its_profile_at_the_16_bit_size():
    profile = {"profile_tokens": 8192, "profile_sequences": 256, "activation_profile_bytes": 400 * 2**20}
    memory = _vllm_memory(_run(profile, "float32"))  # a float32 host measured twice the 16-bit bytes
    assert memory.activation_bytes == 50 * 2**20  # 200 MiB at 8,192 tokens, scaled to the L4's 2,048
    assert memory.activation_source == ("measured (profile forward of 8,192 tokens over 256 sequences, scaled "
                                        "linearly to 2,048 tokens)")
    longer = _vllm_memory(_run(profile), max_model_len=16_384)  # V1 chunks prefill: the budget stays 2,048
    assert longer.activation_bytes == 100 * 2**20 and "scaled linearly to 2,048 tokens" in longer.activation_source
