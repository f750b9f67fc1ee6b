"""The per-node allocation gate: the extender's half of the allocation handshake with the node's device
plugin (extender/policy/allocation.py holds the rule and says why).

Bind takes a node's gate before it creates the Binding and holds it until the kubelet has allocated
every container of that pod that requests the resource (the device plugin's `Allocate`, answered
through `/v1/allocate`), or the pod's status shows the kubelet admitted or refused it, or the pod is
gone. A second bind to the same node waits meanwhile, so the kubelet never has two deepres pods of one
node to tell apart. After an extender restart the gate is rebuilt from the pods the watch lists (bound
by deepres, not yet admitted); the kubelet's PodResources, read by the agent at each `Allocate`, says
which of them the kubelet has allocated already.

One lock (a Condition) for all nodes: the work under it is a few dict operations.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from extender.policy.allocation import Decision, NodePod, Pending, decide

#: how many completely served pods are remembered (per extender) for the kubelet's status to catch up
DONE_MEMORY = 4096
#: seconds a completely served pod stays "recently done"
DONE_TTL_S = 600.0


@dataclass(frozen=True)
class GateStats:
    pending: int
    waiting_binds: int


class AllocationGate:
    """Per node: the pods bound there and not yet allocated (at most one, except after a restart)."""

    def __init__(self, mono: Callable[[], float] = time.monotonic) -> None:
        self._cond = threading.Condition()
        self._pending: dict[str, dict[str, Pending]] = {}  # node -> uid -> Pending
        self._node_of: dict[str, str] = {}  # uid -> node
        self._done: OrderedDict[str, float] = OrderedDict()  # uid -> mono when served completely
        self._waiting = 0
        self.mono = mono

    # ---- bind ----
    def acquire(self, node: str, pod: Pending, timeout_s: float) -> str:
        """Hold `node`'s gate for `pod` (a pod with no container requesting the resource needs none).
        Waits up to `timeout_s` while another pod of that node awaits its allocation; '' once held (or
        already held by this pod: a retried bind), else why not."""
        if not pod.sizes:
            return ""
        deadline = self.mono() + timeout_s
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    held = self._pending.get(node) or {}
                    others = [p for uid, p in held.items() if uid != pod.uid]
                    if not others:
                        if pod.uid not in held:
                            self._add(node, pod)
                        return ""
                    left = deadline - self.mono()
                    if left <= 0:
                        names = ", ".join(sorted(p.key for p in others))
                        return (f"node {node} is still admitting {names} (the kubelet has not allocated its GPUs "
                                f"within {timeout_s:g} s); binding one pod per node at a time")
                    self._cond.wait(min(left, 1.0))
            finally:
                self._waiting -= 1

    def cancel(self, uid: str) -> None:
        """The bind failed: the pod will not reach the node's kubelet."""
        self.settle(uid)

    # ---- the device plugin's Allocate ----
    def allocate(self, node: str, resource: str, size: int, node_pods: Sequence[NodePod]) -> Decision:
        """Decide (the policy's rule) and record the serving; a pod served completely frees the gate."""
        with self._cond:
            self._expire_done()
            pending = list((self._pending.get(node) or {}).values())
            decision = decide(node, resource, size, pending, node_pods, self._done.keys())
            pod = decision.pod
            if pod is not None:
                if pod.complete:
                    self._remove(pod.uid)
                    self._done[pod.uid] = self.mono()
                    while len(self._done) > DONE_MEMORY:
                        self._done.popitem(last=False)
                    self._cond.notify_all()
                else:
                    self._pending[node][pod.uid] = pod
            return decision

    # ---- the pod watch ----
    def settle(self, uid: str) -> bool:
        """The pod was admitted or refused by its kubelet, finished, or is gone: its node's gate opens."""
        with self._cond:
            if uid not in self._node_of:
                return False
            self._remove(uid)
            self._cond.notify_all()
            return True

    def restore(self, node: str, pod: Pending) -> None:
        """After a restart: a pod bound to `node` that its kubelet has not admitted yet (per its status)."""
        if not pod.sizes:
            return
        with self._cond:
            if pod.uid not in self._node_of and pod.uid not in self._done:
                self._add(node, pod)

    def holds(self, uid: str) -> bool:
        return uid in self._node_of  # a dict read: the watch asks it for every event of a bound pod

    def stats(self) -> GateStats:
        with self._cond:
            return GateStats(pending=len(self._node_of), waiting_binds=self._waiting)

    def pending(self, node: str) -> list[Pending]:
        with self._cond:
            return list((self._pending.get(node) or {}).values())

    # ---- under the lock ----
    def _add(self, node: str, pod: Pending) -> None:
        self._pending.setdefault(node, {})[pod.uid] = pod
        self._node_of[pod.uid] = node

    def _remove(self, uid: str) -> None:
        node = self._node_of.pop(uid, None)
        if node is None:
            return
        held = self._pending.get(node)
        if held is not None:
            held.pop(uid, None)
            if not held:
                del self._pending[node]

    def _expire_done(self) -> None:
        cutoff = self.mono() - DONE_TTL_S
        while self._done:
            at = next(iter(self._done.values()))
            if at >= cutoff:
                break
            self._done.popitem(last=False)
