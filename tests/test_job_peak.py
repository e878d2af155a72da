"""The memory a format's job reached, not only its measure stage: the timeline can raise the peaks."""

from harness.measure.timeline import MemoryTimeline, whole_job_peaks


def _series(values: list[int], fields=("rss_bytes",)) -> dict:
    samples = iter(values)
    with MemoryTimeline(reader=lambda: (next(samples, values[-1]),), fields=fields, interval_s=60,
                        stage="load") as timeline:
        timeline.mark("generate:en")
        timeline.mark("generate:zh")
    return timeline.as_dict()


def test_generation_after_the_measure_stage_raises_the_cpu_peak():
    measured = {"peak_bytes": 2_000, "rss_peak_bytes": 2_000, "weights_bytes": 900, "activation_peak_bytes": 300}
    series = _series([1_000, 1_000, 1_000, 5_000])  # the last sample: generating zh
    raised = whole_job_peaks(measured, series)
    assert raised["peak_bytes"] == raised["rss_peak_bytes"] == 5_000
    assert raised["weights_bytes"] == 900 and raised["activation_peak_bytes"] == 300  # the breakdown stays
    assert series["peaks"]["rss_bytes"]["stage"] == "generate:zh"


def test_a_lower_timeline_never_lowers_the_tracked_peak():
    measured = {"peak_bytes": 8_000, "rss_peak_bytes": 8_000}
    assert whole_job_peaks(measured, _series([1_000, 2_000]))["peak_bytes"] == 8_000


def test_gpu_peak_follows_nvml_then_the_allocator():
    measured = {"peak_bytes": 10, "nvml_peak_used_bytes": 10, "cuda_max_reserved_bytes": 8, "cuda_max_allocated_bytes": 6,
                "rss_peak_bytes": 3}
    series = {"peaks": {"nvml_used_bytes": {"bytes": 20}, "cuda_reserved_bytes": {"bytes": 12},
                        "cuda_allocated_bytes": {"bytes": 7}}}
    raised = whole_job_peaks(measured, series)
    assert (raised["peak_bytes"], raised["cuda_max_reserved_bytes"], raised["cuda_max_allocated_bytes"]) == (20, 12, 7)
    no_nvml = {"peak_bytes": 8, "cuda_max_reserved_bytes": 8, "cuda_max_allocated_bytes": 6, "rss_peak_bytes": 30}
    assert whole_job_peaks(no_nvml, {"peaks": {"cuda_reserved_bytes": {"bytes": 9}}})["peak_bytes"] == 9
