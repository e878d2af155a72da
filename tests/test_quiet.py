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
