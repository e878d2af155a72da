"""The memory timeline sampler: a real thread sampling real RSS, stage markers, downsampling that keeps the max."""

from __future__ import annotations

import threading
import time

from harness.measure.timeline import MemoryTimeline, downsample


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "quantgate-memory-timeline"]


def test_a_200_mb_allocation_peaks_in_its_stage_and_the_thread_is_gone_after():
    with MemoryTimeline(cuda=False, interval_s=0.02, stage="load") as timeline:
        assert timeline.running and len(_sampler_threads()) == 1
        time.sleep(0.1)
        timeline.mark("allocate")
        block = bytearray(200 * 2**20)  # zero-filled pages: resident once written
        block[::4096] = b"\x01" * len(block[::4096])
        time.sleep(0.15)
        del block
        timeline.mark("after")
        time.sleep(0.1)
    assert not timeline.running and not _sampler_threads()
    series = timeline.as_dict()
    assert series["fields"] == ["rss_bytes"] and series["error"] is None
    assert [s["stage"] for s in series["stages"]] == ["load", "allocate", "after"]
    assert series["stages"][0]["start_s"] == 0.0 and series["stages"][-1]["end_s"] == series["duration_s"]
    peak = series["peaks"]["rss_bytes"]
    assert peak["stage"] == "allocate"
    allocate = series["stages"][1]
    assert allocate["start_s"] <= peak["t_s"] <= allocate["end_s"]
    load = [p["rss_bytes"] for p in series["points"] if p["stage"] == "load"]
    assert peak["bytes"] - max(load) > 150 * 2**20
    assert series["samples"] >= 10 and len(series["points"]) == series["samples"]  # under 300: every sample kept
    count = len(timeline.samples)
    time.sleep(0.05)
    assert len(timeline.samples) == count  # nothing samples after the block


def test_downsampling_keeps_every_fields_maximum_and_at_most_max_points():
    samples = [(i * 0.1, 100 + (i % 7), 50, 0) for i in range(10_000)]
    samples[4321] = (432.1, 9_999, 50, 1)  # a one-sample spike
    samples[777] = (77.7, 100, 8_888, 0)  # a spike in the second field only
    points = downsample(samples, 300, 2)
    assert len(points) == 300
    assert max(p[1] for p in points) == 9_999 and max(p[2] for p in points) == 8_888
    spike = next(p for p in points if p[1] == 9_999)
    assert spike[0] == 432.1 and spike[-1] == 1  # the lead field's maximum gives the time and stage
    assert [p[0] for p in points] == sorted(p[0] for p in points)
    assert downsample(samples[:5], 300, 2) == samples[:5]


def test_the_series_downsamples_with_the_peak_exact():
    values = iter(range(1000))
    timeline = MemoryTimeline(reader=lambda: (next(values),), fields=("rss_bytes",), interval_s=3600, max_points=50)
    with timeline:
        for index in range(990):
            timeline.mark(f"s{index % 3}")
    series = timeline.as_dict()
    assert series["samples"] == 992 and len(series["points"]) == 50  # entry, one per mark, exit
    assert series["peaks"]["rss_bytes"]["bytes"] == max(p["rss_bytes"] for p in series["points"]) == 991
    assert series["peaks"]["rss_bytes"]["stage"] == "s2" and len(series["stages"]) == 990


def test_a_failing_reader_ends_the_series_not_the_block():
    calls = []

    def reader():
        calls.append(1)
        if len(calls) > 2:
            raise OSError("gone")
        return (1,)

    with MemoryTimeline(reader=reader, fields=("rss_bytes",), interval_s=0.01) as timeline:
        time.sleep(0.1)
    assert "OSError: gone" in timeline.as_dict()["error"] and not timeline.running
