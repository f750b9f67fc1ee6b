"""Each node's GPU model key, for admission per GPU model (`server/gpu_demand.py`): the ledger keeps
one per node from its last report, so that a filter groups the names it is offered without reading
each node's report (that was ~40% of the verbs' time in `deepres bench extender` at 1,000 nodes)."""

from __future__ import annotations

from collections.abc import Mapping

from extender.telemetry import NodeReport

#: A node's (distinct GPU models in GPU order, node software "driver/CUDA"): `NodeReport.model_key`.
ModelKey = tuple[tuple[str, ...], str]


class ModelKeys:
    """Each node's key, how many nodes have each, and one object per key (the filter groups by
    identity). Not thread-safe: the ledger calls it under its lock."""

    def __init__(self) -> None:
        self._of: dict[str, ModelKey] = {}
        self._nodes: dict[ModelKey, int] = {}
        self._object: dict[ModelKey, ModelKey] = {}

    def set(self, node: str, report: NodeReport | None) -> None:
        """`node`'s key from its report (None, or a report without GPUs: it has none)."""
        key = report.model_key if report is not None and report.gpus else None
        old = self._of.get(node)
        if key == old:
            return
        if old is not None:
            left = self._nodes[old] - 1
            if left:
                self._nodes[old] = left
            else:
                del self._nodes[old]
                del self._object[old]
        if key is None:
            self._of.pop(node, None)
        else:
            key = self._object.setdefault(key, key)
            self._of[node] = key
            self._nodes[key] = self._nodes.get(key, 0) + 1

    def snapshot(self) -> tuple[Mapping[str, ModelKey], tuple[ModelKey, ...]]:
        """Each node's key and the distinct ones: a copy (~20 us at 1,000 nodes) where there are
        several keys; with one, the live mapping (read it, never change it)."""
        keys = tuple(self._nodes)
        return (dict(self._of) if len(keys) > 1 else self._of), keys


def nodes_per_model(of: Mapping[str, ModelKey]) -> dict[tuple[str, str], int]:
    """How many nodes report each (GPU model, node software) (a node with two models counts for each)."""
    counts: dict[tuple[str, str], int] = {}
    for models, software in of.values():
        for model in models:
            counts[(model, software)] = counts.get((model, software), 0) + 1
    return counts
