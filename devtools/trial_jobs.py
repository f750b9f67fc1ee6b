"""The trial's training jobs (devtools/trial.py): real PyTorch training on synthetic data, one process each.

DeepRes's own setting: image classification (torchvision ResNet / MobileNet on random images),
object detection (torchvision's Faster R-CNN with a MobileNetV3 backbone on random images and
boxes), speech recognition (a conv front end + bidirectional GRU trained with CTC on random
spectrograms). A job is *input-bound* when its data loader does `loader_ms` of CPU work per sample
in its workers (standing for decoding and augmentation), *GPU-bound* when it does none (the batch is
made on the device). A job is a fixed amount of work (`steps`), so its run time alone and beside
others can be compared.

    python -m devtools.trial_jobs '<job JSON>' RESULT_PATH      (one job)
    python -m devtools.trial_jobs --zygote                     (what the runner starts: see `zygote`)

The result file: the job's name, steps done, start/end wall times, peak memory (CUDA: the
allocator's reserved peak plus the CUDA context as `torch.cuda.mem_get_info` sees it grow; CPU: the
process's peak RSS), `oom` and `error`. torch is imported here only, never by `deepres serve`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: A job's task -> the model families it may use (each family is built by `_model`).
TASKS = {"classification": ("resnet18", "resnet50", "mobilenet_v3_large", "tiny_cnn"),
         "detection": ("fasterrcnn_mobilenet", "tiny_detector"),
         "speech": ("conv_gru", "tiny_gru")}


@dataclass(frozen=True)
class TrialJob:
    """One job of the backlog, and the pod annotations deepres sees for it (never its true usage)."""

    name: str
    task: str  # classification, detection, speech
    model: str
    batch: int
    size: int  # image side, or spectrogram frames
    steps: int
    loader_ms: float = 0.0  # CPU work per sample in the loader's workers (> 0: input-bound)
    workers: int = 2
    amp: bool = True
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def input_bound(self) -> bool:
        return self.loader_ms > 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> TrialJob:
        job = TrialJob(**raw)
        if job.task not in TASKS or job.model not in TASKS[job.task]:
            raise ValueError(f"job {job.name}: model {job.model!r} is not one of {TASKS.get(job.task)} for "
                             f"task {job.task!r}")
        if job.steps < 1 or job.batch < 1 or job.size < 8:
            raise ValueError(f"job {job.name}: steps, batch >= 1 and size >= 8 are needed")
        return job


def _model(job: TrialJob) -> Any:
    import torch
    from torch import nn

    if job.model in ("resnet18", "resnet50", "mobilenet_v3_large"):
        import torchvision

        return getattr(torchvision.models, job.model)(weights=None, num_classes=1000)
    if job.model == "tiny_cnn":
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                             nn.Linear(128, 10))
    if job.model == "fasterrcnn_mobilenet":
        import torchvision

        return torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(
            weights=None, weights_backbone=None, num_classes=91, min_size=job.size, max_size=job.size)
    if job.model == "tiny_detector":  # a box regressor + classifier head: the detection loss shape, CPU-sized
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                             nn.Linear(32, 4 + 5))
    hidden, convs = (512, 256) if job.model == "conv_gru" else (16, 8)

    class ConvGru(nn.Module):
        """Conv front end over (mel, time), a bidirectional GRU, per-frame character logits (CTC)."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(nn.Conv1d(80, convs, 5, stride=2, padding=2), nn.ReLU(),
                                      nn.Conv1d(convs, convs, 5, padding=2), nn.ReLU())
            self.gru = nn.GRU(convs, hidden, num_layers=3 if job.model == "conv_gru" else 1, batch_first=True,
                              bidirectional=True)
            self.out = nn.Linear(2 * hidden, 29)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x).transpose(1, 2)
            y, _ = self.gru(y)
            logits: torch.Tensor = self.out(y).log_softmax(-1)
            return logits

    return ConvGru()


class _Synthetic:
    """A map-style dataset of random samples, with `loader_ms` of CPU work per sample (a busy loop of
    numpy arithmetic on the sample: decode/augment stand-in)."""

    def __init__(self, job: TrialJob) -> None:
        self.job = job

    def __len__(self) -> int:
        return self.job.steps * self.job.batch

    def __getitem__(self, index: int) -> Any:
        import numpy as np
        import torch

        rng = np.random.default_rng(index)
        if self.job.task == "speech":
            x = rng.standard_normal((80, self.job.size), dtype=np.float32)
        else:
            x = rng.standard_normal((3, self.job.size, self.job.size), dtype=np.float32)
        deadline = time.perf_counter() + self.job.loader_ms / 1000.0
        while time.perf_counter() < deadline:
            x = np.tanh(x * 0.99 + 0.01)  # CPU work that scales with the sample
        return torch.from_numpy(np.ascontiguousarray(x))


def _targets(job: TrialJob, n: int, device: Any) -> Any:
    import torch

    if job.task == "classification":
        return torch.randint(0, 10 if job.model == "tiny_cnn" else 1000, (n,), device=device)
    if job.task == "detection":
        boxes = torch.tensor([[10.0, 10.0, job.size / 2, job.size / 2]], device=device)
        return [{"boxes": boxes, "labels": torch.tensor([1], device=device)} for _ in range(n)]
    return torch.randint(1, 29, (n, job.size // 8), device=device)


def _loss(job: TrialJob, model: Any, x: Any, target: Any) -> Any:
    import torch
    from torch import nn

    if job.task == "classification":
        return nn.functional.cross_entropy(model(x), target)
    if job.task == "detection":
        if job.model == "tiny_detector":
            out = model(x)
            boxes = torch.stack([t["boxes"][0] for t in target]) / job.size
            return nn.functional.mse_loss(out[:, :4], boxes) + nn.functional.cross_entropy(
                out[:, 4:], torch.stack([t["labels"][0] for t in target]))
        return sum(model(list(x), target).values())
    logits = model(x).transpose(0, 1)  # (time, batch, classes)
    frames = torch.full((x.shape[0],), logits.shape[0], dtype=torch.long)
    lengths = torch.full((x.shape[0],), target.shape[1], dtype=torch.long)
    return nn.functional.ctc_loss(logits.float(), target, frames, lengths)


def train(job: TrialJob, device_name: str) -> dict[str, Any]:
    """Run the job's steps; the result (see the module docstring)."""
    import torch

    device = torch.device(device_name)
    torch.manual_seed(0)
    if device.type == "cpu":
        torch.set_num_threads(1)
    result: dict[str, Any] = {"name": job.name, "steps": 0, "oom": False, "error": "", "pid": os.getpid()}
    result["start_s"] = time.time()
    try:
        model = _model(job).to(device)
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        amp = job.amp and device.type == "cuda"
        scaler = torch.amp.GradScaler("cuda", enabled=amp)
        if job.input_bound:
            dataset: Any = _Synthetic(job)
            loader: Any = torch.utils.data.DataLoader(dataset, batch_size=job.batch, num_workers=job.workers,
                                                 persistent_workers=False, prefetch_factor=2, pin_memory=amp)
            batches: Any = iter(loader)
        else:
            shape = (job.batch, 80, job.size) if job.task == "speech" else (job.batch, 3, job.size, job.size)
            fixed = torch.randn(shape, device=device)
            batches = iter(fixed for _ in range(job.steps))
        for step in range(job.steps):
            x = next(batches).to(device, non_blocking=True)
            target = _targets(job, x.shape[0], device)
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                loss = _loss(job, model, x, target)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if step % 2 == 1 and device.type == "cuda":
                torch.cuda.synchronize()
            result["steps"] = step + 1
        if device.type == "cuda":
            torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError as err:
        result["oom"], result["error"] = True, f"CUDA out of memory: {str(err)[:200]}"
    except Exception as err:  # a job that fails is reported with its reason, never dropped
        result["error"] = f"{type(err).__name__}: {str(err)[:300]}"
    result["end_s"] = time.time()
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        result["peak_memory_mib"] = round(torch.cuda.max_memory_reserved(device) / 2**20, 1)
        result["device_used_at_end_mib"] = round((total - free) / 2**20, 1)
    else:
        result["peak_memory_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def zygote() -> int:
    """Import torch once, then fork one child per job: a line `{"job": {...}, "result": PATH, "log": PATH,
    "device": "cuda"}` on stdin starts one and answers `start <pid>`; each child's end is answered
    `exit <pid> <rc>`; EOF on stdin ends the zygote once its children have. A job then starts in
    milliseconds instead of the seconds torch's import takes (which would count in its run time). CUDA
    is never touched here: each child initialises it after the fork."""
    import threading

    import torch  # noqa: F401  (the import is what the children share)

    if os.environ.get("DEEPRES_TRIAL_TORCHVISION") == "1":  # the backlog's models need it
        import torchvision  # noqa: F401

    out_lock = threading.Lock()
    children: set[int] = set()
    done = threading.Event()

    def say(line: str) -> None:
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                if done.is_set():
                    return
                time.sleep(0.05)
                continue
            children.discard(pid)
            say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")

    threading.Thread(target=reap, daemon=True).start()
    say("ready")
    for line in sys.stdin:
        if not line.strip():
            continue
        order = json.loads(line)
        job = TrialJob.from_dict(order["job"])
        pid = os.fork()
        if pid == 0:  # the child: its own output file, the job, then out without the parent's cleanup
            rc = 1
            try:
                fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                result = train(job, order.get("device", "cpu"))
                Path(order["result"]).write_text(json.dumps(result), encoding="utf-8")
                rc = 3 if result["oom"] else (1 if result["error"] else 0)
            finally:
                os._exit(rc)
        children.add(pid)
        say(f"start {pid}")
    done.set()
    while children:
        time.sleep(0.1)
    return 0


def main(argv: list[str]) -> int:
    if argv[1:] == ["--zygote"]:
        return zygote()
    if len(argv) != 3:
        print("usage: python -m devtools.trial_jobs '<job JSON>' RESULT_PATH", file=sys.stderr)
        return 2
    job = TrialJob.from_dict(json.loads(argv[1]))
    result = train(job, os.environ.get("DEEPRES_TRIAL_DEVICE", "cpu"))
    Path(argv[2]).write_text(json.dumps(result), encoding="utf-8")
    return 3 if result["oom"] else (1 if result["error"] else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
