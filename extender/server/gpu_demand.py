"""A pod's demand on a GPU model: the offline per-GPU line (predictor.gpucal), then the live calibration
(extender.policy.calibration over the ledger's calibration store), then the usage rule's correction by
the job's observed peaks. The filter and bind admit a pod on a node at its demand on that node's GPU
model; /v1/predict answers it for the GPU model a request names. A cluster has a handful of GPU
models, so a filter computes it once per model among its nodes, not per node (`by_model`)."""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from itertools import compress, repeat
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.ledger import Ledger
from extender.model_keys import ModelKey
from extender.policy import FilterResult, PodRequest, PolicyParams, corrected_admission
from extender.policy.calibration import corrected, regime
from extender.policy.columnar import NodeMatrix
from extender.policy.reasons import joined
from extender.settings import Settings
from extender.telemetry import NodeReport
from predictor import gpucal
from predictor.spec import Demand

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnModel:
    """The demand on one GPU model (per GPU, MiB)."""

    gpu: str
    software: str
    path: str  # exact | family
    offline_mib: float  # the point on the model's per-GPU line (the Demand's own where none)
    offline_upper_mib: float
    line: bool  # a measured per-GPU line applied
    memory_mib: float  # calibrated where the calibration is
    memory_mib_upper: float
    calibrated: bool
    pods: int  # the pods the calibration was learned from
    admission_mib: float  # what the filter admits: the bound, corrected by the job's observed peaks
    regime: str = ""  # the batch regime the calibration's bound scale is taken in

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_software(report: NodeReport) -> str:
    """The calibration's node software: "driver/CUDA" as the agent reported them ("" when neither)."""
    return report.model_key[1]


def node_models(ledger: Ledger, node: str) -> ModelKey | None:
    """(the distinct GPU models of `node` in GPU order, node software) from its last report, or None."""
    telemetry = ledger.telemetry(node)
    if telemetry is None or not telemetry.report.gpus:
        return None
    return telemetry.report.model_key  # computed once per report


def node_model(ledger: Ledger, node: str) -> tuple[str, str] | None:
    """(GPU model, node software) of `node` (its first GPU's model: see `node_models`), or None."""
    found = node_models(ledger, node)
    return (found[0][0], found[1]) if found is not None else None


def gpu_model_of(ledger: Ledger, node: str, uuid: str) -> tuple[str, str] | None:
    """(GPU model, node software) of GPU `uuid` on `node` (the model a bound pod got), or None."""
    telemetry = ledger.telemetry(node)
    if telemetry is None:
        return None
    for gpu in telemetry.report.gpus:
        if gpu.uuid == uuid:
            return gpu.model, node_software(telemetry.report)
    return None


def on_model(ledger: Ledger, params: PolicyParams, demand: Demand, precision: str, gpu: str, software: str,
             upper_to_admission: Any, batch_size: int = 0) -> OnModel:
    """`demand` on GPU model `gpu` with node software `software`. `upper_to_admission(bound)`: the
    usage rule's correction of a bound into the admission (`corrected_admission` with the job's
    correction)."""
    path = gpucal.path_of(demand)
    offline = gpucal.on_gpu(demand, precision, gpu, path)
    batch = regime(batch_size)
    fixed = corrected(offline.memory_mib, offline.memory_mib_upper, ledger.calibration.shifts(), (gpu, software, path),
                      batch)
    return OnModel(gpu, software, path, offline.memory_mib, offline.memory_mib_upper, offline.calibrated,
                   fixed.memory_mib, fixed.memory_mib_upper, fixed.calibrated, fixed.pods,
                   float(upper_to_admission(fixed.memory_mib_upper)), batch)


class ModelDemands:
    """The planner's per-GPU-model admissions (glue: the rules are gpucal's and the policy's)."""

    def __init__(self, ledger: Ledger, params: PolicyParams) -> None:
        self.ledger = ledger
        self.params = params
        self._mixed: set[str] = set()  # nodes mixing GPU models, said once in the log
        self._row_keys = _RowKeys.empty()  # each row's model key (`_grouped`)

    def on(self, req: PodRequest, demand: Demand | None, precision: str, signature_correction: Any,
           gpu: str, software: str, batch_size: int = 0) -> OnModel | None:
        """None for a pod admitted without a model prediction (not a GPU job, a gpu-memory override)."""
        if demand is None or not req.gpu_job or not req.fallback:
            return None
        return on_model(self.ledger, self.params, demand, precision, gpu, software,
                        lambda upper: corrected_admission(upper, signature_correction, self.params), batch_size)

    def on_node(self, req: PodRequest, demand: Demand | None, precision: str, signature_correction: Any,
                models: tuple[str, ...], software: str, batch_size: int = 0, node: str = "") -> OnModel | None:
        """The demand on a node with GPUs of `models`: on a node mixing GPU models, the largest demand
        among them (a pod is admitted on each of its GPUs at its demand there or more: never under;
        the filter does not tell the models of one node apart), said once per node in the log."""
        found = [self.on(req, demand, precision, signature_correction, gpu, software, batch_size) for gpu in models]
        ons = [m for m in found if m is not None]
        if not ons:
            return None
        if len(ons) > 1 and node and node not in self._mixed:
            self._mixed.add(node)
            log.warning("node %s has GPUs of several models (%s): a pod is admitted on any of its GPUs at its "
                        "largest demand among those models (docs/calibration.md)", node, ", ".join(models))
        return max(ons, key=lambda m: m.admission_mib)

    def by_model(self, req: PodRequest, demand: Demand | None, precision: str, signature_correction: Any,
                 names: Iterable[str], batch_size: int = 0) -> list[tuple[PodRequest, tuple[str, ...]]] | None:
        """`names` grouped by GPU model (the set of models on a node mixing them, admitted at the
        largest: `on_node`) with the request admitted on each; None when every group admits `req` as
        it is (no line, no calibration: one filter call as before)."""
        if demand is None or not req.gpu_job or not req.fallback:
            return None
        key_of, in_use = self.ledger.model_keys()
        if not in_use:
            return None  # no node has reported GPUs: every name fails for that, whatever the admission
        if len(in_use) == 1:  # one GPU model and software in the whole cluster (the usual case): one group,
            # no look at each name (a name without a report fails the filter for that whatever it admits)
            names = tuple(names)
            mixed = len(in_use[0][0]) > 1  # (the warning about a node mixing models names one of them)
            node = next((n for n in names if n in key_of), "") if mixed else ""
            model = self.on_node(req, demand, precision, signature_correction, *in_use[0], batch_size, node)
            if model is None or abs(model.admission_mib - req.admission_mib) <= 0.05:
                return None
            return [(on_request(req, model), names)]
        groups = self._grouped(tuple(names), key_of, in_use)
        out: list[tuple[PodRequest, tuple[str, ...]]] = []
        for key, members in groups.items():
            variant = req
            if key is not None:
                model = self.on_node(req, demand, precision, signature_correction, *key, batch_size, members[0])
                if model is not None and abs(model.admission_mib - req.admission_mib) > 0.05:
                    variant = on_request(req, model)
            out.append((variant, members))
        if all(variant is req for variant, _ in out):
            return None
        return out

    def _grouped(self, names: tuple[str, ...], key_of: Mapping[str, ModelKey],
                 in_use: tuple[ModelKey, ...]) -> dict[ModelKey | None, tuple[str, ...]]:
        """`grouped_by_key` over the list's names without repeats, by rows: each name's row from the
        list's lookup (`NodeMatrix.lookup`, the one pass over the names), each row's key from an index
        made once per change of the keys or the rows (`_RowKeys`), each group's rows remembered for its
        filter. At 5,000 names a pass of dict lookups costs ~0.2-0.4 ms: a filter made three (the
        keys, then each group's rows, then the merged answer's)."""
        matrix = self.ledger.matrix
        looked = matrix.lookup(names)
        unique = tuple(looked.names) if len(looked.names) != len(names) else names
        index = self._row_keys
        if not index.holds(key_of, in_use, looked.layout):
            index = self._row_keys = _RowKeys(key_of, in_use, looked.layout, matrix.index, len(matrix.arrays.version))
        codes = index.codes(looked.rows, unique, key_of)
        groups: dict[ModelKey | None, tuple[str, ...]] = {}
        for code, used in enumerate((*in_use, None)):  # (few: the cluster's GPU models and node software)
            mask = codes == code
            if not mask.any():
                continue
            members, group = looked.subset(mask)
            matrix.remember(members, group, by_identity=True)
            groups[used] = members
        return groups


class _RowKeys:
    """Each matrix row's model key, as the index of its key in `in_use` (len(in_use): none), made from
    a snapshot of the keys (`Ledger.model_keys`) and the rows as of `layout`. `holds` tells whether a
    later snapshot is the same: its names and keys compared in order, object by object (~30 us at
    5,000 nodes: no hashing), not looked up name by name."""

    def __init__(self, key_of: Mapping[str, ModelKey], in_use: tuple[ModelKey, ...], layout: int,
                 row_of: Mapping[str, int], rows_in_all: int) -> None:
        self.names, self.keys, self.in_use, self.layout = list(key_of), list(key_of.values()), in_use, layout
        self.code_of = {key: code for code, key in enumerate(in_use)}
        rows = np.fromiter(map(row_of.get, self.names, repeat(-1)), dtype=np.int64, count=len(self.names))
        codes = np.fromiter(map(self.code_of.get, self.keys, repeat(len(in_use))), dtype=np.int64,
                            count=len(self.keys))
        known = rows >= 0
        size = max(rows_in_all, int(rows.max()) + 1 if known.any() else 0)
        self.by_row = np.full(size, len(in_use), dtype=np.int64)
        self.by_row[rows[known]] = codes[known]

    @classmethod
    def empty(cls) -> _RowKeys:
        return cls({}, (), -1, {}, 0)

    def holds(self, key_of: Mapping[str, ModelKey], in_use: tuple[ModelKey, ...], layout: int) -> bool:
        return (layout == self.layout and in_use == self.in_use and len(key_of) == len(self.names)
                and list(key_of) == self.names and list(key_of.values()) == self.keys)

    def codes(self, rows: npt.NDArray[np.int64], names: tuple[str, ...],
              key_of: Mapping[str, ModelKey]) -> npt.NDArray[np.int64]:
        """Each of `names`' key index (rows: theirs, -1 for a name without a row, asked by name)."""
        none = len(self.in_use)
        inside = (rows >= 0) & (rows < len(self.by_row))
        codes: npt.NDArray[np.int64] = np.full(len(rows), none, dtype=np.int64)
        codes[inside] = self.by_row[rows[inside]]
        for i in np.flatnonzero(~inside).tolist():  # names no report made a row for (few)
            key = key_of.get(names[i])
            codes[i] = self.code_of.get(key, none) if key is not None else none
        return codes


def grouped_by_key(names: tuple[str, ...], key_of: Mapping[str, ModelKey],
                   in_use: Iterable[ModelKey]) -> dict[ModelKey | None, tuple[str, ...]]:
    """`names` by their node's model key (`key_of`; `in_use`: every key it holds, nodes of one key sharing
    one object, as `Ledger.model_keys` gives them), each group in the input order; None: the names
    without one (no report of GPUs). The loops run in C (map, compress): a filter
    is offered every node's name, and a Python loop over them was ~15% of the verbs' time in `deepres
    bench extender` at 1,000 nodes."""
    keys = list(map(key_of.get, names))
    groups: dict[ModelKey | None, tuple[str, ...]] = {}
    for used in in_use:  # (few: the cluster's GPU models and node software)
        members = tuple(compress(names, map(operator.is_, repeat(used), keys)))  # (one object per key)
        if members:
            groups[used] = members
    unknown = tuple(compress(names, map(operator.not_, keys)))  # (a key is a non-empty tuple: never falsy)
    if unknown:
        groups[None] = unknown
    return groups


def on_request(req: PodRequest, model: OnModel) -> PodRequest:
    """`req` admitted on the GPU model: its admission and its point there (the whole-GPU fallback's)."""
    return replace(req, admission_mib=model.admission_mib, predicted_mib=model.memory_mib)


def merged(results: list[FilterResult], names: Iterable[str], matrix: NodeMatrix | None = None) -> FilterResult:
    """The filter results of the GPU-model groups as one: passed names in the input order. The
    whole-GPU fallback applies when no node of any group passed without it (as for one group): the
    nodes a group passed by it fail when another group's nodes pass plainly. With the `matrix`, the
    passed names' rows are taken from the list's and remembered (the sharing pass and the shortlist
    look no name up again); the failures are not worded (`policy.reasons`)."""
    plain = any(r.passed and r.request is None for r in results)
    chosen = [r.passed for r in results if r.passed and not (plain and r.request is not None)]
    demoted = {n: "fits only as a whole GPU, and other nodes fit the pod" for r in results
               if plain and r.request is not None for n in r.passed}
    failed = joined(demoted, *(r.failed for r in results))
    unresolvable = joined(*(r.unresolvable for r in results))
    kinds: dict[str, int] = {}
    for r in results:
        for kind, count in r.kinds.items():
            kinds[kind] = kinds.get(kind, 0) + count
    fallback = [r.request for r in results if r.passed and r.request is not None]
    request = None if plain or not fallback else fallback[0]
    if matrix is None:
        order = tuple(compress(*_unique_with(names, set().union(*chosen))))
        return FilterResult(order, failed, unresolvable, kinds, request)
    looked = matrix.lookup(names)  # the list's own (`ModelDemands._grouped` looked it up)
    marked = np.zeros(len(matrix.arrays.version), dtype=bool)  # by row: no name is looked up again
    for group in chosen:
        rows_passed = matrix.lookup(group).rows  # remembered by its filter: found by identity
        marked[rows_passed[(rows_passed >= 0) & (rows_passed < len(marked))]] = True
    rows = looked.rows
    keep = (rows >= 0) & (rows < len(marked))
    keep[keep] = marked[rows[keep]]
    if int(np.count_nonzero(keep)) != sum(map(len, chosen)):  # a passed name without a row, or groups that
        passed = set().union(*chosen)  # share names (never from `by_model`): name by name
        keep = np.fromiter(map(passed.__contains__, looked.names), dtype=bool, count=len(looked.names))
    order, order_lookup = looked.subset(keep)
    if order:
        matrix.remember(order, order_lookup, by_identity=True)
    return FilterResult(order, failed, unresolvable, kinds, request)


def _unique_with(names: Iterable[str], passed: set[str]) -> tuple[list[str], Iterator[bool]]:
    unique = list(dict.fromkeys(names))
    return unique, map(passed.__contains__, unique)


def calibration_file(settings: Settings) -> str:
    """Where the online calibration is kept: next to the local-mode state file (`--no-kube
    --state-file F`: `F.calibration.json`); "" (in memory) otherwise."""
    state = settings.kube.state_file
    return f"{state}.calibration.json" if settings.kube.no_kube and state else ""


def calibration_keeper(settings: Settings, cluster: Any) -> Any:
    """The ConfigMap keeping the online calibration with the API server (`kube.calibration_configmap`
    in the extender's namespace: POD_NAMESPACE, else the ServiceAccount's), or None."""
    name = settings.kube.calibration_configmap
    if settings.kube.no_kube or not name or not hasattr(cluster, "write_config_map"):
        return None
    import os
    from pathlib import Path

    from extender.kube.calibration_configmap import ConfigMapKeeper

    namespace = os.environ.get("POD_NAMESPACE", "")
    account = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if not namespace and account.is_file():
        namespace = account.read_text().strip()
    if not namespace:
        log.error("calibration: kube.calibration_configmap=%s but no namespace (POD_NAMESPACE unset, no "
                  "ServiceAccount namespace file): the calibration is kept in memory only", name)
        return None
    return ConfigMapKeeper(cluster, namespace, name)


class CalibrationCollector(Collector):
    """`deepres_calibration_*` per (GPU model, node software, path): pods seen (with a peak), the
    learned shift (calibrated / offline point at the pods' median point; 1 where none), the bound
    factor, and the residual under-rate (share of the pods it was learned from above the bound)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["gpu_model", "software", "path"]
        seen = GaugeMetricFamily("deepres_calibration_pods_seen",
                                 "Pods deepres placed whose peak the agent reported, per GPU model, node software "
                                 "and prediction path.", labels=labels)
        shift = GaugeMetricFamily("deepres_calibration_shift",
                                  "Calibrated / offline point at the median point of the pods learned from "
                                  "(1: not calibrated yet).", labels=labels)
        factor = GaugeMetricFamily("deepres_calibration_bound_factor",
                                   "Calibrated bound / calibrated point (1: not calibrated yet).", labels=labels)
        under = GaugeMetricFamily("deepres_calibration_under_rate",
                                  "Share of the pods learned from whose peak is above their calibrated bound.",
                                  labels=labels)
        store = self.ledger.calibration
        shifts = store.shifts()
        for key, count in sorted(store.pods_seen().items()):
            learned = shifts.get(key)
            values = list(key)
            seen.add_metric(values, count)
            shift.add_metric(values, learned.shift if learned else 1.0)
            factor.add_metric(values, learned.bound_factor if learned else 1.0)
            under.add_metric(values, learned.under_rate if learned else 0.0)
        yield from (seen, shift, factor, under)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())
