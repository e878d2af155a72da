"""INT8 with bitsandbytes LLM.int8(): weights stored as int8 with per-row scales, outliers kept in 16-bit."""

from __future__ import annotations

from pathlib import Path

from harness.quantize.base import Recipe, package_versions


class BnbInt8Quantizer:
    engine = "bitsandbytes"

    def __init__(self, name: str = "int8") -> None:
        self.name = name

    def versions(self) -> dict[str, str]:
        return package_versions("bitsandbytes", "transformers", "torch")

    def calibration_dtype(self, source_path: Path) -> str:
        return "none"  # LLM.int8 needs no calibration

    def quantize(self, source_path: Path, recipe: Recipe, calibration: list[str], out_dir: Path, *,
                 trust_remote_code: bool = False) -> None:
        # LLM.int8 needs no calibration: outlier columns are found at run time.
        from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

        from harness.runtime.device import device_map

        model = AutoModelForCausalLM.from_pretrained(
            source_path,
            quantization_config=BitsAndBytesConfig(
                load_in_8bit=True, llm_int8_threshold=float(recipe.extra.get("llm_int8_threshold", 6.0))),
            device_map=device_map(),
            trust_remote_code=trust_remote_code,
        )
        model.save_pretrained(out_dir)
        AutoTokenizer.from_pretrained(source_path, trust_remote_code=trust_remote_code).save_pretrained(out_dir)
