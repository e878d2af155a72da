"""The one interface every format implements: recipe + source + calibration texts -> saved artifact directory."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Recipe:
    format: str
    bits: int | None = None
    group_size: int | None = None
    calibration_samples: int = 32
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class Quantizer(Protocol):
    engine: str

    def versions(self) -> dict[str, str]: ...

    def calibration_dtype(self, source_path: Path) -> str:
        """The dtype calibration runs in on this machine ("none" for formats without calibration)."""
        ...

    def quantize(self, source_path: Path, recipe: Recipe, calibration: list[str], out_dir: Path, *,
                 trust_remote_code: bool = False) -> None:
        """Write a checkpoint that transformers can load into out_dir (which exists and is empty).

        trust_remote_code goes to every loader: a model's own code runs only when the user allowed it."""
        ...


def package_versions(*names: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found
