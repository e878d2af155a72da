"""A PyTorch CUDA OOM read by the code around it: the traceback's frames and the lines before say whether a training
step, its optimizer state, generate(), an attention mask or the weights' loading ran out, and each has its own lever.
Memory another process holds and fragmentation come first (harness.diagnose.allocator)."""

from __future__ import annotations

import re
from dataclasses import replace

from harness.diagnose.allocator import (LIST_PROCESSES, allocator_verdict, fragmentation_after_steps,
                                       fragmentation_in_words, free_other_process,
                                       gib, oom_figures)
from harness.diagnose.failures import quoted_line
from harness.diagnose.levers import lever_of
from harness.diagnose.offload import load_moving_weights
from harness.diagnose.preference import reference_weights_first
from harness.diagnose.records import Change, Diagnosis
from harness.diagnose.sequence import (shorter_for_a_profile_run, shorter_for_one_large_request,
                                       shorter_sequence_first)
from harness.diagnose.training_state import model_too_large_to_train
from harness.diagnose.vision import attention_first, flex_uncompiled, image_generation_step, step_change
from harness.measure.oom import OomFigures

GIB = 2**30

# a training step's batch lowered without changing the optimizer's step (accumulation makes up the rest)
_SMALLER_TRAINING_BATCH = Change("lower the batch size (per_device_train_batch_size), with gradient accumulation",
                                 "activations grow with the batch")
# (pattern over the traceback and the lines before the error, kind, summary, changes)
_PHASES = (
    # torch.load deserializes each tensor onto the device it was saved from (torch/serialization.py:
    # default_restore_location -> _cuda_deserialize) unless map_location says otherwise: a checkpoint saved from cuda:0
    # lands on cuda:0 in every process of a multi-GPU resume, and beside the model and optimizer it is loaded into
    (r"serialization\.py|_cuda_deserialize|restore_location|torch\.load\(", "weights_loading",
     "loading a checkpoint ran out: torch.load put its tensors back on the GPU they were saved from, beside the model "
     "and optimizer they are loaded into",
     (Change("torch.load(path, map_location='cpu') (or this process's own device), and drop the loaded dict after "
             "load_state_dict", "the checkpoint's copy stays off this GPU; load_state_dict copies into the tensors "
             "already there", "map_location"),
      Change("lower the batch size (per_device_train_batch_size)", "the first step after the resume needs its "
             "activations beside the model and optimizer"))),
    (r"value_buffer|key_buffer|kv_buffer|mem_manager|max_total_token_num", "kv_cache_too_small",
     "the engine's KV buffer, preallocated at start-up for its whole token budget, did not fit",
     (Change("--max_total_token_num lower (the KV token budget preallocated at start-up)",
             "the KV buffer is this many tokens x layers x heads x head size"),
      Change("quantize the weights (awq or gptq 4-bit)", "leaves more for the KV buffer"))),
    (r"optimizer\.step|optim/adam|adamw?\.py|_multi_tensor_adam|exp_avg|state\[.step.\]", "optimizer_state",
     "the optimizer's state ran out (Adam keeps two fp32 moments per parameter)",
     (Change("an 8-bit optimizer (bitsandbytes adamw_8bit) or a paged optimizer",
             "optimizer state at a quarter of fp32 Adam's"),
      Change("lower the batch size (per_device_train_batch_size)", "fewer activations beside the state"),
      Change("gradient_checkpointing=True", "recomputes activations instead of keeping them"))),
    # transformers >= 4.53 builds masks in masking_utils.py (sdpa_mask, eager_mask, and_masks' inner and_mask)
    (r"attention_mask|_prepare_4d|causal_mask|_update_causal_mask|expand_mask|make_causal|masking_utils\.py|"
     r"\b(?:sdpa|eager|and|or|padding)_mask\b", "attention_mask",
     "the attention mask ran out: it grows with the square of the sequence length",
     (Change("shorter sequences (max_length / truncation)", "the mask is batch x length x length"),
      Change("lower the batch size", "the mask grows with the batch too"),
      Change("attn_implementation='sdpa' or 'flash_attention_2'", "no materialised mask"))),
    # the frames of generate(), or the person's words that it failed at inference ("OOM at inference after
    # fine-tuning", "in the generate script"): inference after a fine-tune is not a training step
    (r"\.generate\(|generation/utils\.py|_sample\(|greedy_search|beam_search|model\.generate|"
     r"\b(?:at|during|in|for) inference\b|\bgenerat(?:e|ion|ing) (?:script|step|call)|\bnum_beams\b", "generate",
     "generate() ran out: the KV cache and logits grow with batch x num_beams x (prompt + new tokens)",
     (Change("lower the batch size of generate() (and num_beams: each beam is one more sequence)",
             "the KV cache and the logits grow with it"),
      Change("shorter max_new_tokens / prompts (max_length)", "the KV cache grows with the sequence"),
      Change("quantize the weights (awq or gptq 4-bit)", "leaves more for the cache"))),
    (r"\.backward\(|loss\.backward|autograd|training_step|trainer\.py|train_step|accelerator\.backward|"
     r"inner_training_loop|solver\.cpp|caffe", "training_step",
     "a training step ran out: activations kept for the backward pass grow with batch x sequence length",
     (_SMALLER_TRAINING_BATCH,
      Change("gradient_checkpointing=True", "recomputes activations instead of keeping them"),
      Change("shorter sequences (max_length)", "activations grow with the length"))),
    (r"from_pretrained|load_state_dict|load_checkpoint|_load_pretrained|modeling_utils\.py|\.cuda\(\)|\.to\(['\"]cuda|"
     r"safetensors", "weights_loading",
     "the weights did not fit while loading",
     (Change("quantize the weights (load_in_4bit / awq / gptq)", "a quarter of the 16-bit weights"),
      Change("device_map='auto' over more GPUs, or a larger GPU", "spreads the weights"))),
    (r"lm_eval|evaluator\.py|loglikelihood", "generate",
     "an evaluation batch ran out of memory",
     (Change("lower the batch size (--batch_size 1, or auto)", "fewer sequences per forward"),
      Change("shorter sequences (max_length)", "activations and KV grow with the length"))),
)


# an LLM fine-tune (PEFT LoRA/QLoRA, trl's SFTTrainer, a fine-tuning script): the base weights are frozen (4-bit
# under QLoRA) and hold no optimizer state, so the activations kept for the backward pass are the bulk of a step, and
# gradient checkpointing is the lever (transformers' single-GPU training guide; PEFT's QLoRA path turns it on,
# prepare_model_for_kbit_training(use_gradient_checkpointing=True); trl's SFTTrainer stopped turning it on by default
# in 0.7.2, huggingface/trl#725)
_FINE_TUNE = re.compile(r"\b(?:q?lora|peft|sft|SFTTrainer|trl|fine-?tun\w*|finetun\w*)\b", re.I)
# and training, not inference with an adapter: a fine-tune, a trainer, a backward pass, epochs
_TRAINING = re.compile(r"\btrain|fine-?tun|finetun|\bsft\b|SFTTrainer|backward|\bepoch", re.I)
# on already: a setting, or LLaMA-Factory (llmtuner), which checkpoints unless --disable_gradient_checkpointing
_CHECKPOINTING_ON = re.compile(r"(?:gradient|activation|grad)_checkpoint\w*\s*[:=]\s*true|--gradient[_-]checkpointing"
                               r"(?!\s*(?:=\s*)?(?:false|0)\b)|gradient_checkpointing_enable\(|finetuning_type|llmtuner|"
                               r"llamafactory", re.I)


# an adapter fine-tune (PEFT LoRA/QLoRA): the base weights are frozen and hold neither gradients nor optimizer state
_ADAPTER = re.compile(r"\b(?:q?lora|peft|LoraConfig|get_peft_model|lora_r|lora_rank|lora_alpha)\b", re.I)
# a traceback's frames ('File "...", line N, in f'): only these place a failure in code; a script quoted beside the
# error (its from_pretrained line) shows what ran before, not what ran out
_FRAME = re.compile(r"File \"[^\"]+\", line \d+")


def _fine_tune_without_checkpointing(context: str, settings: dict) -> bool:
    if not (_FINE_TUNE.search(context) and _TRAINING.search(context)):
        return False
    setting = settings.get("gradient_checkpointing")
    if setting is not None:
        return setting.value is False
    return not _CHECKPOINTING_ON.search(context)


# checkpointing said to be off for a training run: a config key or flag set false (TrainingArguments'
# gradient_checkpointing, NeMo Automodel's distributed.activation_checkpointing, LLaMA-Factory's
# --disable_gradient_checkpointing) or the words ("no activation checkpointing", "without gradient checkpointing")
_CHECKPOINTING_OFF = re.compile(r"(?:gradient|activation)[_ -]checkpoint\w*\s*[:=]\s*false\b|"
                                r"\b(?:no|without)\s+(?:gradient|activation)[_ -]checkpointing\b|"
                                r"--disable[_-]gradient[_-]checkpointing\b", re.I)


def _checkpointing_said_off(context: str, settings: dict) -> bool:
    """A training run (any model, full or adapter fine-tune) whose log or flags say checkpointing is off. Then it is
    the first lever, before a smaller batch: it keeps the step's math as it is (same batch, same optimizer steps) for
    about a third more compute, where a smaller batch changes the run unless accumulation makes up for it; and where the
    batch is shown at LARGE_BATCH+ the batch rule comes first. Never where it is on (nothing repeated in place)."""
    if not _TRAINING.search(context):
        return False
    setting = settings.get("gradient_checkpointing")
    if setting is not None:
        return setting.value is False
    return bool(_CHECKPOINTING_OFF.search(context)) and not _CHECKPOINTING_SET.search(context)


def _checkpointing_first(figures: list, quoted: str, source: str, frozen: bool = True) -> Diagnosis:
    return Diagnosis(source, "pytorch-oom", "training_step",
                     "a fine-tuning step ran out of memory with gradient checkpointing off: with the base weights "
                     "frozen, the activations kept for the backward pass (batch x sequence length x layers) are the "
                     "bulk of it" if frozen else
                     "a training step ran out of memory with activation (gradient) checkpointing said to be off: every "
                     "layer's activations are kept for the backward pass at once (batch x sequence length x layers)",
                     tuple(figures), (
                         Change("gradient_checkpointing=True (TrainingArguments / --gradient_checkpointing)",
                                "keeps one activation per layer and recomputes the rest in the backward pass: the "
                                "activations shrink by about the number of layers, for about a third more compute"),
                         _SMALLER_TRAINING_BATCH,
                         Change("shorter sequences (max_length / cutoff_len / max_seq_length)",
                                "activations grow with the length")),
                     failing_line=quoted)


# gradient checkpointing that does not run: with the base frozen (an adapter, a quantized model) the embeddings' output
# carries no grad, so reentrant checkpointing's recomputed segment has nothing to differentiate and backward raises
# "element 0 of tensors does not require grad and does not have a grad_fn" (peft#137; FastChat#581 / PR#1489,
# axolotl#312: model.enable_input_require_grads()); later transformers / PEFT / TRL releases make the inputs require
# grad themselves when checkpointing an adapter
_CHECKPOINTING_BROKEN = re.compile(r"element 0 of tensors does not require grad and does not have a grad_fn", re.I)
_CHECKPOINTING_WORD = re.compile(r"(?:gradient|activation)[_ -]?checkpoint|use_reentrant", re.I)


def _checkpointing_broken(context: str, figures: list, quoted: str, source: str) -> Diagnosis | None:
    """The log says gradient checkpointing, the lever for a training step's activations, fails with the frozen-inputs
    error: the memory lever is there but does not run in this library pairing, so the releases that run it (or the
    call they make) come before a smaller step."""
    if not (_CHECKPOINTING_BROKEN.search(context) and _CHECKPOINTING_WORD.search(context)):
        return None
    return Diagnosis(source, "pytorch-oom", "training_step",
                     "a training step ran out of memory, and gradient checkpointing, the lever for its activations, "
                     "fails here with 'element 0 of tensors does not require grad': with the base frozen its inputs "
                     "carry no grad, which this transformers / PEFT / TRL pairing does not handle", tuple(figures), (
                         Change("upgrade transformers, PEFT and TRL to releases that make the inputs require grad when "
                                "checkpointing an adapter, then turn gradient checkpointing on",
                                "checkpointing then runs: one activation kept per layer", "upgrade"),
                         Change("model.enable_input_require_grads() before training (or gradient_checkpointing_kwargs="
                                "{'use_reentrant': False})", "the same fix by hand in the release in place", "other"),
                         _SMALLER_TRAINING_BATCH),
                     failing_line=quoted)


SERVING_SHARE = 0.9  # a server preallocating this share of the GPU (vLLM's default and up) leaves little outside it


def _share_down_first(share: float, figures: list, quoted: str, source: str) -> Diagnosis:
    """A server that preallocates a share of the GPU (gpu_memory_utilization: vLLM and the servers built like it)
    ran out outside the share, where transient buffers (MoE scratch, sampler logits, graphs) live: a smaller share is
    what gives them room; the tokens of one step come next."""
    lower = round(share - 0.05, 2)
    return Diagnosis(source, "pytorch-oom", "oom_under_load",
                     f"a server that preallocates {share} of the GPU (gpu_memory_utilization) ran out: its transient "
                     "buffers live in what the share leaves outside it", tuple(figures), (
                         Change(f"--gpu-memory-utilization {lower:.2f}", f"leaves {1 - lower:.0%} of the GPU outside "
                                "the preallocated share for transient buffers (less KV cache)",
                                "gpu_memory_utilization_down"),
                         Change("--max-num-batched-tokens 4096", "caps the tokens of one step, and so its buffers"),
                         free_other_process()),
                     failing_line=quoted)


LARGE_BATCH = 32  # a training batch this large is the first lever: halving it halves the activations, no recompute


# the batch one GPU runs per step where a run names it apart from the global batch (DeepSpeed's train_batch_size is
# micro batch x accumulation x GPUs): OpenRLHF's --micro_train_batch_size, DeepSpeed's train_micro_batch_size_per_gpu,
# NeMo Automodel's and torchtitan's local_batch_size (beside global_batch_size)
_MICRO_BATCH = re.compile(r"\b(?:micro_train_batch_size|train_micro_batch_size_per_gpu|micro_batch_size|"
                          r"local_batch_size)\b[\"']?"
                          r"(?:\s*[:=]\s*|\s+)(\d+)\b", re.I)


def _micro_batch(context: str) -> int | None:
    shown = [int(m.group(1)) for m in _MICRO_BATCH.finditer(context)]
    return min(shown) if shown else None


def _large_batch(settings: dict, context: str = "") -> int | None:
    if (micro := _micro_batch(context)) is not None:
        return micro if micro >= LARGE_BATCH else None
    batch = settings.get("batch_size")
    value = batch.value if batch is not None else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= LARGE_BATCH \
        else None


def _batch_first(batch: int, figures: list, quoted: str, source: str) -> Diagnosis:
    return Diagnosis(source, "pytorch-oom", "training_step",
                     f"a training step ran out at a batch of {batch}: the activations kept for the backward pass grow "
                     "with it, and at this size a smaller batch (with gradient accumulation for the same effective "
                     "batch) comes before recomputing them", tuple(figures), (
                         Change(f"lower the batch size to {batch // 2} (from {batch}), with 2 gradient "
                                "accumulation steps", "halves the activations; the effective batch stays the same",
                                "batch_size_down"),
                         Change("gradient_checkpointing=True", "recomputes activations instead of keeping them"),
                         Change("shorter sequences (max_length)", "activations grow with the length")),
                     failing_line=quoted)


# a memory-efficient attention kernel named anywhere (a trainer's --flash_attn, attn_implementation, sdpa, xformers)
_ATTENTION_ON = re.compile(r"flash[-_ ]?attn|flash[-_ ]?attention|attn_implementation|\bsdpa\b|xformers|"
                           r"use_flash|--attention[-_]backend", re.I)
# gradient checkpointing switched on where the run shows it (a flag, a config key, the call)
_CHECKPOINTING_SET = re.compile(r"--gradient[_-]checkpointing(?!\s*(?:=\s*)?(?:false|0)\b)|"
                                r"(?:gradient|activation)_checkpointing\s*[:=]\s*true|gradient_checkpointing_enable\(",
                                re.I)


def _attention_left(context: str, settings: dict) -> bool:
    """A training step at one sequence per GPU with gradient checkpointing on: neither the batch nor the kept
    activations can shrink further, and what is left to peak is each layer's attention while it is recomputed; in
    eager attention that materialises batch x heads x length x length scores, which a memory-efficient kernel (flash
    attention, PyTorch's SDPA) never holds. Only where no such kernel is named."""
    micro = _micro_batch(context)
    batch = settings.get("batch_size")
    at_one = micro is not None and micro <= 1 if micro is not None else (
        batch is not None and isinstance(batch.value, (int, float)) and not isinstance(batch.value, bool)
        and batch.value <= 1)
    checkpointing = settings.get("gradient_checkpointing")
    on = (checkpointing is not None and checkpointing.value is True) or bool(_CHECKPOINTING_SET.search(context))
    return at_one and on and bool(_TRAINING.search(context)) and not _ATTENTION_ON.search(context)


def _attention_first(figures: list, quoted: str, source: str) -> Diagnosis:
    return Diagnosis(source, "pytorch-oom", "training_step",
                     "a training step ran out at one sequence per GPU with gradient checkpointing on: what is left "
                     "is the attention of the layer being recomputed, which eager attention materialises as length x "
                     "length scores per head", tuple(figures), (
                         Change("a memory-efficient attention kernel: the trainer's --flash_attn (OpenRLHF, "
                                "LLaMA-Factory), or attn_implementation='flash_attention_2' / 'sdpa'",
                                "no length x length score matrix is held: attention memory grows with the length, "
                                "not its square", "attention_kernel"),
                         Change("shorter sequences (max_len / max_length / cutoff_len)",
                                "activations grow with the length"),
                         Change("DeepSpeed ZeRO offload: zero_optimization.offload_optimizer and offload_param "
                                "{\"device\": \"cpu\"}", "the optimizer state and parameter shards move to CPU "
                                "memory", "cpu_offload")),
                     failing_line=quoted)


# a consumer card's memory (a 24 GB RTX 3090/4090 and below: laptops' 6-8 GB, 10-16 GB desktop cards)
CONSUMER_GPU_GIB = 24.5
HELD_BY_TENSORS = 0.85  # PyTorch's own tensors hold this share of the GPU
# reserved above allocated while weights load: loading keeps every tensor it allocates, so the caching allocator holds
# only its rounding (2 MiB small-pool segments, one 20 MiB segment shared by 1-10 MiB tensors: c10/cuda/
# CUDACachingAllocator.cpp kSmallBuffer, kLargeBuffer), which the message's two decimals of a GiB show as 0.00-0.01
LOADING_SLACK = 0.015 * GIB
# what a step's size would be read from: a batch, a length, samples, steps, a training run
_STEP_SIZE_SAID = re.compile(r"batch|seq(?:uence)?[_ ]?len|max[_-]?len|pad_size|max_length|cutoff|samples|\bsteps?\b|"
                             r"\btrain|epoch|num_beams|max_new_tokens", re.I)
_QUANTIZED_SAID = re.compile(r"int4|int8|4[-_ ]?bit|8[-_ ]?bit|awq|gptq|nf4|bnb|bitsandbytes|quantiz|gguf|fp8", re.I)


def _weights_fill_a_small_gpu(oom: OomFigures, context: str, settings: dict) -> bool:
    """PyTorch's OOM line pasted with nothing that sizes a step (no traceback, batch, length, training words), where
    this process's own tensors hold nearly all of a consumer card and the allocator holds nothing spare: what fills
    it is what was loaded, the weights, and on a card this size 16-bit weights of a 6-13B model are the usual cause
    (2 bytes per parameter: 12-26 GB); 8- or 4-bit weights are the change that makes them fit. Not where the
    allocator caches freed blocks (reserved above allocated by more than LOADING_SLACK): loading frees nothing, so
    freed blocks say a step ran and released its activations, and the step is what outgrew the card."""
    allocated, total = oom.bytes_of("allocated"), oom.bytes_of("total")
    unallocated = oom.reserved_unallocated_bytes or 0
    if not allocated or not total or total / GIB > CONSUMER_GPU_GIB or allocated < HELD_BY_TENSORS * total:
        return False
    if unallocated > LOADING_SLACK or _FRAME.search(context) or _STEP_SIZE_SAID.search(context) or \
            _QUANTIZED_SAID.search(context):
        return False
    return not any(key in settings for key in ("batch_size", "max_length", "max_new_tokens", "quantization"))


def _quantize_first(oom: OomFigures, figures: list, quoted: str, source: str) -> Diagnosis:
    return Diagnosis(source, "pytorch-oom", "weights_do_not_fit",
                     f"this process's own tensors hold {oom.allocated} of the {oom.total} card and nothing in the log "
                     "sizes a step (no batch, length or training step): what fills it is what was loaded, most likely "
                     "the weights at 16 bits", tuple(figures), (
                         Change("quantize the weights (8-bit or 4-bit: load_in_8bit / load_in_4bit, a GPTQ/AWQ "
                                "checkpoint, the model's own quantize(4))", "8-bit weights take half the 16-bit "
                                "bytes, 4-bit a quarter", "quantize_smaller"),
                         Change("lower the tokens per step (batch x sequence length)", "the lever where the weights "
                                "fit and the activations do not"),
                         Change("a larger GPU, or split the model over more GPUs", "more room")),
                     ("which model: --model DIR tells weights from activations",), failing_line=quoted)


# a person's words that the same job fits by itself ("MMLU alone worked perfectly", "runs fine on its own")
_WORKS_ALONE = re.compile(r"\b(?:alone|on its own|by itself|separately|individually)\s+(?:it\s+)?(?:works?|worked|"
                          r"runs?|ran|fits?|fitted|is fine|was fine|succeeds?|succeeded)\b|\b(?:works?|worked|runs?|ran|"
                          r"fits?|fine)\s+(?:\w+\s+)?(?:alone|on its own|by itself|separately|individually)\b", re.I)
# TensorRT's own allocator (rtSafe / its default GPU allocator): "Cuda Error in allocate: 2 (out of memory)"
_TENSORRT_ALLOCATOR = re.compile(r"Cuda Error in allocate: 2\b|safeRuntime\.cpp|cudaAllocator\.cpp|\bnvinfer", re.I)


# DeepSpeed ZeRO (stage 2 or 3) named in the log or the flags, and whether its CPU offload is on already
_ZERO = re.compile(r"\bzero[-_ ]?(?:stage[-_ =]?)?[23]\b|\bzero_stage\b|deepspeed", re.I)
_ZERO_OFFLOAD_ON = re.compile(r"offload_(?:optimizer|param)|zero[-_ ]?offload|ZeRO-Offload|cpu_offload", re.I)


# ZeRO stage 3 in place: a config's "stage": 3, zero_optimization.stage 3, LLaMA-Factory's ds_z3_config, "zero3"
_ZERO_3 = re.compile(r"\bzero[-_ ]?(?:stage[-_ =]?)?3\b|zero_optimization\.stage\W{0,3}3\b|[\"']stage[\"']\s*:\s*3\b|"
                     r"\bds_z3(?!_offload)|\bzero[-_ ]?3\b", re.I)


def _zero_offload(context: str, settings: dict) -> Change | None:
    """A DeepSpeed ZeRO run without CPU offload, at one sequence per GPU (no smaller batch is left), or at stage 3
    (parameters, gradients and optimizer state all partitioned: no further stage is left) with no larger batch shown:
    the optimizer state and the parameter shards leave the GPU before anything else (DeepSpeed's ZeRO-Offload /
    ZeRO-Infinity: offload_optimizer, offload_param with device cpu). A batch shown above one comes down first (no
    CPU round trip); an adapter (LoRA) run's optimizer state is the adapter's alone, so offloading it frees little."""
    batch = settings.get("batch_size")
    shown = batch is not None and isinstance(batch.value, (int, float)) and not isinstance(batch.value, bool)
    at_one = shown and batch.value <= 1
    if not _ZERO.search(context) or _ZERO_OFFLOAD_ON.search(context) or _ADAPTER.search(context) or \
            not (at_one or (not shown and _ZERO_3.search(context))):
        return None
    return Change("DeepSpeed ZeRO offload: zero_optimization.offload_optimizer and offload_param {\"device\": \"cpu\"}",
                  "the optimizer state (fp32 Adam: 12 bytes per parameter) and the parameter shards move to CPU "
                  "memory; the batch is already one sequence per GPU", "cpu_offload")


# a vision-language model (Qwen2-VL, LLaVA, InternVL, ...) or an image-evaluation harness: images become tokens, as many
# as the resolution allows (Qwen2-VL's processor: max_pixels 16384 x 28 x 28 by default, one token per 28 x 28 patch,
# so up to 16,384 tokens per image), so at one sample per batch the image resolution is the lever
_VISION_LANGUAGE = re.compile(r"qwen2?[-_.]?(?:\d[-_.]?\d?[-_]?)?vl|\bllava|internvl|\bVLM\b|-VL\b|lmms[-_]?eval|"
                              r"pixel_values|max_pixels|image_processor|vision[-_ ]language", re.I)


def _image_tokens_first(context: str, settings: dict) -> bool:
    batch = settings.get("batch_size")
    at_one = batch is not None and isinstance(batch.value, (int, float)) and batch.value <= 1
    return bool(_VISION_LANGUAGE.search(context)) and (at_one or not _TRAINING.search(context))


def _image_tokens(figures: list, quoted: str, source: str) -> Diagnosis:
    return Diagnosis(source, "pytorch-oom", "activation_peak",
                     "a vision-language model ran out on its image tokens: each image becomes as many tokens as its "
                     "resolution allows, so one large image is a long sequence whatever the batch size",
                     tuple(figures), (
                         Change("lower the image resolution: the processor's max_pixels (Qwen2-VL: e.g. 256*28*28 "
                                "instead of 16384*28*28), or fewer image tiles", "image tokens shrink in proportion "
                                "to the pixels: their activations and KV cache with them", "image_resolution_down"),
                         Change("lower the batch size", "fewer images at once"),
                         Change("quantize the weights (awq or gptq 4-bit)", "leaves more for the image tokens")),
                     failing_line=quoted)


# LMDeploy (pipeline / PytorchEngineConfig / TurbomindEngineConfig; its PyTorch engine runs the models TurboMind does
# not support): the PyTorch engine captures a CUDA graph per batch size up to max_batch_size unless eager_mode=True
# (lmdeploy/pytorch/backends/cuda/graph_runner.py: enable_graph_mode = not backend_config.eager_mode), outside the
# KV share cache_max_entry_count takes of the free memory
_LMDEPLOY = re.compile(r"\blmdeploy\b|PytorchEngineConfig|TurbomindEngineConfig", re.I)
_EAGER_ON = re.compile(r"eager_mode\s*=\s*True|--eager-mode\b", re.I)


def _in_eager_mode(context: str, settings: dict) -> bool:
    setting = settings.get("enforce_eager")
    return (setting is not None and setting.value is True) or bool(_EAGER_ON.search(context))


def _lmdeploy_graphs(settings: dict, figures: list, quoted: str, source: str) -> Diagnosis:
    batch = settings.get("max_batch_size")
    size = int(batch.value) if batch is not None and isinstance(batch.value, (int, float)) else None
    return Diagnosis(source, "lmdeploy", "cuda_graph_capture",
                     "LMDeploy ran out of memory with CUDA graphs on: its PyTorch engine captures a graph per batch "
                     "size up to max_batch_size, outside the KV share (cache_max_entry_count)", tuple(figures), (
                         Change("PytorchEngineConfig(eager_mode=True)", "no CUDA graphs: their memory is not "
                                "allocated (slower decode at small batches)", "enforce_eager"),
                         Change("cache_max_entry_count 0.5 (EngineConfig)", "a smaller KV share of the free memory "
                                "leaves the graphs and activations more room", "gpu_memory_utilization_down"),
                         Change(f"lower max_batch_size (EngineConfig) to {size // 4 if size and size >= 8 else 32}",
                                "fewer and smaller graphs, fewer sequences at once", "batch_size_down")),
                     failing_line=quoted)


# inference that keeps autograd's graph: a generation or decoding run the person wrote themselves (transformers'
# generate() runs under torch.no_grad already), with no sign that gradients are off, where the memory grows with the
# steps generated or a network's forward is called directly: every step's activations stay referenced for a backward
# pass that never comes (PyTorch's autograd notes: no_grad / inference_mode for inference)
_INFERENCE = re.compile(r"\bgenerat(?:e|es|ed|ing)\b|\binference\b|\bsampl(?:e|es|ing)\b|\bdecod(?:e|ing)\b", re.I)
_GRAD_OFF = re.compile(r"no_grad|inference_mode|\.eval\(\)|requires_grad_?\(?\s*=?\s*False|set_grad_enabled\(\s*False",
                       re.I)
_LIBRARY_GENERATE = re.compile(r"generation/utils\.py|\.generate\(|\bnum_beams\b|max_new_tokens|generate script|"
                               r"pipeline\(|\bvllm\b|lm_eval|lmms_eval", re.I)
_GROWS_WITH_STEPS = re.compile(r"\b(?:grows?|goes up|increas\w*|climbs?|accumulat\w*|keeps? (?:rising|growing))\b"
                               r"[^.\n]{0,80}\b(?:steps?|tokens|iterations?)\b", re.I)
_DIRECT_FORWARD = re.compile(r"=\s*\w*(?:net|model|decoder|generator|g_ema|vae)\w*(?:\.\w+)*\(", re.I)


def _autograd_kept_at_inference(context: str) -> bool:
    return bool(_INFERENCE.search(context)) and not _TRAINING.search(context) and \
        not _GRAD_OFF.search(context) and not _LIBRARY_GENERATE.search(context) and \
        bool(_GROWS_WITH_STEPS.search(context) or _DIRECT_FORWARD.search(context))


# an evaluation harness under `accelerate launch` that prepares its model with accelerator.prepare(): prepared for
# training, the model is wrapped for data parallel (DDP's gradient buckets, a copy per process); accelerate's
# prepare_model(model, evaluation_mode=True) skips the wrapper (EleutherAI/lm-evaluation-harness#770)
_ACCELERATE_LAUNCH = re.compile(r"accelerate launch|accelerate\.commands\.launch", re.I)
_EVAL_HARNESS = re.compile(r"--tasks\b|\blm_eval\b|evaluator\.py", re.I)


def _at_default_batch(settings: dict, context: str) -> bool:
    """No batch size given (the harness's default of one sequence) or one given at 1: no smaller batch is left."""
    batch = settings.get("batch_size")
    if batch is None:
        return not re.search(r"--batch[_-]size", context)
    return isinstance(batch.value, (int, float)) and not isinstance(batch.value, bool) and batch.value <= 1


def _inference_mode_first(evaluation: bool, figures: list, quoted: str, source: str) -> Diagnosis:
    first = Change("prepare the model for evaluation: accelerator.prepare_model(model, evaluation_mode=True) instead "
                   "of accelerator.prepare(model)", "no data-parallel training wrapper: no gradient buckets beside "
                   "the weights in each process", "inference_mode") if evaluation else \
        Change("run it under torch.inference_mode() (or torch.no_grad()), with model.eval()",
               "no activations kept for a backward pass: memory stays at one step's, whatever the steps",
               "inference_mode")
    return Diagnosis(source, "pytorch-oom", "generate",
                     "an evaluation under a training wrapper ran out" if evaluation else
                     "inference ran out with autograd on: each step's activations stay referenced for a backward "
                     "pass that never comes, so memory grows with the steps", tuple(figures), (
                         first,
                         Change("lower the batch size", "fewer sequences at once"),
                         Change("shorter sequences (max_length)", "activations grow with the length")),
                     failing_line=quoted)


# an evaluation in transformers' Trainer (trainer.evaluate, its evaluation loop, "OOM when eval starts"): its batch is
# per_device_eval_batch_size (8 by default, whatever the training batch), and the logits of every step stay on the
# GPU until the end of the loop unless eval_accumulation_steps moves them to the CPU every N steps
_TRAINER_EVAL = re.compile(r"trainer\.evaluate|evaluation_loop|prediction_step|\beval(?:uation)?\s+(?:would\s+)?"
                           r"(?:starts?|step|loop)|crash\w*\s+on\s+eval|\bon\s+eval\b", re.I)
_TRAIN_BATCH_IN_CONFIG = re.compile(r"^\s*(?:per_device_train_)?batch_size\s*[:=]\s*(\d+)\s*$", re.M)
# an evaluation batch of its own set (per_device_eval_batch_size, a script's eval_batch_size): the evaluation runs it,
# not the training batch
_EVAL_BATCH = re.compile(r"eval_batch_size|per_device_eval_batch_size", re.I)


def _trainer_eval(settings: dict, context: str, figures: list, quoted: str, source: str) -> Diagnosis | None:
    if not _TRAINER_EVAL.search(context) or _EVAL_BATCH.search(context) or \
            re.search(r"eval_accumulation_steps", context):
        return None
    batch = settings.get("batch_size")
    value = batch.value if batch is not None else None
    if value is None and (written := _TRAIN_BATCH_IN_CONFIG.search(context)):  # a YAML config's "batch_size: 1"
        value = int(written.group(1))
    train = int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 8 else None
    smaller = Change(f"per_device_eval_batch_size={train or 1} (TrainingArguments; 8 unless set)",
                     "the evaluation's own batch, which the training batch does not lower", "batch_size_down")
    accumulate = Change("eval_accumulation_steps=8 (TrainingArguments)", "moves the gathered logits to the CPU every "
                        "8 steps instead of holding every step's on the GPU to the end", "eval_accumulation_steps")
    return Diagnosis(source, "pytorch-oom", "generate",
                     "the Trainer's evaluation ran out: its batch is per_device_eval_batch_size, and it holds every "
                     "step's logits on the GPU until the end of the loop", tuple(figures),
                     (smaller, accumulate) if train is not None else (accumulate, smaller), failing_line=quoted)


# an LLM-like checkpoint the person loads (transformers' loading, a named model family or a size in billions):
# where its weights are what fills the card, quantizing them is the lever; a training script's own small network is not
_LLM_WEIGHTS = re.compile(r"from_pretrained|modeling_utils|safetensors|\btransformers\b|AutoModel|\bLLM\b|"
                          r"\b(?:llama|chatglm|glm|qwen|baichuan|mistral|mixtral|gemma|phi|falcon|bloom|gpt|vicuna|"
                          r"internlm|deepseek|mt0|t5|opt|yi)[-_\d]|\b\d+(?:\.\d+)?\s?[bB]\b", re.I)


_MOVED_TO_GPU = re.compile(r"\.cuda\(|\.to\(\s*['\"]?cuda|\.to\(\s*device\b")


def _small_network_held(context: str, figures: list, quoted: str, source: str) -> Diagnosis | None:
    """Moving a training script's own network onto the GPU ran out (model.cuda(), .to('cuda')) with no LLM-like
    checkpoint in sight: a vision or small network's weights are a few hundred MB, so what fills the GPU before the
    first step is another process; freeing it comes first, then the batch the first step will need."""
    if not _TRAINING.search(context) or _LLM_WEIGHTS.search(context):
        return None
    return Diagnosis(source, "pytorch-oom", "memory_held_elsewhere",
                     "a training script's network ran out while moving onto the GPU, before any step: its weights are "
                     "small, so the GPU is most likely held by another process", tuple(figures), (
                         free_other_process(),
                         step_change(context),
                         Change("a larger GPU", "more room")),
                     (f"which processes hold the GPU: {LIST_PROCESSES} (or fuser -v /dev/nvidia*)",),
                     failing_line=quoted)


# an evaluation run (a script's evaluate / --eval-*, a trainer's eval_steps / eval_strategy, MMLU-style
# multiple-choice scoring, predict / test loops, a generate() call): it runs a batch of its own, not the training batch
_EVALUATION = re.compile(r"\bevaluat\w*|--eval[-_]\w+|\beval(?:_loop|uation|_steps|_strategy)?\b|\bmmlu\b|"
                         r"\bhellaswag\b|\bpredict(?:ion)?s?\b|\btest(?:ing)?[_ ](?:loop|set|step)|\bgenerate\(", re.I)
SMALL_REQUEST = 0.01  # of the GPU: a request this small is the last straw, not one batch's activations
FILLED = 0.85  # of the GPU held by this process's tensors


def _evaluation_keeps_autograd(context: str, oom: OomFigures | None, figures: list, quoted: str,
                               source: str) -> Diagnosis | None:
    """An evaluation (no training, no backward pass, no library harness that turns gradients off) whose tensors fill
    the GPU while the request that failed is tiny: one forward's activations are freed after each batch, so what
    fills it is kept from batch to batch, and without torch.no_grad() that is each forward's autograd graph."""
    if oom is None or not _EVALUATION.search(context) or _TRAINING.search(context) or _GRAD_OFF.search(context) or \
            _LIBRARY_GENERATE.search(context) or re.search(r"\.backward\(|autograd/graph\.py|run_backward", context):
        return None
    tried, total, allocated = oom.bytes_of("tried"), oom.bytes_of("total"), oom.bytes_of("allocated")
    if not (tried and total and allocated) or tried > SMALL_REQUEST * total or allocated < FILLED * total:
        return None
    return _inference_mode_first(False, figures, quoted, source)


# the changes that lower the tokens of one step, where the log leaves open which of batch and length to lower
_STEP_LEVERS = ("batch_size_down", "gradient_checkpointing")


def diagnose_torch(text: str, oom: OomFigures | None, line: int, source: str, weights_16bit_bytes: int | None,
                   has_model: bool, settings: dict | None = None, flags_text: str = "") -> Diagnosis:
    """The reader below, then the tokens of one step chosen from what the log shows (harness.diagnose.sequence): at a
    batch of one with a long or unset sequence length, the shorter sequence comes before a smaller batch or
    gradient checkpointing."""
    diagnosis = _diagnose_torch(text, oom, line, source, weights_16bit_bytes, has_model, settings, flags_text)
    setting = (settings or {}).get("gradient_checkpointing")
    if setting.value is True if setting is not None else _CHECKPOINTING_SET.search(f"{text}\n{flags_text}"):
        # on already, in a spelling settings do not parse (a YAML line): never offered again
        diagnosis = replace(diagnosis, changes=tuple(c for c in diagnosis.changes
                                                     if (c.lever or lever_of(c)) != "gradient_checkpointing"))
    if not diagnosis.changes or (diagnosis.changes[0].lever or lever_of(diagnosis.changes[0])) not in _STEP_LEVERS:
        return diagnosis
    if diagnosis.kind == "generate" or (_EVALUATION.search(text) and not _EVAL_BATCH.search(f"{text}\n{flags_text}")):
        return diagnosis  # an evaluation or generate() runs its own batch, not the training batch the log shows
    shorter = shorter_sequence_first(f"{text}\n{flags_text}", settings or {})
    if shorter is None and oom is not None and (diagnosis.changes[0].lever or lever_of(diagnosis.changes[0])) == \
            "batch_size_down":  # checkpointing said off or left off on a fine-tune stays first
        shorter = shorter_for_one_large_request(f"{text}\n{flags_text}", settings or {}, oom.bytes_of("tried"),
                                                oom.bytes_of("allocated"), oom.bytes_of("total"))
    if shorter is None:
        shorter = shorter_for_a_profile_run(f"{text}\n{flags_text}")
    if shorter is None:
        return diagnosis
    return replace(diagnosis, changes=(shorter,) + tuple(c for c in diagnosis.changes
                                                         if (c.lever or lever_of(c)) != "max_model_len_down"))


def _diagnose_torch(text: str, oom: OomFigures | None, line: int, source: str, weights_16bit_bytes: int | None,
                    has_model: bool, settings: dict | None = None, flags_text: str = "") -> Diagnosis:
    figures = oom_figures(oom, line) if oom is not None else []
    lines = text.splitlines()
    quoted = lines[line - 1].strip()[:300] if 0 < line <= len(lines) else ""
    if oom is not None and (verdict := allocator_verdict(oom)) is not None:
        return Diagnosis(source, "pytorch-oom", verdict.kind, verdict.summary, tuple(figures), verdict.changes,
                         failing_line=quoted)
    if oom is None and (verdict := fragmentation_in_words(text) or fragmentation_after_steps(text)) is not None:
        return Diagnosis(source, "pytorch-oom", verdict.kind, verdict.summary, tuple(figures), verdict.changes,
                         failing_line=quoted)
    if _WORKS_ALONE.search(text):
        return Diagnosis(source, "pytorch-oom", "out_of_memory",
                         "the same job fits when it runs alone and fails after others ran in the same process: the "
                         "memory is enough; what the earlier jobs left behind is not (a batch size detected on an "
                         "earlier, shorter job and reused, tensors or caches still referenced)", tuple(figures), (
                             Change("run the failing job in a fresh process, or upgrade to a release that resets its "
                                    "per-job state (lm-eval re-detects --batch_size auto per task since "
                                    "EleutherAI/lm-evaluation-harness#3654)",
                                    "it starts from what fitted when it ran alone", "upgrade"),
                             Change("an explicit batch size for the failing job (instead of auto)",
                                    "no size carried over from a shorter job"),
                             Change("torch.cuda.empty_cache() and drop references between jobs",
                                    "returns what the earlier jobs cached")),
                         failing_line=quoted)
    if oom is None and _TENSORRT_ALLOCATOR.search(text):
        return Diagnosis(source, "pytorch-oom", "memory_held_elsewhere",
                         "TensorRT could not allocate device memory (its allocator's 'Cuda Error in allocate: 2'): an "
                         "engine's memory is fixed when it is built, so at run time what else holds the GPU decides",
                         tuple(figures), (
                             free_other_process(),
                             Change("a smaller builder workspace (config.max_workspace_size / trtexec --workspace)",
                                    "the builder's scratch memory", "other"),
                             Change("rebuild the engine for a smaller max batch (optimization profile)",
                                    "activations sized at build time")),
                         (f"which processes hold the GPU: {LIST_PROCESSES}",), failing_line=quoted)
    around = "\n".join(lines[max(0, line - 60):line + 10])
    context = f"{text}\n{flags_text}"
    if (uncompiled := flex_uncompiled(context, figures, quoted, source)) is not None:
        return uncompiled
    if (broken := _checkpointing_broken(context, figures, quoted, source)) is not None:
        return broken
    if (attention := attention_first(context, around, figures, quoted, source)) is not None:
        return attention
    if (kept := _evaluation_keeps_autograd(context, oom, figures, quoted, source)) is not None:
        return kept
    total = gib(oom.total) if oom is not None else None
    # --model's weights that nearly fill the GPU; a size only the log's model name gives, weights above the whole GPU
    if weights_16bit_bytes and total and weights_16bit_bytes / GIB > (0.8 if has_model else 1.0) * total:
        return Diagnosis(source, "pytorch-oom", "weights_do_not_fit",
                         f"the weights ({weights_16bit_bytes / GIB:.2f} GiB at 16 bits) nearly fill the {total:.2f} GiB "
                         "GPU", tuple(figures), (
                             Change("quantize (awq or gptq 4-bit)", "a quarter of the 16-bit weights"),
                             Change("a larger GPU, or split the model over more GPUs", "more room")),
                         failing_line=quoted)
    if (moving := load_moving_weights(text, flags_text, total, figures, quoted, source)) is not None:
        return moving
    phase = next((p for p in _PHASES if re.search(p[0], around)), None)
    if (phase is None or phase[1] in ("training_step", "optimizer_state")) and \
            (too_large := model_too_large_to_train(context, oom, figures, quoted, source)) is not None:
        return too_large
    if phase is not None and phase[1] == "weights_loading" and _MOVED_TO_GPU.search(around) and \
            not re.search(_PHASES[0][0], around) and (held := _small_network_held(context, figures, quoted,
                                                                                  source)) is not None:
        return held
    if oom is None and _LMDEPLOY.search(context) and not _in_eager_mode(context, settings or {}) and \
            (phase is None or phase[1] not in ("weights_loading", "training_step", "optimizer_state")):
        return _lmdeploy_graphs(settings or {}, figures, quoted, source)
    if _ADAPTER.search(context) and _fine_tune_without_checkpointing(context, settings or {}) and (
            phase is None or phase[1] in ("training_step", "optimizer_state")
            or (phase[1] == "weights_loading" and not _FRAME.search(around))):
        return _checkpointing_first(figures, quoted, source)
    if (phase is None or phase[1] in ("generate",)) and _image_tokens_first(context, settings or {}):
        return _image_tokens(figures, quoted, source)
    if phase is None or phase[1] == "generate":
        if (evaluation := _trainer_eval(settings or {}, context, figures, quoted, source)) is not None:
            return evaluation
        if _autograd_kept_at_inference(context):
            return _inference_mode_first(False, figures, quoted, source)
        if _ACCELERATE_LAUNCH.search(context) and _EVAL_HARNESS.search(context) and not _TRAINING.search(context) \
                and _at_default_batch(settings or {}, context):
            return _inference_mode_first(True, figures, quoted, source)
    training = phase is None or phase[1] in ("training_step", "optimizer_state")
    if training and (reference := reference_weights_first(context, settings or {}, figures, quoted,
                                                          source)) is not None:
        return reference
    if training and _attention_left(context, settings or {}):
        return _attention_first(figures, quoted, source)
    if training and (offload := _zero_offload(context, settings or {})) is not None:
        checkpointing = Change("gradient_checkpointing=True", "recomputes activations instead of keeping them")
        shorter = Change("shorter sequences (max_length / cutoff_len / max_seq_length)",
                         "activations grow with the length")
        return Diagnosis(source, "pytorch-oom", "training_step",
                         "a DeepSpeed ZeRO training step ran out without CPU offload, at stage 3 or at one sequence "
                         "per GPU: what is left on the GPU is the parameter and optimizer shards and the step's "
                         "activations", tuple(figures),
                         (offload, checkpointing, shorter) if _fine_tune_without_checkpointing(context, settings or {})
                         else (offload, shorter, checkpointing), failing_line=quoted)
    share = (settings or {}).get("gpu_memory_utilization")
    if share is not None and isinstance(share.value, float) and share.value >= SERVING_SHARE and \
            (phase is None or phase[1] not in ("weights_loading", "training_step", "optimizer_state")) and \
            not _TRAINING.search(context):
        return _share_down_first(share.value, figures, quoted, source)
    if training and (large := _large_batch(settings or {}, context)) and _TRAINING.search(context):
        return _batch_first(large, figures, quoted, source)
    if training and _fine_tune_without_checkpointing(context, settings or {}):
        return _checkpointing_first(figures, quoted, source)
    if training and _checkpointing_said_off(context, settings or {}):
        return _checkpointing_first(figures, quoted, source, frozen=False)
    if phase is not None:
        _, kind, summary, changes = phase
        return Diagnosis(source, "pytorch-oom", kind, summary, tuple(figures), changes, failing_line=quoted)
    if (generating := image_generation_step(context, figures, quoted, source)) is not None:
        return generating
    if oom is not None and _weights_fill_a_small_gpu(oom, context, settings or {}):
        return _quantize_first(oom, figures, quoted, source)
    allocated = oom.allocated if oom is not None else None
    if oom is None:  # no figures: the tokens per step first, then what else holds the GPU
        return Diagnosis(source, "pytorch-oom", "out_of_memory",
                         "the GPU ran out of memory; the message has no figures to tell this process's memory from "
                         "another's", (), (
                             step_change(context),
                             free_other_process(),
                             Change("a larger GPU, or split the model over more GPUs", "more room")),
                         ("PyTorch's full message (with 'Tried to allocate' and the GPU's figures) or nvidia-smi's "
                          "output at the failure would let diagnose decide",), failing_line=quoted)
    return Diagnosis(source, "pytorch-oom", "out_of_memory",
                     f"this process's own tensors filled the GPU ({allocated or '?'} allocated of "
                     f"{(oom.total if oom else None) or '?'}); the request is the last straw, not necessarily the "
                     "culprit; the traceback does not show which phase", tuple(figures), (
                         step_change(context),
                         Change("shorter sequences (max_length / the maximum sequence length)",
                                "activations and any KV cache grow with the length"),
                         Change("a larger GPU, or split the model over more GPUs", "splits the weights")),
                     () if has_model else ("which model: --model DIR tells weights from activations; the whole "
                                           "traceback tells which phase ran out",), failing_line=quoted)


# transformers' quantizers refuse to load when accelerate's device_map put modules of a quantized model on the CPU or
# disk (quantizers/quantizer_bnb_4bit.py, quantizer_bnb_8bit.py validate_environment: "Some modules are dispatched on
# the CPU or the disk. Make sure you have enough GPU RAM to fit the quantized model. ... `llm_int8_enable_fp32_cpu_
# offload=True`", older releases `load_in_8bit_fp32_cpu_offload=True`)
_QUANTIZED_DISPATCHED = re.compile(r"Some modules are dispatched on the CPU or the disk\.?\s*Make sure you have enough "
                                   r"GPU RAM to fit the quantized model", re.I)


def quantized_model_dispatched(text: str, source: str) -> Diagnosis | None:
    """The weights are already quantized and still exceed the GPU memory device_map was given: quantizing is spent
    and the CPU placement is what failed, so more GPU memory is the lever: the model spread over more GPUs (every
    card visible to device_map="auto", or the platform's GPU count), else a smaller model."""
    found = _QUANTIZED_DISPATCHED.search(text)
    if found is None:
        return None
    _, quoted = quoted_line(text, found.start())
    return Diagnosis(source, "pytorch-oom", "weights_do_not_fit",
                     "the quantized model's weights do not fit the GPU memory device_map was given: accelerate placed "
                     "some modules on the CPU or disk, which a quantized model refuses", (), (
                         Change("spread the model over more GPUs: device_map=\"auto\" with every card visible "
                                "(CUDA_VISIBLE_DEVICES, max_memory per GPU; a serving platform's GPU count, e.g. "
                                "Xinference --n-gpu 4)", "each GPU holds its share of the quantized layers",
                                "tensor_parallel_up"),
                         Change("a smaller model (fewer parameters, or a lower-bit checkpoint)", "smaller weights",
                                "quantize_smaller"),
                         Change("llm_int8_enable_fp32_cpu_offload=True with a custom device_map",
                                "keeps the CPU-placed modules in 32-bit (slow)", "cpu_offload")),
                     ("how many GPUs the machine has and what each holds (nvidia-smi)",), failing_line=quoted)
