"""The worker jobs survive the JSON file between the pipeline and harness.worker unchanged."""

import json

from harness.jobs import DeviceJob, GenerateItem, GenerateTask, MeasureTask, QuantizeJob, read_job


def _through_a_file(job, tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job.to_json()), encoding="utf-8")
    return read_job(path)


def test_the_quantize_job_round_trips(tmp_path):
    job = QuantizeJob(format="gptq", devices="0,1", source_path="/m", recipe={"format": "gptq", "bits": 4, "seed": 3},
                      calibration_path="/c.json", out_dir="/a", manifest={"engine": "gptqmodel", "versions": {}},
                      trust_remote_code=True, threads=2, failure_path="/f.json")
    assert _through_a_file(job, tmp_path) == job
    assert job.to_json()["kind"] == "quantize" and job.seed == 3


def test_the_device_job_round_trips(tmp_path):
    measure = MeasureTask("/m.json", (("Hello", 8), ("Hi", 4)), ("Hello there",), 8, warmup=1)
    tasks = (GenerateTask("faq", "k1", 12, (GenerateItem("q1", "What?"), GenerateItem("q2", "Why?")), "/g.json"),)
    job = DeviceJob(artifact_path="/a", batch_size=4, measure=measure, generate=tasks, format="int8",
                      devices=None, dtype="float32", threads=1, seed=5, failure_path="/f.json")
    assert _through_a_file(job, tmp_path) == job
    assert _through_a_file(DeviceJob("/a", 1), tmp_path) == DeviceJob("/a", 1)  # nothing to measure


def test_the_job_file_keeps_the_keys_the_worker_reads(tmp_path):
    job = DeviceJob("/a", 2, generate=(GenerateTask("faq", "k", 8, (GenerateItem("q", "p"),), "/g"),))
    data = json.loads(json.dumps(job.to_json()))
    assert data["kind"] == "device" and data["measure"] is None
    assert data["generate"][0]["items"] == [{"id": "q", "prompt": "p"}]
