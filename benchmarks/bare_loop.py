"""The floor: a bare loop of `model.generate` over the same batches, `python -m benchmarks.bare_loop JOB`.

Nothing but transformers: the same rendered prompts, tokenized the same way, sorted longest first into the same
batches, left-padded, greedy, the same max_new_tokens, the same dtype and thread count. No timing hooks, no
progress, no result files until the loop is done.
"""

from __future__ import annotations

import sys
import time

from benchmarks.common import read_job, write_result


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    job = read_job(argv)
    import torch

    torch.set_num_threads(int(job["threads"]))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(job["model_path"])
    model = AutoModelForCausalLM.from_pretrained(job["model_path"], dtype=getattr(torch, job["dtype"])).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = [p["text"] for p in job["prompts"]]
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))
    size = int(job["batch_size"])
    new_tokens: list[list[int]] = [[] for _ in ids]
    loop_started, loop_cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for start in range(0, len(order), size):
            batch = order[start:start + size]
            width = max(len(ids[i]) for i in batch)
            input_ids = torch.tensor([[pad] * (width - len(ids[i])) + ids[i] for i in batch])
            attention = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in batch])
            output = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=False,
                                    max_new_tokens=int(job["max_new_tokens"]), pad_token_id=pad)
            for i, row in zip(batch, output[:, width:].tolist()):
                new_tokens[i] = row
    loop_s, loop_cpu_s = time.perf_counter() - loop_started, time.process_time() - loop_cpu
    eos = tokenizer.eos_token_id
    texts = [tokenizer.decode(row[:row.index(eos)] if eos in row else row, skip_special_tokens=True).strip()
             for row in new_tokens]
    write_result(job, {"generate_s": loop_s, "generate_cpu_s": loop_cpu_s, "in_process_s": time.perf_counter() - started,
                       "outputs": [{"id": p["id"], "prediction": t} for p, t in zip(job["prompts"], texts)]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
