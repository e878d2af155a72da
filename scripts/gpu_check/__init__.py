"""The GPU check (`python -m scripts.gpu_check`, or scripts/gpu_check.sh): do quantgate's memory predictions hold on
a real CUDA device? See __main__.py for what it does and its exit codes.

One job a module:
  __main__.py        the command line: arguments, the steps in order, the exit code
  model.py           the random-weight Llama model (and its tokenizer and gptq checkpoint) the check runs on
  worker.py          one step in a fresh subprocess (no step inherits another's allocations), and that subprocess
  direct.py          the per-format direct measurement: its own loading code and torch.cuda figures, independent
                     of harness's measurement code (that is the point of the check), against harness's predictions
  quantgate_run.py   quantgate itself on the same model, its report.json read through harness.report.schema
  render.py          the printout

Only the NVML sampler (harness.measure.memory.NvmlSampler), the size and time formatters (harness.units) and the
predictions being checked (harness.measure.kv, harness.capacity) come from harness.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the project root: the subprocesses run there
