"""Fidelity (harness.fidelity): the figures, their intervals, the verdict's fidelity rule, and the teacher-forced
measurement on real models (the baseline against itself, and a planted perturbation ladder)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_llama

from harness.decide import FormatOutcome, decide_format
from harness.errors import UserError
from harness.fidelity.summary import FidelityItem, summarize_fidelity
from harness.policy import Policy, policy_from_dict

# --- the per-position figures ----------------------------------------------------------------------


def _position_figures(base, fmt, k=4):
    import torch

    from harness.fidelity.teacher import position_figures

    base, fmt = torch.log_softmax(torch.tensor(base), -1), torch.log_softmax(torch.tensor(fmt), -1)
    values, indices = torch.topk(base, k, dim=-1)
    return position_figures(fmt, indices, values, indices[:, 0])


def test_identical_distributions_have_zero_kl_and_full_agreement():
    logits = np.random.default_rng(0).normal(size=(5, 10)).tolist()
    figures = _position_figures(logits, logits)
    assert figures["kl_sum"] == 0.0 and figures["agree"] == 5 and figures["first_flip"] is None


def test_top_k_kl_is_a_lower_bound_of_the_full_kl_and_grows_with_the_change():
    rng = np.random.default_rng(1)
    base = rng.normal(size=(20, 50))
    previous = 0.0
    for scale in (0.05, 0.2, 0.8):
        other = base + scale * rng.normal(size=base.shape)
        figures = _position_figures(base.tolist(), other.tolist(), k=8)
        p = np.exp(base - np.log(np.exp(base).sum(-1, keepdims=True)))
        q = np.exp(other - np.log(np.exp(other).sum(-1, keepdims=True)))
        full = float((p * (np.log(p) - np.log(q))).sum())
        assert 0 < figures["kl_sum"] <= full + 1e-6
        assert figures["kl_sum"] > previous
        previous = figures["kl_sum"]


def test_a_changed_top_token_is_a_flip_at_its_position():
    base = [[3.0, 0.0, 0.0], [3.0, 0.0, 0.0], [3.0, 0.0, 0.0]]
    fmt = [[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [3.0, 0.0, 0.0]]
    figures = _position_figures(base, fmt, k=3)
    assert figures["first_flip"] == 1 and figures["agree"] == 2


# --- intervals -----------------------------------------------------------------------------------


def _items(kls, tokens=20, agree=1.0):
    return {f"q{i}": FidelityItem(tokens, kl * tokens, agree * tokens) for i, kl in enumerate(kls)}


def test_identical_format_gives_a_zero_width_interval_at_zero():
    summary = summarize_fidelity(_items([0.0] * 30))
    assert (summary.kl.value, summary.kl.ci_low, summary.kl.ci_high) == (0.0, 0.0, 0.0)
    assert summary.top1_agreement.ci_low == 100.0 and summary.flipped_items == 0


def test_the_interval_holds_the_token_weighted_mean_and_clusters_widen_it():
    rng = np.random.default_rng(2)  # items of one cluster share most of their divergence
    kls = np.repeat(rng.gamma(2.0, 0.01, size=5), 8) + rng.gamma(2.0, 0.001, size=40)
    plain = summarize_fidelity(_items(kls))
    assert plain.kl.ci_low < plain.kl.value < plain.kl.ci_high and plain.kl.ci_low >= 0
    assert plain.kl.value == pytest.approx(float(np.mean(kls)))
    clustered = summarize_fidelity(_items(kls), {f"q{i}": f"c{i // 8}" for i in range(40)})
    assert clustered.clusters == 5 and clustered.kl.ci_high - clustered.kl.ci_low > plain.kl.ci_high - plain.kl.ci_low


# --- the verdict's fidelity rule -----------------------------------------------------------------


def _outcomes(n=30, f1_drop=0.0, kl=0.0, agree=1.0, spread=0.0):
    rng = np.random.default_rng(3)
    base = {f"q{i}": {"f1": 60.0 + 20 * (i % 3)} for i in range(n)}
    cand = {i: {"f1": row["f1"] - f1_drop + (spread * rng.normal() if spread else 0.0)} for i, row in base.items()}
    kls = np.full(n, kl) if np.isscalar(kl) else np.asarray(kl)
    fidelity = {"faq": {i: FidelityItem(20, float(k) * 20, agree * 20) for i, k in zip(base, kls)}}
    return (FormatOutcome("baseline", items={"faq": base}, gates={"faq": ["f1"]}),
            FormatOutcome("int8", items={"faq": cand}, gates={"faq": ["f1"]}, fidelity=fidelity))


def test_a_truly_identical_format_is_go_on_30_items_by_the_fidelity_rule():
    baseline, candidate = _outcomes()
    decision = decide_format(baseline, candidate, Policy())
    assert decision.verdict == "GO" and decision.rule == "fidelity"
    assert decision.reasons[0].startswith("GO by the fidelity rule")
    assert decision.fidelity["faq"]["status"] == "pass"


def test_the_same_evidence_without_fidelity_is_inconclusive():
    baseline, candidate = _outcomes()
    for policy in (Policy(), policy_from_dict({"fidelity": {"basis": "tasks"}}),
                   policy_from_dict({"fidelity": {"basis": "tasks_and_fidelity"}})):
        alone = decide_format(baseline, FormatOutcome("int8", items=candidate.items, gates=candidate.gates), policy)
        assert alone.verdict == "INCONCLUSIVE" and alone.rule == ""
    assert decide_format(baseline, candidate, policy_from_dict({"fidelity": {"basis": "tasks"}})).verdict \
        == "INCONCLUSIVE"
    assert decide_format(baseline, candidate, policy_from_dict({"fidelity": {"basis": "tasks_and_fidelity"}})
                         ).verdict == "INCONCLUSIVE"


def test_fidelity_clearly_beyond_the_limit_is_no_go_with_the_figures():
    baseline, candidate = _outcomes(kl=0.3, agree=0.8)
    decision = decide_format(baseline, candidate, Policy())
    assert decision.verdict == "NO-GO"
    assert any("faq/fidelity: KL 0.300" in r and "further from the baseline" in r for r in decision.reasons)


def test_too_few_items_or_a_straddling_interval_cannot_carry_a_go():
    baseline, candidate = _outcomes(n=10)
    assert decide_format(baseline, candidate, Policy()).verdict == "INCONCLUSIVE"
    from harness.policy import DEFAULT_MAX_KL

    kls = np.random.default_rng(4).gamma(1.0, DEFAULT_MAX_KL, size=30)  # mean about max_kl: straddles it
    baseline, candidate = _outcomes(kl=kls)
    decision = decide_format(baseline, candidate, Policy())
    assert decision.verdict == "INCONCLUSIVE" and "straddles" in decision.fidelity["faq"]["detail"]


def _planted_drop(seed: int, drop: float, spread: float):
    """The verdict on 35 items whose F1 drops by `drop` points with noise of `spread`, fidelity perfect."""
    rng = np.random.default_rng(seed)
    baseline = {f"q{i}": {"f1": float(rng.uniform(20, 100))} for i in range(35)}
    candidate = {i: {"f1": row["f1"] - drop + float(rng.normal(0, spread))} for i, row in baseline.items()}
    fidelity = {"faq": {i: FidelityItem(20, 0.0, 20) for i in baseline}}
    return decide_format(FormatOutcome("baseline", items={"faq": baseline}, gates={"faq": ["f1"]}),
                         FormatOutcome("fp8", items={"faq": candidate}, gates={"faq": ["f1"]}, fidelity=fidelity),
                         Policy())


def test_a_task_drop_beyond_the_margin_is_never_talked_over_by_fidelity():
    """A mean task drop past the margin keeps the verdict from GO whatever the fidelity figures say: planted drops
    of twice the margin, noisy enough that the task interval straddles, with perfect fidelity."""
    gone = 0
    for seed in range(40):
        decision = _planted_drop(seed, drop=4.0, spread=12.0)
        delta = decision.scores["faq"]["f1"]["delta"]
        if decision.verdict == "GO":
            assert delta >= -2.0, "GO with a mean drop past the margin"
        gone += delta < -2.0 and decision.verdict != "GO"
    assert gone > 10


def test_a_drop_the_task_interval_shows_to_be_real_is_never_talked_over_by_fidelity():
    """Fidelity is teacher-forced and vouches for the free-running output only up to its first departure; a task
    interval wholly below 0 says departures cost score, so with a mean drop inside the margin it still keeps the
    verdict from GO (Gemma 3 270M's CNN/DM, docs/fidelity.md): planted drops of 1.5 points against a 2-point margin,
    perfect fidelity."""
    held = 0
    for seed in range(30):
        decision = _planted_drop(seed, drop=1.5, spread=3.0)
        score = decision.scores["faq"]["f1"]
        assert decision.fidelity["faq"]["status"] == "pass"
        if score["ci_high"] < 0 and score["ci_low"] < -2.0 <= score["delta"]:
            held += 1
            assert decision.verdict == "INCONCLUSIVE", decision.reasons
            assert any("the drop is real: its interval lies wholly below 0" in r for r in decision.reasons)
            assert any("a drop its interval shows to be real" in r for r in decision.reasons)
        if decision.verdict == "GO":
            assert score["ci_high"] >= 0 or score["ci_low"] > -2.0, "fidelity talked over a real drop"
    assert held >= 5


@pytest.mark.parametrize("fidelity, message", [
    ({"max_kl": -0.1}, "fidelity.max_kl"),
    ({"max_kl": "0.05"}, "fidelity.max_kl"),
    ({"min_top1_agreement": 140.0}, "fidelity.min_top1_agreement"),
    ({"basis": "vibes"}, "fidelity.basis"),
    ({"max_kld": 0.1}, "unknown key 'fidelity.max_kld'"),
    ({"max_kl_for": {"en": float("nan")}}, "fidelity.max_kl_for.en"),
])
def test_a_fidelity_policy_that_cannot_mean_what_it_says_is_refused(fidelity, message):
    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        policy_from_dict({"fidelity": fidelity})


def test_per_language_and_per_evalset_limits_apply(tmp_path):
    from harness.policy import load_policy

    path = tmp_path / "policy.toml"
    path.write_text('[fidelity.max_kl_for]\nzh = 0.02\nen_faq = 0.2\n', encoding="utf-8")
    policy = load_policy(path, known_evalsets=["en_faq", "zh_faq"], known_languages=["en", "zh"])
    assert policy.fidelity.kl_limit("zh_faq", "zh") == 0.02 and policy.fidelity.kl_limit("en_faq", "en") == 0.2
    for key in ("fr", "cn"):  # a language no evalset of the run has would be ignored: refused
        path.write_text(f'[fidelity.max_kl_for]\n{key} = 0.02\n', encoding="utf-8")
        with pytest.raises(UserError, match=f"fidelity.max_kl_for.{key}.*languages: en, zh"):
            load_policy(path, known_evalsets=["en_faq", "zh_faq"], known_languages=["en", "zh"])
    path.write_text('[fidelity.max_kl_for]\nen_fqa = 0.2\n', encoding="utf-8")
    with pytest.raises(UserError, match="fidelity.max_kl_for.en_fqa.*did you mean 'en_faq'"):
        load_policy(path, known_evalsets=["en_faq", "zh_faq"])


# --- quantgate decide with fidelity ----------------------------------------------------------------


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_decide_takes_per_item_fidelity_and_names_the_rule(tmp_path, capsys):
    from harness.cli import main

    base = _write(tmp_path / "b.jsonl", [{"id": f"q{i}", "f1": 50.0 + i} for i in range(30)])
    rows = [{"id": f"q{i}", "f1": 50.0 + i,
             "fidelity": {"kl": 0.002 + 0.0001 * i, "top1_agreement": 99.0 - 0.1 * (i % 5), "tokens": 30}}
            for i in range(30)]
    cand = _write(tmp_path / "c.jsonl", rows)
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand)]) == 0
    out = capsys.readouterr().out
    assert "Verdict: GO (by the fidelity rule)" in out and "fidelity scores: pass" in out
    rows[7]["fidelity"]["kl"] = "0.004"
    _write(cand, rows)
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand)]) == 2
    assert "c.jsonl:8: field 'fidelity.kl': '0.004' is not a KL" in capsys.readouterr().err
    rows[7]["fidelity"] = {"kl": 0.004, "top1_agreement": 0.99, "tokens": 0}
    _write(cand, rows)
    assert main(["decide", "--baseline", str(base), "--candidate", str(cand)]) == 2
    assert "field 'fidelity.tokens'" in capsys.readouterr().err


# --- on real models ------------------------------------------------------------------------------


@pytest.mark.slow
def test_teacher_forced_ladder_on_real_models(tmp_path, demo_checkpoint):
    """The baseline against itself is exactly 0 / 100%; planted noise of growing size gives growing KL."""
    from harness.fidelity.summary import FidelityItem, summarize_fidelity
    from harness.fidelity.teacher import compare_to_reference, write_reference
    from harness.jobs import FidelityTask, GenerateItem, GenerateTask
    from harness.runtime.transformers_backend import LoadedModel
    from harness.worker import generate_evalset

    baseline = LoadedModel(tiny_llama(demo_checkpoint, tmp_path / "base"))
    prompts = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(6)]
    task = GenerateTask("faq", "k", 12, tuple(GenerateItem(f"q{i}", p) for i, p in enumerate(prompts)))
    generated = generate_evalset(baseline, task, baseline.encode, batch_size=3)
    assert all(o["token_ids"] and len(o["token_ids"]) >= o["new_tokens"] for o in generated["outputs"])
    (tmp_path / "gen.json").write_text(json.dumps(generated))
    reference = tmp_path / "ref.npz"
    write_reference(baseline, FidelityTask("faq", "r", "reference", str(reference), generation_path=str(tmp_path / "gen.json"),
                                           items=tuple((f"q{i}", tuple(baseline.encode(p))) for i, p in enumerate(prompts))), 32)

    def measured(model, name):
        out = tmp_path / f"{name}.json"
        compare_to_reference(model, FidelityTask("faq", name, "compare", str(reference), result_path=str(out)))
        items = {row["id"]: FidelityItem.from_json(row) for row in json.loads(out.read_text())["items"]}
        return summarize_fidelity(items)

    itself = measured(baseline, "self")
    assert itself.kl.value == 0.0 and itself.top1_agreement.value == 100.0 and itself.flipped_items == 0
    assert itself.positions == sum(len(o["token_ids"]) for o in generated["outputs"])
    kls = [measured(LoadedModel(tiny_llama(demo_checkpoint, tmp_path / f"n{noise}", noise)), f"n{noise}").kl.value
           for noise in (0.02, 0.1, 0.4)]
    assert 0 < kls[0] < kls[1] < kls[2], kls


def test_a_held_back_fidelity_rule_says_what_held_it_back():
    baseline, candidate = _outcomes(n=30, f1_drop=3.0, spread=12.0)
    decision = decide_format(baseline, candidate, Policy())
    assert decision.verdict == "INCONCLUSIVE" and decision.fidelity["faq"]["status"] == "pass"
    assert decision.reasons[-1].startswith("fidelity holds on every gated evalset, but the fidelity rule cannot "
                                           "carry a GO past faq/f1")


# --- batched teacher forcing (issue #42 item 6) ---------------------------------------------------


class _TinyRuntime:
    """tests/conftest.py tiny_llama's model (same shape, seeding and sharpening) with a small vocabulary, in memory,
    behind the transformers backend's own next_token_logprobs: no checkpoint or tokenizer needed."""

    def __init__(self, noise: float = 0.0):
        import types

        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from harness.runtime.transformers_backend import LoadedModel

        config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        torch.manual_seed(0)
        self.model = LlamaForCausalLM(config).eval()
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for parameter in self.model.parameters():
                parameter.mul_(4.0)
                parameter.add_(noise * parameter.std() * torch.randn(parameter.shape, generator=generator))
        self.device = torch.device("cpu")
        self.tokenizer = types.SimpleNamespace(pad_token_id=0)
        self.next_token_logprobs = types.MethodType(LoadedModel.next_token_logprobs, self)


def _fidelity_figures(tmp_path, base, fmt, batch_size, name):
    from harness.fidelity.teacher import compare_to_reference, write_reference
    from harness.jobs import FidelityTask

    rng = np.random.default_rng(7)
    shared = rng.integers(1, 512, size=40).tolist()  # an instruction every prompt starts with: run once a batch
    prompts = {f"q{i}": shared + rng.integers(1, 512, size=int(rng.integers(1, 40))).tolist() for i in range(9)}
    outputs = [{"id": i, "token_ids": rng.integers(1, 512, size=int(rng.integers(2, 24))).tolist()} for i in prompts]
    outputs[3]["token_ids"] = []  # an item without a continuation is left out on both sides
    (tmp_path / "gen.json").write_text(json.dumps({"outputs": outputs}))
    reference = tmp_path / f"ref-{name}.npz"
    write_reference(base, FidelityTask("faq", "r", "reference", str(reference), generation_path=str(tmp_path / "gen.json"),
                                       items=tuple((i, tuple(p)) for i, p in prompts.items())), 32, batch_size)
    out = tmp_path / f"{name}.json"
    compare_to_reference(fmt, FidelityTask("faq", name, "compare", str(reference), result_path=str(out)), batch_size)
    return {row["id"]: row for row in json.loads(out.read_text())["items"]}


def test_batched_teacher_forcing_moves_the_figures_by_float_noise_only(tmp_path, monkeypatch):
    """Left-padded batches of mixed lengths, their shared prompt prefix run once, give each item the KL, agreement
    and first flip of batch 1 (KL within 1e-4 relative); the baseline against itself stays exactly 0 when batched;
    a logits budget that splits the batches changes nothing either."""
    import harness.fidelity.teacher as teacher

    base, noisy = _TinyRuntime(), _TinyRuntime(noise=0.1)
    assert teacher.shared_prefix(base.model, [([5] * 50 + [1, 2], 51), ([5] * 50 + [3], 50)]) == 49
    assert teacher.shared_prefix(base.model, [([5] * 20 + [1, 2], 21), ([5] * 20 + [3], 20)]) == 0  # too short to pay
    single = _fidelity_figures(tmp_path, base, noisy, 1, "single")
    batched = _fidelity_figures(tmp_path, base, noisy, 4, "batched")
    assert sorted(single) == sorted(batched) and len(single) == 8 and "q3" not in single
    for item_id, row in single.items():
        other = batched[item_id]
        assert row["positions"] == other["positions"] and row["kl_sum"] > 0
        assert other["kl_sum"] == pytest.approx(row["kl_sum"], rel=1e-4)
        assert (other["agree"], other["first_flip"]) == (row["agree"], row["first_flip"])
        assert other["target_logprob_sum"] == pytest.approx(row["target_logprob_sum"], rel=1e-4)
    itself = _fidelity_figures(tmp_path, base, base, 4, "self")
    assert all(row["kl_sum"] == 0.0 and row["agree"] == row["positions"] for row in itself.values())
    monkeypatch.setattr(teacher, "LOGITS_BYTES", 3 * 30 * 512 * 4)  # about 3 items a batch here
    split = _fidelity_figures(tmp_path, base, noisy, 8, "split")
    for item_id, row in single.items():
        assert split[item_id]["kl_sum"] == pytest.approx(row["kl_sum"], rel=1e-4)


# --- decoys: damage confined to a narrow kind of token (issue #42 item 3) ----------------------------


def _numeric_answer_items(rng, answer_kl, n=30, tokens=60):
    """Items whose answer holds one numeric token among `tokens`: background KL of a close format everywhere, and
    answer_kl at the number's position."""
    items = {}
    for i in range(n):
        by_position = list(rng.gamma(2.0, 0.0025, size=tokens))
        by_position[int(rng.integers(5, tokens))] = answer_kl
        items[f"q{i}"] = FidelityItem(tokens, float(sum(by_position)), tokens - (answer_kl > 1.0) - (i % 3 == 0),
                                      first_flip=None, kl_by_position=tuple(by_position))
    return items


def test_a_decoy_that_breaks_only_the_numbers_is_not_passed_by_the_mean():
    """Every numeric answer confidently wrong (2 nats at its one position), a close format elsewhere: the mean KL
    (about 0.04) and agreement (about 98%) are within the limits on 30 items, which the mean alone passed; the tail
    condition holds the pass back. A close format's figures still pass, and so do the decoy's where the per-position
    figures are unknown (quantgate decide input), the limit docs/fidelity.md names."""
    from harness.fidelity.rule import judge_fidelity
    from harness.policy import FidelityRule

    policy = Policy(fidelity=FidelityRule(max_kl=0.05))  # a limit the decoy's mean passes: the tail must catch it
    decoy = _numeric_answer_items(np.random.default_rng(8), answer_kl=2.0)
    judgment = judge_fidelity("faq", decoy, policy)
    assert judgment.summary.kl.ci_high < 0.05 and judgment.summary.top1_agreement.ci_low > 90.0
    assert judgment.status == "inconclusive" and "30 of its 30 items" in judgment.detail
    assert "confidently off the baseline's token" in judgment.detail
    close = _numeric_answer_items(np.random.default_rng(8), answer_kl=0.3)
    assert judge_fidelity("faq", close, policy).status == "pass"
    bare = {i: FidelityItem(item.positions, item.kl_sum, item.agree) for i, item in decoy.items()}
    assert judge_fidelity("faq", bare, policy).status == "pass"
    baseline = {i: {"f1": 60.0 + 20 * (k % 3)} for k, i in enumerate(decoy)}
    rng = np.random.default_rng(9)  # a small F1 loss on each item, noisy: the task interval straddles the margin
    candidate = {i: {"f1": row["f1"] - 1.0 + float(rng.normal(0, 8))} for i, row in baseline.items()}
    decision = decide_format(FormatOutcome("baseline", items={"faq": baseline}, gates={"faq": ["f1"]}),
                             FormatOutcome("decoy", items={"faq": candidate}, gates={"faq": ["f1"]},
                                           fidelity={"faq": decoy}), policy)
    assert decision.verdict != "GO", decision.reasons


def test_a_tiny_model_whose_digit_logits_are_damaged_is_not_go_on_numeric_answers():
    """tiny_llama's model with the lm_head rows of ten 'digit' tokens (the ten it most often puts first) scaled by
    0.7: on the 5 items whose answer is one of those tokens, fidelity says KL 0.071 [0.056, 0.100], agreement 88%
    (past max_kl, not diluted: in a small random model those tokens lead at 13% of all positions) and the verdict is
    NO-GO; the task metric (exact match of the answer token) falls on every one of them."""
    from collections import Counter

    import torch

    from harness.fidelity.teacher import position_figures, teacher_forced_logprobs

    base, decoy = _TinyRuntime(), _TinyRuntime()
    rng = np.random.default_rng(11)
    sequences = []
    for _ in range(30):
        prompt = rng.integers(1, 512, size=int(rng.integers(10, 30))).tolist()
        sequences.append((prompt + rng.integers(1, 512, size=40).tolist(), len(prompt)))
    reference = dict(teacher_forced_logprobs(base, sequences, 8))
    leading = Counter(int(t) for logprobs in reference.values() for t in logprobs.argmax(-1))
    digits = [token for token, _ in leading.most_common(10)]
    with torch.no_grad():
        decoy.model.lm_head.weight[digits] *= 0.7
    numeric = [i for i, logprobs in reference.items() if int(logprobs[0].argmax()) in digits]
    assert len(numeric) >= 4
    fidelity, baseline, candidate = {}, {}, {}
    for index, logprobs in teacher_forced_logprobs(decoy, [sequences[i] for i in numeric], 8):
        item = numeric[index]
        values, top = torch.topk(reference[item], 32, dim=-1)
        targets = torch.tensor(sequences[item][0][sequences[item][1]:])
        fidelity[f"q{item}"] = FidelityItem.from_json(position_figures(logprobs, top, values, targets))
        baseline[f"q{item}"] = {"em": 100.0}
        candidate[f"q{item}"] = {"em": 100.0 * (int(logprobs[0].argmax()) == int(top[0, 0]))}
    decision = decide_format(FormatOutcome("baseline", items={"nums": baseline}, gates={"nums": ["em"]}),
                             FormatOutcome("decoy", items={"nums": candidate}, gates={"nums": ["em"]},
                                           fidelity={"nums": fidelity}), Policy())
    assert decision.fidelity["nums"]["kl"]["value"] > 0.05, decision.fidelity["nums"]["detail"]
    assert decision.verdict == "NO-GO", decision.reasons
