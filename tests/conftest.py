"""Fixtures shared by every suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# A property fails on what it finds, never on how long one example took on a loaded machine: hypothesis's
# default 200 ms deadline made test_annotations' parser property fail under load (a timing flake).
settings.register_profile("deepres", deadline=None)
settings.load_profile("deepres")

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
