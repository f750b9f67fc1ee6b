"""The optional activation count (`deepres.io/activations-millions`): parsing and errors, that leaving
it out reads as before, the dataset's rule against published figures, and that the predictor moves
toward the traced labels when it is told it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from extender.annotations import PREFIX, AnnotationError, parse_job
from predictor import features as feats
from predictor.spec import JobSpec, SpecError


def test_the_activation_count_parses_and_round_trips() -> None:
    spec = JobSpec.parse({"model-type": "vit", "activations-millions": "16.5"})
    assert spec.activations_millions == 16.5
    assert JobSpec.parse(spec.to_annotations()) == spec
    bare = JobSpec.parse({"model-type": "vit"})
    assert bare.activations_millions == 0.0 and "activations-millions" not in bare.to_annotations()


@pytest.mark.parametrize("value", ["lots", "0", "-3", "1e9", "nan"])
def test_a_malformed_activation_count_names_the_key(value: str) -> None:
    key = "activations-millions"
    with pytest.raises(AnnotationError) as err:
        parse_job({PREFIX + "model-type": "cnn", PREFIX + key: value}, created_s=None, now_s=0.0)
    assert PREFIX + key in str(err.value) and repr(value) in str(err.value)
    if value != "0":
        with pytest.raises(SpecError, match=key):
            JobSpec.parse({"model-type": "cnn", key: value})


def test_leaving_it_out_reads_as_the_rows_trained_without_it() -> None:
    """The shape columns of a job without the count are 0 (flag included) and the other features do not
    depend on it: such a job is one of the rows fits saw with it dropped."""
    common = {"model-type": "gpt", "params-millions": "124", "num-layers": "12", "input-dim": "1024"}
    with_count = JobSpec.parse({**common, "activations-millions": "136.4"})
    without = JobSpec.parse(common)
    x = feats.physics_features(feats.columns_from_specs([with_count, without]))
    shape_cols = [x.names.index(n) for n in feats.SHAPE_NAMES]
    other = [i for i in range(x.values.shape[1]) if i not in shape_cols]
    assert np.array_equal(x.values[0, other], x.values[1, other])
    assert not x.values[1, shape_cols].any()
    assert x.values[0, x.names.index("activations_given")] == 1.0


def test_the_activation_count_rule_gives_timm_model_cards_figures() -> None:
    """The dataset's `activations-millions` rule against the "Activations (M)" that timm's published
    model cards list (Hugging Face hub, timm/<name>): resnet50 11.1, efficientnet_b0 6.7,
    vit_base_patch16_224 16.5, convnext_tiny 13.4 (images of 224 px)."""
    pytest.importorskip("timm")
    from predictor.dataset import archs as A
    from predictor.dataset import shapes

    cards = {"timm/resnet50": 11.1, "timm/efficientnet_b0": 6.7, "timm/vit_base_patch16_224": 16.5,
             "timm/convnext_tiny": 13.4}
    by_name = {a.name: a for a in A.timm_archs() if a.name in cards}
    for name, card in cards.items():
        got = shapes.shapes_of(by_name[name])
        assert got["activations_millions"] == pytest.approx(card, abs=0.05), name


def _cnn(stem_stride: int) -> nn.Module:
    """Two hand-written CNNs of the same parameters and weight layers: one downsamples at once, one
    keeps the full resolution through its first block (four times the activations per image there)."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, stride=stem_stride, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.BatchNorm2d(256), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 1000))


def test_the_activation_count_tells_apart_what_the_family_fields_cannot() -> None:
    """Two CNNs the data scientist would annotate alike (same family, parameters, layers, batch and
    input) differ in traced memory; with `activations-millions` (as `deepres profile` counts it) the
    shipped predictor's two answers differ as the traced ones do."""
    from predictor import profile
    from predictor.dataset.shapes import activations_millions
    from predictor.runtime import Predictor

    predictor = Predictor.load()
    traced, plain, told = [], [], []
    for stride in (2, 1):
        model = _cnn(stride)
        batch = (torch.empty(64, 3, 224, 224), torch.empty(64, dtype=torch.long))
        prof = profile.profile_step(model, torch.optim.SGD(model.parameters(), lr=0.1), batch,
                                    nn.functional.cross_entropy, precision="amp", model_type="cnn")
        count = prof.activations_millions  # what `deepres profile` prints for it
        assert prof.annotations()["activations-millions"] == f"{count:.4g}"
        assert count == pytest.approx(activations_millions(model.to("meta"), lambda dtype: (
            torch.empty(1, 3, 224, 224), None)))
        annotations = {"model-type": "cnn", "params-millions": f"{prof.params_millions:.3f}", "batch-size": "64",
                       "input-dim": "224", "num-layers": "5", "precision": "amp", "optimizer": "sgd"}
        traced.append(prof.memory_mib)
        plain.append(predictor.predict(JobSpec.parse(annotations)).memory_mib)
        told.append(predictor.predict(JobSpec.parse({**annotations,
                                                     "activations-millions": f"{count:.3f}"})).memory_mib)
    assert plain[0] == plain[1]  # the family fields cannot tell them apart
    assert traced[1] > 1.5 * traced[0]
    traced_ratio = traced[1] / traced[0]
    assert abs(told[1] / told[0] - traced_ratio) < 0.5 * (traced_ratio - 1.0), (traced, plain, told)


def test_on_a_held_out_group_the_shape_annotations_move_predictions_toward_the_traced_labels() -> None:
    """The tuned network fitted on the dataset's jobs without one architecture group (timm's
    vision_transformer module: ViT, DeiT III, SigLIP... the largest group): its jobs are predicted
    closer to their traced labels with the shape annotations (by the dataset's rule) than without."""
    from predictor import train, trainset

    data = trainset.load_dataset(trainset.DEFAULT_DATA, 4000, 0)
    held = np.flatnonzero(data.groups == "vision_transformer")
    rows = np.flatnonzero(data.groups != "vision_transformer")
    assert len(held) > 100 and (data.cols["activations_millions"][held] > 0).all()
    model = train._fit_estimators("transformer_bigru_tuned", data, rows, 0, 0.5, None, None)
    bare = data.without_shapes()

    def median_error(of: trainset.Dataset) -> float:
        points, _ = model.predict(of, held)
        return float(np.median(np.abs(points[:, 0] / data.y[held, 0] - 1.0)))

    told, without = median_error(data), median_error(bare)
    assert told < 0.8 * without, (told, without)


def test_data_augmentation_does_not_move_the_prediction() -> None:
    """Augmentation runs on the CPU loader: the same job with or without it needs the same GPU memory
    (the dataset sets it for every image model, so a learned input would only punish the default)."""
    from predictor.runtime import Predictor

    predictor = Predictor.load()
    job = {"model-type": "resnet", "params-millions": "11.69", "num-layers": "18", "batch-size": "32",
           "input-dim": "224", "precision": "amp", "optimizer": "sgd"}
    on = predictor.predict(JobSpec.parse({**job, "data-augmentation": "true"}))
    off = predictor.predict(JobSpec.parse({**job, "data-augmentation": "false"}))
    assert (on.memory_mib, on.memory_mib_upper) == (off.memory_mib, off.memory_mib_upper)
