"""The text families' family-path point is the traced table's (issue 47: predictor.family_table.served_point,
served by predictor.runtime where predictor/data/family_bounds.json was earned on it).

The truth these tests hold the point to is the traced peak of a real architecture (`exact.estimate`, the
named-model path over predictor/data/exact.json), never the family path's own arithmetic; each checks
that the network's point, which the family path served before, misses the same truth by more, so a test
fails if the wiring falls back to it."""

from __future__ import annotations

import json
import shutil

import pytest

from predictor import exact, family_bounds, family_table
from predictor.runtime import DEFAULT_ARTIFACT, Predictor
from predictor.spec import JobSpec

#: (architecture, its family fields as a data scientist writes them: model-type, params (M), layers), read off
#: the architecture's card (Hugging Face config): OPT-350m and GPT-2 are `gpt`, BERT-large a `transformer`.
TEXT_JOBS = (("hf/opt-350m", "gpt", 331.2, 24, 1024, 4), ("hf/gpt2", "gpt", 124.4, 12, 512, 8),
             ("hf/bert-large-uncased", "transformer", 335.2, 24, 512, 8))
#: The served point of a job that describes a traced architecture is that architecture's trace, to within this.
CLOSE = 0.05


def _spec(family: str, params: float, layers: int, seq: int, batch: int, precision: str = "fp32") -> JobSpec:
    return JobSpec(family, params_millions=params, num_layers=layers, input_dim=seq, batch_size=batch,
                   precision=precision, optimizer="adamw")


@pytest.fixture(scope="module")
def network_only(tmp_path_factory: pytest.TempPathFactory) -> Predictor:
    """The shipped weights without the family-path file: the network's point (as before issue 47's point)."""
    copy = tmp_path_factory.mktemp("art") / "art"
    shutil.copytree(DEFAULT_ARTIFACT, copy)
    predictor = Predictor.load(copy, cache_size=0)
    assert predictor.family_bounds_path is None
    return predictor


@pytest.fixture(scope="module")
def table_served(tmp_path_factory: pytest.TempPathFactory) -> Predictor:
    """The shipped predictor with margins marked as earned on the table's point: the opt-in wiring. The shipped
    file says `network` (the table point stranded a real 406M-parameter transformer in the capacity replay: its
    point 91 GB on an 80 GB GPU, its measured peak 45.5 GB; docs/predictor.md)."""
    bounds = json.loads(family_bounds.BOUNDS_PATH.read_text(encoding="utf-8"))
    bounds["point"] = "text_table"
    path = tmp_path_factory.mktemp("bounds") / "family_bounds.json"
    path.write_text(json.dumps(bounds), encoding="utf-8")
    shipped = Predictor.load(cache_size=0)
    return Predictor(shipped._estimator, shipped.metadata, 0, str(path))


@pytest.mark.parametrize(("name", "family", "params", "layers", "seq", "batch"), TEXT_JOBS)
def test_a_bare_text_job_is_read_off_the_traced_architecture_it_describes(
        name: str, family: str, params: float, layers: int, seq: int, batch: int, network_only: Predictor,
        table_served: Predictor) -> None:
    truth = exact.estimate(name, batch, seq, "fp32", "adamw").memory_mib
    served = table_served.predict(_spec(family, params, layers, seq, batch))
    network = network_only.predict(_spec(family, params, layers, seq, batch))
    assert abs(served.memory_mib / truth - 1) <= CLOSE, (served.memory_mib, truth)
    assert abs(network.memory_mib / truth - 1) > abs(served.memory_mib / truth - 1), (network.memory_mib, truth)
    assert served.memory_mib < served.memory_mib_upper
    assert served.model_version == network.model_version  # the family path still: no "+exact"


def test_bf16_mixed_takes_the_larger_of_its_two_readings(table_served: Predictor) -> None:
    name, family, params, layers, seq, batch = TEXT_JOBS[0]
    served = table_served.predict(_spec(family, params, layers, seq, batch, "bf16-mixed"))
    amp = exact.estimate(name, batch, seq, "amp", "adamw").memory_mib
    bf16 = exact.estimate(name, batch, seq, "bf16", "adamw").memory_mib
    assert abs(served.memory_mib / max(amp, bf16) - 1) <= CLOSE, (served.memory_mib, amp, bf16)


def test_only_bare_text_jobs_take_the_tables_point() -> None:
    resnet = JobSpec("resnet", params_millions=25, batch_size=32, input_dim=224, num_layers=50)
    assert family_table.served_point(resnet) is None  # the image families keep the network's point
    gpt = _spec("gpt", 331.2, 24, 1024, 4)
    assert family_table.served_point(gpt) is not None
    counted = JobSpec("gpt", params_millions=331.2, num_layers=24, input_dim=1024, batch_size=4,
                      optimizer="adamw", activations_millions=900.0)
    assert family_table.served_point(counted) is None  # an activation count: the network reads it
    named = JobSpec("gpt", params_millions=331.2, num_layers=24, input_dim=1024, batch_size=4, optimizer="adamw",
                    model="hf/opt-350m")
    assert family_table.served_point(named) is None
    assert Predictor.load(cache_size=0).predict(named).model_version.endswith("+exact")


def test_the_held_out_reading_never_reads_the_jobs_own_group() -> None:
    gpt = _spec("gpt", 331.2, 24, 1024, 4)
    index = family_table._index()
    opt = {n for n, g in zip(index.names, index.groups.tolist(), strict=True) if g == "opt"}
    full = family_table.served_point(gpt)
    held = family_table.served_point(gpt, exclude_group="opt")
    assert full is not None and "hf/opt-350m" in full.neighbours
    assert held is not None and not opt & set(held.neighbours)


def test_the_shipped_predictor_serves_the_networks_point() -> None:
    """Until the table point is judged on the capacity replay's real jobs too, the shipped file keeps the network's."""
    assert family_bounds.served_point() == "network"


def test_the_held_out_evaluation_scores_the_served_rule() -> None:
    """`family_eval.points` scores `text_table` as served: the table's point, its own group left out, for a
    text row; the network's for an image row."""
    import numpy as np

    from predictor import family_eval

    text = {"model_type": "gpt", "params_millions": "331.2", "batch_size": "4", "input_dim": "1024",
            "num_layers": "24", "precision": "fp32", "optimizer": "adamw", "group": "opt", "name": "hf/opt-350m"}
    image = {**text, "model_type": "resnet", "params_millions": "25.6", "batch_size": "32", "input_dim": "224",
             "num_layers": "50", "group": "resnet", "name": "timm/resnet50"}
    got = family_eval.points([text, image], DEFAULT_ARTIFACT)
    held = family_table.served_point(_spec("gpt", 331.2, 24, 1024, 4), exclude_group="opt")
    assert held is not None
    assert got["text_table"][0] == held.memory_mib == got["table"][0]
    assert got["text_table"][0] != got["network"][0]
    assert got["text_table"][1] == got["network"][1] and not np.isnan(got["table"][1])
