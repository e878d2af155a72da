"""GPUs by the names people type (#39 item 5): nvidia-smi's own names, typed forms, ambiguous names that say which
card they were taken as, unknown names with the nearest known ones, memory as torch reports it with its source, and
--target-gpu / --gpu-memory-gib in plan and diagnose (one line, exit 2, for a bad name; never exit 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness import cli
from harness.capacity.gpus import (GIB, GPUS, find_gpu, gpu_by_name, gpu_of_size, gpus_by_names, has_capability,
                                   kernel_support, larger_gpus, nearest_gpus)

DIAGNOSE_LOG = Path(__file__).parent / "fixtures" / "diagnose" / "vllm_kv_too_small.log"

# The names nvidia-smi (and rocm-smi / torch's get_device_name) print, and the table's card for each.
SMI_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100-SXM", "NVIDIA A100-SXM4-80GB": "A100-80GB", "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB", "NVIDIA A100 80GB PCIe": "A100-80GB", "NVIDIA GeForce RTX 3090": "RTX-3090",
    "NVIDIA RTX A6000": "RTX-A6000", "NVIDIA L40S": "L40S", "NVIDIA A10G": "A10G", "Tesla T4": "T4",
    "Tesla V100-SXM2-16GB": "V100-16GB", "Tesla V100-SXM2-32GB": "V100-32GB", "Tesla V100-PCIE-32GB": "V100-32GB",
    "NVIDIA H200": "H200", "NVIDIA H100 PCIe": "H100-PCIe", "NVIDIA H100 NVL": "H100-NVL", "NVIDIA H20": "H20",
    "NVIDIA H800": "H800", "NVIDIA A800-SXM4-80GB": "A800-80GB", "NVIDIA L20": "L20", "NVIDIA L40": "L40",
    "NVIDIA L4": "L4", "NVIDIA A10": "A10", "NVIDIA A40": "A40", "NVIDIA A30": "A30",
    "NVIDIA RTX A4000": "RTX-A4000", "NVIDIA GeForce RTX 4090": "RTX-4090",
    "NVIDIA GeForce RTX 5090": "RTX-5090", "NVIDIA GeForce RTX 5070 Ti": "RTX-5070-Ti",
    "NVIDIA GeForce RTX 3060": "RTX-3060", "NVIDIA GeForce RTX 4080": "RTX-4080",
    "NVIDIA RTX 6000 Ada Generation": "RTX-6000-Ada", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition":
    "RTX-PRO-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTX-PRO-6000", "NVIDIA B200": "B200",
    "NVIDIA B300": "B300", "NVIDIA GB200": "GB200", "NVIDIA GH200 480GB": "GH200-96GB",
    "NVIDIA GH200 144G HBM3e": "GH200-144GB", "AMD Instinct MI210": "MI210", "AMD Instinct MI250X": "MI250X",
    "AMD Instinct MI300X": "MI300X", "AMD Instinct MI325X": "MI325X", "AMD Instinct MI355X": "MI355X",
}


@pytest.mark.parametrize("name, card", sorted(SMI_NAMES.items()))
def test_every_nvidia_smi_name_resolves_exactly(name, card):
    match = find_gpu(name)
    assert (match.gpu.name, match.note) == (card, "")


@pytest.mark.parametrize("typed, card", [
    ("RTX 3090", "RTX-3090"), ("3090", "RTX-3090"), ("rtx4090", "RTX-4090"), ("A100-SXM4-80GB", "A100-80GB"),
    ("a100 80g", "A100-80GB"), ("H200 141GB", "H200"), ("RTX 6000 Ada", "RTX-6000-Ada"), ("h100 sxm", "H100-SXM"),
    ("L40", "L40"), ("l40s", "L40S"), ("RTX A6000", "RTX-A6000"), ("H20", "H20"), ("MI300X", "MI300X"),
    ("Tesla T4", "T4"), ("A800", "A800-80GB"), ("RTX 5090", "RTX-5090"), ("GB200", "GB200"), ("a10g", "A10G"),
    ("  NVIDIA  GeForce  RTX-5070-Ti ", "RTX-5070-Ti"), ("H100-NVL", "H100-NVL"), ("B200", "B200"),
])
def test_names_as_people_type_them(typed, card):
    assert gpu_by_name(typed).name == card


def test_a10_is_the_a10_not_the_a10g():
    assert gpu_by_name("A10").name == "A10" and gpu_by_name("A10G").name == "A10G"
    assert gpu_by_name("A10") != gpu_by_name("A10G")  # two cards, even where their totals agree
    assert gpu_by_name("A10").source and gpu_by_name("A10G").estimated


@pytest.mark.parametrize("name, card, other", [
    ("A100", "A100-80GB", "A100-40GB"), ("H100", "H100-SXM", "H100-NVL"), ("V100", "V100-16GB", "V100-32GB"),
    ("A100 PCIe", "A100-40GB", "A100 80GB PCIe"), ("RTX 6000", "RTX-6000-Ada", "RTX PRO 6000"),
    ("GH200", "GH200-96GB", "GH200-144GB"), ("MI250", "MI250X", "64 GB"),
])
def test_an_ambiguous_name_takes_the_common_card_and_says_so(name, card, other):
    match = find_gpu(name)
    assert match.gpu.name == card
    assert match.note.startswith(f"'{name}' taken as {card}: ") and other in match.note


@pytest.mark.parametrize("name, nearest", [
    ("RTX 3080", {"RTX-3090", "RTX-4080"}), ("H300", {"H200", "H800"}), ("A1000", {"A100-80GB", "A100-40GB"}),
    ("L40SS", {"L40S"}), ("MI350X", {"MI355X"}),
])
def test_an_unknown_name_lists_the_nearest(name, nearest):
    with pytest.raises(ValueError) as caught:
        find_gpu(name)
    message = str(caught.value)
    assert message.startswith(f"unknown GPU '{name}'; nearest: ") and "--gpu-memory-gib" in message
    assert nearest <= set(nearest_gpus(name)) and "\n" not in message


def test_a_name_like_no_gpu_says_none_is_close():
    with pytest.raises(ValueError, match=r"unknown GPU 'Z9'; no known name is close; \d+ are known, e\.g\. T4, L4"):
        find_gpu("Z9")


def test_the_table_is_torch_totals_with_their_sources():
    assert len(GPUS) >= 40 and len({g.name for g in GPUS}) == len(GPUS)
    assert [g.memory_bytes for g in GPUS] == sorted(g.memory_bytes for g in GPUS)
    for gpu in GPUS:
        # every figure is logged (a source) or derived (the reason), and every alias is this card's
        assert bool(gpu.source) != bool(gpu.estimated), gpu.name
        assert not gpu.source or "https://github.com/" in gpu.source or "quantgate's own" in gpu.source, gpu.name
        assert all(find_gpu(alias).gpu is gpu for alias in (gpu.name, *gpu.aliases)), gpu.name
        # as torch reports it: below the marketed size read as GiB (nvidia-smi's MiB would reach it)
        marketed = float(re.match(r"\d+", gpu.nominal).group())
        assert 0.9 * marketed < gpu.memory_gib < marketed, gpu.name
        assert (gpu.vendor == "amd") == (gpu.compute_capability is None) == gpu.arch.startswith("gfx")
    # the totals logged on real GPUs (DESIGN.md's figures, and each card's source)
    logged = {"A100-80GB": 79.15, "L40S": 44.40, "RTX-3090": 23.58, "A10": 22.09, "L4": 22.03, "H100-SXM": 79.11,
              "H200": 139.81, "RTX-4090": 23.64, "RTX-5090": 31.37, "T4": 14.56, "H20": 95.00, "H100-NVL": 93.00}
    assert {name: round(gpu_by_name(name).memory_gib, 2) for name in logged} == logged
    assert gpu_by_name("H200").memory_bytes == round(150_121_545_728 / 2**20) * 2**20  # this project's H200


def test_compute_capability_and_amd_architecture():
    assert {g.name: g.compute_capability for g in map(gpu_by_name, ("T4", "A100", "L40S", "H200", "B200", "RTX 5090",
                                                                    "V100"))} == {
        "T4": 7.5, "A100-80GB": 8.0, "L40S": 8.9, "H200": 9.0, "B200": 10.0, "RTX-5090": 12.0, "V100-16GB": 7.0}
    mi300x, mi250x = gpu_by_name("MI300X"), gpu_by_name("MI250X")
    assert (mi300x.arch, mi250x.arch, gpu_by_name("MI355X").arch) == ("gfx942", "gfx90a", "gfx950")
    assert kernel_support(mi300x) == {"bf16": True, "marlin": False, "awq": None, "gptq": None, "fp8": True}
    assert kernel_support(mi250x)["fp8"] is False
    assert has_capability(mi300x, 8.0) is None  # ROCm kernels do not follow CUDA's numbers: the planners ask no more
    assert "AMD gfx942" in mi300x.describe() and "as torch reports it" in gpu_by_name("L4").describe()
    assert all(g.vendor == "nvidia" for g in larger_gpus(gpu_by_name("L4")))
    assert larger_gpus(gpu_by_name("MI210"))[0].name == "MI300X"  # the MI250X's GCD is the MI210's 64 GB


def test_a_size_keeps_the_named_gpus_capability():
    a100 = gpu_by_name("A100")
    slice_ = gpu_of_size(40, like=a100)
    assert (slice_.memory_bytes, slice_.compute_capability, slice_.name) == (40 * GIB, 8.0, "A100-80GB at 40 GiB")
    assert gpu_of_size(96, like=gpu_by_name("MI300X")).arch == "gfx942"


def test_a_list_of_gpus():
    assert [m.gpu.name for m in gpus_by_names("RTX 5070 Ti, RTX 5090")] == ["RTX-5070-Ti", "RTX-5090"]
    with pytest.raises(ValueError, match="no GPU named"):
        gpus_by_names(" , ")


# --- the commands: one line and exit 2 for a bad name, the note on stderr, --gpu-memory-gib everywhere


def _config(tmp_path) -> Path:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["plan", "diagnose"])
def test_an_unknown_gpu_is_one_line_and_exit_2(tmp_path, capsys, command):
    argv = ([command, "--model", str(_config(tmp_path)), "--format", "awq"] if command == "plan"
            else [command, str(DIAGNOSE_LOG)])
    assert cli.main([*argv, "--target-gpu", "RTX 3080"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--target-gpu: unknown GPU 'RTX 3080'; nearest: RTX-4080, RTX-3090" in err


def test_diagnose_takes_an_ambiguous_name_and_a_size(capsys):
    assert cli.main(["diagnose", str(DIAGNOSE_LOG), "--target-gpu", "A100", "--json"]) == 0  # was exit 3
    captured = capsys.readouterr()
    assert "note: 'A100' taken as A100-80GB" in captured.err and json.loads(captured.out)[0]["kind"]
    # the GPU's total by size alone: the log's 0.71 GiB shortfall on 22.05 GiB is utilization 0.94
    assert cli.main(["diagnose", str(DIAGNOSE_LOG), "--gpu-memory-gib", "22.05", "--json"]) == 0
    changes = [c["setting"] for c in json.loads(capsys.readouterr().out)[0]["changes"]]
    assert "--gpu-memory-utilization 0.94" in changes
    assert cli.main(["diagnose", str(DIAGNOSE_LOG), "--gpu-memory-gib", "nan"]) == 2
    assert cli.main(["diagnose", str(DIAGNOSE_LOG), "--target-gpu", "L4,L40S"]) == 2
    assert "name the one GPU the log is from" in capsys.readouterr().err


def test_plan_on_a_named_gpu_at_a_size_and_on_uneven_stages(tmp_path, capsys):
    config = str(_config(tmp_path))
    assert cli.main(["plan", "--model", config, "--format", "awq", "--target-gpu", "NVIDIA A100-SXM4-80GB",
                     "--gpu-memory-gib", "40", "--json"]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert (target["memory_bytes"], target["compute_capability"]) == (40 * GIB, 8.0)
    assert cli.main(["plan", "--model", config, "--format", "awq", "--target-gpu", "RTX 5070 Ti,RTX 5090",
                     "--json"]) == 0
    captured = capsys.readouterr()
    target = json.loads(captured.out)["target"]
    assert target["gpu"] == "RTX-5070-Ti" and target["pipeline_parallel_size"] == 2
    assert "2 pipeline stages on RTX-5070-Ti + RTX-5090: each engine's plan sizes every stage as an RTX-5070-Ti" \
        in captured.err
    assert cli.main(["plan", "--model", config, "--target-gpu", "L4,L4", "--pipeline-parallel-size", "3"]) == 2
    assert "give one GPU per stage" in capsys.readouterr().err


def test_a_bigger_gpu_suggestion_stays_with_the_vendor():
    """A plan that does not fit on an AMD card is not told to use an NVIDIA one, nor the other way round."""
    from harness.capacity import Target, Workload, model_shape, plan_engine, weight_format
    from harness.measure.kv import DEMO_CONFIG

    shape = model_shape(DEMO_CONFIG)
    for name in ("MI210", "T4"):
        gpu = gpu_by_name(name)
        small = gpu_of_size(0.3, like=gpu)  # too small for the demo model's weights and a 32k sequence
        plan = plan_engine("vllm", shape, weight_format("baseline"), Target(small), Workload(max_model_len=32_768))
        suggested = re.search(r"one (\S+) \(", plan.reason)
        assert not plan.fits and suggested, plan.reason
        assert gpu_by_name(suggested.group(1)).vendor == gpu.vendor, plan.reason


def test_run_takes_a_named_gpu_at_another_size():
    """`quantgate run --target-gpu A100-80GB --gpu-memory-gib 40`: a MIG slice of an A100, its compute capability
    kept; the named GPU alone plans at its own memory."""
    from harness.config import CapacitySettings

    slice_ = CapacitySettings(target_gpu="A100-80GB", gpu_memory_gib=40).target().gpu
    assert slice_.memory_gib == 40 and slice_.compute_capability == gpu_by_name("A100-80GB").compute_capability
    whole = CapacitySettings(target_gpu="A100-80GB")
    assert whole.target().gpu == gpu_by_name("A100-80GB")
    report = whole.for_report(policy_serving_unchecked())
    assert report.settings.target().gpu == gpu_by_name("A100-80GB")


def policy_serving_unchecked():
    from harness.policy import Policy

    return Policy().serving
