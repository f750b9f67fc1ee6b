"""The shipped predictor at run time: JobSpec -> Demand, fast, deterministic, cached, thread-safe.

The extender calls `predict` inside kube-scheduler's 5-second extender timeout for every pod it
sees, often for the same JobSpec again (a pod is retried on every cluster event), so:
- the artifact (metadata.json + .npz weights) is loaded once (`Predictor.load`) and the network
  runs in numpy (`predictor.inference`), the blended LightGBM booster too (`predictor.trees`): no
  torch or lightgbm in the extender's process or image, and for one row numpy beats torch's
  per-operator dispatch anyway;
- results are cached by JobSpec (frozen, hashable; `defaulted` does not take part) in a bounded LRU;
- a lock guards the cache only; inference itself needs no lock (nothing changes after loading).

The admission bound is the model's point (or upper quantile) with its learned term times a margin
calibrated on architectures held out by group (`predictor.train.set_margins`: one for all families,
or per family where that reserves less on nested folds); a job on the bare family path (no
architecture, no traced peak, no activation count) takes its family's margin earned on held-out
groups per batch regime instead, where one was earned (`family_bound`, `predictor.family_bounds`);
where those margins were earned on the table's point (`family_bounds.served_point`), a bare text job's
point is the traced table's nearest architectures (`predictor.family_table.served_point`).
A JobSpec outside the sizes the model was trained on for its family gets a wider bound and a warning
in its Demand.
"""

from __future__ import annotations

import json
import math
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from predictor import exact, family_bounds, family_heads, family_table, steptime
from predictor import features as feats
from predictor.inference import NumpyEstimator
from predictor.spec import Demand, JobSpec, estimate_gpu_seconds
from predictor.trees import BoostedMedian, StackedTrees, TreeEnsemble

FloatArray = npt.NDArray[np.float64]
#: JobSpec precisions the network has no word for -> the readings it answers (the larger one is kept).
NETWORK_PRECISIONS: dict[str, tuple[str, ...]] = {"bf16-mixed": ("amp", "bf16")}
DEFAULT_ARTIFACT = Path(__file__).resolve().parent / "artifacts"
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "transformer_bigru_tuned.npz"
DEFAULT_CACHE_SIZE = 4096
#: JobSpec sizes whose training range is recorded per family (annotation keys in the warnings).
INPUT_RANGE_COLUMNS: tuple[str, ...] = ("params_millions", "batch_size", "input_dim", "num_layers")
#: Outside the trained range the bound grows by 2^(OUT_OF_RANGE_SLOPE x how many doublings out),
#: at most OUT_OF_RANGE_MAX_FACTOR: errors of a regressor grow with the distance it extrapolates, and
#: a generous bound costs less than an OOM. No floor: a job 5% past the range is widened ~2%, not
#: x1.25 (on the grouped test a quarter of the jobs were a little outside a range, and their errors
#: were no larger than those inside).
OUT_OF_RANGE_SLOPE = 0.5
OUT_OF_RANGE_MAX_FACTOR = 4.0
#: A family absent from the training data (no range at all).
UNSEEN_FAMILY_FACTOR = 2.0


#: The smallest positive float: learned densities can be far below 1 (they are per input element).
TINY_DENSITY = float(np.finfo(np.float64).tiny)
#: Artifact arrays of the blend's tree members, one ensemble per target: TREE_PREFIX + "<target>." + name
#: (the LightGBM booster) and ADABOOST_PREFIX + "<target>." + name, plus "weights" (the AdaBoost trees).
TREE_PREFIX = "tree"
ADABOOST_PREFIX = "ada"


def blend_points(*members: FloatArray) -> FloatArray:
    """The blend's point in target units: the median, in log space, of its members' predictions (with
    two members, their geometric mean). One rule for `predictor.train` and the runtime.
    Why a blend: on jobs of architectures none of them saw, the members err differently (the network
    extrapolates along the log sizes, the boosted trees stay inside what they saw, AdaBoost's weighted
    median of trees least of all), so the median errs less and the margin the bound needs shrinks
    (nested grouped folds: see docs/predictor.md)."""
    logs = np.log(np.maximum(np.stack([np.asarray(m, dtype=np.float64) for m in members]), TINY_DENSITY))
    out: FloatArray = np.exp(np.median(logs, axis=0))
    return out


class BlendedEstimator:
    """The shipped predictor's learner at serving time: the numpy network, the flattened LightGBM
    booster of each target and, where the artifact has it, the flattened AdaBoost regressor of each
    target (`predictor.trees`), blended by `blend_points`; no quantile head (the bound's base is the
    blended point)."""

    def __init__(self, network: NumpyEstimator, trees: Sequence[TreeEnsemble],
                 adaboost: BoostedMedian | None = None) -> None:
        self.network = network
        self.trees = StackedTrees(trees)
        self.adaboost = adaboost

    def predict_with_upper(self, X: FloatArray) -> tuple[FloatArray, FloatArray | None]:
        points, _ = self.network.predict_with_upper(X)
        members = [points, np.exp(self.trees.predict(X))]  # the trees learn log(target)
        if self.adaboost is not None:
            members.append(np.exp(self.adaboost.predict(X)))
        if any(m.shape != points.shape for m in members):
            raise ValueError(f"{points.shape[1]} network targets but {[m.shape[1] for m in members[1:]]} tree outputs")
        return blend_points(*members), None


def _ensemble(weights: Mapping[str, Any], prefix: str, n_features: int) -> TreeEnsemble:
    """One flattened tree ensemble of the artifact, checked against the number of features."""
    ensemble = TreeEnsemble.from_arrays(weights, prefix)
    ensemble.check(n_features)
    return ensemble


class ArtifactError(RuntimeError):
    """The shipped artifact is missing or unreadable; the message names the command that builds it."""


class Predictor:
    """The embedded demand predictor (`predictor.spec.DemandPredictor`)."""

    def __init__(self, estimator: NumpyEstimator | BlendedEstimator, metadata: dict[str, Any],
                 cache_size: int = DEFAULT_CACHE_SIZE, family_bounds_path: str | None = None) -> None:
        self._estimator = estimator
        self.metadata = metadata
        self.version: str = str(metadata["version"])
        self._margins = Margins(
            point_base=metadata.get("memory_upper_base", "quantile") == "point",
            shift=float(metadata.get("memory_upper_shift", 0.0)),
            by_family={str(k): float(v) for k, v in metadata.get("memory_upper_shift_by_family", {}).items()},
            unseen=None if metadata.get("memory_upper_shift_unseen_family") is None
            else float(metadata["memory_upper_shift_unseen_family"]))
        # the margins of jobs that do not state `activations-millions` (predictor.train.shaped_margins)
        bare = metadata.get("memory_upper_without_shapes") or {}
        self._bare_margins = Margins(
            point_base=bare.get("base", metadata.get("memory_upper_base", "quantile")) == "point",
            shift=float(bare.get("shift", self._margins.shift)),
            by_family={str(k): float(v) for k, v in bare.get("by_family", self._margins.by_family).items()},
            unseen=self._margins.unseen if bare.get("unseen_family") is None else float(bare["unseen_family"]))
        self._target_ranges: dict[str, list[list[float]]] = metadata.get("target_ranges", {})
        calibration = metadata.get("memory_calibration", {})
        self._calibration = (float(calibration.get("context_mib", 0.0)), float(calibration.get("factor", 1.0)))
        self._ranges: dict[str, dict[str, tuple[float, float]]] = {
            str(family): {col: (float(lo), float(hi)) for col, (lo, hi) in cols.items()}
            for family, cols in metadata.get("input_ranges", {}).items()
        }
        self._cache: OrderedDict[JobSpec, Demand] = OrderedDict()
        self._cache_size = max(0, cache_size)
        self._lock = threading.Lock()
        #: The family path's earned margins (`family_bound`; None: the artifact's own margin, as before
        #: issue 47, and the held-out evaluation's `previous` figures, `predictor.family_eval`).
        self.family_bounds_path = family_bounds_path
        self.hits = 0
        self.misses = 0

    @classmethod
    def load(cls, path: str | Path | None = None, cache_size: int = DEFAULT_CACHE_SIZE) -> Predictor:
        """Load the artifact directory (default: the shipped `predictor/artifacts/`)."""
        directory = Path(path) if path is not None else DEFAULT_ARTIFACT
        meta_path, weights_path = directory / METADATA_FILE, directory / WEIGHTS_FILE
        if not meta_path.is_file() or not weights_path.is_file():
            raise ArtifactError(
                f"no trained predictor in {directory} (need {METADATA_FILE} and {WEIGHTS_FILE}): "
                f"build it with `deepres train` (after `deepres dataset`)"
            )
        try:
            metadata = json.loads(meta_path.read_text())
            with np.load(weights_path, allow_pickle=False) as archive:
                weights = {name: archive[name] for name in archive.files}
            network = NumpyEstimator(metadata["estimator"], weights)
            estimator: NumpyEstimator | BlendedEstimator = network
            blend = metadata.get("blend")
            if blend is not None:  # the network blended with tree ensembles (predictor.train.BLEND_MEMBERS)
                targets = range(int(blend["targets"]))
                n_features = len(metadata["feature_names"])
                trees = [_ensemble(weights, f"{TREE_PREFIX}{k}.", n_features) for k in targets]
                adaboost = None
                if "adaboost" in blend.get("members", ()):
                    ada = [_ensemble(weights, f"{ADABOOST_PREFIX}{k}.", n_features) for k in targets]
                    adaboost = BoostedMedian(ada, [weights[f"{ADABOOST_PREFIX}{k}.weights"] for k in targets])
                estimator = BlendedEstimator(network, trees, adaboost)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
            raise ArtifactError(f"the predictor artifact in {directory} is unreadable ({err}): "
                                f"rebuild it with `deepres train`") from None
        if metadata.get("feature_set") != "physics" or metadata.get("feature_names") != list(
            feats.physics_features(feats.columns_from_specs([JobSpec("mlp")])).names
        ):
            raise ArtifactError(f"the predictor artifact in {directory} was built for other features: "
                                f"rebuild it with `deepres train`")
        return cls(estimator, metadata, cache_size, earned_bounds_of(directory))

    def with_cache_size(self, cache_size: int) -> Predictor:
        """The same loaded model with its own, empty cache of the given size (0: no cache)."""
        return Predictor(self._estimator, self.metadata, cache_size, self.family_bounds_path)

    def predict(self, spec: JobSpec) -> Demand:
        """The Demand of one JobSpec (cached)."""
        with self._lock:
            cached = self._cache.get(spec)
            if cached is not None:
                self._cache.move_to_end(spec)
                self.hits += 1
                return cached
        demand = self._compute([spec])[0]
        self._remember(spec, demand)
        return demand

    def predict_many(self, specs: Sequence[JobSpec]) -> list[Demand]:
        """Demands of many JobSpecs in one network pass (cached ones are reused)."""
        out: list[Demand | None] = [None] * len(specs)
        missing: dict[JobSpec, list[int]] = {}
        with self._lock:
            for i, spec in enumerate(specs):
                cached = self._cache.get(spec)
                if cached is not None:
                    out[i] = cached
                    self.hits += 1
                else:
                    missing.setdefault(spec, []).append(i)
        if missing:
            unique = list(missing)
            for spec, demand in zip(unique, self._compute(unique), strict=True):
                for i in missing[spec]:
                    out[i] = demand
                self._remember(spec, demand)
        return [d for d in out if d is not None]

    def cache_clear(self) -> None:
        with self._lock:
            self._cache.clear()

    def _remember(self, spec: JobSpec, demand: Demand) -> None:
        with self._lock:
            self.misses += 1
            if self._cache_size == 0:
                return
            self._cache[spec] = demand
            self._cache.move_to_end(spec)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _compute(self, specs: Sequence[JobSpec]) -> list[Demand]:
        """The network's Demand of each spec (bf16-mixed: the larger of its amp and whole-model bf16
        readings, the network's vocabulary), then the exact-architecture / traced-peak hook
        (predictor/exact.py), then the notes of how the spec was read (`JobSpec.notes`)."""
        readings = [NETWORK_PRECISIONS.get(spec.precision, (spec.precision,)) for spec in specs]
        flat = [spec if p == spec.precision else replace(spec, precision=p)
                for spec, ps in zip(specs, readings, strict=True) for p in ps]
        network = self._network(flat)
        out, k = [], 0
        for spec, ps in zip(specs, readings, strict=True):
            group, k = network[k:k + len(ps)], k + len(ps)
            demand = group[0] if len(group) == 1 else replace(
                group[0], memory_mib=max(d.memory_mib for d in group),
                memory_mib_upper=max(d.memory_mib_upper for d in group),
                warnings=tuple(dict.fromkeys(w for d in group for w in d.warnings)))
            demand = family_heads.apply(spec, exact.override(spec, demand))  # the task's head, family path
            parts = steptime.step_parts(spec, demand)
            step = sum(parts)
            # the job's GPU time is its steps on the reference GPU (the measured step-time model, issue 30
            # point 5); the FLOPs-only estimate stays where no step could be computed
            demand = replace(demand, step_seconds=_significant(step),
                             step_parts=tuple(_significant(p) for p in parts),
                             gpu_seconds=_significant(step * spec.iterations) if step > 0 else demand.gpu_seconds)
            if spec.notes:
                demand = replace(demand, warnings=(*demand.warnings, *spec.notes))
            out.append(demand)
        return out

    def _network(self, specs: Sequence[JobSpec]) -> list[Demand]:
        cols = feats.columns_from_specs(specs)
        terms = feats.decomposition(cols, *self._calibration)
        x = feats.physics_features(cols, terms).values
        points, upper = self._estimator.predict_with_upper(x)  # densities: learned term, FLOPs
        if self._target_ranges:  # each family's densities stay inside what it had in training
            low, high = clip_bounds(self._target_ranges, [spec.model_type for spec in specs], points.shape[1])
            points = np.clip(points, low, high)
            upper = None if upper is None else np.clip(upper, low[:, 0], high[:, 0])
        memory = terms.memory(points[:, 0])
        margins = [self._margins if spec.activations_millions > 0 else self._bare_margins for spec in specs]
        head = upper if upper is not None else points[:, 0]
        base = np.where([m.point_base for m in margins], points[:, 0], head)
        flops = terms.flops(points[:, 1])
        checked = [out_of_range(spec, self._ranges) for spec in specs]
        widen = np.asarray([math.exp(m.margin(spec.model_type, self._ranges)) * factor
                            for spec, m, (factor, _) in zip(specs, margins, checked, strict=True)])
        # the margin and the out-of-range factor widen the learned term only: the fixed bytes are exact
        bound = np.maximum(terms.memory(base * widen), memory)
        fixed = terms.memory(np.zeros(len(specs)))
        table_point = (self.family_bounds_path is not None
                       and family_bounds.served_point(self.family_bounds_path) == "text_table")
        for i, spec in enumerate(specs):  # the bare family path: the bound earned per family and batch regime
            if (not spec.model and spec.traced_peak_mib <= 0 and spec.activations_millions <= 0
                    and self._bare_margins.point_base):
                read = family_table.served_point(spec) if table_point else None
                if read is not None:  # a text family: the traced table's nearest architectures (issue 47)
                    memory[i] = read.memory_mib
                bound[i] = family_bound(spec, float(memory[i]), float(fixed[i]), math.log(widen[i] / checked[i][0]),
                                        checked[i][0], self.family_bounds_path)
        return [
            Demand(
                memory_mib=round(float(memory[i]), 1),
                memory_mib_upper=round(float(bound[i]), 1),
                gflops_per_iteration=_significant(float(flops[i])),
                gpu_seconds=_significant(estimate_gpu_seconds(float(flops[i]), spec.iterations, spec.precision)),
                model_version=self.version,
                warnings=checked[i][1],
            )
            for i, spec in enumerate(specs)
        ]


def earned_bounds_of(directory: Path) -> str | None:
    """The family path's earned margins for the artifact in `directory`: predictor/data/family_bounds.json
    for the shipped artifact (they were earned by its recipe on held-out groups: `predictor.family_eval`),
    a `family_bounds.json` beside another artifact's weights, else None (its own margins: `deepres evaluate`
    scores those)."""
    if directory.resolve() == DEFAULT_ARTIFACT.resolve():
        return str(family_bounds.BOUNDS_PATH)
    own = directory / "family_bounds.json"
    return str(own) if own.is_file() else None


def family_bound(spec: JobSpec, memory: float, fixed: float, artifact_margin: float, out_of_range: float,
                 bounds_path: str | None) -> float:
    """The bound of a job on the bare family path: its learned term (what is not weights and optimizer
    state, `fixed`) widened by its family's margin earned on held-out architecture groups
    (`predictor.family_bounds`, per batch regime; the artifact's one margin where none was earned or
    `bounds_path` is None) and the out-of-range factor."""
    earned = None if bounds_path is None else family_bounds.margin(spec.model_type, spec.batch_size, bounds_path)
    margin = artifact_margin if earned is None else earned
    act = max(memory - fixed, 0.0)
    return max(fixed + act * math.exp(margin) * out_of_range, memory)


@dataclass(frozen=True)
class Margins:
    """One population's calibrated bound (`predictor.train.set_margins`): the base it multiplies (the
    point, else the quantile head) and its log margins."""

    point_base: bool
    shift: float
    by_family: Mapping[str, float]
    unseen: float | None

    def margin(self, family: str, ranges: Mapping[str, object]) -> float:
        return margin_for(family, self.by_family, self.shift, self.unseen, ranges)


def margin_for(family: str, family_shifts: Mapping[str, float], shift: float, unseen_shift: float | None,
               ranges: Mapping[str, object]) -> float:
    """The calibrated log margin of a job of this family (`predictor.train.set_margins`): its own where it
    has one, the margin over every held-out job for a family with no training range at all (never
    seen), else the margin of all families together. One rule for `evaluate` and the runtime."""
    if ranges and family not in ranges and unseen_shift is not None:
        return unseen_shift
    return float(family_shifts.get(family, shift))


def clip_bounds(ranges: Mapping[str, Sequence[Sequence[float]]], families: Sequence[str] | npt.NDArray[Any],
                n_targets: int) -> tuple[FloatArray, FloatArray]:
    """(low, high) per row and target from the per-family ranges: a learner that mixes families
    (a tree leaf, a network's linear path) never gives a job a density its family never had in
    training (a tiny custom CNN read as an MLP: a 400x memory). A family without a range: unbounded."""
    low = np.full((len(families), n_targets), 0.0)
    high = np.full((len(families), n_targets), np.inf)
    for i, family in enumerate(families):
        bounds = ranges.get(str(family))
        if bounds is not None:
            low[i], high[i] = bounds[0], bounds[1]
    return low, high


_KEYS = {"params_millions": "params-millions", "batch_size": "batch-size", "input_dim": "input-dim",
         "num_layers": "num-layers"}


Ranges = Mapping[str, Mapping[str, tuple[float, float]]]


def out_of_range(spec: JobSpec, ranges: Ranges) -> tuple[float, tuple[str, ...]]:
    """(bound factor, warnings) for a JobSpec against the per-family training ranges (`range_factor`)."""
    return range_factor(spec.model_type, {col: float(getattr(spec, col)) for col in INPUT_RANGE_COLUMNS}, ranges)


def range_factor(family: str, values: Mapping[str, float], ranges: Ranges) -> tuple[float, tuple[str, ...]]:
    """(bound factor, warnings) for one job's sizes against the per-family training ranges.

    Inside every range: (1.0, ()). Otherwise the factor grows with the largest distance outside, in
    doublings (see OUT_OF_RANGE_SLOPE), and one warning names each value, the range and the factor.
    A family with no range at all was never trained on: UNSEEN_FAMILY_FACTOR. With no ranges
    recorded (an artifact without them) nothing is flagged. `deepres evaluate` scores the bound
    with this same rule, so the report measures what is served.
    """
    if not ranges:
        return 1.0, ()
    family_ranges = ranges.get(family)
    if family_ranges is None:
        return UNSEEN_FAMILY_FACTOR, (
            f"model-type={family}: the predictor was trained on no job of this family; "
            f"the bound is widened x{UNSEEN_FAMILY_FACTOR:g}",)
    excess: dict[str, float] = {}
    for col, (low, high) in family_ranges.items():
        value = float(values[col])
        if value > high > 0:
            excess[col] = math.log2(value / high)
        elif 0 < value < low:
            excess[col] = math.log2(low / value)
    if not excess:
        return 1.0, ()
    factor = 2.0 ** (OUT_OF_RANGE_SLOPE * max(excess.values()))
    factor = min(OUT_OF_RANGE_MAX_FACTOR, factor)
    warnings = tuple(
        f"{_KEYS.get(col, col)}={_fmt(float(values[col]))} is outside {_fmt(family_ranges[col][0])}.."
        f"{_fmt(family_ranges[col][1])}, the range the predictor was trained on for {family}: "
        f"less reliable, the bound is widened x{factor:.2f}"
        for col in excess
    )
    return factor, warnings


def _fmt(value: float) -> str:
    return f"{value:g}"


def _significant(value: float, digits: int = 6) -> float:
    """Round to `digits` significant digits (hides float noise between batch and single passes)."""
    return float(f"{value:.{digits}g}")
