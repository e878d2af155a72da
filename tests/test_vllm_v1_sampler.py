"""V1's dummy sampler run sorts the whole vocabulary with torch up to vLLM 0.16, and gpt-oss's MXFP4 experts run on
Marlin on Hopper until 0.12 vendored triton_kernels (harness/capacity/vllm_versions.py, from each release's source)."""

from harness.capacity.vllm_versions import V1_SAMPLER, V1_SORTING_SAMPLER, mxfp4_backend_of, rules_for


def test_the_sampler_peak_follows_the_release():
    assert V1_SORTING_SAMPLER == 38 > V1_SAMPLER
    for version in ("0.8.5", "0.10.1", "0.11.0", "0.16.0"):
        assert rules_for(version)[0].sampler_bytes_per_logit == V1_SORTING_SAMPLER, version
    for version in ("0.17.1", "0.19.0", "0.25.1", "0.34"):
        assert rules_for(version)[0].sampler_bytes_per_logit == V1_SAMPLER, version


def test_mxfp4_runs_triton_on_hopper_once_vllm_ships_triton_kernels():
    assert mxfp4_backend_of("0.11.0", 9.0) == "marlin"
    assert mxfp4_backend_of("0.12.0", 9.0) == "triton"
