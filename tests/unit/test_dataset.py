"""Traced labels and the `deepres dataset` generator: memory accounting, FLOPs, resume, failures."""

from __future__ import annotations

import argparse
import csv
import re
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from predictor.dataset import generate as gen
from predictor.dataset import templates, tracing
from predictor.spec import JobSpec

MIB = float(1 << 20)
TINY = gen.SamplerLimits(max_params_millions=0.3, max_layers=2, max_batch=8, max_seq=64, max_side=32,
                         families=("mlp", "gru", "transformer", "cnn"))


def _linear_trace(n_in: int, n_out: int, batch: int, *, optimizer: str = "adam", precision: str = "fp32",
                  input_grad: bool = False) -> tracing.Trace:
    def batch_fn(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch, n_in, dtype=dtype)
        return (x.requires_grad_() if input_grad else x), torch.randint(0, n_out, (batch,))

    return tracing.trace_training_step(lambda: nn.Linear(n_in, n_out, bias=False), batch_fn,
                                       nn.functional.cross_entropy, optimizer=optimizer, precision=precision)


@pytest.mark.parametrize(("optimizer", "states"), [("sgd", 0), ("momentum", 1), ("adam", 2), ("rmsprop", 1)])
def test_peak_holds_params_grads_and_optimizer_state(optimizer: str, states: int) -> None:
    n_in, n_out, batch = 512, 256, 4
    weight_bytes = n_in * n_out * 4
    trace = _linear_trace(n_in, n_out, batch, optimizer=optimizer)
    parts = trace.breakdown_bytes
    assert parts["params"] == weight_bytes
    assert parts["optimizer"] == states * weight_bytes
    assert trace.peak_bytes >= weight_bytes * (2 + states)  # params + grads + state at the optimizer step
    assert sum(parts.values()) == trace.peak_bytes
    assert all(v >= 0 for v in parts.values())


def test_precision_changes_the_bytes_per_value() -> None:
    fp32 = _linear_trace(1024, 1024, 2, optimizer="sgd")
    fp16 = _linear_trace(1024, 1024, 2, optimizer="sgd", precision="fp16")
    amp = _linear_trace(1024, 1024, 2, optimizer="sgd", precision="amp")
    assert fp16.breakdown_bytes["params"] * 2 == fp32.breakdown_bytes["params"]
    assert amp.breakdown_bytes["params"] == fp32.breakdown_bytes["params"]  # fp32 master weights
    assert fp16.peak_bytes < fp32.peak_bytes


def test_activations_grow_with_the_batch() -> None:
    spec = JobSpec(model_type="cnn", params_millions=0.5, num_layers=3, input_dim=32, batch_size=8, optimizer="sgd")
    small = tracing.trace_job(spec)
    large = tracing.trace_job(JobSpec(**{**spec.to_dict(), "batch_size": 32}))
    assert large.breakdown_bytes["activations"] > 3 * small.breakdown_bytes["activations"]
    assert large.breakdown_bytes["params"] == small.breakdown_bytes["params"]


def test_linear_flops_are_six_b_in_out_for_a_training_step() -> None:
    b, n_in, n_out = 8, 64, 32
    # forward 2*B*in*out, backward 2*B*in*out for the input gradient + 2*B*in*out for the weight gradient
    assert _linear_trace(n_in, n_out, b, input_grad=True).flops == 6 * b * n_in * n_out
    # the first layer's input needs no gradient: its backward is the weight gradient only
    assert _linear_trace(n_in, n_out, b).flops == 4 * b * n_in * n_out


def test_replayed_kernels_give_the_same_trace_as_fresh_ones() -> None:
    spec = JobSpec(model_type="gpt", params_millions=2.0, num_layers=6, input_dim=64, batch_size=2)
    first, second = tracing.trace_job(spec), tracing.trace_job(spec)
    assert (first.peak_bytes, first.flops, first.breakdown_bytes) == (second.peak_bytes, second.flops,
                                                                      second.breakdown_bytes)
    # six identical blocks: FLOPs are affine in depth, so the replay did not drop or double anything
    two = tracing.trace_job(JobSpec(**{**spec.to_dict(), "num_layers": 2, "params_millions": 2.0}))
    four = tracing.trace_job(JobSpec(**{**spec.to_dict(), "num_layers": 4, "params_millions": 2.0}))
    assert two.flops > 0 and four.flops > two.flops and first.flops > four.flops


def test_sampler_is_a_pure_function_of_seed_and_job_id() -> None:
    jobs = [gen.sample_job(7, i) for i in range(30)]
    assert jobs == [gen.sample_job(7, i) for i in range(30)]
    assert jobs != [gen.sample_job(8, i) for i in range(30)]
    assert all(templates.plan(j).matched for j in jobs)


def test_columns_are_exactly_the_contract(repo_root: Path) -> None:
    text = (repo_root / "docs" / "CONTRACTS.md").read_text()
    section = text.split("Columns, exactly:", 1)[1].split("Models train on", 1)[0]
    section = re.sub(r"\(`ok` or `error`\)", "", section)  # values, not columns
    groups = re.findall(r"`([^`]+)`", section.replace("\n", " "))
    names = [name.strip() for group in groups for name in group.split(",")]
    assert tuple(names) == gen.COLUMNS


def _strip_timing(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row.pop("trace_seconds")
    return rows


def test_generator_resumes_to_the_same_file(tmp_path: Path) -> None:
    fit = gen.FALLBACK_CALIBRATION
    whole = gen.generate(5, 3, tmp_path / "a.csv", jobs=1, timeout_s=120, limits=TINY)
    gen.finalize(whole, 5, tmp_path / "a_final.csv", fit)

    work = tmp_path / "b.csv"
    gen.generate(5, 3, work, jobs=1, timeout_s=120, limits=TINY, stop_after=2)  # "killed" after two jobs
    with open(work, "a") as handle:
        handle.write("4,cnn,0.2")  # a torn line from the interruption
    assert len(gen.read_rows(work)) == 2
    resumed = gen.generate(5, 3, work, jobs=1, timeout_s=120, limits=TINY)
    gen.finalize(resumed, 5, tmp_path / "b_final.csv", fit)

    assert _strip_timing(tmp_path / "a_final.csv") == _strip_timing(tmp_path / "b_final.csv")
    rows = _strip_timing(tmp_path / "b_final.csv")
    assert [r["job_id"] for r in rows] == ["0", "1", "2", "3", "4"]
    assert all(r["status"] == "ok" for r in rows)
    with open(tmp_path / "b_final.csv") as handle:
        assert handle.readline().strip().split(",") == list(gen.COLUMNS)


def test_a_failing_job_is_recorded_not_fatal(tmp_path: Path) -> None:
    def flaky(spec: JobSpec, plan: templates.Plan) -> tracing.Trace:
        if spec.model_type == "gru":
            raise RuntimeError("boom on purpose")
        return tracing.trace_job(spec, plan)

    families = [gen.sample_job(1, i, TINY).model_type for i in range(6)]
    assert "gru" in families and set(families) != {"gru"}
    rows = gen.generate(6, 1, tmp_path / "w.csv", jobs=1, timeout_s=120, limits=TINY, trace_fn=flaky)
    for i, family in enumerate(families):
        if family == "gru":
            assert rows[i]["status"] == "error" and "boom on purpose" in rows[i]["error"]
            assert rows[i]["memory_mib"] == ""
        else:
            assert rows[i]["status"] == "ok" and float(rows[i]["memory_mib"]) > 0


def test_a_slow_trace_times_out_as_an_error_row() -> None:
    def slow(spec: JobSpec, plan: templates.Plan) -> tracing.Trace:
        time.sleep(5)
        raise AssertionError("the timeout should have fired")

    row = gen.run_job(0, 0, TINY, timeout_s=0.2, trace_fn=slow)
    assert row["status"] == "error" and "exceeded" in row["error"]


def test_bad_arguments_are_a_usage_error() -> None:
    from extender.cli import UsageError

    parser = argparse.ArgumentParser()
    gen.add_arguments(parser)
    with pytest.raises(UsageError):
        gen.run(parser.parse_args(["--n", "0"]))


@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_tracker_agrees_with_pytorchs_memtracker(optimizer: str) -> None:
    """Our meta-device tracker against torch's MemTracker under FakeTensorMode (the reference tool)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10))

    def batch(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(16, 64, dtype=dtype), torch.randint(0, 10, (16,))

    ours = tracing.trace_training_step(model, batch, nn.functional.cross_entropy, optimizer=optimizer)
    with FakeTensorMode():
        net = model()
        params = list(net.parameters())
        opt = tracing.make_optimizer(optimizer, params, 1e-3, 0.0)
        tracker = MemTracker()
        tracker.track_external(net, opt)
        with tracker:
            for iteration in range(2):
                if iteration == 1:  # the steady state: measure the second iteration only
                    tracker.reset_mod_stats()
                    tracker._peak_mem.clear()
                x, y = batch(torch.float32)
                loss = nn.functional.cross_entropy(net(x), y)
                del x  # same convention as ours: the input is released after the forward pass
                loss.backward()  # type: ignore[no-untyped-call]
                del loss
                opt.step()
                opt.zero_grad(set_to_none=True)
        reference = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
    # MemTracker also counts Adam's per-parameter step counters (CPU scalars on a GPU too: not ours)
    step_counters = 4 * len(params) if optimizer == "adam" else 0
    assert ours.peak_bytes == reference - step_counters
