"""`deepres predict -f pod.yaml`: what deepres will predict for a training pod, before submitting it.

Reads a Pod, or the pod template of a Deployment/Job/StatefulSet/ReplicaSet/DaemonSet/CronJob
(`-f -` reads stdin), parses its `deepres.io/*` annotations with the same parser the extender uses,
and prints the JobSpec (marking defaulted fields), the predicted peak GPU memory with its admission
bound, the GFLOPs per iteration and the GPU-time estimate; `--json` for scripts.
A bad annotation exits 2 with one line naming the key, the value and what is accepted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from predictor import gpucal
from predictor.spec import JOB_KEYS, JobSpec, SpecError

PREFIX = "deepres.io/"
_TEMPLATE_KINDS = ("Deployment", "Job", "StatefulSet", "ReplicaSet", "DaemonSet", "ReplicationController")


#: What `--gpu` does not include.
LIVE_NOTE = ("the live online calibration (learned from the peaks of pods placed on this GPU model) happens in the "
             "extender: POST /v1/predict with \"gpu\" answers the demand the filter admits there now "
             "(docs/calibration.md)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True, help="pod manifest (YAML or JSON); '-' reads stdin")
    parser.add_argument("--json", action="store_true", help="print the JobSpec and the Demand as JSON")
    parser.add_argument("--artifact", type=Path, default=None, help="artifact directory (default: the shipped one)")
    parser.add_argument("--gpu", metavar="NAME", default=None,
                        help="the GPU model's NVML name (e.g. 'NVIDIA H100 80GB HBM3'): the demand on its measured "
                             "per-GPU line where one exists (the offline part; the live calibration happens in the "
                             "extender: POST /v1/predict with \"gpu\")")


def pod_annotations(document: Any, source: str) -> dict[str, str]:
    """The annotations of the pod a manifest runs (a Pod, or a workload's pod template)."""
    from predictor.errors import UsageError

    if not isinstance(document, Mapping):
        raise UsageError(f"{source}: expected a Kubernetes object (a YAML mapping), got {type(document).__name__}")
    kind = str(document.get("kind", ""))
    meta: Any
    if kind == "Pod" or (not kind and "metadata" in document):
        meta = document.get("metadata")
    elif kind in _TEMPLATE_KINDS:
        meta = _dig(document, ("spec", "template", "metadata"))
    elif kind == "CronJob":
        meta = _dig(document, ("spec", "jobTemplate", "spec", "template", "metadata"))
    else:
        raise UsageError(f"{source}: kind {kind or '(none)'!r} does not run a pod: "
                         f"expected Pod, CronJob or one of {', '.join(_TEMPLATE_KINDS)}")
    annotations = (meta or {}).get("annotations") if isinstance(meta, Mapping) else None
    if annotations is None:
        return {}
    if not isinstance(annotations, Mapping):
        raise UsageError(f"{source}: metadata.annotations must be a mapping")
    return {str(k): "" if v is None else str(v) for k, v in annotations.items()}


def _dig(document: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = document
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def read_manifest(filename: str) -> tuple[Any, str]:
    """The first object of a YAML/JSON file or stdin, and a name for messages."""
    from predictor.errors import UsageError

    source = "stdin" if filename == "-" else filename
    try:
        text = sys.stdin.read() if filename == "-" else Path(filename).read_text()
    except OSError as err:
        raise UsageError(f"cannot read {source}: {err.strerror or err}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise UsageError(f"{source} is not valid YAML{where}: {getattr(err, 'problem', None) or err}") from None
    if not documents:
        raise UsageError(f"{source} holds no Kubernetes object")
    return documents[0], source


def job_spec(annotations: Mapping[str, str], source: str) -> JobSpec:
    """Parse the deepres.io/* annotations; errors name the annotation as the user wrote it."""
    from predictor.errors import UsageError

    raw = {k[len(PREFIX):]: v for k, v in annotations.items() if k.startswith(PREFIX)}
    if "model-type" not in raw and "model" not in raw:
        override = raw.get("gpu-memory")
        hint = (f" (it sets {PREFIX}gpu-memory={override}, which deepres uses as is)" if override
                else f": add {PREFIX}model-type and the other {PREFIX}* annotations to get a prediction")
        raise UsageError(f"{source}: not a GPU job for deepres, no {PREFIX}model-type annotation{hint}")
    try:
        return JobSpec.parse({k: v for k, v in raw.items() if k in JOB_KEYS})
    except SpecError as err:
        raise UsageError(str(err.with_prefix(PREFIX))) from None


def _fmt_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def run(args: argparse.Namespace) -> int:
    from predictor.runtime import ArtifactError, Predictor

    document, source = read_manifest(args.filename)
    spec = job_spec(pod_annotations(document, source), source)
    try:
        predictor = Predictor.load(args.artifact)
    except ArtifactError as err:
        print(f"deepres predict: {err}", file=sys.stderr)
        return 1
    demand = predictor.predict(spec)
    gpu = getattr(args, "gpu", None)
    if gpu is not None and not gpu.strip():
        from predictor.errors import UsageError

        raise UsageError("--gpu must name a GPU model as NVML does, e.g. 'NVIDIA A100-SXM4-40GB'")
    on_gpu = gpucal.on_gpu(demand, spec.precision, gpu) if gpu else None
    if args.json:
        payload = {"job_spec": spec.to_dict(), "defaulted": sorted(spec.defaulted), "demand": demand.to_dict()}
        if on_gpu is not None:
            payload["on_gpu"] = {"gpu": gpu, "path": gpucal.path_of(demand), "memory_mib": on_gpu.memory_mib,
                                 "memory_mib_upper": on_gpu.memory_mib_upper, "line": on_gpu.calibrated,
                                 "note": on_gpu.note or LIVE_NOTE}
        print(json.dumps(payload, indent=2))
        return 0
    name = _dig(document, ("metadata", "name")) if isinstance(document, Mapping) else None
    print(f"job: {name or source}")
    annotations = spec.to_annotations()
    for key in (k for k in JOB_KEYS if k in annotations):  # model / traced-peak-mib only when given
        mark = "   (default)" if key in spec.defaulted else ""
        print(f"  {PREFIX}{key:<18} {annotations[key]}{mark}")
    print(f"predicted peak GPU memory: {demand.memory_mib:,.0f} MiB ({demand.memory_mib / 1024:.2f} GiB) per GPU")
    print(f"admission bound (upper):   {demand.memory_mib_upper:,.0f} MiB ({demand.memory_mib_upper / 1024:.2f} GiB)")
    print(f"compute:                   {demand.gflops_per_iteration:,.2f} GFLOPs per iteration")
    print(f"GPU time (reference H100, measured steps): {_fmt_duration(demand.gpu_seconds)} "
          f"for {spec.iterations:,} iterations")
    print(f"model: {demand.model_version}")
    if on_gpu is not None:
        line = "its measured per-GPU line" if on_gpu.calibrated else "no measured line: the Demand's own bound"
        print(f"on {gpu} ({line}): {on_gpu.memory_mib:,.0f} MiB, bound {on_gpu.memory_mib_upper:,.0f} MiB per GPU")
        print(f"note: {LIVE_NOTE}")
    for warning in demand.warnings:
        print(f"warning: {warning}")
    if demand.memory_mib_upper > 80 * 1024:
        print("note: the bound exceeds an 80 GB GPU: no single GPU can admit this job as it is", file=sys.stderr)
    return 0
