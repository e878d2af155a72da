"""The served measurements: latency at each concurrency, and whether the planned flags hold under load."""

from __future__ import annotations

import time

from harness.measure.latency import percentile, summarize
from harness.runtime.vllm.client import (CompletionRequest, Endpoint, RequestFailed, Sampling, ServedCompletion,
                                         complete_all, get_text, metric_total)

PREEMPTIONS = "vllm:num_preemptions_total"
SATURATION_NEW_TOKENS = 8


def latency_at(endpoint: Endpoint, requests: list[CompletionRequest], sampling: Sampling, concurrency: int,
               label: str, alive=None) -> dict:
    """Streamed requests, `concurrency` in flight; at least P95_MIN_REQUESTS and two rounds of the concurrency."""
    wanted = max(len(requests), 2 * concurrency if concurrency > 1 else len(requests))
    batch = [requests[i % len(requests)] for i in range(wanted)]
    started = time.perf_counter()
    done = complete_all(endpoint, batch, sampling, concurrency=concurrency, label=label, alive=alive)
    wall = time.perf_counter() - started
    return summarize_served(done, concurrency, wall)


def summarize_served(done: list[ServedCompletion], concurrency: int, wall_s: float) -> dict:
    tokens = sum(c.new_tokens for c in done)
    return {"concurrency": concurrency, "requests": len(done),
            "ttft_ms": _summary([c.ttft_s * 1000 for c in done]),
            "itl_ms": _summary([gap * 1000 for c in done for gap in c.chunk_gaps_s]),
            "tpot_ms": _summary([c.tpot_s * 1000 for c in done if c.tpot_s is not None]),
            "e2e_ms": _summary([c.e2e_s * 1000 for c in done]),
            "output_tokens_per_s": round(tokens / wall_s, 2) if wall_s else None, "wall_s": round(wall_s, 2)}


def _summary(values_ms: list[float]) -> dict:
    block = summarize(values_ms)
    block["p99"] = round(percentile(sorted(values_ms), 99), 3) if values_ms else None
    return block


def saturation(endpoint: Endpoint, filler_ids: list[int], sampling: Sampling, *, concurrency: int,
               max_model_len: int, alive, preemptions_metric: str | None = PREEMPTIONS, engine: str = "vLLM") -> dict:
    """max_num_seqs requests at once, each prompt filling max_model_len: the server must answer all of them,
    stay up and preempt nothing (the engine's preemption counter from /metrics, before and after: vLLM's
    vllm:num_preemptions_total)."""
    prompt_len = max(1, max_model_len - SATURATION_NEW_TOKENS)
    requests = [CompletionRequest(prompt, SATURATION_NEW_TOKENS, ignore_eos=True)
                for prompt in distinct_fillers(filler_ids, prompt_len, concurrency)]
    before = _preemptions(endpoint, preemptions_metric)
    failed, reasons = 0, []
    try:
        complete_all(endpoint, requests, sampling, concurrency=concurrency, label="saturation check", alive=alive)
    except RequestFailed as exc:
        failed, reasons = 1, [str(exc)]
    up = alive()
    after = _preemptions(endpoint, preemptions_metric) if up else None
    preempted = None if before is None or after is None else after - before
    holds = up and not failed and preempted == 0
    if holds:
        reason = (f"{concurrency} concurrent requests of {prompt_len} + {SATURATION_NEW_TOKENS} tokens: all "
                  "answered, no preemption")
    elif not up:
        reason = f"the server died under {concurrency} concurrent requests of {prompt_len} tokens"
    elif failed:
        reason = f"a request failed under {concurrency} concurrent requests of {prompt_len} tokens: {reasons[0]}"
    elif preempted is None:
        reason = (f"{concurrency} concurrent requests of {prompt_len} tokens were answered, but the server's /metrics "
                  f"has no {preemptions_metric or 'preemption counter'}, so whether it preempted is unknown (serve "
                  "with metrics on)")
    else:
        reason = (f"{engine} preempted {preempted:.0f} time(s) under {concurrency} concurrent requests of {prompt_len} "
                  "tokens: the KV cache does not hold max-num-seqs sequences of max-model-len")
    return {"holds": bool(holds), "concurrency": concurrency, "prompt_tokens": prompt_len,
            "new_tokens": SATURATION_NEW_TOKENS, "preemptions": preempted, "failed_requests": failed,
            "server_alive": up, "reason": reason}


def distinct_fillers(filler_ids: list[int], length: int, count: int) -> list[tuple[int, ...]]:
    """`count` different prompts of `length` tokens: the filler repeated, after a few tokens that spell the
    request's number in the filler's own tokens (base = its distinct ids). vLLM caches shared prefixes by default;
    identical prompts would share their KV blocks instead of each holding its own, which is what the check is
    about."""
    digits = sorted(set(filler_ids)) or [1]
    width = 1
    while len(digits) > 1 and len(digits) ** width < count:  # one distinct id cannot spell a number
        width += 1
    body = list(filler_ids) or [1]
    body = body * (length // len(body) + 1)
    prompts = []
    for number in range(count):
        head = []
        for _ in range(width):
            number, digit = divmod(number, len(digits))
            head.append(digits[digit])
        prompts.append(tuple((head + body)[:length]))
    return prompts


def _preemptions(endpoint: Endpoint, metric: str | None) -> float | None:
    if metric is None:
        return None
    try:
        return metric_total(get_text(endpoint.base_url + "/metrics"), metric)
    except OSError:
        return None
