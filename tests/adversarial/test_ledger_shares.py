"""Issue 34 row 6, a pod that lies: a declared `deepres.io/gpu-share` is a prior, not a pass.

With sharing on, six pods declaring 0.01 joined a GPU-bound pod, whose slowdown with their real duty
(they were GPU-bound too) became 6.45 against a bound of 1.25. Now a declaration counts only down to
its namespace's share floor until the job signature's duty is observed (default 1.0: not at all),
through the live HTTP path (filter, bind) against the in-memory API server.
"""

from __future__ import annotations

from extender.policy.interference import slowdowns
from extender.settings import Settings
from tests.adversarial.ledger_support import api_server, cluster_mode, gpu, report
from tests.fixtures.kube.payloads import binding_args, extender_args, pod
from tests.fixtures.kube.server import post

GPU_MIB = 81_920.0  # memory never decides here: only the compute rule


def test_six_pods_declaring_a_tiny_share_never_push_a_gpu_bound_pod_past_the_bound() -> None:
    settings = Settings()
    settings.policy.sharing = True
    settings.policy.namespace_gpu_share_floors = {"trusted": 0.0}  # the admin trusts this namespace's declarations
    cluster = api_server()
    with cluster_mode(cluster, settings=settings) as (url, _ext):
        assert post(url + "/v1/telemetry", report("a", 1, [gpu("a-gpu0", GPU_MIB)]), token="token-a")[0] == 200
        resident = pod("gpu-bound", {"deepres.io/gpu-memory": "8Gi"})  # declares nothing: GPU-bound
        cluster.add_pod(resident)
        assert post(url + "/bind", binding_args(resident, "a")) == (200, {"Error": ""})
        joined = []
        for i in range(6):
            liar = pod(f"liar-{i}", {"deepres.io/gpu-memory": "2Gi", "deepres.io/gpu-share": "0.01"})
            cluster.add_pod(liar)
            if post(url + "/filter", extender_args(liar, names=["a"]))[1]["NodeNames"] == ["a"] \
                    and post(url + "/bind", binding_args(liar, "a"))[1]["Error"] == "":
                joined.append(liar["metadata"]["name"])
        # the liars are GPU-bound in truth: the resident's slowdown with the ones that joined
        resident_slowdown = slowdowns((1.0, *(1.0 for _ in joined)))[0]
        assert joined == [] and resident_slowdown <= settings.policy.max_slowdown
        # where the admin trusts declarations, an honest light pod still shares the GPU
        light = pod("light", {"deepres.io/gpu-memory": "2Gi", "deepres.io/gpu-share": "0.05"}, namespace="trusted")
        cluster.add_pod(light)
        assert post(url + "/filter", extender_args(light, names=["a"]))[1]["NodeNames"] == ["a"]
        assert post(url + "/bind", binding_args(light, "a")) == (200, {"Error": ""})
