"""Fixtures shared by every suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# A property fails on what it finds, never on how long one example took on a loaded machine: hypothesis's
# default 200 ms deadline made test_annotations' parser property fail under load (a timing flake).
# `make test` (CI's gate) tries the same examples on every run and every machine: each property's come
# from a hash of the test (`derandomize`), none from a local example database, so a run passes or fails
# on the code, not on the draw. DEEPRES_HYPOTHESIS_EXPLORE=1 draws new examples each run and replays the
# failures it kept (.hypothesis/): a full run of that kind found the fragmentation score's memo bug
# (tests/unit/test_policy_fragmentation.py), which a fixed draw would have missed until the test changed.
settings.register_profile("deepres", deadline=None, derandomize=True, database=None)
settings.register_profile("explore", deadline=None)
settings.load_profile("explore" if os.environ.get("DEEPRES_HYPOTHESIS_EXPLORE") else "deepres")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (public traces and GPU measurements); tests that need it skip without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs ../shared/data beside the repository ({SHARED_DATA} not found)")
    return SHARED_DATA
