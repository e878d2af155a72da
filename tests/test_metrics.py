"""Metrics against hand-computed values and against rouge-score's own scorer."""

from __future__ import annotations

import pytest
from rouge_score import rouge_scorer

from harness.metrics import score_prediction, tokenizer_name
from harness.metrics.qa import abstains, contains, exact_match, f1, qa_scores, segment_zh
from harness.metrics.rouge import RougeScorer
from harness.metrics.tokenizers import MixedTokenizer, RougeDefaultTokenizer, detect_language, rouge_tokenizer


# ---------------------------------------------------------------- QA, English (SQuAD)


def test_em_squad_normalization_drops_articles_punctuation_case():
    assert exact_match("The Denver Broncos!", ["Denver Broncos"]) == 100.0


def test_em_squad_normalization_strips_the_thousands_comma():
    assert exact_match("1,000", ["1000"]) == 100.0


def test_em_is_zero_for_a_different_answer():
    assert exact_match("Carolina Panthers", ["Denver Broncos"]) == 0.0


def test_f1_partial_overlap_by_hand():
    # pred -> [big, red, fox, jumped] (4), gold -> [red, fox] (2); overlap 2: P = 1/2, R = 1, F1 = 2/3
    assert f1("The big red fox jumped", ["a red fox"]) == pytest.approx(200 / 3)


def test_f1_counts_repeated_tokens_as_a_bag():
    # pred [new, new, york] vs gold [new, york]: overlap min-counts = 2, P = 2/3, R = 1, F1 = 0.8
    assert f1("new new york", ["New York"]) == pytest.approx(80.0)


def test_max_over_gold_answers():
    assert exact_match("paris", ["London", "Paris"]) == 100.0
    # gold 1: [red, fox] vs pred [red, fox, jumped]: F1 0.8; gold 2 identical: 1.0
    assert f1("red fox jumped", ["red fox", "red fox jumped"]) == pytest.approx(100.0)
    assert f1("red fox jumped", ["red fox", "blue whale"]) == pytest.approx(80.0)


def test_contains_matches_whole_normalized_words():
    assert contains("It was held in Denver, Colorado.", ["denver"]) == 100.0
    assert contains("10 items", ["1"]) == 0.0  # "1" is not a word of the prediction


# ---------------------------------------------------------------- QA, Chinese (CMRC 2018)


def test_em_chinese_strips_full_width_punctuation():
    assert exact_match("北京。", ["北京"], language="zh") == 100.0
    assert exact_match("“北京”！", ["北京"], language="zh") == 100.0


def test_auto_language_picks_chinese_rules_for_cjk_answers():
    assert exact_match("北京。", ["北京"], language="auto") == 100.0
    # the SQuAD rules only strip ASCII punctuation, so the full stop would count
    assert exact_match("北京。", ["北京"], language="en") == 0.0


def test_f1_chinese_characters_by_hand():
    # pred 4 chars, gold 2, common run 2: P = 1/2, R = 1, F1 = 2/3
    assert f1("北京大学", ["北京"], language="zh") == pytest.approx(200 / 3)


def test_f1_chinese_uses_the_longest_common_contiguous_run_like_cmrc():
    # "北上京" vs "北京": the longest common *run* is 1 char (a subsequence would be 2):
    # P = 1/3, R = 1/2, F1 = 2 * (1/6) / (5/6) = 0.4
    assert f1("北上京", ["北京"], language="zh") == pytest.approx(40.0)


def test_chinese_segmentation_keeps_latin_runs_and_drops_punctuation():
    assert segment_zh("光荣和ω-force，GPU 加速。") == ["光", "荣", "和", "ωforce", "gpu", "加", "速"]


def test_contains_chinese_substring():
    assert contains("答案是北京。", ["北京"], language="zh") == 100.0
    assert contains("答案是上海。", ["北京"], language="zh") == 0.0


# ---------------------------------------------------------------- unanswerable items


def test_unanswerable_scores_100_only_when_the_model_abstains():
    phrases = ["cannot be answered", "无法回答"]
    assert qa_scores("This cannot be answered.", [], abstain_phrases=phrases) == {
        "em": 100.0, "f1": 100.0, "contains": 100.0}
    assert qa_scores("无法回答。", [], language="zh", abstain_phrases=phrases)["f1"] == 100.0
    assert qa_scores("", [], abstain_phrases=phrases)["em"] == 100.0  # empty output abstains
    assert qa_scores("Paris", [], abstain_phrases=phrases) == {"em": 0.0, "f1": 0.0, "contains": 0.0}


def test_abstain_phrase_compared_after_normalization():
    assert abstains("It CANNOT be answered!", ["cannot be answered"])
    assert abstains("The answer is not in the context.", ["not in the context"])
    assert not abstains("Normandy", ["not in the context"])


# ---------------------------------------------------------------- ROUGE


def test_english_rouge_equals_rouge_score_default_scorer():
    reference = "The cats were sitting on the mat, waiting for dinner."
    prediction = "A cat sat on the mat and waited for its dinner."
    expected = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True).score(reference, prediction)
    ours = RougeScorer("en").score(prediction, [reference])
    for name in ("rouge1", "rouge2", "rougeL"):
        assert ours[name] == pytest.approx(expected[name].fmeasure * 100)


def test_english_tokenizer_is_rouge_scores_default():
    text = "Running quickly, the 3 runners ran!"
    assert rouge_tokenizer("en").tokenize(text) == rouge_scorer.tokenizers.DefaultTokenizer(True).tokenize(text)


def test_rouge_score_default_tokenizer_scores_chinese_zero_ours_does_not():
    text = "今天天气很好"
    default = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True).score(text, text)
    assert default["rouge1"].fmeasure == 0.0
    assert RougeScorer("zh").score(text, [text]) == {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0}


def test_chinese_rouge_by_hand():
    scores = RougeScorer("zh").score("今天天气很好", ["今天天气不错"])
    assert scores["rouge1"] == pytest.approx(66.67, abs=0.01)  # 4 of 6 characters each way
    assert scores["rouge2"] == pytest.approx(60.0)  # bigrams 今天 天天 天气 shared, 3 of 5
    assert scores["rougeL"] == pytest.approx(200 / 3)  # LCS 今天天气


def test_rouge_takes_the_best_reference_per_metric():
    scorer = RougeScorer("en")
    assert scorer.score("the cat sat", ["a dog ran", "the cat sat"])["rougeL"] == pytest.approx(100.0)
    single = scorer.score("the cat sat", ["a dog ran"])
    assert single["rouge1"] == 0.0


def test_mixed_tokenizer_keeps_text_order():
    assert MixedTokenizer().tokenize("GPU加速 running 很快") == ["gpu", "加", "速", "run", "很", "快"]


def test_mixed_tokenizer_equals_default_on_text_without_cjk():
    text = "The quick brown foxes jumped over 2 lazy dogs."
    assert MixedTokenizer().tokenize(text) == RougeDefaultTokenizer().tokenize(text)


def test_tokenizer_names_are_recorded():
    assert tokenizer_name("en") == "rouge-score default (Porter stemmer)"
    assert tokenizer_name("zh") == "char-cjk+word-latin"
    assert tokenizer_name("auto", task="generation") == "char-cjk+word-latin"
    assert tokenizer_name("zh", task="qa") == "CMRC 2018 (CJK chars, Latin words)"


def test_score_prediction_dispatches_by_task():
    assert score_prediction("qa", "en", "Denver Broncos", ["Denver Broncos"], ["em"]) == {"em": 100.0}
    assert score_prediction("generation", "zh", "今天", ["今天"], ["rougeL"]) == {"rougeL": 100.0}


def test_detect_language_uses_the_30_percent_share():
    assert detect_language("使用GPU") == "zh"  # 2 CJK of 5 letters
    assert detect_language("the GPU named 北京") == "en"  # 2 CJK of 15


def test_score_item_lives_in_metrics_only():
    import subprocess
    import sys
    from pathlib import Path

    from harness import evalsets, metrics
    from harness.metrics.score import score_item

    assert metrics.score_item is score_item and not hasattr(evalsets, "score_item")  # the re-export is gone
    # harness.metrics does not import harness.evalsets (which imports it): importing it first works on its own
    code = "import sys, harness.metrics; assert 'harness.evalsets' not in sys.modules; print('ok')"
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_score_item_by_hand():
    from pathlib import Path

    from harness.evalsets import EvalItem, EvalSet
    from harness.metrics import score_item

    def evalset(task: str, language: str, metrics: tuple[str, ...], item: EvalItem) -> EvalSet:
        return EvalSet(name=task, task=task, language=language, spec_path=None, data_path=Path(f"{task}.jsonl"),
                       description="", prompt_template="", system_prompt=None, few_shot=(), max_new_tokens=16,
                       metrics=metrics, gate=metrics[-1:], abstain_phrases=(), items=(item,), content_hash="sha256:0")

    item = EvalItem(id="q0", question="Who won Super Bowl 50?", context="", instruction="",
                    answers=("Denver Broncos",), references=("Denver Broncos",), line=1)
    qa = evalset("qa", "en", ("em", "f1"), item)
    assert score_item(qa, item, "The Denver Broncos!") == {"em": 100.0, "f1": 100.0}
    reference = EvalItem(id="s0", question="", context="", instruction="Summarize.", answers=(),
                         references=("今天天气不错",), line=1)
    summary = evalset("generation", "zh", ("rouge1",), reference)
    assert score_item(summary, reference, "今天天气很好") == {
        "rouge1": pytest.approx(200 / 3)}
