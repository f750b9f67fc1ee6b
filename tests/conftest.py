"""Fixtures shared by every suite."""

from __future__ import annotations

from pathlib import Path

import pytest

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
