"""The software a run records in its report and keys its measured results by: Python and the engines' versions."""

from __future__ import annotations

import platform

from harness.quantize.base import package_versions

ENVIRONMENT_PACKAGES = ("torch", "transformers", "bitsandbytes", "gptqmodel", "optimum", "rouge-score", "datasets",
                        "numpy", "nvidia-ml-py")


def environment() -> dict:
    return {"python": platform.python_version(), **package_versions(*ENVIRONMENT_PACKAGES)}
