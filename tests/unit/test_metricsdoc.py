"""docs/metrics.md's table of the extender's metrics is the code's, and it is what a running extender serves.

Why: the page was written by hand and had fallen behind (the restore, state-file, dropped-node and UUID
conflict counters were missing). The table is generated from the registry (devtools/metricsdoc.py); this
fails when the committed page differs, and checks the table against a real scrape of `deepres serve`
(the real server over loopback HTTP), so a metric registered elsewhere than the generator looks is caught.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from devtools import metricsdoc
from devtools.localserver import LocalServer
from tests.fixtures.kube.server import TOKEN

PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_the_committed_page_holds_the_generated_table() -> None:
    page = PAGE.read_text()
    assert page == metricsdoc.render(page), "docs/metrics.md's metrics table differs from the code: run " \
                                            "`deepres report docs` and commit the page"


def test_the_table_lists_exactly_what_the_running_extender_serves(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with LocalServer(tmp_path, token=TOKEN) as server, \
            urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as response:
        scraped = response.read().decode()
    # `*_created`: prometheus_client's creation time of each counter and histogram, not a metric of its own
    families = {f.name: f.type for f in text_string_to_metric_families(scraped)
                if f.name.startswith("deepres_") and not f.name.endswith("_created")}
    # the parser names a counter without its `_total`, as the registry does
    documented = {name.removesuffix("_total") if kind == "counter" else name: kind
                  for name, kind, _, _ in metricsdoc.definitions()}
    assert families == documented
    table = metricsdoc.table()
    for name, kind, labels, _ in metricsdoc.definitions():
        assert f"| `{name}` | {kind} |" in table
        for label in labels:  # every label the table names appears on the served series where they exist
            samples = [s for f in text_string_to_metric_families(scraped) for s in f.samples
                       if s.name.startswith(name.removesuffix("_total"))]
            assert all(label in s.labels for s in samples if s.labels and "le" not in s.labels), (name, label)
