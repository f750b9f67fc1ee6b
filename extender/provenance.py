"""What made a report: the stamp every report writer puts under its `provenance` key (issue 33).

    from extender.provenance import stamp
    report["provenance"] = stamp("deepres simulate --experiment capacity")

A stamp holds the commit (and whether the tree had uncommitted changes), the shipped predictor's
version (predictor/artifacts/metadata.json), a hash of the live policy defaults
(`PolicySettings().params()`) and the command. tests/unit/test_provenance.py fails when a report the
README cites no longer matches the shipped predictor or the policy defaults.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PREDICTOR_METADATA = REPO / "predictor" / "artifacts" / "metadata.json"


def predictor_version(metadata: Path = PREDICTOR_METADATA) -> str:
    """The shipped predictor's version ("none" when no artifact is shipped)."""
    try:
        return str(json.loads(metadata.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError):
        return "none"


#: PolicyParams fields added after reports were stamped, with the value that does what the policy did before the
#: field existed: left out of the hash while they hold it, so a stamp made before them still names the same
#: defaults (a field set to anything else changes the hash). `bound_beyond_gpus`: the whole-GPU fallback was the
#: only behaviour before the setting (issue 47). `sharing_feedback` off: the forecast alone decided joins, and
#: `sharing_move_after_s` does nothing without it (issue 46).
ADDED_AT_PRIOR_BEHAVIOUR: dict[str, object] = {"bound_beyond_gpus": "whole-gpu", "sharing_feedback": False,
                                               "sharing_move_after_s": 600.0}


def params_hash(params: Any) -> str:
    """A short hash of a PolicyParams (every field, less those at their prior behaviour: ADDED_AT_PRIOR_BEHAVIOUR)."""
    fields = {k: v for k, v in asdict(params).items()
              if not (k in ADDED_AT_PRIOR_BEHAVIOUR and v == ADDED_AT_PRIOR_BEHAVIOUR[k])}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def policy_hash() -> str:
    """The hash of the live policy defaults (`PolicySettings().params()`)."""
    from extender.settings import PolicySettings

    return params_hash(PolicySettings().params())


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def stamp(command: str) -> dict[str, Any]:
    """The provenance of a report made now by `command`."""
    return {"commit": _git("rev-parse", "HEAD") or "unknown",
            # reports/ left out: a command that writes its report in parts (one cluster size after another)
            # would find its own first part there and call its tree dirty
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)reports")),
            "predictor_version": predictor_version(), "policy_params_hash": policy_hash(), "command": command}
