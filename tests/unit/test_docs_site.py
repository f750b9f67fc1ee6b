"""The docs site builds strictly, and strictness is real: a broken link or a missing page fails it.

Why: CI runs `make docs` (mkdocs build --strict); a site that builds whatever its links say would let
the guides point at pages and anchors that moved. The build takes about a second.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devtools.mkdocs_hooks import pending_absent, prune_nav

ROOT = Path(__file__).resolve().parents[2]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )


@pytest.fixture
def site_copy(tmp_path: Path) -> Path:
    """mkdocs.yml, its hook and docs/ copied under tmp_path: a build there never touches the tree."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "devtools").mkdir()
    shutil.copy(ROOT / "devtools" / "mkdocs_hooks.py", tmp_path / "devtools" / "mkdocs_hooks.py")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def test_the_site_builds_strictly(site_copy: Path) -> None:
    done = build(site_copy / "mkdocs.yml", site_copy / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site_copy / "site" / "index.html").is_file()


def test_a_broken_link_fails_the_build(site_copy: Path) -> None:
    page = site_copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [a page that is not there](no-such-page.md).\n")
    done = build(site_copy / "mkdocs.yml", site_copy / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_a_missing_anchor_fails_the_build(site_copy: Path) -> None:
    page = site_copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [the rules](rules.md#no-such-heading).\n")
    done = build(site_copy / "mkdocs.yml", site_copy / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr


def test_a_nav_entry_without_its_page_fails_unless_pending(site_copy: Path) -> None:
    config = yaml.safe_load((site_copy / "mkdocs.yml").read_text())
    config["nav"].append({"Nowhere": "nowhere.md"})
    (site_copy / "mkdocs.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    done = build(site_copy / "mkdocs.yml", site_copy / "site")
    assert done.returncode != 0
    assert "nowhere.md" in done.stderr


def test_pending_pages_leave_the_nav_only_while_absent(tmp_path: Path) -> None:
    (tmp_path / "here.md").write_text("# here\n")
    absent = pending_absent(["here.md", "later.md"], tmp_path)
    assert absent == {"later.md"}
    nav = [{"Home": "index.md"}, {"Section": [{"Here": "here.md"}, {"Later": "later.md"}]},
           {"Only": [{"L": "later.md"}]}]
    assert prune_nav(nav, absent) == [{"Home": "index.md"}, {"Section": [{"Here": "here.md"}]}]
