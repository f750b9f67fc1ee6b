"""Whether this node's setup lets the device plugin isolate GPUs, pure: the agent reads the inputs
(the NVIDIA container toolkit's config file, its Node's allocatable resources, the CDI specs on the
node) and, when any problem is found, does not advertise the resource and says why (log, metric, an
Event on the Node). docs/device-plugin.md has the table of supported node setups.

- Another device plugin advertising the same GPUs (NVIDIA's plugin or the GPU Operator: `nvidia.com/gpu`
  or MIG resources in the Node's allocatable): both would hand out the same devices.
- `volume-mounts`: the runtime reads the device list from mounts only with
  `accept-nvidia-visible-devices-as-volume-mounts = true` (not its default); without it a container gets
  no GPU, or, with the env var accepted, every GPU `NVIDIA_VISIBLE_DEVICES` names.
- `envvar`: unprivileged containers' `NVIDIA_VISIBLE_DEVICES` must be honoured
  (`accept-nvidia-visible-devices-envvar-when-unprivileged`, default true).
- `cdi`: a CDI spec declaring the kind must be on the node (`nvidia-ctk cdi generate`).
With the simulated source there are no devices to isolate: only the other-plugin check applies.
"""

from __future__ import annotations

import tomllib
from collections.abc import Collection, Mapping

#: resources another GPU device plugin advertises for the same devices
FOREIGN_GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
FOREIGN_GPU_PREFIXES = ("nvidia.com/mig-",)
VOLUME_MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"


def _count(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 1  # a quantity we cannot read is not nothing


def other_plugins(allocatable: Mapping[str, object]) -> list[str]:
    """`resource (count)` of the GPU resources another device plugin advertises on the node."""
    return [f"{name} ({value})" for name, value in sorted(allocatable.items())
            if (name in FOREIGN_GPU_RESOURCES or name.startswith(FOREIGN_GPU_PREFIXES)) and _count(value) > 0]


def toolkit_setting(config_text: str, key: str) -> bool | None:
    """A boolean of the toolkit's config.toml (top level), None when absent; ValueError when the file is
    not TOML or the value not a boolean."""
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"not valid TOML: {err}") from None
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ValueError(f"{key} is {value!r}, not a boolean")
    return value


def problems(strategy: str, *, simulated: bool, allocatable: Mapping[str, object], toolkit_path: str,
             toolkit_config: str | None, cdi_kinds: Collection[str], cdi_kind: str) -> list[str]:
    """Why the plugin must not advertise on this node (empty: it may). `toolkit_config` is the toolkit
    config file's text, None when it could not be read; `cdi_kinds` the kinds the node's CDI specs declare."""
    found = []
    others = other_plugins(allocatable)
    if others:
        found.append(f"another device plugin advertises the same GPUs on this node ({', '.join(others)}): both "
                     f"would hand them out; disable it on deepres nodes (the GPU Operator: label the node "
                     f"nvidia.com/gpu.deploy.device-plugin=false)")
    if simulated:
        return found
    if strategy in ("volume-mounts", "envvar"):
        key = VOLUME_MOUNTS_KEY if strategy == "volume-mounts" else ENVVAR_KEY
        if toolkit_config is None:
            found.append(f"cannot read the NVIDIA container toolkit's config ({toolkit_path}): the {strategy} "
                         f"strategy needs {key} = true there (devicePlugin.toolkitConfig names the file)")
        else:
            try:
                value = toolkit_setting(toolkit_config, key)
            except ValueError as err:
                found.append(f"the NVIDIA container toolkit's config ({toolkit_path}) cannot be read: {err}")
            else:
                # the env var is honoured by default; mounts only when set
                on = value if value is not None else strategy == "envvar"
                if not on:
                    found.append(f"the {strategy} strategy needs {key} = true in {toolkit_path} (it is "
                                 f"{'false' if value is False else 'not set'}): containers would not get "
                                 f"exactly their GPUs")
    elif strategy == "cdi" and cdi_kind not in cdi_kinds:
        found.append(f"no CDI spec on this node declares kind {cdi_kind} (/etc/cdi, /var/run/cdi): generate one "
                     f"(nvidia-ctk cdi generate) for the cdi strategy")
    return found
