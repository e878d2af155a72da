"""Reader rules by kind of failure, each on a log written for the rule (not a corpus log): image models in their own
terms (attention kernels, resolution, --no-half), flex attention run eagerly, an evaluation that keeps autograd's
graphs, a small network's move to an occupied GPU, llama.cpp / ollama's own reader, a vLLM vision model on a release
without --limit-mm-per-prompt, and a table of the person's own runs; with the tenth set: the tokens of a step chosen
from what the log shows (a long or unset sequence at one sequence a step), transformers' masking_utils, quantization
calibration, LMDeploy's TurboMind, a load moving every weight onto the GPU, and what the log says held or fixed it."""

from __future__ import annotations

from harness.diagnose.advise import Context, diagnose_text
from harness.diagnose.llamacpp import diagnose_llama_cpp
from harness.diagnose.measured import measured_down

_OLD_LINE = ("RuntimeError: CUDA out of memory. Tried to allocate {tried} (GPU 0; {total} GiB total capacity; "
             "{allocated} GiB already allocated; 20.00 MiB free; {reserved} GiB reserved in total by PyTorch)\n")


def _levers(d) -> list[str]:
    return [c.lever for c in d.changes]


def test_a_web_ui_with_its_chunked_cross_attention_gets_a_memory_efficient_kernel_first():
    log = ("set COMMANDLINE_ARGS=--medvram --opt-split-attention\n"
           + _OLD_LINE.format(tried="20.00 MiB", total="6.00", allocated="5.10", reserved="5.20"))
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "attention_kernel" and "--xformers" in d.changes[0].setting
    assert "image_resolution_down" in _levers(d) and "tokens per step" not in d.changes[0].setting
    on = diagnose_text(log.replace("--opt-split-attention", "--opt-split-attention --xformers"), "x")
    assert "attention_kernel" not in _levers(on)  # in place already: not offered again


def test_an_image_at_a_large_resolution_said_in_words_puts_the_attention_kernel_first():
    said = "Generating a picture at {side}x{side} fills the card.\nThen: OutOfMemoryError: CUDA out of memory.\n"
    assert diagnose_text(said.format(side=1024), "x").changes[0].lever == "attention_kernel"
    small = diagnose_text(said.format(side=512), "x")  # 64 x 64 latent pixels: attention is not what grows
    assert small.changes[0].lever != "attention_kernel"


def test_an_oom_inside_an_attention_computation_asks_for_a_kernel_unless_one_is_on():
    trace = ('Traceback (most recent call last):\n  File "/app/model/attention.py", line 88, in forward\n'
             "    attn = torch.baddbmm(bias, q, k.transpose(-1, -2)).softmax(-1)\n"
             + _OLD_LINE.format(tried="4.00 GiB", total="23.65", allocated="18.00", reserved="18.20"))
    d = diagnose_text(trace, "x")
    assert d.kind == "activation_peak" and d.changes[0].lever == "attention_kernel"
    sdpa = diagnose_text("attn_implementation='sdpa'\n" + trace, "x")
    assert "attention_kernel" not in _levers(sdpa)


def test_a_diffusion_ui_run_in_fp32_drops_no_half_first_and_speaks_of_images():
    log = ("COMMANDLINE_ARGS=--no-half --medvram\nError completing request\n"
           + _OLD_LINE.format(tried="648.00 MiB", total="6.00", allocated="4.66", reserved="4.70"))
    d = diagnose_text(log, "x")
    assert "--no-half" in d.changes[0].setting and d.changes[0].lever == "half_precision"
    assert d.changes[1].lever == "image_resolution_down" and "resolution" in d.changes[1].setting
    assert all("sequence length" not in c.setting for c in d.changes)


def test_flex_attention_run_without_torch_compile_is_compiled_first():
    log = ("Using attention backend 'flex'\nUserWarning: flex_attention called without torch.compile() - this will "
           "use an unfused implementation that materializes the full scores matrix\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of "
           "79.11 GiB of which 1.00 GiB is free. Of the allocated memory 76.00 GiB is allocated by PyTorch, and "
           "100.00 MiB is reserved by PyTorch but unallocated.\n")
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "attention_kernel" and "torch.compile" in d.changes[0].setting
    flags = diagnose_text(log.splitlines()[0] + "\n" + log.splitlines()[2] + "\n", "x",
                          Context(flags_text="--train_module.compile_model false"))
    assert flags.changes[0].lever == "attention_kernel"  # compile switched off in the flags: eager flex again
    compiled = diagnose_text(log.splitlines()[0] + "\n" + log.splitlines()[2] + "\n", "x")
    assert compiled.changes[0].lever != "attention_kernel"  # nothing says it ran uncompiled


def test_an_evaluation_whose_tensors_fill_the_gpu_at_a_tiny_request_runs_without_autograd_first():
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0 has a total capacity of "
           "80.00 GiB of which 5.00 MiB is free. Of the allocated memory {allocated} GiB is allocated by PyTorch, and "
           "30.00 MiB is reserved by PyTorch but unallocated.\n")
    run = "$ python scripts/score.py --eval-hellaswag\n"
    d = diagnose_text(run + oom.format(allocated="76.00"), "x")
    assert d.changes[0].lever == "inference_mode" and "no_grad" in d.changes[0].setting
    assert diagnose_text(run + oom.format(allocated="40.00"), "x").changes[0].lever != "inference_mode"
    grad_off = diagnose_text(run + "with torch.no_grad():\n" + oom.format(allocated="76.00"), "x")
    assert grad_off.changes[0].lever != "inference_mode"
    training = diagnose_text("python train.py --eval-every 100\n  loss.backward()\n" + oom.format(allocated="76.00"),
                             "x")
    assert training.changes[0].lever != "inference_mode"


def test_a_training_scripts_small_network_that_cannot_move_to_the_gpu_frees_the_gpu_first():
    trace = ("THCudaCheck FAIL file=/pytorch/THCStorage.cu line=58 error=2 : out of memory\n"
             'Traceback (most recent call last):\n  File "train.py", line 381, in <module>\n'
             "    model = model.cuda()\n")
    d = diagnose_text(trace, "x")
    assert d.changes[0].lever == "free_other_process" and d.changes[1].lever == "batch_size_down"
    assert "quantize_smaller" not in _levers(d)
    llm = diagnose_text(trace.replace("    model = model.cuda()\n",
                                      "    model = AutoModel.from_pretrained('THUDM/chatglm-6b').half().cuda()\n"), "x")
    assert llm.changes[0].lever == "quantize_smaller"  # an LLM checkpoint's weights: quantizing them is the lever


def test_a_vision_training_step_is_lowered_in_images_not_tokens():
    log = ("python train.py --cfg yolov5s.yaml --batch-size 24 --img-size 1280\n"
           + _OLD_LINE.format(tried="24.00 MiB", total="10.89", allocated="9.69", reserved="9.73"))
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "batch_size_down" and "images per step" in d.changes[0].setting
    assert "quantize_smaller" not in _levers(d)


def test_llama_cpp_and_ollama_logs_get_their_own_reader_fewer_gpu_layers_first():
    weights = ("llm_load_tensors: offloaded 62/62 layers to GPU\n"
               "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 35533.34 MiB on device 0: cudaMalloc failed: "
               "out of memory\nllama_model_load: error loading model: unable to allocate CUDA0 buffer\n")
    d = diagnose_text(weights, "x")
    assert d.reader == "llama.cpp" and d.kind == "weights_do_not_fit"
    assert d.changes[0].lever == "cpu_offload" and "num_gpu 31" in d.changes[0].setting
    assert _levers(d)[1:] == ["quantize_smaller", "max_model_len_down"]
    assert any(f.value == "62 of 62" for f in d.figures)
    given = diagnose_llama_cpp(weights.replace("offloaded 62/62", "offloaded 40/62"), "x", "-ngl 40")
    assert "-ngl 20" in given.changes[0].setting  # fewer than the user's 40, never the same
    kv = diagnose_text("llama_init_from_model: n_ctx = 131072\nalloc_tensor_range: failed to allocate CUDA0 buffer of "
                       "size 1879048192\nllama_init_from_model: failed to initialize the context: failed to allocate "
                       "buffer for kv cache\n", "x", Context(flags_text="-c 131072"))
    assert kv.reader == "llama.cpp" and kv.changes[0].lever == "max_model_len_down"
    assert "131,072" in kv.changes[0].setting
    assert diagnose_llama_cpp("torch.OutOfMemoryError: CUDA out of memory.\n", "x") is None  # not ggml's


def test_a_vllm_vision_model_before_limit_mm_per_prompt_existed_lowers_max_num_seqs():
    said = "vllm {version}: serving llava-hf/llava-1.5-7b-hf runs out of memory at start-up (out of memory)\n"
    old = diagnose_text(said.format(version="0.5.4"), "x", Context(engine="vllm"))
    assert old.changes[0].lever == "max_num_seqs_down"
    assert "limit_mm_per_prompt_down" not in _levers(old)  # the flag did not exist yet
    new = diagnose_text(said.format(version="0.6.3"), "x", Context(engine="vllm"))
    assert new.changes[0].lever != "max_num_seqs_down"
    chinese = diagnose_text("在0.5.4版本中推理llava-1.5，会出现out of memory的情况\n", "x", Context(engine="vllm"))
    assert chinese.changes[0].lever == "max_num_seqs_down"


def test_a_table_of_the_persons_own_runs_gives_the_largest_value_that_held():
    table = ("| `MAX_SEQS` | free after boot | one prompt |\n|---|---|---|\n| 8 | 596 MiB | ok |\n"
             "| 12 | 416 MiB | ok |\n| **16** | **356 MiB** | **dead** |\n| 24 | 200 MiB | ok |\n")
    change = measured_down(table)
    assert change.setting == "--max-num-seqs 12" and change.lever == "max_num_seqs_down"
    assert measured_down(table.replace("MAX_SEQS", "WORKERS")) is None  # no setting diagnose knows
    assert measured_down(table.replace("dead", "ok")) is None  # nothing died: nothing measured
    d = diagnose_text("vllm serve org/model-27b --max-num-seqs 16\n" + table
                      + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n", "x")
    assert d.changes[0].setting == "--max-num-seqs 12"


def test_llm_uis_vision_language_models_and_gguf_in_pytorch_are_not_read_as_image_generators_or_llama_cpp():
    oom = _OLD_LINE.format(tried="20.00 MiB", total="24.00", allocated="21.50", reserved="21.60")
    ooba = diagnose_text("text-generation-webui server.py --loader transformers\n" + oom, "x")
    assert "attention_kernel" not in _levers(ooba)[:1] and "image_resolution_down" not in _levers(ooba)
    vlm = diagnose_text("Qwen2-VL-7B fine-tune, an image of 1024x1024, batch_size=1\n" + oom, "x")
    assert vlm.changes[0].lever == "image_resolution_down" and "max_pixels" in vlm.changes[0].setting
    gguf = diagnose_text("transformers loading a gguf file (gguf_file=...)\n" + oom, "x")
    assert gguf.reader == "pytorch-oom"
    both = "| batch_size | result |\n|---|---|\n| 8 | ok, no error |\n| 16 | OOM |\n"
    assert measured_down(both) is None  # 'ok' and 'error' in one run: neither held nor died
    assert measured_down(both.replace("ok, no error", "ok")).setting == "lower the batch size to 8"


# rules of the tenth set's kinds: the tokens of a step chosen from what the log shows, quantization calibration,
# LMDeploy's TurboMind, a load that moves every weight onto the GPU, and what the log says held or fixed it

_NEW_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of "
             "{total} GiB of which 200.00 MiB is free. Of the allocated memory {allocated} GiB is allocated by "
             "PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.\n")
_BACKWARD = ('  File "/usr/lib/python3/site-packages/torch/autograd/graph.py", line 825, in _engine_run_backward\n'
             "    return Variable._execution_engine.run_backward(\n")


def test_a_training_step_at_one_sequence_with_a_long_length_shortens_the_sequence_first():
    log = ("torchrun train.py --per_device_train_batch_size 1 --max_seq_length 16384 "
           "--attn_implementation flash_attention_2\n"
           + _BACKWARD + _NEW_LINE.format(tried="4.00 GiB", total="79.11", allocated="75.00"))
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "max_model_len_down" and "8,192 (from 16,384)" in d.changes[0].setting
    assert _levers(d).count("max_model_len_down") == 1


def test_a_large_batch_is_still_lowered_as_a_batch_whatever_the_length():
    log = ("torchrun train.py --per_device_train_batch_size 32 --max_seq_length 16384\n"
           + _BACKWARD + _NEW_LINE.format(tried="4.00 GiB", total="79.11", allocated="75.00"))
    assert diagnose_text(log, "x").changes[0].lever == "batch_size_down"


def test_a_batch_of_two_or_a_short_length_keeps_the_batch_first():
    for flags in ("--per_device_train_batch_size 2 --max_seq_length 16384 --attn_implementation sdpa",
                  "--per_device_train_batch_size 1 --max_seq_length 1024 --attn_implementation sdpa"):
        log = f"torchrun train.py {flags}\n" + _BACKWARD + _NEW_LINE.format(tried="4.00 GiB", total="79.11",
                                                                           allocated="75.00")
        assert diagnose_text(log, "x").changes[0].lever != "max_model_len_down", flags


def test_an_ms_swift_fine_tune_without_max_length_sets_a_length_before_gradient_checkpointing():
    log = ("swift sft --model Qwen/Qwen2.5-7B-Instruct --train_type lora --dataset my.jsonl\n"
           "torch.OutOfMemoryError: CUDA out of memory.\n")
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "max_model_len_down" and "max_length" in d.changes[0].setting
    assert "gradient_checkpointing" in _levers(d)
    bounded = diagnose_text(log.replace("--train_type lora", "--train_type lora --max_length 1024"), "x")
    assert bounded.changes[0].lever != "max_model_len_down"  # a short length in place: not the lever


def test_an_attention_mask_built_in_transformers_masking_utils_is_lowered_in_length():
    log = ('  File "/py/site-packages/transformers/masking_utils.py", line 130, in sdpa_mask\n'
           "    causal_mask = _vmap_for_bhqkv(mask_function)(batch_arange, head_arange, cache_position, kv_arange)\n"
           + _NEW_LINE.format(tried="8.00 GiB", total="31.36", allocated="24.00"))
    d = diagnose_text(log, "x")
    assert d.kind == "attention_mask" and d.changes[0].lever == "max_model_len_down"


def test_a_calibration_pass_lowers_its_samples_or_their_length_from_what_it_shows():
    awq = ("AWQ:   0%|          | 0/32 [00:05<?, ?it/s]\nTraceback (most recent call last):\n"
           '  File "/py/awq/quantize/quantizer.py", line 160, in quantize\n'
           "    input_feat = self._get_input_feat(self.modules[i], named_linears)\n"
           '  File "/py/awq/quantize/quantizer.py", line 510, in _get_input_feat\n'
           "    self.inps = layer(self.inps, **self.module_kwargs)[0]\n")
    d = diagnose_text(awq + _NEW_LINE.format(tried="2.00 GiB", total="23.65", allocated="21.00"), "x",
                      Context(flags_text="--n_samples 1024 --seqlen 512"))
    assert d.changes[0].lever == "batch_size_down" and "n_samples 512" in d.changes[0].setting
    assert "n_parallel_calib_samples" in d.changes[0].setting
    cut = diagnose_text(awq, "x", Context(flags_text="--n_samples 1024"))  # its error line not pasted
    assert cut.kind == "activation_peak" and cut.changes[0].lever == "batch_size_down"
    long = diagnose_text(awq + _NEW_LINE.format(tried="2.00 GiB", total="23.65", allocated="21.00"), "x",
                         Context(flags_text="--n_samples 128 --seqlen 8192"))
    assert long.changes[0].lever == "max_model_len_down"


def test_autogptq_with_inputs_cached_on_the_gpu_moves_them_to_the_cpu_first():
    log = ('  File "/py/auto_gptq/modeling/_base.py", line 360, in quantize\n    layer_inputs.append(...)\n'
           + _NEW_LINE.format(tried="500.00 MiB", total="23.65", allocated="22.80"))
    d = diagnose_text(log, "x", Context(flags_text="--num_samples 128"))
    assert "cache_examples_on_gpu=False" in d.changes[0].setting
    assert d.changes[0].lever == "calibration_cache_on_cpu"  # its own id: a catch-all "other" is never graded right
    off = diagnose_text(log + "quantize(examples, cache_examples_on_gpu=False)\n", "x")
    assert all("cache_examples_on_gpu" not in c.setting for c in off.changes)  # in place: not offered again


def test_turbomind_at_nearly_all_of_the_free_memory_lowers_its_kv_share_in_its_own_flags():
    log = ("lmdeploy serve api_server internlm2-chat-7b --cache-max-entry-count 0.95 --session-len 8192\n"
           "[TM][WARNING] [RejectInvalidRequests] Skipping invalid infer request for id 7, code = 6\n"
           "[TM][WARNING] [forward] Request failed for 7, code 6\n")
    d = diagnose_text(log, "x")
    assert d.reader == "lmdeploy" and d.changes[0].setting == "--cache-max-entry-count 0.7"
    assert d.changes[0].lever == "gpu_memory_utilization_down"
    assert {"--session-len 4096", "a lower --max-batch-size"} <= {c.setting for c in d.changes}
    oom = diagnose_text("lmdeploy serve api_server m --max-batch-size 128\n"
                        "[TM][ERROR] CUDA runtime error: out of memory /lmdeploy/src/turbomind/utils/allocator.h:246\n",
                        "x")
    assert oom.reader == "lmdeploy" and oom.changes[0].setting == "--cache-max-entry-count 0.5"
    assert "--max-batch-size 64" in [c.setting for c in oom.changes]


def test_turbomind_sessions_longer_than_its_blocks_lower_the_session_length():
    log = ("[TM][WARNING] No enough blocks for `session_len` (32768), `session_len` truncated to 12288.\n"
           "[TM][WARNING] [RejectInvalidRequests] Skipping invalid infer request for id 1, code = 6\n")
    d = diagnose_text(log, "x")
    assert d.reader == "lmdeploy" and d.changes[0].setting == "--session-len 12288"


def test_a_load_moving_every_weight_onto_the_gpu_caps_the_gpu_share_first():
    move = ('  File "/py/torch/nn/modules/module.py", line 1143, in convert\n'
            "    return t.to(device, dtype if t.is_floating_point() or t.is_complex() else None, non_blocking)\n"
            + _OLD_LINE.format(tried="314.00 MiB", total="8.00", allocated="6.75", reserved="6.98"))
    d = diagnose_text(move, "x")
    assert d.kind == "weights_loading" and d.changes[0].lever == "cpu_offload" and "6.5GiB" in d.changes[0].setting
    capped = diagnose_text("python server.py --gpu-memory 7800\n" + move, "x")
    assert capped.changes[0].lever == "cpu_offload" and "--gpu-memory 6246" in capped.changes[0].setting
    training = diagnose_text(move + "loss.backward()\n", "x")
    assert training.changes[0].lever != "cpu_offload"


def test_a_value_the_log_says_held_comes_first_and_a_failed_one_does_not():
    ran = ("CUDA out of memory on 8 GPUs.\nIt ran correctly only when set model_max_length = 512.\n")
    d = diagnose_text(ran, "x")
    assert d.changes[0].lever == "max_model_len_down" and d.changes[0].setting == "model_max_length 512"
    ctx = diagnose_text("cuda out of memory at -c 32768. I need to reduce context to 8K to make it work.\n", "x")
    assert ctx.changes[0].setting == "context 8192"
    failed = diagnose_text("CUDA out of memory.\nIt does not work even when I set batch_size=1.\n", "x")
    assert failed.changes[0].setting != "batch_size 1"


def test_a_code_change_the_log_says_fixed_it_is_upgraded_to_first():
    said = ("We hit torch.OutOfMemoryError during CUDA-graph capture on 16 nodes, and this PR resolves it.\n")
    assert diagnose_text(said, "x").changes[0].lever == "upgrade"
    tried = "torch.OutOfMemoryError: CUDA out of memory.\nUpgrading to 0.6.1 did not help, the OOM stays.\n"
    assert diagnose_text(tried, "x").changes[0].lever != "upgrade"


def test_every_tools_cpu_cache_switch_is_one_lever():
    from harness.diagnose.levers import lever_of

    for setting in ("quantize(..., cache_examples_on_gpu=False)", "AutoRound(..., low_gpu_mem_usage=True)",
                    "GPTQModifier(..., offload_hessians=True)", "GPTQQuantizer(..., cache_block_outputs=False)"):
        assert lever_of(setting) == "calibration_cache_on_cpu", setting
    assert lever_of("quantize the weights (load_in_4bit / awq / gptq)") == "quantize_smaller"


def test_a_cpu_cache_switch_said_to_have_worked_is_offered_not_taken_as_in_place():
    said = ("AutoGPTQ quantization of a 7B model goes OOM with more samples.\n"
            "If I run with `cache_examples_on_gpu=False` it works, but it is a lot slower\n")
    d = diagnose_text(said, "x")
    assert d.changes[0].setting.endswith("cache_examples_on_gpu=False)")


def test_llama_cpp_running_out_said_in_words_is_read_by_its_own_reader():
    said = ("./main -m mixtral-8x7b.Q5_K_M.gguf -ngl 33 -c 32768\ncuda-out-of-memory error with 40000 MB in use.\n"
            "Both GPUs are free before running llama.cpp\n")
    d = diagnose_text(said, "x")
    assert d.reader == "llama.cpp" and d.changes[0].lever == "cpu_offload" and "-ngl 16" in d.changes[0].setting
    torch = diagnose_text("llama.cpp is not used here\n" + _NEW_LINE.format(tried="1.00 GiB", total="23.65",
                                                                              allocated="22.00"), "x")
    assert torch.reader != "llama.cpp"  # PyTorch's own message is PyTorch's to read


def test_one_small_image_in_a_low_vram_mode_upgrades_the_ui_rather_than_shrinking_the_image():
    log = ("1 batch, 256 x 256, 20 steps, euler a.\n"
           + _OLD_LINE.format(tried="26.00 MiB", total="4.00", allocated="3.38", reserved="3.45")
           + "It runs with --lowvram and still fails.\n")
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "upgrade" and "image_resolution_down" not in _levers(d)
    large = diagnose_text(log.replace("256 x 256", "512 x 512").replace("1 batch", "4 batch"), "x")
    assert large.changes[0].lever != "upgrade"  # four images: the batch still has something to give


# with the eleventh set: checkpointing said off on a training step, a vision encoder's one allocation larger than the
# GPU, a preference fine-tune's reference model, a colocated rollout's wake-up after a lower share failed

def test_a_training_step_with_checkpointing_said_off_turns_it_on_before_a_smaller_batch():
    said = ("8x H100 continued pretraining of a 14B model, recipe with activation_checkpointing: false\n"
            "step=3 TRAIN peak=74.10 GiB\n" + _BACKWARD
            + _NEW_LINE.format(tried="2.00 GiB", total="79.11", allocated="77.00"))
    d = diagnose_text(said, "x")
    assert d.changes[0].lever == "gradient_checkpointing" and "batch_size_down" in _levers(d)
    flagged = diagnose_text("training step OOM\n" + _BACKWARD + _NEW_LINE.format(
        tried="2.00 GiB", total="79.11", allocated="77.00"), "x",
        Context(flags_text="--distributed.activation_checkpointing false"))
    assert flagged.changes[0].lever == "gradient_checkpointing"  # a recipe's config path read as its key
    on = diagnose_text(said.replace("activation_checkpointing: false", "activation_checkpointing: true"), "x")
    assert on.changes[0].lever != "gradient_checkpointing" and "gradient_checkpointing" not in _levers(on)
    large = diagnose_text(said + "per_device_train_batch_size=64\n", "x")
    assert large.changes[0].lever == "batch_size_down"  # a batch of 64 shown: the batch rule comes first
    assert "frozen" not in d.summary  # a full training run: every weight trains


def test_a_vision_encoder_profile_asking_more_than_the_gpu_in_one_allocation_gets_a_kernel_first():
    log = ("INFO [gpu_model_runner.py] Encoder cache will be initialized with a budget of 16384 tokens, and profiled "
           "with 1 image items of the maximum feature size.\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of "
           "23.55 GiB of which 9.00 GiB is free. Of the allocated memory 13.00 GiB is allocated by PyTorch, and "
           "200.00 MiB is reserved by PyTorch but unallocated.\n")
    d = diagnose_text(log.format(tried="40.00 GiB"), "x", Context(engine="vllm"))
    assert d.changes[0].lever == "attention_kernel" and "flash-attn" in d.changes[0].setting
    assert "limit_mm_per_prompt_down" in _levers(d)
    small = diagnose_text(log.format(tried="2.00 GiB"), "x", Context(engine="vllm"))
    assert small.changes[0].lever != "attention_kernel"  # a request the GPU could hold: no matrix to blame
    hip = diagnose_text(log.format(tried="40.00 GiB").replace("torch.OutOfMemoryError: CUDA", "torch.OutOfMemoryError:"
                                                               " HIP"), "x", Context(engine="vllm"))
    assert hip.changes[0].lever != "attention_kernel"  # ROCm: flash-attn is no pip install there


def test_a_lora_preference_step_at_one_pair_quantizes_the_shared_base_first():
    said = ("llamafactory-cli train --stage dpo --finetuning_type lora --per_device_train_batch_size 1 "
            "--model_name_or_path Qwen/Qwen2.5-32B\nCUDA out of memory\n")
    d = diagnose_text(said, "x")
    assert d.changes[0].lever == "quantize_smaller" and "quantization_bit" in d.changes[0].setting
    quantized = diagnose_text(said.replace("--finetuning_type lora", "--finetuning_type lora --quantization_bit 4"),
                              "x")
    assert quantized.changes[0].lever != "quantize_smaller"  # in place: the step's own levers are left
    larger = diagnose_text(said.replace("--per_device_train_batch_size 1", "--per_device_train_batch_size 8"), "x")
    assert larger.changes[0].lever != "quantize_smaller"  # a batch left to lower
    full = diagnose_text("DPOTrainer full fine-tune, per_device_train_batch_size=1\nCUDA out of memory\n", "x")
    assert "precompute_ref_log_probs" in full.changes[0].setting and "quantize_smaller" in _levers(full)
    sft = diagnose_text(said.replace("--stage dpo", "--stage sft"), "x")
    assert "reference" not in sft.summary  # no reference model in a supervised fine-tune


def test_a_colocated_wake_up_whose_lower_share_still_failed_pins_the_kv_cache_in_bytes():
    log = ("(VllmWorker) ERROR  File \"vllm/device_allocator/cumem.py\", line 120, in wake_up\n"
           "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62\n")
    d = diagnose_text(log, "x", Context(engine="vllm"))
    assert d.changes[0].lever == "gpu_memory_utilization_down" and "max_total_tokens_down" in _levers(d)
    tried = diagnose_text(log + "lowering gpu_memory_utilization to 0.5 still OOM'ed\n", "x", Context(engine="vllm"))
    assert tried.changes[0].lever == "max_total_tokens_down" and "kv-cache-memory-bytes" in tried.changes[0].setting
    pinned = diagnose_text("vllm_kwargs: kv_cache_memory_bytes: 21474836480\n" + log, "x", Context(engine="vllm"))
    assert "max_total_tokens_down" not in _levers(pinned)  # fixed in bytes already: not offered again
    fix = diagnose_text(log + "+      kv_cache_memory_bytes: 21474836480  # 20 GiB\n", "x", Context(engine="vllm"))
    assert "max_total_tokens_down" in _levers(fix)  # a diff's added line is the fix, not the failing run


def test_a_step_filling_the_card_that_asks_for_one_tensor_of_gibs_shortens_the_sequences_first():
    filled = _OLD_LINE.format(tried="3.00 GiB", total="47.54", allocated="44.90", reserved="45.60")
    d = diagnose_text(filled, "x")
    assert d.changes[0].lever == "max_model_len_down" and "batch_size_down" in _levers(d)
    backward = diagnose_text(_BACKWARD + _NEW_LINE.format(tried="2.50 GiB", total="79.11", allocated="76.80"), "x")
    assert backward.changes[0].lever == "max_model_len_down"
    set_long = diagnose_text("--max_seq_length 8192\n" + filled, "x")
    assert "4,096 (from 8,192)" in set_long.changes[0].setting
    small = diagnose_text(filled.replace("3.00 GiB", "300.00 MiB"), "x")
    assert small.changes[0].lever != "max_model_len_down"  # one small tensor: nothing says which dimension
    batch = diagnose_text("per_device_train_batch_size=8\n" + filled, "x")
    assert batch.changes[0].lever == "batch_size_down"  # a batch shown: the batch rules read it
    short = diagnose_text("--max_seq_length 1024\n" + filled, "x")
    assert short.changes[0].lever != "max_model_len_down"  # short already: nothing repeated in place
    room = diagnose_text(_OLD_LINE.format(tried="4.00 GiB", total="10.73", allocated="4.41", reserved="4.60"), "x")
    assert room.changes[0].lever != "max_model_len_down"  # a half-empty card: the request says nothing of length


# with the twelfth set: a per-GPU batch by its NeMo Automodel / torchtitan name, packed training data at a long packed
# length, a model whose training state alone exceeds the card

def test_a_local_batch_size_is_the_batch_one_gpu_runs():
    log = ("torchrun --nproc-per-node=8 finetune.py --step_scheduler.local_batch_size {batch} "
           "--step_scheduler.global_batch_size 512 --dataset.max_length 16384 --attn_implementation sdpa\n"
           + _BACKWARD + _NEW_LINE.format(tried="4.00 GiB", total="79.11", allocated="75.00"))
    d = diagnose_text(log.format(batch=1), "x")
    assert d.changes[0].lever == "max_model_len_down" and "8,192 (from 16,384)" in d.changes[0].setting
    assert diagnose_text(log.format(batch=8), "x").changes[0].lever != "max_model_len_down"  # a batch left to give
    large = diagnose_text(log.format(batch=64), "x")
    assert "to 32 (from 64)" in large.changes[0].setting  # the per-GPU batch, not the global 64 beside it


def test_packed_rows_of_a_long_length_halve_the_packed_length_first():
    said = ("Reproduced the OOM with the recipe's {packing}: every rank hit torch.OutOfMemoryError trying to "
            "allocate 6.00 GiB with 75.00 GiB already used\n")
    d = diagnose_text(said.format(packing="packed_sequence_size: 8192"), "x")
    assert d.changes[0].lever == "max_model_len_down" and "4,096 (from 8,192)" in d.changes[0].setting
    assert "packed" in d.changes[0].setting and "batch_size_down" in _levers(d)
    switched = diagnose_text(said.format(packing="sample_packing: true, sequence_len: 16384"), "x")
    assert switched.changes[0].lever == "max_model_len_down"  # packing on by its switch, the length by its name
    for other in ("sample_packing: false, sequence_len: 16384",  # packing off: the rows are the samples' own lengths
                  "packed_sequence_size: 2048",  # a short pack: nothing says the length is what grew
                  "packed_sequence_size: 8192, per_device_train_batch_size: 4"):  # several packs a step: the batch
        assert diagnose_text(said.format(packing=other), "x").changes[0].lever != "max_model_len_down", other


def test_a_model_whose_training_state_exceeds_the_card_gets_a_smaller_model_first():
    printed = "Total number of parameters in the model: {count}\n"
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of "
           "39.38 GiB of which 15.38 MiB is free. Of the allocated memory {allocated} GiB is allocated by PyTorch, and "
           "138.61 MiB is reserved by PyTorch but unallocated.\n")
    d = diagnose_text(printed.format(count="3,161,117,824") + oom.format(allocated="38.73"), "x")
    assert d.changes[0].lever == "quantize_smaller" and "smaller model" in d.changes[0].setting
    assert "cpu_offload" in _levers(d) and "47.1 GiB" in d.summary  # 16 bytes a parameter
    nanogpt = diagnose_text("python train.py config/train_big.py\nnumber of parameters: 3200.00M\n"
                            + oom.format(allocated="20.00"), "x")
    assert nanogpt.changes[0].lever == "quantize_smaller"  # training said: the state is coming whatever is held yet
    for other in (printed.format(count="124,439,808") + oom.format(allocated="38.73"),  # 2 GB of state: fits
                  printed.format(count="3,161,117,824") + oom.format(allocated="12.00"),  # no sign of training
                  "generate.py\n" + printed.format(count="3,161,117,824") + oom.format(allocated="38.73"),
                  "trainable params: 4,194,304 || all params: 3,161,117,824\ntrain.py\n" + oom.format(
                      allocated="38.73"),  # an adapter: the base keeps no gradients or optimizer state
                  "deepspeed --zero_stage 3 train.py\n" + printed.format(count="3,161,117,824")
                  + oom.format(allocated="38.73")):  # sharded already
        assert diagnose_text(other, "x").changes[0].lever != "quantize_smaller", other



# with the thirteenth set: an encoder-decoder model named by --model, an older message whose memory outside the process
# is most of the card, a shortage spelled "out-of-memory", a batch size of 0 (auto), a failure said to come after
# earlier steps fitted, a regression since a dated or committed build, gradient checkpointing that cannot run

_V0_PROFILE = ("(VllmWorkerProcess pid=214) ERROR 09-27 05:20:38 multiproc_worker_utils.py:233] Exception in worker "
               "VllmWorkerProcess while processing method determine_num_available_blocks: CUDA out of memory. Tried to "
               "allocate 12.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 9.00 GiB is free. Process 7 has "
               "70.10 GiB memory in use. Of the allocated memory 66.00 GiB is allocated by PyTorch, and 1.50 GiB is "
               "reserved by PyTorch but unallocated.\n")


def test_an_encoder_decoder_model_named_by_model_profiles_one_encoder_input_per_sequence():
    named = diagnose_text(_V0_PROFILE, "x", Context(flags_text="--model meta-llama/Llama-3.2-90B-Vision-Instruct "
                                                                "--tensor-parallel-size 8 --max-model-len 8192"))
    assert named.changes[0].lever == "max_num_seqs_down" and "--max-num-seqs 16" in named.changes[0].setting
    # V0 refuses chunked prefill for an encoder-decoder model (worker/utils.py): never offered there
    assert "enable_chunked_prefill" not in _levers(named)
    frame = ('  File "/usr/local/lib/python3.12/dist-packages/vllm/worker/model_runner.py", line 1220, in profile_run\n'
             + _V0_PROFILE)  # the profile run named by its frame: an encoder-decoder model's profile all the same
    assert diagnose_text(frame, "x", Context(flags_text="--model meta-llama/Llama-3.2-11B-Vision-Instruct")).changes[
        0].lever == "max_num_seqs_down"
    decoder_only = diagnose_text(_V0_PROFILE, "x", Context(flags_text="--model meta-llama/Llama-3.1-70B-Instruct "
                                                                       "--tensor-parallel-size 8"))
    assert decoder_only.changes[0].lever != "max_num_seqs_down"  # a decoder-only profile: its tokens, not its images
    seqs = diagnose_text(_V0_PROFILE, "x", Context(flags_text="--model openai/whisper-large-v3 --max-num-seqs 128"))
    assert seqs.changes[0].setting == "--max-num-seqs 32"  # a quarter of the 128 in place


def test_an_older_message_with_most_of_the_card_outside_this_process_frees_the_gpu_first():
    held = _OLD_LINE.format(tried="64.00 MiB", total="23.69", allocated="3.90", reserved="4.10")  # 19.6 GiB outside
    d = diagnose_text(held, "x")
    assert d.kind == "memory_held_elsewhere" and d.changes[0].lever == "free_other_process"
    assert "CUDA_VISIBLE_DEVICES" in d.changes[0].setting  # or run where nothing else is
    own = _OLD_LINE.format(tried="64.00 MiB", total="23.69", allocated="21.90", reserved="22.40")  # the context only
    assert diagnose_text(own, "x").changes[0].lever != "free_other_process"
    quarter = _OLD_LINE.format(tried="64.00 MiB", total="23.69", allocated="16.90", reserved="17.40")  # 6 GiB: unsure
    assert diagnose_text(quarter, "x").changes[0].lever != "free_other_process"


def test_a_shortage_spelled_out_of_memory_with_hyphens_is_a_memory_failure():
    said = "Fine-tuning a 7B model, the trainer stops with a CUDA out-of-memory error in the first epoch.\n"
    d = diagnose_text(said, "x")
    assert d.kind != "not_recognised" and d.changes  # read as the shortage it is, not an unknown error


def test_a_batch_size_of_zero_is_an_automatic_choice_not_a_batch_nothing_can_go_below():
    log = "* Chosen batch size: 128\nObtaining hidden states for the prompts\nCUDA out of memory\n"
    auto = diagnose_text(log, "x", Context(flags_text="--batch-size 0"))
    assert auto.changes[0].lever == "batch_size_down"
    one = diagnose_text(log, "x", Context(flags_text="--batch-size 1"))
    assert "batch_size_down" not in _levers(one)  # at one already: nothing to lower


def test_a_failure_said_to_come_after_earlier_steps_fitted_grows_segments_first():
    said = ("GRPO with the repository's settings on my own data: after a few training steps, at step {step} during "
            "loss.backward() for the actor, I get a CUDA out-of-memory error.\n")
    d = diagnose_text(said.format(step=4), "x")
    assert d.kind == "fragmentation" and d.changes[0].lever == "expandable_segments"
    assert "batch_size_down" in _levers(d)  # a longer batch than the earlier ones is the other reading
    on = diagnose_text(said.format(step=4), "x", Context(flags_text="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    assert "expandable_segments" not in _levers(on)  # in place already
    second = ("Training always OOMs at the second step during loss computation.\n")  # Adam's state arrives there
    assert diagnose_text(second, "x").changes[0].lever != "expandable_segments"
    first = "The first step runs out of memory: torch.OutOfMemoryError: CUDA out of memory.\n"
    assert diagnose_text(first, "x").changes[0].lever != "expandable_segments"
    figures = ("after 300 iterations:\n" + _NEW_LINE.format(tried="2.00 GiB", total="79.11", allocated="76.00"))
    assert diagnose_text(figures, "x").kind != "fragmentation"  # the figures say the tensors fill the card


def test_a_run_that_has_failed_since_a_dated_or_committed_build_upgrades_first():
    log = ("benchmark.py + Llama-3-8B + FSDP hits OOM since {since} on H100\n"
           "torchrun --nproc-per-node=8 benchmark.py --micro_batch_size 1 --model_name Llama-3-8B\n")
    for since in ("5/4/24", "2024-05-04", "commit ba561bf", "nightly 20240504"):
        assert diagnose_text(log.format(since=since), "x").changes[0].lever == "upgrade", since
    for since in ("upgrading to 0.25.1",  # a release's new defaults: a setting may answer them
                  "image tokens grew",  # "since" as "because"
                  "0.9"):
        assert diagnose_text(log.format(since=since), "x").changes[0].lever != "upgrade", since


def test_gradient_checkpointing_that_fails_on_frozen_inputs_upgrades_the_libraries_first():
    log = ("SFTTrainer with a LoRA adapter on a 4-bit model, per_device_train_batch_size=1\n"
           "If I turn on gradient checkpointing I get: RuntimeError: element 0 of tensors does not require grad and "
           "does not have a grad_fn\nWithout it: " + _NEW_LINE.format(tried="150.00 MiB", total="3.80",
                                                                   allocated="3.52"))
    d = diagnose_text(log, "x")
    assert d.changes[0].lever == "upgrade" and "enable_input_require_grads" in d.changes[1].setting
    other = log.replace("If I turn on gradient checkpointing I get", "The loss function raised")  # not checkpointing
    assert diagnose_text(other, "x").changes[0].lever != "upgrade"


def test_a_serving_start_up_profiled_at_a_long_context_shortens_the_context_first():
    """An engine's peak-memory profile run (a vLLM fork's own words) at a model's whole context, with no batch shown:
    the profile prefills that context in one step, so a shorter --max-model-len comes before a smaller batch."""
    log = ("$ myengine serve org/Some-8B-Instruct --kv-cache-dtype fp8\n"
           "INFO:     Context Length = {length}\nINFO:     Total model weights memory usage: 5.40 GiB\n"
           "INFO:     Profiling peak memory usage...\nTraceback (most recent call last):\n"
           + _NEW_LINE.format(tried="1024.00 MiB", total="11.66", allocated="10.90"))
    d = diagnose_text(log.format(length=131072), "x")
    assert d.changes[0].lever == "max_model_len_down" and "131,072" in d.changes[0].setting
    assert d.kind != "fits"
    assert diagnose_text(log.format(length=4096), "x").changes[0].lever != "max_model_len_down"  # a short context
    unprofiled = log.replace("Profiling peak memory usage...", "Serving requests")  # no profile run shown
    assert diagnose_text(unprofiled.format(length=131072), "x").changes[0].lever != "max_model_len_down"


def test_a_bare_oom_line_whose_allocator_caches_freed_blocks_is_a_step_not_the_weights():
    """PyTorch's OOM line alone on a consumer card its tensors fill: where reserved equals allocated nothing was freed
    (a load), so the weights come first; where the allocator caches freed blocks a step ran and released its
    activations, so the step's tokens come before quantizing."""
    loading = _OLD_LINE.format(tried="24.00 MiB", total="10.89", allocated="9.69", reserved="9.70")
    assert diagnose_text(loading, "x").changes[0].lever == "quantize_smaller"
    stepped = diagnose_text(_OLD_LINE.format(tried="24.00 MiB", total="10.89", allocated="9.69", reserved="9.79"), "x")
    assert stepped.changes[0].lever == "batch_size_down" and "quantize_smaller" not in _levers(stepped)[:1]
    assert stepped.kind != "fits"
