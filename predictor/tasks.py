"""What a model is trained for (`deepres.io/task`, `deepres.io/target-dim`): the head decides memory.

Tasks and their defaults (the head the traced table and the dataset trace when no task is given):

- Hugging Face encoders (BERT, RoBERTa, DeBERTa, ELECTRA, ALBERT, DistilBERT, ModernBERT...): default
  masked-lm; also traced (`predictor/data/exact_tasks.json`): sequence-classification, token-classification.
- Hugging Face decoders (GPT-2, Llama, OPT, Pythia, Qwen...; XLNet): default causal-lm; also
  sequence-classification.
- Hugging Face encoder-decoders (T5, BART, Pegasus, mBART, Marian): seq2seq, targets a quarter of the
  input (at least 16 tokens) unless `target-dim` says otherwise (traced at TARGET_LENGTHS).
- Vision models (timm, torchvision, HF image models) and the vision families: image-classification
  (the classifier is the head traced; no other).
- Families without a model name: `gpt` causal-lm, `transformer` masked-lm, `mlp`/`rnn`/`lstm`/`gru`
  sequence-classification. The family network has no head feature: a `gpt` or `transformer` job with
  a classification task is scaled by the traced ratio of that head to the default one
  (`predictor/family_heads.py`); other tasks are checked, not used.

The default of a text model is its pre-training head: the larger one (a vocabulary's logits per
token), so a job that fine-tunes a classifier without saying so is over-, never under-predicted.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from predictor.errors import SpecError

#: Accepted task names (and spellings, case-insensitive) -> the task.
TASK_ALIASES: dict[str, str] = {
    "sequence-classification": "sequence-classification", "seq-cls": "sequence-classification",
    "text-classification": "sequence-classification", "classification": "sequence-classification",
    "token-classification": "token-classification", "ner": "token-classification",
    "masked-lm": "masked-lm", "mlm": "masked-lm", "fill-mask": "masked-lm",
    "causal-lm": "causal-lm", "clm": "causal-lm", "text-generation": "causal-lm",
    "seq2seq": "seq2seq", "seq2seq-lm": "seq2seq", "summarization": "seq2seq", "translation": "seq2seq",
    "image-classification": "image-classification",
}
TASKS: tuple[str, ...] = ("sequence-classification", "token-classification", "masked-lm", "causal-lm", "seq2seq",
                          "image-classification")
#: transformers' auto class of each traced head.
HEAD_CLASSES: dict[str, str] = {
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
}
SEQUENCE_LABELS = 2  # a binary classifier (GLUE's SST-2, IMDb): the head's width hardly matters
TOKEN_LABELS = 9  # CoNLL-2003 NER
#: Target lengths (tokens) the seq2seq heads are traced at; `target-dim` between them is interpolated.
TARGET_LENGTHS: tuple[int, ...] = (32, 128, 512)
TARGET_DIM_RANGE = (1, 1_000_000)
TARGET_IGNORED = "target-dim ignored: only the seq2seq task has targets (task={task})"

_HF_TABLE = Path(__file__).resolve().parent / "dataset" / "hf_models.json"
_PRETRAINING = {"mlm": "masked-lm", "clm": "causal-lm", "seq2seq": "seq2seq", "image": "image-classification"}
_OTHERS = {"masked-lm": ("sequence-classification", "token-classification"),
           "causal-lm": ("sequence-classification",), "seq2seq": ("seq2seq",), "image-classification": ()}
FAMILY_DEFAULT: dict[str, str] = {
    "cnn": "image-classification", "resnet": "image-classification", "vit": "image-classification",
    "gpt": "causal-lm", "transformer": "masked-lm",
    "mlp": "sequence-classification", "rnn": "sequence-classification", "lstm": "sequence-classification",
    "gru": "sequence-classification",
}


@cache
def _hf_tasks() -> dict[str, str]:
    if not _HF_TABLE.is_file():
        return {}
    return {f"hf/{m['name']}": _PRETRAINING[m["task"]] for m in json.loads(_HF_TABLE.read_text())["models"]}


def tasks_of(name: str) -> tuple[str, tuple[str, ...]]:
    """(default task, the other tasks traced) of a table name (`hf/bert-base-uncased`, `timm/resnet50`)."""
    default = _hf_tasks().get(name, "image-classification")
    return default, _OTHERS[default]


def parse_task(text: str) -> str:
    """The task for a spelling; SpecError naming the accepted ones."""
    task = TASK_ALIASES.get(str(text).strip().lower())
    if task is None:
        raise SpecError("task", text, "one of " + ", ".join(TASKS))
    return task


def check_task(name: str, family: str, task: str, target_dim: int) -> str:
    """The task a job runs (its default when `task` is empty); SpecError when the model has no such head.
    (A `target-dim` beside a task without targets is ignored, with a note: `TARGET_IGNORED`.)"""
    if name:
        default, others = tasks_of(name)
        allowed = (default, *others)
    else:
        default = FAMILY_DEFAULT.get(family, "sequence-classification")
        allowed = TASKS
    chosen = task or default
    if chosen not in allowed:
        raise SpecError("task", task, f"one of {', '.join(dict.fromkeys(allowed))} for {name or family}")
    return chosen
