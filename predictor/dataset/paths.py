"""Where the real-architecture dataset's outputs live (read by `campaign`, written by `real`)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "predictor" / "data"
TRACES_OUT = DATA_DIR / "real_traces.csv.gz"
JOBS_OUT = DATA_DIR / "real_jobs.csv.gz"
EXACT_OUT = DATA_DIR / "exact.json"
STORE = DATA_DIR / "real_units.jsonl.gz"
