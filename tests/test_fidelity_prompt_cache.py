"""Fidelity over the prompt caches a format's own generation kept (issue #42 item 6): the forwards run over the
continuation only, give the figures of the whole-prompt forwards within float noise, keep the baseline against
itself at exactly 0, and leave nothing on disk."""

import json
import types

import numpy as np
import pytest

from harness.fidelity.prompt_cache import read_batches
from harness.fidelity.teacher import compare_to_reference, write_reference
from harness.jobs import FidelityTask, GenerateItem, GenerateTask
from harness.worker import generate_evalset
from test_fidelity import _TinyRuntime


class _TinyGenerator(_TinyRuntime):
    """test_fidelity's float32 tiny Llama behind the transformers backend's own generate and teacher-forcing code,
    generating to the token limit (no stop token)."""

    def __init__(self, noise: float = 0.0):
        from harness.runtime.transformers_backend import LoadedModel

        super().__init__(noise)
        self.model.generation_config.eos_token_id = None
        self.tokenizer = types.SimpleNamespace(pad_token_id=0, eos_token_id=None,
                                               decode=lambda ids, skip_special_tokens=True: " ".join(map(str, ids)))
        for name in ("_generate", "generate", "generate_keeping_prompt_cache"):
            setattr(self, name, types.MethodType(getattr(LoadedModel, name), self))


def _prompts():
    rng = np.random.default_rng(11)
    shared = rng.integers(1, 512, size=36).tolist()
    return {f"q{i}": shared + rng.integers(1, 512, size=int(rng.integers(1, 30))).tolist() for i in range(10)}


def _generate(runtime, prompts, directory):
    task = GenerateTask("faq", "k", 12, tuple(GenerateItem(i, i) for i in prompts))
    return generate_evalset(runtime, task, lambda prompt: prompts[prompt], 4, directory)


def _figures(tmp_path, base, fmt, name, cached: bool):
    prompts = _prompts()
    base_dir = tmp_path / f"{name}-base-cache" if cached else None
    generated = _generate(base, prompts, base_dir)
    (tmp_path / "gen.json").write_text(json.dumps(generated))
    reference = tmp_path / f"ref-{name}.npz"
    write_reference(base, FidelityTask("faq", "r", "reference", str(reference), generation_path=str(tmp_path / "gen.json"),
                                       items=tuple((i, tuple(p)) for i, p in prompts.items())), 32, 4, base_dir)
    fmt_dir = tmp_path / f"{name}-fmt-cache" if cached else None
    _generate(fmt, prompts, fmt_dir)
    out = tmp_path / f"{name}.json"
    compare_to_reference(fmt, FidelityTask("faq", name, "compare", str(reference), result_path=str(out)), 4, fmt_dir)
    result = json.loads(out.read_text())
    with np.load(reference) as data:
        reference_cached = int(data["prompt_cache_items"])
    return {row["id"]: row for row in result["items"]}, result["prompt_cache_items"], reference_cached, generated


def test_cached_prompts_give_the_whole_prompt_figures(tmp_path):
    base, noisy = _TinyGenerator(), _TinyGenerator(noise=0.1)
    whole, whole_cached, _, plain = _figures(tmp_path, base, noisy, "whole", cached=False)
    cached, fmt_cached, reference_cached, kept = _figures(tmp_path, base, noisy, "cached", cached=True)
    assert (whole_cached, fmt_cached, reference_cached) == (0, 10, 10)
    # keeping the caches changes neither the generations nor their accounting
    assert [o["token_ids"] for o in kept["outputs"]] == [o["token_ids"] for o in plain["outputs"]]
    assert kept["prompt_cache_s"] >= 0 and plain["prompt_cache_s"] is None
    assert sorted(whole) == sorted(cached) and len(whole) == 10
    for item_id, row in whole.items():
        other = cached[item_id]
        assert row["positions"] == other["positions"] == 12 and row["kl_sum"] > 0
        assert other["kl_sum"] == pytest.approx(row["kl_sum"], rel=1e-4)
        assert (other["agree"], other["first_flip"]) == (row["agree"], row["first_flip"])
        assert other["target_logprob_sum"] == pytest.approx(row["target_logprob_sum"], rel=1e-4)
    itself, itself_cached, _, _ = _figures(tmp_path, base, base, "self", cached=True)
    assert itself_cached == 10
    assert all(row["kl_sum"] == 0.0 and row["agree"] == row["positions"] for row in itself.values())


def test_the_cache_holds_the_prompt_but_its_last_token(tmp_path):
    prompts = _prompts()
    _generate(_TinyGenerator(), prompts, tmp_path / "cache")
    batches = read_batches(tmp_path / "cache")
    assert [len(b.item_ids) for b in batches] == [4, 4, 2]
    for batch in batches:
        assert batch.width == max(batch.prompt_lengths)
        keys, values = batch.load(list(range(len(batch.item_ids))), "cpu")[0]
        assert keys.shape == (len(batch.item_ids), 2, batch.width - 1, 16) == values.shape


def test_a_comparison_follows_a_reference_made_over_whole_prompts(tmp_path):
    """A reference without caches (an older run's, or one past the disk budget): the comparison takes the whole
    prompts too, so both sides stay on one path."""
    base, noisy = _TinyGenerator(), _TinyGenerator(noise=0.1)
    prompts = _prompts()
    (tmp_path / "gen.json").write_text(json.dumps(_generate(base, prompts, None)))
    reference = tmp_path / "ref.npz"
    write_reference(base, FidelityTask("faq", "r", "reference", str(reference), generation_path=str(tmp_path / "gen.json"),
                                       items=tuple((i, tuple(p)) for i, p in prompts.items())), 32, 4)
    _generate(noisy, prompts, tmp_path / "fmt")
    out = tmp_path / "out.json"
    compare_to_reference(noisy, FidelityTask("faq", "c", "compare", str(reference), result_path=str(out)), 4,
                         tmp_path / "fmt")
    assert json.loads(out.read_text())["prompt_cache_items"] == 0


def test_a_comparison_in_a_later_job_rebuilds_the_prompt_caches(tmp_path):
    """A format whose generation ran in an earlier job than its comparison (a Ray task rerun beside the baseline)
    has no prompt caches of its own: its prompts are prefilled again in generation's batches, so it stays on the
    reference's path. The baseline against itself is then exactly 0, and a format's figures are those its own
    caches give, to the bit."""
    base, noisy = _TinyGenerator(), _TinyGenerator(noise=0.1)
    with_caches, cached_items, _, _ = _figures(tmp_path, base, noisy, "own", cached=True)
    prompts = _prompts()
    reference = tmp_path / "ref-own.npz"
    for name, model in (("later-self", base), ("later-noisy", noisy)):
        out = tmp_path / f"{name}.json"
        compare_to_reference(model, FidelityTask("faq", name, "compare", str(reference), result_path=str(out)), 4,
                             None)
        result = json.loads(out.read_text())
        assert result["prompt_cache_items"] == len(prompts) == cached_items
        rows = {row["id"]: row for row in result["items"]}
        if model is base:
            assert all(row["kl_sum"] == 0.0 and row["agree"] == row["positions"] for row in rows.values())
        else:
            assert rows == with_caches
