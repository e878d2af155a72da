"""Library output in the parent process stays off the console: dropped at import, kept in a log for real work."""

import subprocess
import sys

from conftest import ROOT

CHILD = """
import os, sys
from pathlib import Path
from harness.quiet import output_to, quiet_imports
print("before", flush=True)
with quiet_imports():
    os.write(2, b"Failed to load _C_mxfp8.so (from C, past Python)\\n")
with output_to(Path(sys.argv[1])):
    os.write(1, b"Converting and de-quantizing GGUF tensors\\n")
    print("a Python print", file=sys.stderr)
print("after", flush=True)
"""


def test_library_output_goes_to_the_log_and_the_console_comes_back(tmp_path):
    log = tmp_path / "logs" / "convert.log"
    result = subprocess.run([sys.executable, "-c", CHILD, str(log)], cwd=ROOT, capture_output=True, text=True,
                            check=True, env={"PYTHONPATH": str(ROOT)})
    assert result.stdout == "before\nafter\n" and result.stderr == ""
    assert log.read_text() == "Converting and de-quantizing GGUF tensors\na Python print\n"


def test_a_message_logged_on_every_matmul_is_kept_once_in_workers_and_vllm_servers(tmp_path):
    """bitsandbytes' per-matmul 'MatMul8bitLt: inputs will be cast' (a logging warning): once per process, in a
    worker (quiet_repeated_library_logs) and in a vLLM process (server_site/sitecustomize.py on its PYTHONPATH)."""
    import subprocess
    import sys

    from harness.runtime.vllm.server import with_forced_cpu

    code = ("import logging; log = logging.getLogger('bitsandbytes.autograd._functions')\n"
            "{setup}\n"
            "for _ in range(50): log.warning('MatMul8bitLt: inputs will be cast from %s to float16', 'torch.bfloat16')\n"
            "log.warning('another message')")
    worker = subprocess.run([sys.executable, "-c", code.format(
        setup="from harness.quiet import quiet_repeated_library_logs; quiet_repeated_library_logs()")],
        capture_output=True, text=True, check=True)
    env = with_forced_cpu({k: v for k, v in __import__("os").environ.items() if k != "QUANTGATE_FORCE_AVX2"})
    server = subprocess.run([sys.executable, "-c", code.format(setup="")], capture_output=True, text=True, env=env,
                            check=True)
    for result in (worker, server):
        assert result.stderr.count("MatMul8bitLt") == 1 and "another message" in result.stderr, result.stderr
