"""The device plugin's settings (no gRPC import: the agent reads them whether the plugin runs or not)."""

from __future__ import annotations

from dataclasses import dataclass

from extender.agent.deviceplugin import RESOURCE_NAME
from extender.agent.deviceplugin.allocation import DEFAULT_CDI_KIND, STRATEGIES


@dataclass(frozen=True)
class PluginSettings:
    """What `deepres agent --device-plugin` is told (see the agent's flags for each why)."""

    node: str
    plugin_dir: str
    resource: str = RESOURCE_NAME
    slots_per_gpu: int = 16
    strategy: str = "volume-mounts"
    cdi_kind: str = DEFAULT_CDI_KIND
    socket_name: str = "deepres-gpu.sock"
    check_interval_s: float = 2.0

    def problems(self) -> list[str]:
        found = []
        if self.strategy not in STRATEGIES:
            found.append(f"--device-list-strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if not 1 <= self.slots_per_gpu <= 1000:
            found.append(f"--device-plugin-slots must be in [1, 1000], got {self.slots_per_gpu}")
        if "/" not in self.resource:
            found.append(f"--device-plugin-resource must be a domain-prefixed name, got {self.resource!r}")
        if "=" in self.cdi_kind or "/" not in self.cdi_kind:
            found.append(f"--cdi-kind must be a CDI kind like nvidia.com/gpu, got {self.cdi_kind!r}")
        return found
