"""RSS of a checkpoint's process as it generates at a new prompt length each time, then at lengths it has seen.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/rss_per_shape.py CHECKPOINT_DIR [bfloat16|float32]

Prints one line per generate call: the prompt length and the RSS after it (MiB). Memory that rises with every new
length and not when lengths repeat is a cache per input shape, not a leak per request. The README's note on the
demo's int8 memory comes from this script on the int8 artifact in the quantgate cache.
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def main(path: str, dtype: str = "bfloat16") -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, device_map="cpu", dtype=getattr(torch, dtype))
    print(f"loaded: {rss_mib():,.0f} MiB", flush=True)
    lengths = [50 + 37 * i for i in range(12)]
    for length in lengths + lengths[:6]:  # twelve new lengths, then six seen before
        ids = torch.randint(100, 10_000, (4, length))
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
        print(f"prompt length {length:>4}: {rss_mib():,.0f} MiB", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
