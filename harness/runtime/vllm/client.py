"""Talk to a vLLM OpenAI-compatible server with the standard library: streamed completions on token-id prompts
(so the server sees exactly the tokens the transformers backend sees), many in flight, and its /metrics."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable

from harness import progress
from harness.errors import UserError

REQUEST_TIMEOUT_S = 1800.0


class RequestFailed(RuntimeError):
    """A request the server refused or dropped; the message carries the server's own reason."""


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # http://host:port, no trailing slash
    model: str  # the name the server serves the model under


@dataclass(frozen=True)
class CompletionRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool = False  # the saturation check generates every token it asks for


@dataclass(frozen=True)
class Sampling:
    """Greedy decoding as the transformers backend does it: its stop tokens and repetition penalty."""

    stop_token_ids: tuple[int, ...] = ()
    repetition_penalty: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class ServedCompletion:
    text: str
    prompt_tokens: int
    new_tokens: int
    finish_reason: str | None
    ttft_s: float
    e2e_s: float
    chunk_gaps_s: tuple[float, ...]  # time between streamed chunks after the first (inter-token latency)

    @property
    def tpot_s(self) -> float | None:
        return (self.e2e_s - self.ttft_s) / (self.new_tokens - 1) if self.new_tokens > 1 else None


def get_json(url: str, timeout: float = 10.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8"))


class NotVllm(ValueError):
    """A URL that does not answer as a vLLM server does; the message says what it answered instead."""


def vllm_identity(base_url: str, timeout: float = 10.0) -> tuple[str, list[dict]]:
    """(version, models) as a vLLM server states them: GET /version answers {"version": ...} and GET /v1/models
    lists at least one model card of vLLM's own (owned_by "vllm", with its max_model_len). Anything else raises
    NotVllm: a server that is not there, or only speaks the OpenAI shape, is never trusted with a verdict."""
    base = base_url.rstrip("/")
    found = {}
    for path in ("/version", "/v1/models"):
        try:
            found[path] = get_json(base + path, timeout=timeout)
        except urllib.error.HTTPError as exc:
            raise NotVllm(f"GET {path} answered HTTP {exc.code}, as no vLLM server does") from None
        except urllib.error.URLError as exc:
            raise NotVllm(f"no answer ({getattr(exc.reason, 'strerror', None) or exc.reason})") from None
        except (OSError, ValueError) as exc:
            raise NotVllm(f"GET {path} did not answer JSON ({type(exc).__name__})") from None
    version = found["/version"].get("version") if isinstance(found["/version"], dict) else None
    if not isinstance(version, str) or not version:
        raise NotVllm(f"GET /version answered {str(found['/version'])[:80]!r}, not vLLM's {{\"version\": ...}}")
    listing = found["/v1/models"]
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list) or not models or not all(isinstance(m, dict) for m in models):
        raise NotVllm("GET /v1/models lists no model")
    if not all(m.get("owned_by") == "vllm" and isinstance(m.get("max_model_len"), int) and m.get("id")
               for m in models):
        raise NotVllm("GET /v1/models lists models that are not vLLM's own (no owned_by \"vllm\" and "
                      "max_model_len): an OpenAI-compatible server of another kind")
    return version, models


def check_endpoints(endpoints: dict[str, str]) -> None:
    """Each --vllm-endpoint (format -> URL) answers as a vLLM server, before anything else runs: a dead URL or
    another kind of server is one line, not a failure after the model was fetched and quantized."""
    for fmt, url in endpoints.items():
        try:
            vllm_identity(url)
        except NotVllm as exc:
            raise UserError(f"--vllm-endpoint {fmt}={url}: {exc}; start the vLLM server there or fix the URL") \
                from None


def get_text(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8", errors="replace")


def complete(endpoint: Endpoint, request: CompletionRequest, sampling: Sampling) -> ServedCompletion:
    body = {"model": endpoint.model, "prompt": list(request.prompt_ids), "max_tokens": request.max_tokens,
            "temperature": 0.0, "seed": sampling.seed, "stream": True,
            "stream_options": {"include_usage": True}, "skip_special_tokens": True}
    if request.ignore_eos:
        body["ignore_eos"] = True
    elif sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.repetition_penalty is not None:
        body["repetition_penalty"] = sampling.repetition_penalty
    http = urllib.request.Request(endpoint.base_url + "/v1/completions", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"}, method="POST")
    pieces: list[str] = []
    stamps: list[float] = []
    usage: dict = {}
    finish = None
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(http, timeout=REQUEST_TIMEOUT_S) as response:
            for raw in response:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    stamps.append(time.perf_counter())
                    pieces.append(choice.get("text") or "")
                    finish = choice.get("finish_reason") or finish
    except urllib.error.HTTPError as exc:
        raise RequestFailed(f"the server answered {exc.code}: {_error_message(exc)}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise RequestFailed(f"the server dropped the request ({getattr(exc, 'reason', exc)})") from None
    ended = time.perf_counter()
    first = stamps[0] if stamps else ended
    return ServedCompletion(text="".join(pieces).strip(),
                            prompt_tokens=int(usage.get("prompt_tokens", len(request.prompt_ids))),
                            new_tokens=int(usage.get("completion_tokens", 0)), finish_reason=finish,
                            ttft_s=first - started, e2e_s=ended - started,
                            chunk_gaps_s=tuple(b - a for a, b in zip(stamps, stamps[1:])))


def prompt_logprobs(endpoint: Endpoint, prompt_ids: tuple[int, ...] | list[int],
                    top_k: int) -> list[dict[int, tuple[float, int]] | None]:
    """The server's log-probabilities at every prompt position (vLLM's `prompt_logprobs`): entry j holds, for the
    distribution that predicts prompt_ids[j], its top_k tokens and the actual one as {token id: (logprob, rank)}
    (rank 1: the most likely); entry 0 is None. One forward, one token generated (and ignored)."""
    body = {"model": endpoint.model, "prompt": list(prompt_ids), "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": top_k}
    http = urllib.request.Request(endpoint.base_url + "/v1/completions", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(http, timeout=REQUEST_TIMEOUT_S) as response:
            data = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise RequestFailed(f"the server answered {exc.code}: {_error_message(exc)}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise RequestFailed(f"the server dropped the request ({getattr(exc, 'reason', exc)})") from None
    entries = (data.get("choices") or [{}])[0].get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(prompt_ids):
        raise RequestFailed(f"the server gave no prompt_logprobs for {len(prompt_ids)} prompt tokens "
                            f"(got {type(entries).__name__}); it may not be vLLM, or too old for them")
    return [None if entry is None else {int(token): (float(v["logprob"]), int(v.get("rank") or 0))
                                        for token, v in entry.items()} for entry in entries]


def complete_all(endpoint: Endpoint, requests: list[CompletionRequest], sampling: Sampling, *, concurrency: int,
                 label: str, alive: Callable[[], bool] | None = None) -> list[ServedCompletion]:
    """Every request, `concurrency` in flight (the server batches them), in the order given. `alive` is asked
    every second: a server that died fails the batch at once instead of leaving requests to time out."""
    results: list[ServedCompletion | None] = [None] * len(requests)
    progress.step(label, 0, len(requests))
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
    try:
        futures = {pool.submit(complete, endpoint, r, sampling): i for i, r in enumerate(requests)}
        pending, done = set(futures), 0
        while pending:
            finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in finished:
                results[futures[future]] = future.result()
                done += 1
                progress.step(label, done, len(requests))
            if pending and alive is not None and not alive():
                raise RequestFailed(f"the server died with {len(pending)} requests unanswered")
    except BaseException:
        # Ctrl-C or a failed request: do not wait for the rest; stopping the server ends those in flight.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


def metric_total(metrics_text: str, name: str) -> float | None:
    """The sum over labels of a Prometheus counter in /metrics text (None when the server has no such metric)."""
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if line.startswith(name) and (line[len(name):len(name) + 1] in ("{", " ")):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except ValueError:
                continue
    return total if seen else None


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read().decode("utf-8", errors="replace"))
        message = body.get("message") or (body.get("error") or {}).get("message") or body
    except (ValueError, AttributeError, OSError):
        message = exc.reason
    return str(message)[:300]
