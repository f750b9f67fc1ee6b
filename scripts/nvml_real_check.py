"""The agent's NVML source on a real GPU: what it reports while a training process runs.

Run on a GPU machine beside the campaign (`python -m predictor.dataset.campaign run`): samples the
agent's own `NvmlSource` every `--every` seconds for `--seconds`, and records, per sample, the
agent's report (as the agent would send it) beside the raw NVML answers it was built from, so the
GPU-less tests can replay real answers (tests/unit/test_nvml_recorded.py).

    python scripts/nvml_real_check.py --out $OUT/nvml-real.json --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pynvml

from extender.agent.nvml import NvmlSource


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def raw(handle: Any) -> dict[str, Any]:
    """The NVML answers the agent reads, as plain values (None where the call failed)."""
    def call(fn: Any, *args: Any) -> Any:
        try:
            return fn(handle, *args)
        except pynvml.NVMLError as err:
            return {"error": str(err), "code": getattr(err, "value", None)}

    mem = call(pynvml.nvmlDeviceGetMemoryInfo)
    util = call(pynvml.nvmlDeviceGetUtilizationRates)
    procs = call(pynvml.nvmlDeviceGetComputeRunningProcesses)
    out: dict[str, Any] = {
        "name": _text(call(pynvml.nvmlDeviceGetName)), "uuid": _text(call(pynvml.nvmlDeviceGetUUID)),
        "memory": mem if isinstance(mem, dict) else {"total": mem.total, "free": mem.free, "used": mem.used},
        "utilization": util if isinstance(util, dict) else {"gpu": util.gpu, "memory": util.memory},
        "temperature": call(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
        "power_mw": call(pynvml.nvmlDeviceGetPowerUsage),
        "mig_mode": call(pynvml.nvmlDeviceGetMigMode),
        "processes": procs if isinstance(procs, dict) else [
            {"pid": p.pid, "used_gpu_memory": p.usedGpuMemory} for p in procs],
    }
    try:
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        out["memory_v2"] = {"total": v2.total, "free": v2.free, "used": v2.used, "reserved": v2.reserved}
    except (pynvml.NVMLError, TypeError, AttributeError) as err:
        out["memory_v2"] = {"error": str(err)}
    for pid_info in out["processes"] if isinstance(out["processes"], list) else ():
        try:
            pid_info["cgroup"] = Path(f"/proc/{pid_info['pid']}/cgroup").read_text().strip()[:300]
        except OSError as err:
            pid_info["cgroup"] = f"unreadable: {err}"
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=2.0)
    args = parser.parse_args()
    source = NvmlSource.open()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    samples = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        before = raw(handle)
        sample = source.sample()
        samples.append({"at": time.time(), "raw": before, "agent": msgspec.to_builtins(sample)})
        time.sleep(args.every)
    record = {"driver": _text(pynvml.nvmlSystemGetDriverVersion()),
              "nvml_version": _text(pynvml.nvmlSystemGetNVMLVersion()),
              "cuda_driver": pynvml.nvmlSystemGetCudaDriverVersion(), "pid": os.getpid(),
              "own_cgroup": Path("/proc/self/cgroup").read_text().strip()[:300],
              "cgroup_v2": Path("/sys/fs/cgroup/cgroup.controllers").exists(), "samples": samples}
    args.out.write_text(json.dumps(record, indent=1))
    busy = [s for s in samples if s["raw"]["processes"]]
    print(f"nvml check: {len(samples)} samples, {len(busy)} with processes; agent saw "
          f"{sum(len(g['processes']) for s in samples for g in s['agent']['gpus'])} process entries")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
