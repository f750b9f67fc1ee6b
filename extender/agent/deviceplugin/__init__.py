"""The agent's kubelet device plugin: a container gets exactly the GPUs deepres assigned to its pod.

Why: handing a pod its GPUs through an `NVIDIA_VISIBLE_DEVICES` env var it sets itself works only on
nodes whose NVIDIA container runtime honours that variable in unprivileged containers, and there it
lets any pod name any GPU. A device plugin is what the kubelet asks before it starts a container
(`Allocate`); its answer (an env var, volume mounts, or CDI device names) is the only device list a
hardened node accepts, and it comes from the extender's decision (its allocation gate, asked at each
`Allocate`), not from the pod. HAMi pairs its scheduler extender with a device plugin the same way.

Modules:
- `api.proto` (vendored kubelet API v1beta1) and its generated `api_pb2*` (`python -m devtools.protos`);
- `podresources.proto` (the kubelet's PodResources API v1, the List call) and its `podresources_pb2*`;
- `allocation`: pure rules: device IDs (slots per GPU), the node's pods as the handshake sends them, the
  response per device-list strategy;
- `preflight`: whether the node's setup lets the plugin isolate GPUs (toolkit setting, another plugin);
- `plugin`: the gRPC service on a Unix socket, the registration with the kubelet, and at each `Allocate`
  the allocation handshake with the extender (extender/policy/allocation.py says why).
"""

RESOURCE_NAME = "deepres.io/gpu"
API_VERSION = "v1beta1"
#: the kubelet's folder for device plugin sockets (hostPath in the agent pod)
KUBELET_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
#: the kubelet's PodResources API (what it allocated to which pod; hostPath in the agent pod)
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: the NVIDIA container toolkit's config (the preflight reads the device-list strategy's setting there)
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
