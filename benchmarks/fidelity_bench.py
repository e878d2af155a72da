"""6: calibration of the fidelity rule. How large a KL / how low a top-1 agreement goes with a task drop of one
margin? A ladder of formats of growing damage from the demo model (int8, GPTQ 8-bit, GPTQ and AWQ 4-bit, GPTQ
3-bit; the two extra GPTQ rungs quantized with GPTQModel directly and judged as --candidate) is run through
`quantgate run` on the public sets in ../shared/data (SQuAD, CMRC 2018, CNN/DailyMail), and for every rung and set
the fidelity figures are put beside the gated task metric's paired delta.

The relation is fitted through the origin over every (rung, set): drop in margins = b x KL (and = c x (100 -
agreement)); the KL at which the fitted drop reaches one margin is 1 / b. The policy's defaults (harness.policy
DEFAULT_MAX_KL, DEFAULT_MIN_TOP1_AGREEMENT) should sit at or below that, and no rung whose KL interval lies
below max_kl may have a task interval wholly below -margin: both are in the table this writes
(reports/bench/fidelity.md, docs/fidelity.md quotes it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, child_env, demo_cache, run_child, say

SETS = ("squad_200", "cmrc_200", "cnndm_summeval_100")
BUILT_IN = ("int8", "gptq", "awq")
GPTQ_BITS = (8, 3)  # the extra rungs, GPTQ with group 64 like the built-in 4-bit
SHARED = ROOT.parent / "shared" / "data"


def run_fidelity_bench(demo: Path, work: Path, items: int, calibration_samples: int, threads: int,
                       batch_size: int) -> dict | None:
    if not SHARED.is_dir():
        say(f"fidelity: {SHARED} is not present; skipped")
        return None
    from harness.calibration import choose_calibration
    from harness.quantize.base import Recipe

    cache = demo_cache(work / "cache", demo)
    env = dict(child_env(), QUANTGATE_CACHE=str(cache))
    from harness.launcher import set_gptqmodel_cpu_workers

    quantize_env = dict(env)
    set_gptqmodel_cpu_workers(quantize_env)  # as quantgate's own quantize workers get it
    texts = list(choose_calibration(None, [], calibration_samples).texts)
    calibration_path = work / "calibration.json"
    calibration_path.write_text(json.dumps(texts), encoding="utf-8")
    started = time.time()
    candidates = []
    for bits in GPTQ_BITS:
        out = work / f"gptq{bits}"
        if not (out / "config.json").is_file():
            say(f"fidelity: quantizing GPTQ {bits}-bit group 64 with GPTQModel ({len(texts)} calibration texts)")
            recipe = Recipe("gptq", bits=bits, group_size=64, calibration_samples=len(texts), seed=0)
            run_child("benchmarks.gptqmodel_direct", {"recipe": recipe.as_dict(), "source_path": str(demo),
                                                      "calibration_path": str(calibration_path),
                                                      "out_dir": str(out), "threads": threads},
                      work / f"quantize-{bits}", base_env=quantize_env)
        candidates += ["--candidate", f"gptq{bits}bit={out}"]
    run_dir = work / "run"
    command = [sys.executable, "-m", "harness", "run", "--model", "demo", "--formats", ",".join(("baseline",) + BUILT_IN),
               *candidates, "--evalsets", *(str(ROOT / "benchmarks" / "shared_evalsets" / f"{s}.toml") for s in SETS),
               "--allow-outside-paths", "--max-items", str(items), "--batch-size", str(batch_size),
               "--threads", str(threads),
               "--calibration-samples", str(calibration_samples), "--latency-requests", "2", "--out", str(run_dir)]
    say(f"fidelity: quantgate run on the ladder, {items} items per set ({' '.join(command[3:])})")
    with open(work / "run.log", "w", encoding="utf-8") as log:
        code = subprocess.call(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if code not in (0, 1):
        raise RuntimeError(f"quantgate run exited with {code}; see {work / 'run.log'}")
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    rows = ladder_rows(report)
    return {"rows": rows, "fit": fit(rows), "items": items, "calibration_samples": calibration_samples,
            "command": " ".join(["quantgate", *command[3:]]), "wall_s": time.time() - started,
            "device": report.get("device", {}).get("name"), "compute_dtype": report["formats"]["baseline"].get(
                "compute_dtype")}


def ladder_rows(report: dict) -> list[dict]:
    """One row per candidate and evalset: fidelity with its interval, the gated metric's delta with its interval."""
    rows = []
    for name, fmt in report["formats"].items():
        if fmt["role"] != "candidate" or fmt["status"] != "ok":
            continue
        for evalset, entry in (fmt.get("fidelity") or {}).items():
            if not entry.get("kl"):
                continue
            for metric, score in fmt["scores"].get(evalset, {}).items():
                if not score["gated"] or score["delta"] is None:
                    continue
                rows.append({"format": name, "evalset": evalset, "metric": metric, "kl": entry["kl"],
                             "top1_agreement": entry["top1_agreement"], "items": entry["items"],
                             "delta": score["delta"], "ci_low": score["ci_low"], "ci_high": score["ci_high"],
                             "margin": score["margin"]})
    return rows


def fit(rows: list[dict]) -> dict:
    """Least squares through the origin of the drop in margins on KL and on disagreement; the KL and agreement at
    which the fitted drop is one margin."""
    points = [(r["kl"]["value"], 100 - r["top1_agreement"]["value"], -r["delta"] / r["margin"]) for r in rows
              if r["margin"]]
    if not points:
        return {}
    slope_kl = sum(k * d for k, _, d in points) / max(sum(k * k for k, _, _ in points), 1e-12)
    slope_dis = sum(a * d for _, a, d in points) / max(sum(a * a for _, a, _ in points), 1e-12)
    return {"points": len(points), "drop_per_nat": slope_kl, "drop_per_point_disagreement": slope_dis,
            "kl_at_margin": 1 / slope_kl if slope_kl > 0 else None,
            "agreement_at_margin": 100 - 1 / slope_dis if slope_dis > 0 else None}


def render_fidelity_bench(result: dict | None) -> list[str]:
    if not result:
        return []
    from harness.policy import DEFAULT_MAX_KL, DEFAULT_MIN_TOP1_AGREEMENT

    lines = ["## 6. Fidelity calibration: KL and top-1 agreement against task drops", "",
             f"`{result['command']}` ({result['items']} items per set, {result['device']}, baseline in "
             f"{result['compute_dtype']}; {result['wall_s'] / 60:.0f} min). Drop = −delta / margin of the set's "
             "gated metric (1.0 = one margin).", "",
             "| format | evalset | KL nats/token [95% CI] | top-1 % [95% CI] | gated metric | delta [95% CI] | "
             "drop in margins |", "|---|---|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: (r["kl"]["value"], r["evalset"])):
        kl, agree = r["kl"], r["top1_agreement"]
        lines.append(f"| {r['format']} | {r['evalset']} | {kl['value']:.4f} [{kl['ci_low']:.4f}, {kl['ci_high']:.4f}] "
                     f"| {agree['value']:.1f} [{agree['ci_low']:.1f}, {agree['ci_high']:.1f}] | {r['metric']} | "
                     f"{r['delta']:+.1f} [{r['ci_low']:+.1f}, {r['ci_high']:+.1f}] | "
                     f"{-r['delta'] / r['margin']:+.2f} |")
    f = result["fit"]
    if f:
        lines += ["", f"Fit through the origin over {f['points']} (rung, set) points: drop = {f['drop_per_nat']:.1f} "
                      f"margins per nat/token of KL, {f['drop_per_point_disagreement']:.2f} margins per point of "
                      "disagreement; one margin at KL "
                      + (f"{f['kl_at_margin']:.3f}" if f["kl_at_margin"] else "n/a") + " and agreement "
                      + (f"{f['agreement_at_margin']:.1f}%" if f["agreement_at_margin"] else "n/a")
                      + f". Policy defaults: max_kl {DEFAULT_MAX_KL}, min_top1_agreement {DEFAULT_MIN_TOP1_AGREEMENT}."]
        below = [r for r in result["rows"] if r["kl"]["ci_high"] <= DEFAULT_MAX_KL
                 and r["top1_agreement"]["ci_low"] >= DEFAULT_MIN_TOP1_AGREEMENT]
        worse = [r for r in below if r["ci_high"] is not None and r["ci_high"] < -r["margin"]]
        lines.append(f"Rows the fidelity rule passes at the defaults: {len(below)}; of those with a task interval "
                     f"wholly below −margin: {len(worse)}"
                     + (" (" + ", ".join(f"{r['format']}/{r['evalset']}" for r in worse) + ")" if worse else "") + ".")
    return lines


def main(argv: list[str]) -> int:
    """`python -m benchmarks.fidelity_bench --render RESULT.json`: the Markdown of a saved result."""
    result = json.loads(Path(argv[argv.index("--render") + 1]).read_text(encoding="utf-8"))
    print("\n".join(render_fidelity_bench(result)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main(sys.argv[1:]))
