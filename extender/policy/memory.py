"""The arithmetic of a GPU's memory: what is occupied and what is free (one formula, used by the
filter, preemption's what-if and the simulator's columnar cluster). Below `types` and `usage`, which
both read it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def occupied_mib(used_mib: float, reserved_mib: float, foreign_mib: float = 0.0, pending_mib: float = 0.0) -> float:
    """Memory of a GPU that is not free: reservations + foreign use, at least what is used now.

    `pending_mib` (part of `reserved_mib`) is what reservations whose use cannot show in `used_mib`
    yet hold on a GPU whose report names no processes: with no process list, the used memory cannot
    be told apart from ours, so only settled reservations may hide inside it, and pending ones come
    on top (else a burst of binds fills a GPU's observed use a second time). 0 where processes are
    listed: attribution already keeps our pods' memory out of the foreign share."""
    pending = min(max(pending_mib, 0.0), max(reserved_mib, 0.0))
    return max(used_mib, reserved_mib - pending + foreign_mib, 0.0) + pending


def effective_free_mib(capacity_mib: float, occupied: float, healthy: bool = True) -> float:
    """Effective free memory of a GPU with `occupied` MiB occupied (`occupied_mib`): capacity -
    occupied, and -1 for an unhealthy GPU so that nothing ever fits on it. `GpuView.free_mib` and
    preemption's what-if read it; the simulator through GpuView."""
    return max(capacity_mib - occupied, 0.0) if healthy else -1.0


def occupied_mib_array(used_mib: F64, reserved_mib: F64, foreign_mib: F64 | float = 0.0,
                       pending_mib: F64 | float = 0.0) -> F64:
    """`occupied_mib` over arrays (the simulator's columnar cluster): the same formula."""
    pending = np.minimum(np.maximum(pending_mib, 0.0), np.maximum(reserved_mib, 0.0))
    out: F64 = np.maximum(np.maximum(used_mib, reserved_mib - pending + foreign_mib), 0.0) + pending
    return out
