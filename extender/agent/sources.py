"""The one interface every GPU source implements, and what a sample is.

Production uses `nvml` only; `simulated` exists for kind and local runs and is chosen explicitly
with `--source simulated`, never as a fallback. A source returns the schema's own `GpuReport`
records (processes not yet attributed to pods unless the source knows the pod, as the simulated one
does), so nothing is translated twice between sampling and the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from extender.telemetry import GpuReport

SOURCE_NAMES = ("nvml", "simulated")


class SourceUnavailable(RuntimeError):
    """The source cannot start at all (no driver, no library): the agent exits with this message."""


@dataclass(frozen=True)
class Sample:
    """One sampling round. `responsive` is False when the source as a whole did not answer (e.g.
    NVML could not even count devices): /healthz turns 503 on that, not on one unhealthy GPU."""

    gpus: tuple[GpuReport, ...]
    responsive: bool = True
    error: str = ""


class GpuSource(Protocol):
    """Anything that can sample this node's GPUs."""

    @property
    def name(self) -> str:
        """`nvml` or `simulated`: goes into the report's `source` field."""
        ...

    def sample(self) -> Sample:
        """Read every GPU now; per-GPU failures are reported as unhealthy GPUs, never raised."""
        ...

    def close(self) -> None:
        """Release the library or connections; called once at shutdown."""
        ...
