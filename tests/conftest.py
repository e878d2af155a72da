import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.runtime.vllm.locate import PROJECT_ENV

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NOISE = ("Failed to load", "MatMul8bitLt", "Traceback", "GPT-QModel", "UserWarning")


def quantgate(*args: str, cache: Path, timeout: float = 1800, check_codes=(0, 1),
              env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUANTGATE_CACHE": str(cache), "PYTHONPATH": str(ROOT), **(env or {})}
    result = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    if check_codes is not None and result.returncode not in check_codes:
        raise AssertionError(f"quantgate {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(autouse=True)
def environment_restored():
    """Each test gets os.environ and tempfile's directory back as they were: a test that calls `cli.main` in this
    process confines it (harness.sandbox.confine_process: offline variables, cache locations, TMPDIR in that test's
    cache), which otherwise stays for every later test on the worker (Chromium then failed to start: its singleton
    socket path under that TMPDIR was too long)."""
    saved, saved_tempdir = dict(os.environ), tempfile.tempdir
    yield
    os.environ.clear()
    os.environ.update(saved)
    tempfile.tempdir = saved_tempdir


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def vllm_install():
    if not (PROJECT_ENV / "bin" / "python").exists():
        if os.environ.get("QUANTGATE_REQUIRE_VLLM") == "1":
            pytest.fail(f"{PROJECT_ENV} is missing but QUANTGATE_REQUIRE_VLLM=1 (build it: nox -s vllm_env)")
        pytest.skip(f"{PROJECT_ENV} is not built (nox -s vllm_env)")
    return PROJECT_ENV


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """One cache for the whole session: the demo model is fetched and converted once, for real."""
    return tmp_path_factory.mktemp("quantgate-cache")


# `nox -s demo`'s own recipe (calibration count, group size, calibration source: all defaults) on fewer items.
# Only these size flags may be added: a test that quantizes another way once hid a crash of two formats.
E2E_ARGS = ("--model", "demo", "--max-items", "4", "--batch-size", "4", "--max-new-tokens", "16",
            "--latency-requests", "4")  # the served runs take the same, so they reuse the transformers measurements
SIZE_FLAGS = ("--max-items", "--batch-size", "--max-new-tokens", "--latency-requests")
NO_BF16 = {"QUANTGATE_FORCE_NO_BF16": "1"}


def _demo_recipe_command(out: Path) -> list[str]:
    return [sys.executable, "-m", "harness", "run", *E2E_ARGS, "--formats", "baseline,int8,gptq,awq", "--out", str(out)]


class _BackgroundRun:
    """`quantgate run` in its own process, its output in files (two runs at once cannot fill each other's pipes)."""

    def __init__(self, out: Path, cache: Path, env: dict | None = None):
        self.out, self.command = out, _demo_recipe_command(out)
        self.stdout, self.stderr = out.parent / f"{out.name}.stdout", out.parent / f"{out.name}.stderr"
        with self.stdout.open("w") as stdout, self.stderr.open("w") as stderr:
            self.process = subprocess.Popen(self.command, cwd=ROOT, stdout=stdout, stderr=stderr, text=True, env={
                **os.environ, "QUANTGATE_CACHE": str(cache), "PYTHONPATH": str(ROOT), **(env or {})})

    def result(self, timeout: float = 3000):
        code = self.process.wait(timeout=timeout)
        done = subprocess.CompletedProcess(self.command, code, self.stdout.read_text(), self.stderr.read_text())
        if code not in (0, 1):
            raise AssertionError(f"quantgate run exited {code}\n{done.stdout}\n{done.stderr}")
        return self.out, json.loads((self.out / "report.json").read_text()), done


@pytest.fixture(scope="session")
def demo_run(demo_cache, demo_checkpoint, tmp_path_factory):
    """`nox -s demo`'s recipe on a few items on this CPU as it is: the real pipeline on the demo model, all four
    formats, the demo's recipe, a few items per bundled set."""
    return _BackgroundRun(tmp_path_factory.mktemp("demo-run"), demo_cache).result()


@pytest.fixture(scope="session")
def demo_run_no_bf16(demo_cache, demo_checkpoint, tmp_path_factory):
    """The same with the no-bf16 path forced (float32 calibration and compute), whatever this CPU has. On a CPU
    without bf16 units it is the native run, which the same worker then serves from its cache (tests/conftest.py
    puts both groups on one worker there)."""
    return _BackgroundRun(tmp_path_factory.mktemp("demo-run-no-bf16"), demo_cache, NO_BF16).result()


@pytest.fixture(scope="session")
def demo_checkpoint(demo_cache) -> Path:
    """The converted demo checkpoint directory (bf16 safetensors) in the session's cache."""
    quantgate("cache", "ls", cache=demo_cache)  # a cheap command first: the cache directory exists
    code = ("from harness.source import resolve_source; print(resolve_source('demo').path)")
    env = dict(os.environ, QUANTGATE_CACHE=str(demo_cache), PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900, check=True)
    return Path(result.stdout.strip().splitlines()[-1])


def tiny_llama(demo_checkpoint: Path, target: Path, noise: float = 0.0) -> Path:
    """A small random Llama with the demo model's tokenizer, saved to `target`; `noise` adds Gaussian noise of that
    size (relative to each weight's spread) on top of the same seeded weights."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.loads((demo_checkpoint / "config.json").read_text())["vocab_size"]
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)  # sharper distributions than the initializer's near-uniform ones
            parameter.add_(noise * parameter.std() * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(target)
    for file in demo_checkpoint.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, target / file.name)
    return target


def tiny_bf16_llama(demo_checkpoint: Path, target: Path, **sizes) -> Path:
    """A small random bf16 Llama (seeded; untied lm_head, as quantizers leave it 16-bit) with the demo model's
    tokenizer, saved to `target`; `sizes` override its LlamaConfig fields."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.loads((demo_checkpoint / "config.json").read_text())["vocab_size"]
    fields = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, tie_word_embeddings=False, max_position_embeddings=512, dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{**fields, **sizes})).to(torch.bfloat16).save_pretrained(target)
    for file in demo_checkpoint.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, target / file.name)
    return target


# `nox -s tests` runs the suite on two xdist workers (-n 2 --dist loadgroup), each with its own session fixtures and
# cache. A test that needs one of the demo recipe's runs (demo_run, demo_run_no_bf16: minutes each) must share a worker
# with every other test that needs the same run, in file order (the served and candidate runs read the artifacts the
# native run left in that worker's cache), and those blocks start first, being the longest. On a CPU with bf16 units
# the two runs share nothing costly, so each has its block and its worker; without them they are the same run, so one
# block holds both and the second run comes from the cache. The rest spreads over both workers. xdist's own
# xdist_group mark does not group under pytest 9 (it rewrites Item._nodeid, which pytest 9 no longer reads), so the
# scheduler below groups by file, and collection checks that every test needing a run is in its group's files.
DEMO_RUN_FILES = {"demo-run": ("test_pipeline_e2e.py", "test_pipeline_external.py", "test_vllm_served_run.py"),
                  "demo-run-no-bf16": ("test_pipeline_e2e_no_bf16.py",)}
DEMO_RUN_FIXTURES = {"demo-run": "demo_run", "demo-run-no-bf16": "demo_run_no_bf16"}


@functools.cache
def _bf16_cpu() -> bool:  # asked once per process, not per test id (it reads /proc/cpuinfo)
    from harness.runtime.device import cpu_has_bf16_matmul

    return cpu_has_bf16_matmul()


def demo_run_scope(nodeid: str) -> str | None:
    name = Path(nodeid.split("::", 1)[0]).name
    for group, files in DEMO_RUN_FILES.items():
        if name in files:
            return group if _bf16_cpu() else "demo-run"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # fixturenames is the static closure: a test that asked for a run through request.getfixturevalue would not be
    # seen here, and would run the demo recipe again on the other worker.
    for group, fixture in DEMO_RUN_FIXTURES.items():
        strays = [item.nodeid for item in items
                  if fixture in item.fixturenames and Path(item.nodeid.split("::")[0]).name not in DEMO_RUN_FILES[group]]
        if strays:
            raise pytest.UsageError(f"{strays[0]} needs {fixture}: move it into one of {DEMO_RUN_FILES[group]} "
                                    "(tests/conftest.py), or it runs the demo recipe again on another xdist worker")
    grouped = [item for item in items if demo_run_scope(item.nodeid)]
    chosen = set(map(id, grouped))
    items[:] = grouped + [item for item in items if id(item) not in chosen]


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class DemoRunScheduling(LoadScopeScheduling):
        """The tests of each demo-run group as one work unit; every other test a unit of its own."""

        def _split_scope(self, nodeid: str) -> str:
            return demo_run_scope(nodeid) or nodeid

    return DemoRunScheduling(config, log)


def ours(process) -> bool:
    """Whether a process was started by this test worker (xdist runs two workers at once; serially, all are)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        return True
    try:
        return process.environ().get("PYTEST_XDIST_WORKER") == worker
    except Exception:  # gone, or not ours to read
        return False
