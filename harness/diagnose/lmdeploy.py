"""LMDeploy's TurboMind engine read in its own terms. Its KV cache takes --cache-max-entry-count (0.8 by default since
v0.2.1) of the GPU memory left free after the weights; the forward's buffers, the sampling and anything else the
server allocates later share what is left. Its flags: --cache-max-entry-count, --session-len, --max-batch-size.

The strings are TurboMind's own (src/turbomind, v0.5.0): LlamaBatch.cc's `[RejectInvalidRequests] Skipping invalid
%s request for id %ld, code = %d` (Request.h: 1 kInvalid, 2 kConflict, 3 kBusy, 4 kInactive, 5 kFail, 6 kTooLong
"history + prompt > session_len"), LlamaV2.cc's `[forward] Request failed for %ld, code %d`, LlamaBatch.cc's `No
enough blocks for `session_len` (%d), `session_len` truncated to %d.`, BlockManager.cc's `out of memory` and
cuda_utils.h's `[TM][ERROR] CUDA runtime error: out of memory`."""

from __future__ import annotations

import re

from harness.diagnose.failures import quoted_line
from harness.diagnose.records import Change, Diagnosis, Figure

_MARKERS = re.compile(r"\[TM\]\[|\bturbomind\b|TurbomindEngineConfig|--cache-max-entry-count|cache_max_entry_count",
                      re.I)
_REJECTED = re.compile(r"Skipping invalid (?:infer|stop) request for id \d+, code = (\d+)|"
                       r"Request failed for \d+, code (\d+)")
_OOM = re.compile(r"CUDA runtime error: out of memory|\bout of memory\b|OutOfMemoryError", re.I)
_BLOCKS_SHORT = re.compile(r"No enough blocks for `session_len` \((\d+)\), `session_len` truncated to (\d+)")
_SHARE = re.compile(r"(?:--cache-max-entry-count|cache_max_entry_count)[\"']?\s*(?:[:=]\s*|\s+)(\d*\.\d+|\d+)", re.I)
_SESSION = re.compile(r"(?:--session-len|session_len)[\"']?\s*(?:[:=]\s*|\s+)(\d+)", re.I)
_BATCH = re.compile(r"(?:--max-batch-size|max_batch_size)[\"']?\s*(?:[:=]\s*|\s+)(\d+)", re.I)
DEFAULT_SHARE = 0.8  # lmdeploy/cli/utils.py cache_max_entry_count: "The percentage of free gpu memory occupied by
# the k/v cache, excluding weights"
MOST = 0.5  # a KV share at or above this takes most of the memory the weights leave
NEARLY_ALL = 0.9  # at or above this the forward's buffers have a tenth of the free memory or less
_CODES = {1: "invalid", 2: "conflict (the session id is in use)", 3: "busy", 4: "inactive session", 5: "failed",
          6: "too long (history + prompt longer than session_len)"}


def _value(pattern: re.Pattern, context: str) -> float | None:
    found = [float(m.group(1)) for m in pattern.finditer(context)]
    return found[-1] if found else None


def diagnose_lmdeploy(text: str, source: str, flags_text: str = "") -> Diagnosis | None:
    context = f"{text}\n{flags_text}"
    if not re.search(r"\[TM\]\[|\bturbomind\b", context, re.I) or not _MARKERS.search(context):
        return None
    rejected, oom, short = _REJECTED.search(text), _OOM.search(text), _BLOCKS_SHORT.search(text)
    if not (rejected or oom):
        return None
    code = int(next(g for g in rejected.groups() if g)) if rejected else None
    found = oom or rejected
    line, quoted = quoted_line(text, found.start())
    share = _value(_SHARE, context)
    set_share = share is not None
    share = share if set_share else DEFAULT_SHARE
    session, batch = _value(_SESSION, context), _value(_BATCH, context)
    figures = [Figure("KV cache share of the free memory", f"{share:g}",
                      "given on the command line" if set_share else "lmdeploy's default")]
    if code is not None:
        figures.append(Figure("request rejected", f"code {code}: {_CODES.get(code, 'unknown')}", f"log line {line}"))
    lower_to = round(max(min(share - 0.2, 0.7), 0.3), 2) if share >= NEARLY_ALL else round(max(share - 0.3, 0.2), 2)
    lower_share = Change(f"--cache-max-entry-count {lower_to:g}",
                         f"the KV cache takes {share:g} of the memory the weights leave free; {lower_to:g} leaves "
                         f"{1 - lower_to:.0%} of it for the forward's buffers", "gpu_memory_utilization_down")
    fewer = Change(f"--max-batch-size {int(batch) // 2}" if batch and batch >= 2 else "a lower --max-batch-size",
                   "fewer sequences in one forward: smaller buffers", "max_batch_size_down")
    shorter = Change(f"--session-len {int(session) // 2}" if session else "a shorter --session-len",
                     "each session's KV blocks and the prefill buffer grow with it", "max_model_len_down")
    if oom is not None and share >= MOST:
        return Diagnosis(source, "lmdeploy", "activation_peak",
                         f"TurboMind ran out of memory with its KV cache at {share:g} of the free memory: what it "
                         "allocates beside the cache (the forward's buffers) did not fit", tuple(figures),
                         (lower_share, fewer, shorter), failing_line=quoted)
    if oom is not None:
        return Diagnosis(source, "lmdeploy", "activation_peak",
                         "TurboMind ran out of memory beside a KV cache share already low", tuple(figures),
                         (fewer, shorter, lower_share), failing_line=quoted)
    if share >= NEARLY_ALL:
        return Diagnosis(source, "lmdeploy", "oom_under_load",
                         f"TurboMind failed a request (code {code}) with its KV cache at {share:g} of the free memory: "
                         f"the forward has {1 - share:.0%} of it left, so a failure while serving is first suspected "
                         "to be memory, whatever code the request came back with", tuple(figures),
                         (lower_share, fewer, shorter), failing_line=quoted)
    if short is not None:
        return Diagnosis(source, "lmdeploy", "kv_cache_too_small",
                         f"TurboMind's KV blocks hold {short.group(2)} tokens, below --session-len {short.group(1)}: "
                         "it truncated the session length and rejects longer requests", tuple(figures), (
                             Change(f"--session-len {short.group(2)}", "what the KV blocks hold", "max_model_len_down"),
                             Change(f"--cache-max-entry-count {min(share + 0.1, 0.9):g}", "more blocks for the KV "
                                    "cache, if nothing else needs the memory", "gpu_memory_utilization_up")),
                         failing_line=quoted)
    return None
