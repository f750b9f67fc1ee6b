"""Task heads of the Hugging Face models of the traced table (`deepres.io/task`, `deepres.io/target-dim`).

The table (`predictor/data/exact.json`, `deepres dataset real`) traces each Hugging Face text model
with its pre-training head: the masked-LM head for encoders, the causal-LM head for decoders, and
seq2seq with targets a quarter of the input (at least 16 tokens). People mostly fine-tune with
another head: a sequence classifier has 2 logits per sequence where the masked-LM head has a
vocabulary's worth per token (bert-base at 128 tokens, batch 32: ~750 MB of logits and their
gradient). This module traces the same models, built the same way (`archs.build`'s configs, meta
device, the same tracer), with the other heads, and writes `predictor/data/exact_tasks.json`:

    {"models": {"hf/bert-base-uncased": {"tasks": {"sequence-classification": {"batches": [...],
        "inputs": {"128": {"params_millions", "num_layers", "curves": {precision: ...}}}}}}}}

the curves in the layout of exact.json (`real.curves_of`). A seq2seq target length is its own key,
`seq2seq@<target tokens>` (traced at TARGET_LENGTHS), read by `predictor.exact` between them.

Vision models (timm, torchvision, HF image models): the traced head is the image classifier; no
other head is traced (`image-classification` is their only task).

Run it (CPU, meta device, minutes per model): `python -m predictor.dataset.heads [--match NAME]
[--tiers 0,1] [--workers N]`; it resumes from its work file and rewrites the JSON at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from predictor.dataset.paths import DATA_DIR
from predictor.progress import progress, say
from predictor.tasks import HEAD_CLASSES, SEQUENCE_LABELS, TARGET_LENGTHS, TOKEN_LABELS, tasks_of

TASKS_OUT = DATA_DIR / "exact_tasks.json"
WORK = Path("/tmp") / "deepres-heads.jsonl"


def build_head(arch: Any, input_dim: int, task: str, target_len: int = 0) -> tuple[Any, Any, Any]:
    """(model, batch maker, loss) of a Hugging Face text model with the head of `task` (meta device:
    call inside `torch.device("meta")`)."""
    import torch
    import torch.nn.functional as F
    import transformers
    from torch import nn

    from predictor.dataset import archs as A

    entry = A.hf_table()[arch.name.split("/", 1)[1]]
    config = A.hf_config(entry)
    if task == "seq2seq":
        model = transformers.AutoModelForSeq2SeqLM.from_config(config)  # type: ignore[no-untyped-call]

        class Seq2Seq(nn.Module):  # decoder inputs of the target length (teacher forcing), longer or shorter
            def __init__(self, inner: nn.Module) -> None:
                super().__init__()
                self.model = inner

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                decoder = x.new_zeros((x.shape[0], target_len))
                return self.model(input_ids=x, decoder_input_ids=decoder).logits  # type: ignore[no-any-return]

        return Seq2Seq(model), A._token_batch(input_dim, target_len), A._token_loss
    config.num_labels = SEQUENCE_LABELS if task == "sequence-classification" else TOKEN_LABELS
    if getattr(config, "pad_token_id", None) is None:  # decoders find each sequence's last token by the pad id
        config.pad_token_id = getattr(config, "eos_token_id", None) or 0
        if isinstance(config.pad_token_id, list):
            config.pad_token_id = config.pad_token_id[0]
    auto = getattr(transformers, HEAD_CLASSES[task])
    model = auto.from_config(config)

    class Head(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.model = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=x).logits  # type: ignore[no-any-return]

    if task == "sequence-classification":
        def batch_of(b: int) -> Any:
            return lambda dtype: (torch.empty(b, input_dim, dtype=torch.long), torch.empty(b, dtype=torch.long))

        return Head(model), batch_of, lambda out, target: F.cross_entropy(out.float(), target)
    return Head(model), A._token_batch(input_dim, input_dim), A._token_loss


def units(match: str = "", tiers: tuple[int, ...] = (0,)) -> list[tuple[Any, str, int, int]]:
    """(arch, table task key, input, target length) for every head to trace, the default input first."""
    from predictor.dataset import archs as A

    out = []
    for arch in A.hf_archs():
        if arch.kind == "image" or match not in arch.name:
            continue
        _, others = tasks_of(arch.name)
        inputs = [i for t in tiers for i in (arch.inputs[:1] if t == 0 else arch.inputs[1:])]
        for task in others:
            for input_dim in inputs:
                if task == "seq2seq":
                    out += [(arch, f"seq2seq@{t}", input_dim, t) for t in TARGET_LENGTHS]
                else:
                    out.append((arch, task, input_dim, 0))
    return out  # (seq2seq models: `others` is seq2seq itself, at each target length)


def trace_unit(arch: Any, key: str, input_dim: int, target_len: int) -> dict[str, Any]:
    from predictor.dataset import real

    task = key.split("@", 1)[0]
    started = time.perf_counter()
    try:
        info = real.trace_input(arch, input_dim,
                                build=lambda a, i: build_head(a, i, task, target_len))
        error = ""
    except Exception as err:  # one head that does not build must not stop the others
        info, error = None, f"{type(err).__name__}: {err}"[:300].replace("\n", " ")
    return {"name": arch.name, "task": key, "input": input_dim, "batches": list(arch.batches), "info": info,
            "error": error, "seconds": round(time.perf_counter() - started, 2)}


def _key(r: dict[str, Any]) -> str:
    return f"{r['name']}|{r['task']}|{r['input']}"


def read_work(path: Path) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[_key(record)] = record
    return done


def write_table(done: dict[str, dict[str, Any]], out: Path = TASKS_OUT) -> dict[str, Any]:
    """The task table from the traced records (sorted: the same records give the same file)."""
    from predictor.dataset import real

    models: dict[str, Any] = {}
    for k in sorted(done):
        r = done[k]
        if r["info"] is None:
            continue
        curves = real.curves_of(r["info"], r["batches"])
        if not curves:
            continue
        task = models.setdefault(r["name"], {"tasks": {}})["tasks"].setdefault(
            r["task"], {"batches": r["batches"], "inputs": {}})
        task["inputs"][str(r["input"])] = {"params_millions": round(r["info"]["params"] / 1e6, 4),
                                           "num_layers": r["info"]["num_layers"], "curves": curves}
    table = {"version": 1, "about": "deepres task-head table: written by `python -m predictor.dataset.heads`; "
                                    "read by predictor/exact.py (layout of exact.json's entries)",
             "models": dict(sorted(models.items()))}
    out.write_text(json.dumps(table, separators=(",", ":")) + "\n")
    return {"models": len(models), "heads": sum(len(m["tasks"]) for m in models.values()),
            "errors": {k: r["error"] for k, r in done.items() if r["error"]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m predictor.dataset.heads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--match", default="", help="only architectures whose name contains this text")
    parser.add_argument("--tiers", default="0", help="0: default input only; 1: the two other inputs (default 0)")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--out", type=Path, default=TASKS_OUT)
    parser.add_argument("--outputs-only", action="store_true", help="trace nothing: rewrite the table")
    parser.add_argument("--retry-errors", action="store_true", help="trace again the heads that recorded an error")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    done = read_work(args.work)
    if not args.outputs_only:
        todo = [u for u in units(args.match, tuple(int(t) for t in args.tiers.split(",")))
                if f"{u[0].name}|{u[1]}|{u[2]}" not in done or (args.retry_errors and done[
                    f"{u[0].name}|{u[1]}|{u[2]}"]["error"])]
        started = time.monotonic()
        with args.work.open("a") as handle:  # a bar with the time left; each unit's line above it
            for n, (arch, key, input_dim, target_len) in enumerate(progress(todo, "heads", unit="unit"), 1):
                record = trace_unit(arch, key, input_dim, target_len)
                handle.write(json.dumps(record, separators=(",", ":")) + "\n")
                handle.flush()
                done[_key(record)] = record
                rate = n / max(1e-9, time.monotonic() - started)
                say(f"[{n}/{len(todo)}] {_key(record)} {record['seconds']:.1f}s {record['error'][:80]} "
                    f"eta={(len(todo) - n) / rate / 60:.0f} min")
    print(json.dumps(write_table(done, args.out)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
