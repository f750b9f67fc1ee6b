"""`deepres profile NAME`: a named model traced on the CPU without code (issue 25, part 6)."""

from __future__ import annotations

import re

import pytest

from extender.cli import main
from predictor.runtime import Predictor
from predictor.spec import JobSpec


def _annotations(out: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r'^deepres\.io/([\w-]+): "([^"]*)"$', out, re.MULTILINE)}


def test_profile_timm_resnet50(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "timm/resnet50", "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    found = _annotations(out)
    assert found["model"] == "timm/resnet50" and found["batch-size"] == "64" and found["input-dim"] == "224"
    spec = JobSpec.parse(found)  # what it prints is what a pod may carry
    assert Predictor.load().predict(spec).model_version.endswith("+exact")
    traced = float(re.search(r"traced peak ([\d.]+) MiB", out).group(1))  # type: ignore[union-attr]
    # resnet50, batch 64, fp32: ~5.2 GiB of activations (timm's card: 11.1 M activations per sample at
    # 224 px, x 4 bytes x 64 samples x ~2 kept for backward) plus 25.6 M parameters' weights and states
    assert 4000 < traced < 8000


def test_profile_hf_bert_with_a_classification_head(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "hf/bert-base-uncased", "--task", "sequence-classification", "--precision",
                 "bf16"]) == 0
    found = _annotations(capsys.readouterr().out)
    assert found["model"] == "hf/bert-base-uncased" and found["task"] == "sequence-classification"
    assert found["precision"] == "bf16-mixed"  # plain bf16 reads as bf16-mixed; never printed ambiguous
    JobSpec.parse(found)


def test_profile_rejects_a_head_the_model_has_not(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "hf/gpt2", "--task", "masked-lm"]) == 2
    assert "task" in capsys.readouterr().err
