"""The shipped predictor at run time: JobSpec -> Demand, fast, deterministic, cached, thread-safe.

The extender calls `predict` inside kube-scheduler's 5-second extender timeout for every pod it
sees, often for the same JobSpec again (a pod is retried on every cluster event), so:
- the artifact is loaded once (`Predictor.load`) and the network runs in inference mode on one
  torch thread (a tiny network gains nothing from more, and the web server has its own threads);
- results are cached by JobSpec (frozen, hashable; `defaulted` does not take part) in a bounded LRU;
- a lock guards the cache only; inference itself needs no lock (no state changes in eval mode).
"""

from __future__ import annotations

import json
import pickle
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictor import exact
from predictor import features as feats
from predictor.model import TransformerBiGRURegressor
from predictor.spec import Demand, JobSpec, estimate_gpu_seconds

DEFAULT_ARTIFACT = Path(__file__).resolve().parent / "artifacts"
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "transformer_bigru_tuned.pt"
DEFAULT_CACHE_SIZE = 4096
#: torch intra-op threads for inference: one, so a request never contends with the server's threads.
INFERENCE_THREADS = 1


class ArtifactError(RuntimeError):
    """The shipped artifact is missing or unreadable; the message names the command that builds it."""


class Predictor:
    """The embedded demand predictor (`predictor.spec.DemandPredictor`)."""

    def __init__(self, estimator: TransformerBiGRURegressor, metadata: dict[str, Any],
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self._estimator = estimator
        self.metadata = metadata
        self.version: str = str(metadata["version"])
        self._memory_shift = float(metadata.get("memory_upper_shift", 0.0))
        self._cache: OrderedDict[JobSpec, Demand] = OrderedDict()
        self._cache_size = max(0, cache_size)
        self._lock = threading.Lock()
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
            weights = torch.load(weights_path, map_location="cpu", weights_only=True)
            estimator = TransformerBiGRURegressor.from_state(weights, metadata["estimator"])
        except (OSError, ValueError, KeyError, RuntimeError, TypeError, pickle.UnpicklingError) as err:
            raise ArtifactError(f"the predictor artifact in {directory} is unreadable ({err}): "
                                f"rebuild it with `deepres train`") from None
        if metadata.get("feature_set") != "physics" or metadata.get("feature_names") != list(
            feats.physics_features(feats.columns_from_specs([JobSpec("mlp")])).names
        ):
            raise ArtifactError(f"the predictor artifact in {directory} was built for other features: "
                                f"rebuild it with `deepres train`")
        torch.set_num_threads(INFERENCE_THREADS)
        return cls(estimator, metadata, cache_size)

    def with_cache_size(self, cache_size: int) -> Predictor:
        """The same loaded model with its own, empty cache of the given size (0: no cache)."""
        return Predictor(self._estimator, self.metadata, cache_size)

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
        x = feats.physics_features(feats.columns_from_specs(specs)).values
        # numpy: at these sizes torch operator dispatch, not arithmetic, would dominate
        points, upper = self._estimator.predict_with_upper(x, engine="numpy")
        memory = points[:, 0]
        bound = upper if upper is not None else memory
        bound = np.maximum(bound * np.exp(self._memory_shift), memory)
        demands = []
        for spec, mem, mem_upper, gflops in zip(specs, memory, bound, points[:, 1], strict=True):
            demands.append(exact.override(spec, Demand(  # exact-architecture / traced-peak hook (predictor/exact.py)
                memory_mib=round(float(mem), 1),
                memory_mib_upper=round(float(mem_upper), 1),
                gflops_per_iteration=_significant(float(gflops)),
                gpu_seconds=_significant(estimate_gpu_seconds(float(gflops), spec.iterations, spec.precision)),
                model_version=self.version,
            )))
        return demands


def _significant(value: float, digits: int = 6) -> float:
    """Round to `digits` significant digits (hides float noise between batch and single passes)."""
    return float(f"{value:.{digits}g}")
