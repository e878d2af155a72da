"""The tokens of one step are batch x sequence length; which of the two to lower first is read from what the log
shows. A batch already at one sequence has nothing left to give, so where a sequence length is set long (4k
tokens or more) or left unset (the framework then takes the model's whole context, or does not truncate at all) the
shorter sequence comes first; a large batch is lowered as a batch. Packed training data fills every row to the
packed length whatever the samples' own lengths, so a long packed length comes first unless a batch of several packs
is shown."""

from __future__ import annotations

import re

from harness.diagnose.records import Change

# one sequence a step: the batch has nothing left to give (at 2, halving it frees as much as halving the length and
# changes no sample)
SMALL_BATCH = 1
LONG_SEQUENCE = 4096  # tokens: at this length a sequence's activations (and eager attention's scores) dominate a step

# the names a sequence length goes by: transformers' tokenizer and Trainer (max_length, model_max_length), LLaMA-Factory
# (cutoff_len), trl / llm-compressor (max_seq_length), Megatron / NeMo (seq_length, --seq-length), nanoGPT / lit-gpt
# (block_size), Axolotl (sequence_len), AutoAWQ / AutoRound (seqlen, max_calib_seq_len), a packed row's length (NeMo
# Automodel's packed_sequence_size, a VLM recipe's pack_size)
_NAMES = (r"max_length|model_max_length|cutoff_len|max_seq_length|max_seq_len|seq_len|seqlen|seq_length|"
          r"sequence_len|max_source_length|block_size|max_calib_seq_len|max_sequence_length|packed_sequence_size|"
          r"pack_size")
_SET = re.compile(rf"(?<![\w-])(?:--?)?(?:{_NAMES.replace('_', '[_-]')})[\"'`]?\s*(?:[:=]\s*|\s+)[\"'`]?"
                  r"(\d[\d_,]*)(k\b)?", re.I)
_SAID = re.compile(r"\b(?:sequence|context|seq)[ _-]?(?:length|len)\b(?:\s+(?:of|is|=|:))?\s+(\d[\d_,]*)\s*(k\b)?",
                   re.I)
# ms-swift 3.x: TemplateArguments.max_length defaults to None, which its __post_init__ turns into the model's
# max_model_len (swift/llm/argument/base_args/template_args.py): a `swift sft` / `swift rlhf` command without
# --max_length trains at the model's whole context
_SWIFT_TRAIN = re.compile(r"\bswift\s+(?:sft|rlhf|pt)\b[^\n]*", re.I)
# the length said to be unset in words
_UNSET_IN_WORDS = re.compile(rf"\b(?:{_NAMES})\b[\"'`]?\s*(?:=|:|is|defaults? to)\s*None\b|"
                             r"\bwithout (?:any )?(?:truncation|max[_ ]length|max_seq_length)\b|"
                             r"\b(?:not|never|no) truncat\w*|\buntruncated\b", re.I)
# the batch one GPU runs: transformers' per_device_train_batch_size, Megatron's micro_batch_size, DeepSpeed's
# train_micro_batch_size_per_gpu, OpenRLHF's micro_train_batch_size, NeMo Automodel's and torchtitan's local_batch_size
# (beside global_batch_size), a script's batch_size
_BATCH = re.compile(r"(?<![\w-])(?:--?)?(?:per[_-]device[_-]train[_-]batch[_-]size|micro[_-]batch[_-]size|"
                    r"micro_train_batch_size|train_micro_batch_size_per_gpu|local[_-]batch[_-]size|batch[_-]size|MBS|"
                    r"bs)[\"'`]?"
                    r"\s*(?:[:=]\s*|\s+(?:of\s+)?)(\d+)\b", re.I)
# ms-swift 3.x's TrainArguments default one sequence per GPU (per_device_train_batch_size=1)
_SWIFT_BATCH = 1
# packing on: a packed length set (NeMo Automodel's packed_sequence_size, pack_size), or the switch said on (Axolotl's
# sample_packing, trl's / LLaMA-Factory's packing, LLaMA-Factory's neat_packing); a switch said off is no packing
_PACKED_LENGTH = re.compile(r"(?<![\w-])(?:--?)?(?:packed[_-]sequence[_-]size|pack[_-]size)[\"'`]?\s*(?:[:=]\s*|\s+)"
                            r"[\"'`]?[1-9]", re.I)
_PACKING_ON = re.compile(r"(?<![\w-])(?:--?)?(?:sample[_-]|neat[_-])?packing[\"'`]?\s*(?:[:=]\s*|\s+)[\"'`]?"
                         r"(?:true|1)\b", re.I)


def _count(digits: str, thousands: str | None) -> int:
    value = int(digits.replace(",", "").replace("_", ""))
    return value * 1024 if thousands else value


def sequence_set(context: str) -> int | None:
    """The longest sequence length the log or flags set (tokens)."""
    found = [_count(m.group(1), m.group(2)) for m in _SET.finditer(context)]
    found += [_count(m.group(1), m.group(2)) for m in _SAID.finditer(context)]
    return max(found) if found else None


def sequence_unset(context: str) -> bool:
    """A length left unset where the framework then does not bound it: said in words, or a ms-swift training command
    line shown without --max_length."""
    if _UNSET_IN_WORDS.search(context):
        return True
    return any("max_length" not in m.group(0).replace("-", "_") for m in _SWIFT_TRAIN.finditer(context)) \
        and sequence_set(context) is None


def batch_shown(context: str, settings: dict) -> int | None:
    """The batch one GPU runs a step, where the log, the flags or the framework's default shows it."""
    shown = [int(m.group(1)) for m in _BATCH.finditer(context)]
    setting = settings.get("batch_size")
    if setting is not None and isinstance(setting.value, (int, float)) and not isinstance(setting.value, bool):
        shown.append(int(setting.value))
    if shown:
        return min(shown)
    return _SWIFT_BATCH if _SWIFT_TRAIN.search(context) else None


def packed(context: str) -> bool:
    """Packed training data: a packed length set, or packing switched on."""
    return bool(_PACKED_LENGTH.search(context) or _PACKING_ON.search(context))


def shorter_sequence_first(context: str, settings: dict) -> Change | None:
    """The shorter sequence, where the batch is already small and the length long or unset, or where packed rows of a
    long length are shown with no batch of several; else None (the batch, where large, is the tokens-per-step
    lever)."""
    batch, packs = batch_shown(context, settings), packed(context)
    if (batch is None and not packs) or (batch is not None and batch > SMALL_BATCH):
        return None
    length = sequence_set(context)
    if packs and length is not None and length >= LONG_SEQUENCE:
        return Change(f"a shorter packed length: packed_sequence_size / pack_size / max_length {length // 2:,} (from "
                      f"{length:,})", f"packing fills every row to {length:,} tokens whatever the samples' own "
                      "lengths, so the packed length is what a step's activations (and eager attention's scores, "
                      "its square) grow with; half the length halves the tokens of a row", "max_model_len_down")
    if batch is None:
        return None
    if length is not None and length >= LONG_SEQUENCE:
        return Change(f"shorter sequences: max_length / max_seq_length / cutoff_len {length // 2:,} (from "
                      f"{length:,})", f"a step is {batch} x {length:,} tokens: at one sequence a step the length "
                      "is what is left to lower (activations grow with it, eager attention's scores with its "
                      "square)", "max_model_len_down")
    if length is None and sequence_unset(context):
        return Change("set a maximum sequence length (--max_length / max_seq_length / cutoff_len, e.g. 2048)",
                      "no length is set, so each sample runs at its own length up to the model's whole context; at "
                      "one sequence a step the length is what is left to lower", "max_model_len_down")
    return None


# one request of this size in a step whose batch is not shown: a tensor that large in a transformer's step is the
# length's (eager attention's scores, batch x heads x length x length, or the logits, batch x length x vocabulary)
ONE_LARGE_REQUEST = 2 * 1024 ** 3
HELD_BY_TENSORS = 0.85  # the step's own tensors hold this share of the GPU (as harness.diagnose.pytorch reads it)


def shorter_for_one_large_request(context: str, settings: dict, tried_bytes: int | None,
                                   allocated_bytes: int | None, total_bytes: int | None) -> Change | None:
    """A step whose own tensors already fill the card (HELD_BY_TENSORS of it) and that failed asking for one more
    tensor of 2 GiB or more, where neither a batch nor a short length is shown: the tensor grows with the length (its
    square for eager attention's scores), and data prepared without a maximum length lets one long sample ask for it
    whatever the batch; a shorter maximum length comes before a smaller batch. None where a batch is shown (the batch
    rules read it), a length under LONG_SEQUENCE is set already, or the card was not filled (a request as large as the
    room left on a half-empty card says nothing of which dimension)."""
    if tried_bytes is None or tried_bytes < ONE_LARGE_REQUEST or batch_shown(context, settings) is not None:
        return None
    if not allocated_bytes or not total_bytes or allocated_bytes < HELD_BY_TENSORS * total_bytes:
        return None
    length = sequence_set(context)
    if length is not None and length < LONG_SEQUENCE:
        return None
    gib = tried_bytes / 1024 ** 3
    if length is not None:
        return Change(f"shorter sequences: max_length / max_seq_length / cutoff_len {length // 2:,} (from "
                      f"{length:,})", f"the step failed asking for one {gib:.2f} GiB tensor: a tensor that large is "
                      "the length's (attention scores grow with its square, logits with length x vocabulary)",
                      "max_model_len_down")
    return Change("set a maximum sequence length (--max_length / max_seq_length / cutoff_len, e.g. 2048)",
                  f"the step failed asking for one {gib:.2f} GiB tensor and no batch or length is shown: a tensor "
                  "that large is the length's (attention scores grow with its square, logits with length x "
                  "vocabulary), and one sample longer than the rest asks for it whatever the batch",
                  "max_model_len_down")


# a serving engine's start-up profile run (vLLM's and its forks' profile_run / determine_num_available_blocks,
# Aphrodite's "Profiling peak memory usage"): with chunked prefill off it prefills one sequence of the whole context,
# so the context length, not a batch, is what the profile's activations grow with
_PROFILE_RUN = re.compile(r"\bProfiling peak memory\b|\bprofile_run\b|\bdetermine_num_available_blocks\b|"
                          r"\bMemory profiling\b", re.I)
# a context this long is a model's own default (Llama 3.1's 131,072, Qwen2.5's 32,768), not a length the task chose
PROFILED_CONTEXT = 32768


def shorter_for_a_profile_run(context: str) -> Change | None:
    """A start-up that ran out of memory in the engine's peak-memory profile run at a context of PROFILED_CONTEXT or
    more: the profile prefills that whole context in one step, so a shorter --max-model-len comes before a smaller
    batch. None where no profile run or no such length is shown."""
    length = sequence_set(context)
    if length is None or length < PROFILED_CONTEXT or not _PROFILE_RUN.search(context):
        return None
    return Change(f"--max-model-len {length // 4:,} (from {length:,})",
                  f"the start-up's profile run prefills the whole {length:,}-token context in one step (the "
                  "model's own context when no length is given); its activations grow with the length, not with "
                  "a batch", "max_model_len_down")
