"""`quantgate diagnose`: read an out-of-memory message, a vLLM start-up log or an nvidia-smi trace and say which
memory ran out, with the figures quoted from the log and the arithmetic, and which settings to change.

    readers (one per log kind) -> LogFacts -> advise (with the memory model, when --model names the model) -> Diagnosis

harness.diagnose.readers: PyTorch CUDA OOM (both message shapes), vLLM (V0 and V1 lines, 0.6 to 0.34), nvidia-smi
(--query-gpu CSV); harness.diagnose.advise: the kind and the ranked changes; harness.diagnose.records: the records.
"""

from harness.diagnose.advise import diagnose_text
from harness.diagnose.records import Change, Diagnosis, Figure

__all__ = ["Change", "Diagnosis", "Figure", "diagnose_text"]
