"""vLLM colocated with a trainer on the same GPUs (an RL trainer's rollout engine: TRL's GRPO, OpenRLHF, verl,
NeMo-RL, ms-swift's colocate mode, X-R1). The trainer's weights, gradients and optimizer state share each GPU with
vLLM, outside vLLM's accounting: vLLM's --gpu-memory-utilization is a share of the whole GPU (V1 refuses to start
when less than that share is free: vllm/v1/worker/gpu_worker.py, "Free memory on device ... is less than desired GPU
memory utilization"; V0 sizes its KV cache as total x share minus its own profiled peak, whatever the trainer holds).
So an OOM of the rollout engine in such a trainer asks for a smaller vLLM share first (the trainer's
vllm_gpu_memory_utilization). Where vLLM sleeps between rollouts (sleep mode, level 1: weights offloaded, KV cache
discarded) and the OOM is placed in the trainer's own path (Megatron, the training or log-prob step), the memory
vLLM keeps while asleep ("... GiB memory is still in use") is no share any vLLM setting sizes: what the trainer needs
per GPU is, and it falls with the trainer's tensor parallel degree."""

from __future__ import annotations

import re
from dataclasses import replace

from harness.diagnose.records import Change, Diagnosis
from harness.diagnose.settings import Setting, number

# an RL trainer or its rollout shown by name, command or setting
_COLOCATED = re.compile(r"\b(?:grpo|ppo|dapo|rlhf|rollout)\b|colocat|openrlhf|\bverl\b|nemo[-_ ]?rl\b|swift rlhf|"
                        r"\bx_r1\b|\btrl\b|\bvllm_gpu_memory_utilization\b|\bvllm_mode\b", re.I)
# a trainer on vLLM's GPU said in words ("runs a vLLM server and training concurrently on the same GPU", "the trainer
# shares one H100 with the server"): the same memory story as a named RL trainer
_GPU_SAID = r"(?:same|one|a single|the shared)\s+(?:\w+\s+)?(?:GPU|device|card|H100|A100|H200)"
_TRAINER_BESIDE = re.compile(rf"\btrain(?:ing|er|s)?\b[^.\n]{{0,100}}?\b{_GPU_SAID}\b|"
                             rf"\b{_GPU_SAID}\b[^.\n]{{0,100}}?\btrain(?:ing|er|s)?\b", re.I)
# vLLM asleep or offloaded between rollouts (vLLM's sleep mode: "Sleep mode freed 43.82 GiB, 4.11 GiB memory is still
# in use", wake_up, a trainer's free_cache_engine)
_ASLEEP = re.compile(r"sleep mode|\bsleep\(|memory is still in use|wake[_ ]up|free_cache_engine", re.I)
# the OOM placed in the trainer's own path in the same sentence ("the OOM happened later in the Megatron
# training/logprob path")
_TRAINER_SIDE = re.compile(r"\b(?:OOM|out of memory)\b[^.\n]{0,120}?\b(?:megatron|training|train step|log[-_ ]?probs?|"
                           r"backward|update_actor|actor update|optimizer|fsdp)\b", re.I)
# kinds where the rollout engine's own room ran out (not CUDA-graph capture, KV room a context asks, another process)
_ROOM = ("not_recognised", "out_of_memory", "activation_peak", "no_kv_cache_memory", "oom_under_load",
         "weights_loading")
COLOCATED_SHARE = 0.5  # where the trainer's share is not shown: half the GPU for vLLM, half for the trainer
LEAST_SHARE = 0.3  # a 0.2 step stops here
SMALL_STEP = 0.05  # the step below it
SMALLEST_SHARE = 0.1


def colocated_trainer(diagnosis: Diagnosis, text: str, settings: dict[str, Setting]) -> Diagnosis:
    if diagnosis.reader != "vllm" or diagnosis.kind not in _ROOM or not (
            _COLOCATED.search(text) or _TRAINER_BESIDE.search(text)):
        return diagnosis
    # a larger share takes from the trainer beside it: never offered here
    diagnosis = replace(diagnosis, changes=tuple(c for c in diagnosis.changes
                                                 if c.lever != "gpu_memory_utilization_up"))
    share = _smaller_share(settings)
    if _ASLEEP.search(text) and _TRAINER_SIDE.search(text):
        first = Change("the trainer's tensor parallel size x2 (Megatron: tensor_model_parallel_size, with "
                       "sequence_parallel)", "the OOM is in the trainer's own step while vLLM sleeps: what vLLM keeps "
                       "asleep is no share a vLLM setting sizes, what the trainer holds per GPU falls with its tensor "
                       "parallel degree", "tensor_parallel_up")
        return _first(diagnosis, (first, share) if share else (first,))
    if share is None:
        return diagnosis
    return _first(diagnosis, (share,))


def _smaller_share(settings: dict[str, Setting]) -> Change | None:
    current = number(settings, "gpu_memory_utilization")
    lower = COLOCATED_SHARE if current is None else round(current - 0.2, 2)
    if current is not None and lower < LEAST_SHARE:
        # a share already small holds vLLM's weights and little else: a small step (0.05 of an 80 GiB GPU is 4 GiB
        # for the trainer) rather than one that leaves vLLM no KV cache
        lower = round(current - SMALL_STEP, 2)
    if lower < SMALLEST_SHARE:
        return None
    return Change(f"--gpu-memory-utilization {lower:.2f} (the trainer's vllm_gpu_memory_utilization)",
                  "vLLM's share is of the whole GPU, the trainer's memory included: a smaller share leaves the "
                  "trainer its weights, gradients and optimizer state", "gpu_memory_utilization_down")


def _first(diagnosis: Diagnosis, changes: tuple[Change, ...]) -> Diagnosis:
    levers = {c.lever for c in changes}
    return replace(diagnosis, changes=changes + tuple(c for c in diagnosis.changes if c.lever not in levers))
