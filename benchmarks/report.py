"""Targets, ratios and the Markdown of reports/bench/latest.md. Pure functions of the measured numbers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float  # user + system CPU of the process and its children (every side here computes on one thread)

    def on(self, basis: str) -> float:
        return self.cpu_s if basis == "cpu" else self.wall_s


@dataclass(frozen=True)
class Check:
    """One ratio against its target: `at_most` (ours / reference <= target) or `at_least` (a speedup,
    reference / ours >= target), judged on `basis` ("cpu" or "wall"); the other basis is shown too."""

    name: str
    ours: Timing
    reference_name: str
    reference: Timing
    target: float
    kind: str  # "at_most" | "at_least"
    basis: str = "cpu"

    def ratio_on(self, basis: str) -> float:
        ours, reference = self.ours.on(basis), self.reference.on(basis)
        if self.kind == "at_least":
            return reference / ours if ours > 0 else float("inf")
        return ours / reference if reference > 0 else float("inf")

    @property
    def ratio(self) -> float:
        return self.ratio_on(self.basis)

    @property
    def met(self) -> bool:
        return self.ratio <= self.target if self.kind == "at_most" else self.ratio >= self.target

    @property
    def target_text(self) -> str:
        return f"≤ {self.target:g}×" if self.kind == "at_most" else f"≥ {self.target:g}×"


def seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def both(timing: Timing) -> str:
    return f"{seconds(timing.cpu_s)} / {seconds(timing.wall_s)}"


def summary_table(checks: list[Check]) -> list[str]:
    lines = ["| benchmark | quantgate CPU / wall | reference: CPU / wall | ratio, CPU | ratio, wall | target | met |",
             "|---|---:|---:|---:|---:|---:|:---:|"]
    for c in checks:
        cpu, wall = (f"**{r:.2f}×**" if c.basis == basis else f"{r:.2f}×"
                     for basis, r in (("cpu", c.ratio_on("cpu")), ("wall", c.ratio_on("wall"))))
        lines.append(f"| {c.name} | {both(c.ours)} | {c.reference_name}: {both(c.reference)} | {cpu} | {wall} | "
                     f"{c.target_text} ({c.basis}) | {'yes' if c.met else '**no**'} |")
    return lines


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def render(title: str, blocks: list[tuple[str, list[str]]]) -> str:
    """`# title`, then each (heading, lines) block as a `##` section; an empty heading means no heading."""
    out = [f"# {title}", ""]
    for heading, lines in blocks:
        if heading:
            out += [f"## {heading}", ""]
        out += lines + [""]
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------- reports/bench/latest.md

VERSIONS = ("torch", "transformers", "lm_eval", "gptqmodel", "datasets", "tokenizers", "accelerate", "numpy")


def build_report(args, eval_run, profile, cache_run, quantize_runs, load_before, load_after, total_s: float,
                 measured_at: str, machine: dict | None = None, kept: dict | None = None) -> tuple[str, list[Check]]:
    """The Markdown and the checks, from run.py's arguments and the results of the steps that ran."""
    checks = make_checks(eval_run, cache_run, quantize_runs)
    blocks: list[tuple[str, list[str]]] = [("", [
        f"Measured {measured_at} by `benchmarks/run.py{' --quick' if args.quick else ''}` in "
        f"{total_s / 60:.1f} min, all on one machine, minutes apart. Times are CPU / wall seconds. Every process "
        "here computes on one thread, so on an idle machine CPU ≈ wall; on this shared machine other jobs "
        "inflate wall times, so the targets are judged on CPU time, except the cache's, which is about waiting. "
        "The judged ratio is in bold.", "", *summary_table(checks)])]
    misses = miss_notes(checks, eval_run, profile, quantize_runs)
    if misses:
        blocks.append(("Where targets are missed, and why", misses))
    blocks.append(("Machine and settings", machine_lines(args, load_before, load_after, machine, kept)))
    if eval_run:
        blocks.append(("1-2. Evaluation: quantgate vs lm-evaluation-harness vs a bare generate loop", eval_lines(eval_run)))
    if profile:
        blocks.append(("Where quantgate's evaluation time goes", profile_lines(profile, args.profile_items)))
    if cache_run:
        blocks.append(("3. Cache", cache_lines(cache_run)))
    if quantize_runs:
        blocks.append(("4. Quantization", quantize_lines(quantize_runs)))
    return render("quantgate benchmarks", blocks), checks


def make_checks(e, cache_run, quantize_runs) -> list[Check]:
    checks = []
    if e:
        qg = Timing(e.quantgate.wall_s, e.quantgate.cpu_s)
        checks.append(Check("1. evaluation, end to end (vs lm-eval, same batch size)", qg, "lm-eval",
                            Timing(e.lm_eval.wall_s, e.lm_eval.cpu_s), 0.67, "at_most"))
        if e.lm_eval_default:
            checks.append(Check("1b. evaluation, end to end (vs lm-eval at its default batch size, 1)", qg,
                                "lm-eval batch 1", Timing(e.lm_eval_default.wall_s, e.lm_eval_default.cpu_s),
                                0.67, "at_most"))
        checks.append(Check("2. overhead: generation loop (vs bare `model.generate`)",
                            Timing(e.quantgate.generate_s, e.quantgate.generate_cpu_s), "bare loop",
                            Timing(e.bare.generate_s, e.bare.generate_cpu_s), 1.05, "at_most"))
    if cache_run:
        checks.append(Check("3. cache: unchanged repeat (speedup over cold)",
                            Timing(cache_run.warm_s, cache_run.warm_cpu_s), "cold run",
                            Timing(cache_run.cold_s, cache_run.cold_cpu_s), 20, "at_least", basis="wall"))
    for q in quantize_runs:
        checks.append(Check(f"4. quantize {q.format} (vs GPTQModel direct)",
                            Timing(q.quantgate_stage_s, q.quantgate_stage_cpu_s), "direct",
                            Timing(q.direct_s, q.direct_cpu_s), 1.1, "at_most"))
    return checks


def miss_notes(checks: list[Check], e, profile: dict[str, float] | None, quantize_runs) -> list[str]:
    """One paragraph per missed target (and the context of target 1), from the numbers of this run."""
    notes = []
    missed = {c.name.split(".")[0] for c in checks if not c.met}
    if e and missed & {"1", "1b"}:
        q, lm, bare = e.quantgate, e.lm_eval, e.bare
        generation = {k: v for k, v in (profile or {}).items() if k.startswith("generation")}
        forward = generation.get("generation: model forward (transformers/torch)", 0.0)
        share = (f" The py-spy profile below puts {100 * forward / sum(generation.values()):.1f}% of quantgate's "
                 "generation time inside the model's forward pass." if generation else "")
        notes.append(
            f"- **1. vs lm-eval at the same batch size ({e.batch_size})**: quantgate's generation loop takes "
            f"{q.generate_cpu_s / bare.generate_cpu_s:.2f}× the CPU time of the bare `model.generate` loop and "
            f"{q.generate_cpu_s / lm.generate_cpu_s:.2f}× lm-eval's. Both tools run the same transformers `generate` "
            "over the same longest-first batches (lm-eval's Collator sorts by length as well), so generation, "
            f"{100 * q.generate_cpu_s / q.cpu_s:.0f}% of quantgate's CPU time here, cannot differ by harness work."
            f"{share} What is left is fixed cost: {q.cpu_s - q.generate_cpu_s:.1f} s CPU for quantgate (two "
            "processes that each import torch and transformers: the CLI renders the prompts through the chat "
            "template, the per-format worker that DESIGN.md asks for loads the model) against "
            f"{lm.cpu_s - lm.generate_cpu_s:.1f} s for lm-eval; even at zero it would give "
            f"{q.generate_cpu_s / lm.cpu_s:.2f}×. Reaching 0.67× at equal batch size needs generation itself 1.5× "
            "faster than `model.generate` (another engine, e.g. vLLM, or a compiled static-cache decode): a change "
            "of engine and numerics, not of harness overhead.")
        if e.lm_eval_default:
            one = e.lm_eval_default
            differ = e.items - e.same_as_quantgate[one.name]
            notes.append(
                f"- **1b. vs lm-eval at its default batch size (1)**: {q.cpu_s / one.cpu_s:.2f}× CPU "
                f"({q.wall_s / one.wall_s:.2f}× wall); batching is worth {one.generate_cpu_s / q.generate_cpu_s:.2f}× "
                "on generation on this CPU." + (
                    f" Its outputs differ from the batched ones on {differ}/{e.items} items: in bf16 a padded batch "
                    "runs matmuls of other shapes whose last-bit rounding can flip a near-tie greedy token "
                    "(tests/test_batching.py asserts batched == unbatched in float32)." if differ else ""))
    if e and "2" in missed:
        notes.append(f"- **2. overhead**: {e.quantgate.generate_cpu_s - e.bare.generate_cpu_s:.1f} s CPU over the bare "
                     f"loop's {e.bare.generate_cpu_s:.1f} s; see the profile for where quantgate's generation time goes.")
    for q in quantize_runs:
        if q.quantgate_stage_cpu_s > 1.1 * q.direct_cpu_s:
            notes.append(f"- **4. {q.format}**: GPTQModel's load/quantize/save took {q.quantgate_inner_s:.1f} s (wall) in "
                         f"quantgate's worker and {q.direct_inner_s:.1f} s directly; the rest of the stage "
                         f"({q.quantgate_stage_s - q.quantgate_inner_s:.1f} s vs {q.direct_s - q.direct_inner_s:.1f} s) "
                         "is process start-up and, for quantgate, sealing the artifact.")
    return notes


def machine_facts(threads: int) -> dict:
    """What the report says of the machine and software, taken when the bench measures (saved with the results, so
    a report rendered later, or a section kept from an earlier run, names the machine that measured it)."""
    import platform

    from harness import __version__
    from harness.quantize.base import package_versions
    from harness.runtime.device import device_info

    info = device_info(threads)
    return {"name": info["name"], "cores": info.get("cores", "?"),
            "memory_gib": round(info.get("total_memory_bytes", 0) / 2**30), "platform": platform.platform(),
            "versions": f"quantgate {__version__}, python {platform.python_version()}, "
                        + ", ".join(f"{k} {v}" for k, v in package_versions(*VERSIONS).items())}


def machine_lines(args, load_before, load_after, machine: dict | None, kept: dict | None = None) -> list[str]:
    """The machine and settings; `kept` ({"machine", "args", "steps"}): those of the earlier run whose sections this
    report keeps, whose settings lines (benchmarks 1-4) are its own."""
    busy = max(load_before[0], load_after[0]) > 1.5
    unrecorded = "not recorded (saved before the bench recorded its machine)"

    def described(facts: dict | None, label: str) -> list[str]:
        return [(f"- machine{label}: {facts['name']}, {facts['cores']} cores, {facts['memory_gib']} GiB RAM; "
                 f"{facts['platform']}" if facts else f"- machine{label}: {unrecorded}"),
                f"- versions{label}: {facts['versions'] if facts else unrecorded}"]

    settings = kept["args"] if kept else args
    lines = described(machine, " of this run" if kept else "")
    if kept:
        lines += described(kept.get("machine"), f" of the kept sections ({', '.join(kept['steps'])})")
    return lines + [
        f"- load average (1 min) at start {load_before[0]:.2f}, at end {load_after[0]:.2f}"
        + (" — **the machine was busy with other work: wall times are inflated, CPU times much less**" if busy else ""),
        f"- threads: {settings.threads} torch thread(s) in every process; batch size {settings.batch_size} on every "
        "side",
        f"- benchmarks 1-2: {settings.items} items of benchmarks/shared_evalsets/squad_200.toml, each side run "
        f"{settings.repeats} time(s) (best time of each kind counts), lm-eval at batch size 1 once",
        f"- benchmarks 3-4: `--max-items {settings.cache_items} --calibration-samples {settings.calibration_samples}` "
        f"(3 also `--latency-requests {settings.latency_requests}`)",
    ]


def eval_lines(e) -> list[str]:
    sides = [s for s in (e.quantgate, e.lm_eval, e.bare, e.lm_eval_default) if s is not None]
    rows = [[s.name, both(Timing(s.wall_s, s.cpu_s)), both(Timing(s.generate_s, s.generate_cpu_s)),
             seconds(s.cpu_s - s.generate_cpu_s), f"{s.scores['em']:.2f}", f"{s.scores['f1']:.2f}",
             "-" if s is e.quantgate else f"{e.same_as_quantgate[s.name]}/{e.items}",
             "; ".join(f"{c:.0f}/{w:.0f} ({gc:.0f}/{g:.0f})" for c, w, gc, g in s.extra["runs"])] for s in sides]
    lm_em = e.lm_eval.extra["lm_eval_metrics"].get("exact_match,none")
    lines = [
        f"{e.items} SQuAD items, demo checkpoint in {e.dtype}, greedy, max_new_tokens {e.max_new_tokens}, batch size "
        f"{e.batch_size}, every side in its own process. lm-eval {e.lm_eval.extra['version']} builds its prompts "
        "itself (task YAML over the same JSONL, `apply_chat_template=True`): "
        f"{e.prompts_identical}/{e.items} prompt texts are identical to quantgate's.",
        "",
        *table(["side", "process, CPU / wall", "generation, CPU / wall", "CPU outside generation", "EM", "F1",
                "same text as quantgate", "every run: CPU/wall (generation CPU/wall), s"], rows),
        "",
        "- *process*: process start to exit as the parent saw it (imports, model load, data, prompts, generation, "
        "scoring; for quantgate its worker subprocess too), CPU time including subprocesses. *generation*: "
        "quantgate's generate stage (`wall_s`, `cpu_s` of its result); lm-eval's time inside "
        "`HFLM.generate_until`; the bare loop's `model.generate` calls. Each is the best over the side's runs, "
        "which ran round robin (quantgate, lm-eval, bare loop, then again); every run of a side generated the "
        "same texts.",
        "- EM/F1 are quantgate's SQuAD metrics (harness.metrics.qa) on each side's outputs.",
    ]
    differ = e.items - e.same_as_quantgate["lm-eval"]
    if differ:
        lines.append(f"- {differ}/{e.items} lm-eval outputs differ from quantgate's at the same batch size: lm-eval "
                     "breaks ties between prompts of equal token length by prompt text, quantgate (and the bare loop) "
                     "by item order, so such items can sit in another batch, next to other padding, and bf16 "
                     "rounding of other matmul shapes can flip a near-tie greedy token. The scores above show what "
                     "that does to EM/F1.")
    if lm_em is not None:
        lines.append(f"- lm-eval's own `exact_match` on its outputs is {100 * lm_em:.1f}: it compares the raw string "
                     "with the first gold answer (no lowercasing, punctuation or article stripping, one reference), so "
                     "it is not the SQuAD number.")
    return lines


def profile_lines(profile: dict[str, float], items: int) -> list[str]:
    total = sum(profile.values())
    rows = [[name, seconds(value), f"{100 * value / total:.1f}%"] for name, value in profile.items()]
    return [
        f"quantgate's side once more on {items} items under py-spy (100 Hz, the side's process and its worker): "
        "seconds of samples of running threads (a thread in a timed wait still counts; a process blocked on its "
        "child does not). Run after the timed runs: sampling slows what it samples.",
        "",
        *table(["category", "seconds", "share"], rows),
    ]


def cache_lines(c) -> list[str]:
    recomputed = {k: v for k, v in c.warm_stages_run.items() if v}
    return [
        f"`quantgate {' '.join(c.args)}` twice with one fresh cache (only the converted demo checkpoint linked in): "
        f"cold {seconds(c.cold_s)} wall ({seconds(c.cold_cpu_s)} CPU), repeat {seconds(c.warm_s)} wall "
        f"({seconds(c.warm_cpu_s)} CPU) → **{c.cold_s / c.warm_s:.0f}× faster**. The cold run does what a first run "
        "in a fresh cache does: fingerprint the checkpoint, quantize int8, GPTQ and AWQ (GPTQModel JIT-builds its "
        "CPU packing kernel once per cache), measure and generate for every format. "
        + ("The repeat recomputed no stage: it checked the cached artifacts' hashes, rendered the prompts, scored "
           "the cached outputs and wrote the reports." if not recomputed else f"The repeat recomputed stages: {recomputed}."),
    ]


def quantize_lines(runs) -> list[str]:
    rows = [[q.format, str(q.calibration_texts), both(Timing(q.quantgate_stage_s, q.quantgate_stage_cpu_s)),
             both(Timing(q.direct_s, q.direct_cpu_s)), f"{q.quantgate_stage_cpu_s / q.direct_cpu_s:.2f}×",
             f"{q.quantgate_stage_s / q.direct_s:.2f}×", seconds(q.quantgate_inner_s), seconds(q.direct_inner_s)]
            for q in runs]
    return [
        *table(["format", "calibration texts", "quantgate stage, CPU / wall", "GPTQModel direct, CPU / wall",
                "ratio, CPU", "ratio, wall", "quantgate: GPTQModel calls, wall", "direct: GPTQModel calls, wall"], rows),
        "",
        "- *quantgate stage*: `harness.artifacts.ensure_artifact` with the cache off, as `quantgate run` calls it "
        "(calibration file, quantize worker process with its imports, GPTQModel, sealing the artifact), in the cache "
        "benchmark 3 left, whose cold run already built GPTQModel's CPU packing kernel. *GPTQModel direct*: right "
        "after it, a process that imports GPTQModel and calls load/quantize/save with the recipe from the artifact's "
        "manifest, the same calibration texts, backend, thread count, and the exact environment quantgate gives its "
        "worker. The last two columns: GPTQModel's import + load/quantize/save timed inside each process.",
    ]
