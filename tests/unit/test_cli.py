"""`deepres --version`: what the images' smoke test and an admin run first."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from extender.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_version_is_the_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"deepres {version}"
