"""`deepres serve` with the placement rule taken out, for `deepres bench cluster --floor` only.

Issue 31 asks what the extender costs per GPU pod. This measures the floor under that cost: the
same server, settings, transport, pod watch, bind and telemetry, but each /filter of a GPU pod
names one of the offered nodes, round-robin, with no filter, sharing pass, score or reservation
(the pod's demand is still predicted, as the real filter does, to tell a GPU pod). Bind then
reserves the GPUs as it does for a pod no prioritize assumed, and refuses a node without room
(kube-scheduler filters the pod again).
What a real run costs above this run is the placement rule's share; what this run costs is what
any choice would leave.

Not a scheduler: a run places pods blind to the GPUs. The serving code has no such switch: run as a
command, this module replaces `Placer.filter` in the server's main process and (through `load_app`,
which granian's worker imports by name) in its worker; importing it changes nothing.

    python -m devtools.floor_extender serve ARGS...   # what `deepres bench cluster --floor` starts
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

from extender import cli
from extender.annotations import AnnotationError
from extender.policy.types import FilterResult
from extender.protocol import ExtenderArgs, ProtocolError, filter_error, filter_result, parse_extender_args
from extender.server import placing, serve
from extender.server.planner import PredictorUnavailable

_real_filter = placing.Placer.filter
_real_load_app = serve.load_app
_turn = itertools.count()


def floor_filter(self: placing.Placer, body: Any) -> dict[str, Any]:
    """One offered node, in turn, for a GPU pod; any other pod as the real filter answers it."""
    try:
        args = body if isinstance(body, ExtenderArgs) else parse_extender_args(body)
    except ProtocolError as err:
        return filter_error(f"bad ExtenderArgs: {err}")
    not_ready = self.readiness.not_ready()
    if not_ready or not args.node_names:
        return _real_filter(self, args)
    self.cluster.learn_pod(args.raw_pod)  # local mode only, as the real filter
    try:
        plan = self.planner.plan(args.pod, self.clock())
    except (AnnotationError, PredictorUnavailable):  # the real filter answers these
        return _real_filter(self, args)
    if not plan.request.gpu_job:
        return _real_filter(self, args)
    name = args.node_names[next(_turn) % len(args.node_names)]
    return filter_result(FilterResult((name,), {}, {}, {}), args)


def load_app(*args: Any, **kwargs: Any) -> Any:
    """`serve.load_app` in the worker (granian's loader imports this function by name)."""
    install()
    return _real_load_app(*args, **kwargs)


def install() -> None:
    """The floor filter in this process, and in the server's worker through `load_app`."""
    placing.Placer.filter = floor_filter  # type: ignore[method-assign]
    serve.load_app = load_app


if __name__ == "__main__":  # by its name, so that the worker imports `devtools.floor_extender.load_app`
    from devtools import floor_extender

    floor_extender.install()
    raise SystemExit(cli.main(sys.argv[1:]))
