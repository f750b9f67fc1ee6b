"""mkdocs hooks of the docs site (mkdocs.yml `hooks:`), run by `make docs` and its tests.

Pages that other branches are still writing are named in mkdocs.yml `extra.pending_pages`, with their
nav entries already in place: while such a file is absent its nav entry is left out, so the strict
build passes; once the file exists the entry stays, and from then on it is checked as every other page.
Nothing else is exempt: a link to a pending page from another page still fails the strict build.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.deepres")


def pending_absent(pending: list[str], docs_dir: Path) -> set[str]:
    """The pending pages whose file is not (yet) under docs_dir."""
    return {page for page in pending if not (docs_dir / page).is_file()}


def prune_nav(nav: list[Any], absent: set[str]) -> list[Any]:
    """nav without the entries whose page is in absent (sections left empty are dropped too)."""
    kept: list[Any] = []
    for entry in nav:
        if isinstance(entry, str):
            if entry not in absent:
                kept.append(entry)
            continue
        if not isinstance(entry, dict):
            kept.append(entry)
            continue
        pruned: dict[str, Any] = {}
        for title, value in entry.items():
            if isinstance(value, list):
                children = prune_nav(value, absent)
                if children:
                    pruned[title] = children
            elif not (isinstance(value, str) and value in absent):
                pruned[title] = value
        if pruned:
            kept.append(pruned)
    return kept


def on_config(config: Any) -> Any:
    pending = list(config["extra"].get("pending_pages") or [])
    absent = pending_absent(pending, Path(config["docs_dir"]))
    if absent and config["nav"]:
        log.info("pending pages left out of the nav until they exist: %s", ", ".join(sorted(absent)))
        config["nav"] = prune_nav(config["nav"], absent)
    return config
