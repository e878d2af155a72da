"""Preference fine-tunes with a reference model (DPO, KTO, PPO): at one pair per GPU the weights are what is left.

DPO and KTO score every pair under the policy and under a frozen reference; PPO keeps a reference beside the policy
too. Under LoRA the reference is the policy's own base with the adapter switched off (TRL's DPOTrainer with a
peft_config and no ref_model; LLaMA-Factory's dpo/kto stages with finetuning_type lora), so the base weights sit on
every GPU once and, with the batch at one pair, quantizing them (QLoRA) is the lever left. A full fine-tune holds a
second full copy as reference: taking it off the GPU (its log-probs computed once beforehand, TRL's
precompute_ref_log_probs) comes first there."""

from __future__ import annotations

import re

from harness.diagnose.records import Change, Diagnosis

# a preference stage or trainer that keeps a reference model (ORPO and SimPO keep none: not these)
_WITH_REFERENCE = re.compile(r"--stage[\s=]+(?:dpo|kto|ppo)\b|\b(?:DPO|KTO|PPO)(?:Trainer|Config)\b|"
                             r"\b(?:dpo|kto)\s+(?:train|training|stage)\b|\btrain(?:ing)?\s+(?:dpo|kto)\b", re.I)
_ADAPTER = re.compile(r"\b(?:q?lora|peft|LoraConfig|get_peft_model|lora_r|lora_rank|lora_alpha)\b", re.I)
_QUANTIZED = re.compile(r"quantization_bit|load_in_[48]bit|\bqlora\b|bnb_4bit|bitsandbytes|\bnf4\b", re.I)
_BATCH_AT_ONE = re.compile(r"(?:per_device_train_batch_size|micro_batch_size|train_batch_size)[\"']?(?:\s*[:=]\s*|\s+)"
                           r"1\b", re.I)


def _at_one_pair(context: str, settings: dict) -> bool:
    batch = settings.get("batch_size")
    if batch is not None and isinstance(batch.value, (int, float)) and not isinstance(batch.value, bool):
        return batch.value <= 1
    return bool(_BATCH_AT_ONE.search(context))


def reference_weights_first(context: str, settings: dict, figures: list, quoted: str,
                            source: str) -> Diagnosis | None:
    """A DPO/KTO/PPO training step at one pair per GPU: the weights of policy and reference are what is left."""
    if not (_WITH_REFERENCE.search(context) and _at_one_pair(context, settings)):
        return None
    shorter = Change("shorter sequences (cutoff_len / max_length / max_prompt_length)",
                     "each pair runs chosen and rejected through policy and reference")
    if _ADAPTER.search(context):
        if _QUANTIZED.search(context):
            return None  # quantized already: the step's own levers (length, checkpointing) are left to the reader
        return Diagnosis(source, "pytorch-oom", "training_step",
                         "a LoRA preference step (DPO/KTO/PPO) ran out at one pair per GPU: the reference is the base "
                         "model with the adapter switched off, so the base weights at 16 bits on every GPU are what is "
                         "left", tuple(figures), (
                             Change("load the base quantized (QLoRA: LLaMA-Factory --quantization_bit 4, "
                                    "BitsAndBytesConfig(load_in_4bit=True))",
                                    "a quarter of the 16-bit base weights; policy and reference share them",
                                    "quantize_smaller"),
                             shorter,
                             Change("DeepSpeed ZeRO-3 (shards the base weights over the GPUs)",
                                    "each GPU holds 1/N of the weights", "other")),
                         failing_line=quoted)
    return Diagnosis(source, "pytorch-oom", "training_step",
                     "a full preference step (DPO/KTO/PPO) ran out at one pair per GPU: a second full copy of the "
                     "model is held as the reference beside the policy and its optimizer state", tuple(figures), (
                         Change("take the reference off the GPU: its log-probs computed once before training (TRL "
                                "precompute_ref_log_probs=True), or a LoRA policy whose reference is the base with the "
                                "adapter off", "no second copy of the weights during the step", "other"),
                         Change("load the reference quantized (8-bit or 4-bit)", "a half or a quarter of its copy",
                                "quantize_smaller"),
                         shorter),
                     failing_line=quoted)
