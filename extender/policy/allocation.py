"""Which pod a kubelet's `Allocate` is for: the per-node allocation handshake's rule, pure.

The kubelet's device plugin API names slot IDs in `Allocate`, never the pod, and every deepres pod asks
for the same kind of slot, so the answer cannot come from the request. It comes from two facts that no
tenant can write:

- the extender's gate: at most one pod per node that deepres bound and whose containers the kubelet has
  not all allocated yet (`Pending`: bind waits for the node's previous pod before it creates the next
  Binding, HAMi's per-node allocation lock kept in the extender's memory instead of a Node annotation);
- the kubelet's own record of what it allocated (its PodResources API, read by the agent), with the
  pods of the node as the API server lists them (`NodePod`).

The kubelet admits one pod at a time and calls `Allocate` once per container that requests the
resource (init containers first, then the app containers, in spec order), so an `Allocate` is for the
one pod of the node that requests the resource and has not been allocated, which must be the gate's.
Anything else is refused, never guessed: a pod deepres did not bind asking for the resource (a pod of
the default scheduler with a nodeSelector, a pod created with `spec.nodeName`), two candidates, a
request whose size is not what the pod's next container asks for. A refusal fails that pod's
admission at the kubelet (`UnexpectedAdmissionError`); a served pod keeps its GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from extender.pod_requests import NodePod

__all__ = ["Decision", "NodePod", "Pending", "decide"]


@dataclass(frozen=True)
class Pending:
    """A pod deepres bound to a node whose containers the kubelet has not all been handed yet."""

    uid: str
    key: str  # namespace/name, for messages
    gpus: tuple[str, ...]
    #: the devices each container asks for, in the order the kubelet allocates them (init containers,
    #: then containers; only those with a positive request)
    sizes: tuple[int, ...]
    served: int = 0

    @property
    def complete(self) -> bool:
        return self.served >= len(self.sizes)


@dataclass(frozen=True)
class Decision:
    """The pod served and the gate's new record of it, or why none is (`error`)."""

    pod: Pending | None = None
    error: str = ""

    @property
    def served(self) -> bool:
        return self.pod is not None


def decide(node: str, resource: str, size: int, pending: Sequence[Pending], node_pods: Sequence[NodePod],
           recently_done: Iterable[str] = ()) -> Decision:
    """Whom an `Allocate` of `size` devices on `node` serves (see the module doc).

    `pending`: the gate's pods for this node; `node_pods`: the node's pods that request `resource`;
    `recently_done`: uids of pods the gate served completely a moment ago (the kubelet's status for
    them may lag, and PodResources does not list plain init containers)."""
    done = set(recently_done)
    pending_uids = {p.uid for p in pending}
    waiting = [p for p in node_pods if not p.allocated and p.uid not in pending_uids and p.uid not in done]
    if waiting:
        names = ", ".join(sorted(p.key for p in waiting)[:5])
        return Decision(error=f"pods on node {node} request {resource} that deepres did not bind to it ({names}): "
                              f"refusing rather than guessing which pod this Allocate is for")
    present = {p.uid: p for p in node_pods}
    candidates = [p for p in pending if p.uid in present and not p.complete
                  and (p.served > 0 or not present[p.uid].allocated)]
    if not candidates:
        return Decision(error=f"no pod that deepres bound to node {node} awaits a container requesting {size} "
                              f"{resource}: refusing to hand out GPUs to an unknown pod")
    if len(candidates) > 1:
        names = ", ".join(sorted(p.key for p in candidates))
        return Decision(error=f"{len(candidates)} pods bound to node {node} await their GPUs ({names}): refusing "
                              f"rather than guessing which one this Allocate is for")
    pod = candidates[0]
    expected = pod.sizes[pod.served]
    if size != expected:
        return Decision(error=f"Allocate asks for {size} {resource} on node {node}, but the next container of pod "
                              f"{pod.key} requests {expected}: refusing")
    return Decision(pod=Pending(pod.uid, pod.key, pod.gpus, pod.sizes, pod.served + 1))
