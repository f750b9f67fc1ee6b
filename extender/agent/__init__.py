"""The deepres node agent: the only source of what GPUs really hold.

It samples GPUs through a `GpuSource` (real NVML in production, a simulated source for kind and local
runs), attributes compute processes to pods through /proc/<pid>/cgroup, tracks each pod's peak GPU
memory, posts an `extender.telemetry.NodeReport` to the extender and exposes the same figures on
/metrics. Modules:

- `sources`: the `GpuSource` protocol and the sample records it returns;
- `nvml`: the production source over pynvml; `simulated`: GPUs from config, usage from pods;
- `cgroups`: PID -> pod UID and container id (pure parsing + a reader with a proc root);
- `tracking`: per-pod peaks and report building (pure: the clock is passed in);
- `reporter`: the sender thread (auth, retries, newest-wins queue);
- `kube`: the only module here that talks to the API server (pods on this node, node annotation);
- `metrics`: the Prometheus registry, /metrics and /healthz;
- `main`: `deepres agent` (its benchmark, `deepres bench agent`, is devtools/bench_agent.py);
- `deviceplugin/`: the kubelet device plugin (`--device-plugin`): each container gets exactly the
  GPUs deepres assigned to its pod (docs/device-plugin.md);
- `fakenvml`: a pynvml-shaped fake for tests and the benchmark, never selectable by `--source`.
"""

from extender import __version__

AGENT_VERSION = __version__

__all__ = ["AGENT_VERSION"]
