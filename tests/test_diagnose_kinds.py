"""Reader rules by kind of failure, each on a log written for the rule (not a corpus log): image models in their own
terms (attention kernels, resolution, --no-half), flex attention run eagerly, an evaluation that keeps autograd's
graphs, a small network's move to an occupied GPU, llama.cpp / ollama's own reader, a vLLM vision model on a release
without --limit-mm-per-prompt, and a table of the person's own runs."""

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
    assert "--no-half" in d.changes[0].setting and d.changes[0].lever == "other"
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
