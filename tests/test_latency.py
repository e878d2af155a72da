from harness.measure.latency import latency_block, summarize
from harness.runtime.base import BatchTiming


def test_percentiles_interpolate_like_numpy():
    stats = summarize([10.0, 20.0, 30.0, 40.0, 50.0])
    assert stats["p50"] == 30.0
    assert stats["p95"] == 48.0  # 40 + 0.8 * (50 - 40)
    assert stats["count"] == 5 and stats["mean"] == 30.0


def test_tpot_excludes_the_first_token():
    # 0.2 s to the first token, then 9 more steps in 0.9 s: 100 ms per output token.
    timing = BatchTiming(batch_size=2, prompt_tokens=50, steps=10, ttft_s=0.2, e2e_s=1.1)
    block = latency_block([timing])
    assert block["ttft_ms"]["p50"] == 200.0
    assert abs(block["tpot_ms"]["p50"] - 100.0) < 1e-6
    assert block["requests"] == 2 and block["batch_size"] == 2
    assert abs(block["throughput_tok_s"] - 20 / 1.1) < 0.01


def test_a_p95_of_too_few_requests_is_shown_as_the_max_of_n():
    from harness.report.schema import LatencyStats
    from harness.report.view import p95_text

    few = latency_block([BatchTiming(1, 10, 5, 0.01 * i, 0.1 * i) for i in range(1, 9)])
    assert few["requests"] == 8 and few["e2e_ms"]["max"] == 800.0
    assert p95_text(LatencyStats.model_validate(few["e2e_ms"])) == "max of 8: 800.0 ms"
    enough = latency_block([BatchTiming(1, 10, 5, 0.01 * i, 0.1 * i) for i in range(1, 21)])
    from harness.units import format_ms

    # 1900 + 0.05 x 100: interpolated, not the max
    assert p95_text(LatencyStats.model_validate(enough["e2e_ms"])) == format_ms(1905.0)
