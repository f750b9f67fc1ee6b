"""A filter's failure reasons, worded when read (`columnar.filter_matrix`): at 5,000 nodes a filter
whose answer carries no failures (the shortlist drops them when some node fits) wording thousands of
full nodes' reasons was the largest per-name cost of a pod. Pure: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from itertools import chain

from extender.policy.filtering import MEMORY, NO_REPORT, STALE, TOO_FEW_GPUS, TOO_LARGE, is_fresh, node_failure
from extender.policy.types import NodeView, PodRequest, PolicyParams

#: The failure kinds `filter_matrix` sorts failed rows into, in node_failure's order of conditions.
KINDS = (NO_REPORT, STALE, TOO_FEW_GPUS, TOO_LARGE, MEMORY)
#: The words of a failure the filter found on a row whose NodeView fits the pod when the words are read
#: (a report arrived in between: kube-scheduler asks again).
CHANGED = "its telemetry changed while the filter read it"


class Wording:
    """`node_failure`'s words for a name the filter failed, from its NodeView, when asked. The most
    common failure at scale, a job larger than a node's GPUs, depends on the GPU size alone: worded
    once per size (the conditions are node_failure's, in its order)."""

    def __init__(self, pod: PodRequest, nodes: Mapping[str, NodeView], now_s: float, params: PolicyParams) -> None:
        self.pod, self.nodes, self.now_s, self.params = pod, nodes, now_s, params
        self._too_large: dict[float, str] = {}

    def __call__(self, name: str) -> str:
        pod, node = self.pod, self.nodes.get(name)
        count = max(pod.gpus, 1)
        if (node is not None and is_fresh(node.received_s, self.now_s, self.params)
                and len(node.capacity_desc) >= count and node.capacity_desc[count - 1] < pod.admission_mib):
            size = node.capacity_desc[count - 1]
            if size not in self._too_large:
                self._too_large[size] = self._words(node)
            return self._too_large[size]
        return self._words(node)

    def _words(self, node: NodeView | None) -> str:
        failure = node_failure(self.pod, node, self.now_s, self.params)
        return failure[1] if failure is not None else CHANGED


class Reasons(Mapping[str, str]):
    """Why each of `names` failed (in their order), worded on first read by `word`: a filter answer
    whose failures nobody reads (the shortlist drops them when some node fits) words none."""

    def __init__(self, names: tuple[str, ...], word: Callable[[str], str]) -> None:
        self._names, self._word = names, word
        self._members: frozenset[str] | None = None
        self._worded: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __contains__(self, name: object) -> bool:
        if self._members is None:
            self._members = frozenset(self._names)
        return name in self._members

    def __getitem__(self, name: str) -> str:
        words = self._worded.get(name)
        if words is None:
            if name not in self:
                raise KeyError(name)
            words = self._worded[name] = self._word(name)
        return words

    def __repr__(self) -> str:
        return f"Reasons({dict(self)!r})"


class _Joined(Mapping[str, str]):
    """Mappings read as one, as `{**a, **b}` would be (the later one's words for a name in both),
    without reading any words before they are asked for."""

    def __init__(self, maps: tuple[Mapping[str, str], ...]) -> None:
        self._maps = maps

    def __getitem__(self, name: str) -> str:
        for one in reversed(self._maps):
            if name in one:
                return one[name]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(chain.from_iterable(self._maps)))

    def __len__(self) -> int:
        return len(dict.fromkeys(chain.from_iterable(self._maps)))

    def __contains__(self, name: object) -> bool:
        return any(name in one for one in self._maps)

    def __repr__(self) -> str:
        return f"_Joined({dict(self)!r})"


def joined(*maps: Mapping[str, str]) -> Mapping[str, str]:
    """`{**a, **b, ...}` of failure reasons, lazily where some are `Reasons` (none worded here)."""
    present = tuple(m for m in maps if m)
    if len(present) <= 1:
        return present[0] if present else {}
    if all(type(m) is dict for m in present):
        return {k: v for m in present for k, v in m.items()}
    return _Joined(present)
