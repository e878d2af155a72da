"""The decision policy: how much each metric may drop, absolute floors, memory and latency budgets,
and how much evidence a GO needs.

Read from a TOML file (see policies/default.toml); every key has a built-in default, and the file's
`[margins]` are merged over the default margins. Unknown keys and wrong types are errors.

Evidence for GO (see harness/decide.py): a gated metric passes only on at least `min_items` paired items
(`[min_items_for]` sets it per "metric" or "evalset/metric", like margins) and when the set could have
detected a drop of the margin: its minimum detectable effect at `power` is at most the margin.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from harness.errors import UserError, did_you_mean

GIB = 1024**3
SCORE_SCALE = 100.0  # every score is in points on 0-100

# Non-inferiority margins in score points (0-100): a candidate may lose at most this much.
DEFAULT_MARGINS: dict[str, float] = {
    "rougeL": 1.0,
    "rouge1": 1.0,
    "rouge2": 1.0,
    "f1": 2.0,
    "em": 2.0,
    "contains": 2.0,
}


class ServingTarget(BaseModel):
    """[serving]: the deployment a candidate must fit. With target_gpu set, each candidate gets a capacity check: the
    vLLM plan on that GPU must hold min_concurrency sequences of max_model_len tokens, else NO-GO. Unset: no check."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    target_gpu: str | None = None  # a GPU of the table: T4, A10G, L4, RTX-4090, A100-40GB, ..., H200, B200
    max_model_len: int | None = Field(default=None, gt=0)  # tokens per sequence (default 4096)
    min_concurrency: int | None = Field(default=None, gt=0)  # sequences of max_model_len at once (default 1)

    @field_validator("target_gpu")
    @classmethod
    def _known_gpu(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from harness.capacity.gpus import gpu_by_name

        return gpu_by_name(value).name

    @model_validator(mode="after")
    def _needs_a_gpu(self) -> ServingTarget:
        if self.target_gpu is None and (self.max_model_len is not None or self.min_concurrency is not None):
            raise ValueError("[serving] sets max_model_len or min_concurrency but no target_gpu: name the GPU "
                             "(target_gpu = \"L4\"), or the capacity check is not run")
        return self

    @property
    def checked(self) -> bool:
        return self.target_gpu is not None

    @property
    def length(self) -> int:
        return self.max_model_len or DEFAULT_SERVING_LEN

    @property
    def concurrency(self) -> int:
        return self.min_concurrency or 1


DEFAULT_SERVING_LEN = 4096

# Defaults of the fidelity rule (harness.fidelity; docs/fidelity.md has the calibration they come from: on the
# ladder at 100 items a set, 85 points on the demo model and Gemma 3 270M, every RTN rung on both, the fitted task
# drop reaches one margin at KL 0.100 over the decision region (above 0.070 at 95%), at 0.070 on Gemma alone there and
# at 0.073 [0.038, 0.110] on the demo model's CNN/DM, so max_kl keeps a factor of 2.8 below the region's low end and
# 1.5 below that set's; on Gemma's CNN/DM the drop does not follow KL at all, and the guards in harness/decide.py (a
# mean drop past the margin, an interval wholly below 0) are what block a fidelity GO there; agreement is a guard
# that binds after KL).
DEFAULT_MAX_KL = 0.025  # nats per token, KL(baseline || format)
DEFAULT_MIN_TOP1_AGREEMENT = 90.0  # percent of output positions


class FidelityRule(BaseModel):
    """[fidelity]: how closely a format must reproduce the baseline, token by token, for the fidelity rule to carry
    a GO (harness.decide). Keys of the *_for tables are an evalset's name or a language ("en", "zh")."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    basis: Literal["tasks_or_fidelity", "tasks_and_fidelity", "tasks"] = "tasks_or_fidelity"
    max_kl: float = Field(default=DEFAULT_MAX_KL, gt=0, le=10)
    min_top1_agreement: float = Field(default=DEFAULT_MIN_TOP1_AGREEMENT, gt=0, le=100)
    max_kl_for: dict[str, float] = Field(default_factory=dict)
    min_top1_agreement_for: dict[str, float] = Field(default_factory=dict)
    min_items: int | None = Field(default=None, ge=2)  # items per evalset; unset: the policy's min_items

    @field_validator("max_kl_for", "min_top1_agreement_for")
    @classmethod
    def _limits_in_range(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        high, what = (10, "a KL in nats per token, > 0 and at most 10") if info.field_name == "max_kl_for" \
            else (100, "a percentage in (0, 100]")
        for key, limit in value.items():
            if not (math.isfinite(limit) and 0 < limit <= high):
                raise ValueError(f"key 'fidelity.{info.field_name}.{key}' = {limit}: must be {what}")
            if high == 100 and limit <= 1.0:
                raise ValueError(f"key 'fidelity.{info.field_name}.{key}' = {limit:g} looks like a fraction, but "
                                 f"agreement is a percentage: write {limit * 100:g} for {limit:.0%}")
        return value

    @field_validator("min_top1_agreement")
    @classmethod
    def _agreement_is_a_percentage(cls, value: float) -> float:
        if value <= 1.0:
            raise ValueError(f"{value:g} looks like a fraction, but agreement is a percentage: write "
                             f"{value * 100:g} for {value:.0%}")
        return value

    def kl_limit(self, evalset: str, language: str | None) -> float:
        return self.max_kl_for.get(evalset, self.max_kl_for.get(language or "", self.max_kl))

    def agreement_limit(self, evalset: str, language: str | None) -> float:
        return self.min_top1_agreement_for.get(evalset, self.min_top1_agreement_for.get(language or "",
                                                                                        self.min_top1_agreement))


class SpotChecks(BaseModel):
    """[spot_checks]: what people's judgments of a random sample (`quantgate review`) must show. The increase of
    the share judged unacceptable (candidate minus baseline, same items) is judged on its one-sided exact upper
    bound at the policy's confidence (harness.review.summary): 0 of 59 judged items passes a 5-point limit, 0 of
    20 does not. A failing spot check is NO-GO whether or not they are required; required, too few judgments make
    a format INCONCLUSIVE."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    required: bool = False  # a GO needs a passing spot check
    min_reviewed: int = Field(default=20, ge=1)  # judged items of the random sample, per format
    max_unacceptable_increase: float = Field(default=5.0, gt=0, lt=100)  # points


class Policy(BaseModel):
    """What a candidate format must satisfy to be GO. Keys of `margins`, `floors` and `min_items_for` are `metric`
    or `evalset/metric` (the more specific one wins). Strict types: "2.0", true or 30.0 where a number or a count
    belongs is an error, never a silent coercion."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    margins: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_MARGINS))
    floors: dict[str, float] = Field(default_factory=dict)
    max_memory_bytes: int | None = Field(default=None, gt=0)
    max_memory_gib: float | None = Field(default=None, gt=0)
    max_ttft_p95_ms: float | None = Field(default=None, gt=0)
    max_tpot_p95_ms: float | None = Field(default=None, gt=0)
    latency_budgets_judge: Literal["served", "transformers"] = "served"
    inconclusive_is: Literal["fail", "pass"] = "fail"
    min_items: int = Field(default=30, ge=2)
    min_items_for: dict[str, int] = Field(default_factory=dict)
    power: float = Field(default=0.8, ge=0.5, lt=1.0)
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    resamples: int = Field(default=2000, ge=2000)
    seed: int = 0
    serving: ServingTarget = Field(default_factory=ServingTarget)
    fidelity: FidelityRule = Field(default_factory=FidelityRule)
    spot_checks: SpotChecks = Field(default_factory=SpotChecks)

    @field_validator("margins", mode="before")
    @classmethod
    def _merge_default_margins(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {**DEFAULT_MARGINS, **value}
        return value

    @field_validator("margins", "floors")
    @classmethod
    def _finite_non_negative(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        for key, points in value.items():
            if not math.isfinite(points) or points < 0:
                raise ValueError(f"key '{info.field_name}.{key}' = {points}: must be a finite number of points >= 0")
        return value

    @field_validator("margins")
    @classmethod
    def _margins_that_can_bind(cls, value: dict[str, float]) -> dict[str, float]:
        for key, points in value.items():
            if points >= SCORE_SCALE:
                raise ValueError(f"key 'margins.{key}' = {points:g}: a margin of {SCORE_SCALE:g} points or more can "
                                 f"never bind (scores are 0-{SCORE_SCALE:g}, so no drop exceeds it); give the drop "
                                 "you accept in points, e.g. 2.0")
        return value

    @field_validator("floors")
    @classmethod
    def _floors_that_can_bind(cls, value: dict[str, float]) -> dict[str, float]:
        for key, points in value.items():
            if not 0 < points <= SCORE_SCALE:
                raise ValueError(f"key 'floors.{key}' = {points:g}: a floor must lie in (0, {SCORE_SCALE:g}] points "
                                 f"(scores are 0-{SCORE_SCALE:g}: a floor of 0 never binds, one above "
                                 f"{SCORE_SCALE:g} always fails); remove it or give the lowest acceptable score")
        return value

    @field_validator("min_items_for")
    @classmethod
    def _at_least_two_items(cls, value: dict[str, int]) -> dict[str, int]:
        for key, count in value.items():
            if count < 2:
                raise ValueError(f"key 'min_items_for.{key}' = {count}: must be at least 2 items (an interval needs 2)")
        return value

    @model_validator(mode="after")
    def _fidelity_needs_the_items_tasks_need(self) -> Policy:
        if self.fidelity.min_items is not None and self.fidelity.min_items < self.min_items:
            raise ValueError(f"fidelity.min_items = {self.fidelity.min_items} is below min_items = {self.min_items}: "
                             "the fidelity rule would carry a GO on fewer items than any task metric may; remove it "
                             f"or set it to at least {self.min_items}")
        return self

    @model_validator(mode="after")
    def _one_memory_budget(self) -> Policy:
        if self.max_memory_bytes is not None and self.max_memory_gib is not None:
            raise ValueError("set max_memory_bytes or max_memory_gib, not both")
        return self

    @property
    def memory_budget_bytes(self) -> int | None:
        if self.max_memory_bytes is not None:
            return self.max_memory_bytes
        if self.max_memory_gib is not None:
            return int(self.max_memory_gib * GIB)
        return None

    def margin_for(self, evalset: str, metric: str) -> float | None:
        return self.margins.get(f"{evalset}/{metric}", self.margins.get(metric))

    def floor_for(self, evalset: str, metric: str) -> float | None:
        return self.floors.get(f"{evalset}/{metric}", self.floors.get(metric))

    def min_items_at(self, evalset: str, metric: str) -> int:
        """The paired items a GO on this metric needs: "evalset/metric", then "metric", then `min_items`."""
        return self.min_items_for.get(f"{evalset}/{metric}", self.min_items_for.get(metric, self.min_items))

    def without_budgets(self) -> Policy:
        """This policy with memory and latency budgets removed (for inputs that carry no measurements)."""
        return self.model_copy(
            update={"max_memory_bytes": None, "max_memory_gib": None, "max_ttft_p95_ms": None, "max_tpot_p95_ms": None,
                    "serving": ServingTarget()}
        )

    def has_budgets(self) -> bool:
        return self.serving.checked or any(
            v is not None for v in (self.memory_budget_bytes, self.max_ttft_p95_ms, self.max_tpot_p95_ms)
        )

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def load_policy(path: str | Path | None, known_metrics: Sequence[str] | None = None,
                known_evalsets: Sequence[str] | None = None,
                known_languages: Sequence[str] | None = None) -> Policy:
    """The policy in `path`, or the built-in defaults when `path` is None.

    known_metrics: when given, a [margins]/[floors]/[min_items_for] key naming any other metric is an error, not a
    silently ignored typo. A run passes the metrics it scores; `quantgate decide` those plus the ones its score
    files carry. known_evalsets likewise for the evalset of an "evalset/metric" key: a margin for a set that is
    not there would be ignored, and the verdict judged by the default margin instead. known_languages: the
    languages of those evalsets; a [fidelity] *_for key must name one of them or an evalset.
    """
    if path is None:
        return Policy()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM some editors write is not part of the TOML
    except OSError as exc:
        raise UserError(f"{path}: cannot read the policy file ({exc.strerror or exc}); check the --policy path") from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start}); save the policy file "
                        "as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from exc
    policy = policy_from_dict(data, source=str(path))
    if known_metrics is not None:
        _check_metric_keys(data, known_metrics, str(path))
    if known_evalsets is not None:
        _check_evalset_keys(data, known_evalsets, str(path), known_languages or ())
    return policy


def _keyed_entries(data: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(table, key) of every [margins]/[floors]/[min_items_for] key: "metric" or "evalset/metric"."""
    for table in ("margins", "floors", "min_items_for"):
        for key in data.get(table) or {}:
            yield table, key


def _check_metric_keys(data: dict[str, Any], known: Sequence[str], source: str) -> None:
    for table, key in _keyed_entries(data):
        metric = key.rsplit("/", 1)[-1]
        if metric not in known:
            raise UserError(f"{source}: key '{table}.{key}': unknown metric '{metric}'{did_you_mean(metric, known)} "
                            f"(known: {', '.join(known)}; keys are 'metric' or 'evalset/metric')")


def _check_evalset_keys(data: dict[str, Any], known: Sequence[str], source: str, languages: Sequence[str]) -> None:
    for table, key in _keyed_entries(data):
        evalset, slash, _ = key.rpartition("/")
        if slash and evalset not in known:
            raise UserError(f"{source}: key '{table}.{key}': no evalset '{evalset}' in this run"
                            f"{did_you_mean(evalset, known)} (evalsets: {', '.join(known)}); a key for a set "
                            "that is not there would be ignored")
    fidelity = data.get("fidelity") or {}
    for table in ("max_kl_for", "min_top1_agreement_for"):
        for key in fidelity.get(table) or {} if isinstance(fidelity, dict) else {}:
            if key not in known and key not in languages:
                present = ", ".join(sorted(set(languages))) or "none given"
                raise UserError(f"{source}: key 'fidelity.{table}.{key}': neither an evalset of this run"
                                f"{did_you_mean(key, [*known, *languages])} (evalsets: {', '.join(known)}) nor the "
                                f"language of one (languages: {present}); a limit for a set or language that is "
                                "not there would be ignored")


def policy_from_dict(data: dict[str, Any], *, source: str = "policy") -> Policy:
    """Validate a policy given as a mapping (a TOML table); errors name `source` and the key."""
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        messages = [f"{source}: {_describe(err)}" for err in exc.errors()]
        raise UserError(messages[0], problems=messages[1:]) from exc


def _describe(err: dict[str, Any]) -> str:
    location = ".".join(str(part) for part in err["loc"])
    if err["type"] == "extra_forbidden" and not location.startswith(("serving.", "fidelity.", "spot_checks.")):
        allowed = ", ".join(Policy.model_fields)
        return f"unknown key '{location}' (allowed: {allowed})"
    if err["type"] == "extra_forbidden" and location.startswith("fidelity."):
        return f"unknown key '{location}' (allowed: {', '.join(FidelityRule.model_fields)})"
    if err["type"] == "extra_forbidden" and location.startswith("spot_checks."):
        return f"unknown key '{location}' (allowed: {', '.join(SpotChecks.model_fields)})"
    if err["type"] == "extra_forbidden" and location.startswith("serving."):
        return f"unknown key '{location}' (allowed: {', '.join(ServingTarget.model_fields)})"
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if not location or isinstance(err.get("input"), dict):  # a whole table: the message names the key
        return message
    return f"key '{location}': {message}, got {err.get('input')!r}"
