"""Fidelity: how closely a format reproduces the baseline, token by token, on the run's own items.

The baseline's greedy output for each item is the reference continuation. The baseline, teacher-forced on
prompt + continuation, keeps at every output position its TOP_K most likely tokens with their log-probabilities
(the reference, one file per evalset in the cache: harness.fidelity.teacher.write_reference). Every other format
is teacher-forced on the same ids and compared position by position (teacher.compare_to_reference):

- KL(baseline || format), nats per token, over the reference's top-k tokens plus one bucket for the rest of the
  vocabulary: the KL of the coarse-grained distributions, a lower bound of the full-vocabulary KL (coarse-graining
  never increases a divergence); with k = 32 the bucket holds little mass for a peaked model;
- top-1 agreement: the format's most likely token is the baseline's;
- the log-probability the format gives the baseline's own token;
- the first flip: the first position where the format's greedy choice departs from the baseline's.

Per evalset these become token-weighted means with intervals that resample items (clusters of items that share a
context, as for the task metrics): harness.fidelity.summary. The verdict's fidelity rule is in harness.decide.
"""

from harness.fidelity.summary import FidelityItem, FidelitySummary, summarize_fidelity

TOP_K = 32
VERSION = 2  # of the reference and comparison files: a change reruns the fidelity stage (2: batched forwards)

__all__ = ["TOP_K", "VERSION", "FidelityItem", "FidelitySummary", "summarize_fidelity"]
