"""lm-evaluation-harness on the same work: `python -m benchmarks.lm_eval_side JOB`.

The task is declared from the evalset's own data file (lm-eval's `json` dataset loader) with the evalset's prompt
template turned into lm-eval's Jinja `doc_to_text`; lm-eval renders it through the model's chat template itself
(apply_chat_template=True), so each tool builds its own prompts and the bench checks they are the same text.
The `hf` backend loads the checkpoint in the same dtype, on the same thread count, at the same batch size.
"""

from __future__ import annotations

import string
import sys
import time
from pathlib import Path

from benchmarks.common import read_job, write_result

TASK_TEMPLATE = Path(__file__).resolve().parent / "lmeval_task" / "task.yaml.in"


def jinja_from_format(template: str) -> str:
    """A str.format prompt template ({context}) as the equivalent Jinja template ({{context}})."""
    parts, literal = [], ""
    for text, field, _, _ in string.Formatter().parse(template):
        literal += text
        if field is not None:
            parts += [_jinja_literal(literal), "{{" + field + "}}"]
            literal = ""
    return "".join(parts + [_jinja_literal(literal)])


def _jinja_literal(text: str) -> str:
    return "{% raw %}" + text + "{% endraw %}" if any(c in text for c in "{}%#") else text


def write_task(task_dir: Path, name: str, data_path: str, prompt_template: str, max_new_tokens: int) -> Path:
    """The task YAML (benchmarks/lmeval_task/task.yaml.in, filled in) in its own include directory."""
    import json

    task_dir.mkdir(parents=True, exist_ok=True)
    text = TASK_TEMPLATE.read_text(encoding="utf-8")
    # JSON strings are valid YAML scalars: no quoting rules to get wrong.
    for key, value in {"NAME": name, "DATA_PATH": data_path, "DOC_TO_TEXT": jinja_from_format(prompt_template),
                       "MAX_GEN_TOKS": max_new_tokens}.items():
        text = text.replace("@" + key + "@", json.dumps(value))
    path = task_dir / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    job = read_job(argv)
    import torch

    torch.set_num_threads(int(job["threads"]))
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    generate_s, generate_cpu_s = [], []
    original = HFLM.generate_until

    def timed_generate_until(self, requests, disable_tqdm: bool = False):
        begin, begin_cpu = time.perf_counter(), time.process_time()
        try:
            return original(self, requests, disable_tqdm=True)
        finally:
            generate_s.append(time.perf_counter() - begin)
            generate_cpu_s.append(time.process_time() - begin_cpu)

    HFLM.generate_until = timed_generate_until
    task_dir = Path(job["task_dir"])
    write_task(task_dir, job["task_name"], job["data_path"], job["prompt_template"], job["max_new_tokens"])
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": job["model_path"], "dtype": job["dtype"], "device": "cpu"},
        tasks=[job["task_name"]], task_manager=TaskManager(include_path=str(task_dir)), batch_size=job["batch_size"],
        limit=job["max_items"], apply_chat_template=True, log_samples=True, num_fewshot=0, bootstrap_iters=0,
    )
    samples = sorted(results["samples"][job["task_name"]], key=lambda s: s["doc_id"])
    write_result(job, {
        "generate_s": sum(generate_s),  # inside HFLM.generate_until: tokenization, batching, generation, decoding
        "generate_cpu_s": sum(generate_cpu_s),
        "in_process_s": time.perf_counter() - started,
        "lm_eval_metrics": {k: v for k, v in results["results"][job["task_name"]].items() if isinstance(v, (int, float))},
        "outputs": [{"id": s["doc"]["id"], "prediction": s["filtered_resps"][0], "prompt": s["arguments"][0][0]}
                    for s in samples],
        "version": lm_eval.__version__,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
