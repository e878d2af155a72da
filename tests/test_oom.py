"""Parsing PyTorch CUDA OOM messages and the one-line reasons built from them."""

from __future__ import annotations

import signal

from harness.measure.oom import oom_reason, parse_cuda_oom, parse_size

NEW_FORM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.06 GiB "
    "is free. Including non-PyTorch memory, this process has 78.03 GiB memory in use. Of the allocated memory "
    "76.50 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html"
    "#environment-variables)"
)
OLD_FORM = (
    "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already "
    "allocated; 3.50 MiB free; 14.63 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory "
    "try setting max_split_size_mb to avoid fragmentation."
)


def test_parse_size_units():
    assert parse_size("2.00 GiB") == 2 * 2**30
    assert parse_size("3.50 MiB") == int(3.5 * 2**20)
    assert parse_size("0 bytes") == 0
    assert parse_size("12.5 parsecs") is None and parse_size(None) is None


def test_new_form():
    figures = parse_cuda_oom(NEW_FORM)
    assert figures is not None
    assert (figures.tried, figures.total, figures.free) == ("2.00 GiB", "79.10 GiB", "1.06 GiB")
    assert (figures.allocated, figures.reserved, figures.in_use, figures.gpu) == ("76.50 GiB", "1.02 GiB",
                                                                                   "78.03 GiB", 0)
    assert figures.reserved_unallocated_bytes == int(1.02 * 2**30)
    reason = oom_reason(figures)
    assert reason.startswith("tried to allocate 2.00 GiB on GPU 0 (79.10 GiB total); 76.50 GiB already allocated; "
                             "1.06 GiB free; 1.02 GiB reserved but unallocated; ")
    assert "--max-num-seqs" in reason and "--max-model-len" in reason and "smaller format" in reason
    assert "--gpu-memory-utilization" in reason and "\n" not in reason
    assert "other processes" not in reason  # 79.10 - 1.06 - 78.03 = 0.01 GiB: rounding


def test_new_form_as_torch_prints_it_with_private_pools_and_another_process():
    message = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 1 has a total capacty "
               "of 23.64 GiB of which 301.06 MiB is free. Process 4242 has 9.00 GiB memory in use. Including "
               "non-PyTorch memory, this process has 14.34 GiB memory in use. Of the allocated memory 13.10 GiB "
               "is allocated by PyTorch, with 24.00 MiB allocated in private pools (e.g., CUDA Graphs), and "
               "801.50 MiB is reserved by PyTorch but unallocated.")
    figures = parse_cuda_oom(message)
    assert (figures.tried, figures.total, figures.free, figures.gpu) == ("512.00 MiB", "23.64 GiB", "301.06 MiB", 1)
    assert figures.reserved == "801.50 MiB"
    reason = oom_reason(figures)
    # 23.64 GiB - 0.29 GiB free - 14.34 GiB ours = about 9 GiB held elsewhere.
    assert "other processes hold about 9.0" in reason
    assert "free the GPU of other processes" in reason


def test_old_form():
    figures = parse_cuda_oom(OLD_FORM)
    assert (figures.tried, figures.total, figures.allocated, figures.free, figures.reserved) == (
        "20.00 MiB", "15.78 GiB", "14.56 GiB", "3.50 MiB", "14.63 GiB")
    assert figures.reserved_is_total and figures.gpu == 0
    assert figures.in_use is None
    reason = oom_reason(figures)
    assert reason.startswith("tried to allocate 20.00 MiB on GPU 0 (15.78 GiB total); 14.56 GiB already allocated; "
                             "3.50 MiB free; 14.63 GiB reserved in total; ")
    assert "fragmentation" not in reason  # only ~70 MiB cached beyond the tensors


def test_fragmentation_points_at_expandable_segments():
    message = ("CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; 39.39 GiB total capacity; 30.00 GiB already "
               "allocated; 120.00 MiB free; 38.90 GiB reserved in total by PyTorch)")
    reason = oom_reason(parse_cuda_oom(message))
    assert "expandable_segments:True" in reason


def test_not_an_oom_message():
    assert parse_cuda_oom("RuntimeError: shape mismatch") is None
    assert parse_cuda_oom("") is None and parse_cuda_oom(None) is None
    assert parse_cuda_oom("out of memory: the quick brown fox 12 GiB") is None
    assert parse_cuda_oom("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported") is None


def test_reason_without_figures_and_for_sigkill():
    assert "smaller format" in oom_reason(None)
    killed = oom_reason(None, killed_signal=signal.SIGKILL, rss_peak_bytes=30 * 2**30)
    assert "killed by SIGKILL" in killed and "out-of-memory killer" in killed
    assert "30.00 GiB" in killed and "more RAM" in killed and "\n" not in killed
    assert "SIGTERM" in oom_reason(None, killed_signal=15)
