"""What `deepres bench cluster` (devtools/bench_cluster.py) reads off the processes it measures: CPU
time and RSS of a process tree from /proc, and the request histograms of kube-apiserver's and the
extender's /metrics."""

from __future__ import annotations

import os
from pathlib import Path


def tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                children = task / "children"
                if children.exists():
                    todo += [int(c) for c in children.read_text().split()]
        except OSError:
            continue
    return found


def cpu_s(pid: int) -> float:
    """utime+stime of `pid` and its descendants alive now (the extender's server and its worker)."""
    total = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """The resident memory of `pid` and its descendants (the engine's main process and its worker:
    the pages they share counted in each)."""
    total_kib = 0
    for p in tree(pid):
        try:
            lines = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        total_kib += sum(int(line.split()[1]) for line in lines if line.startswith("VmRSS:"))
    return round(total_kib / 1024.0, 1)


def apiserver_binding(text: str) -> tuple[float, float]:
    """kube-apiserver's request histogram for Bindings, from its /metrics: (seconds in total, requests)."""
    from prometheus_client.parser import text_string_to_metric_families

    total, count = 0.0, 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request_duration_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("verb") == "POST" and (labels.get("subresource") == "binding"
                                                 or labels.get("resource") == "bindings"):
                if sample.name.endswith("_sum"):
                    total += sample.value
                elif sample.name.endswith("_count"):
                    count += sample.value
    return total, count


def verb_totals(text: str) -> dict[str, float]:
    """The extender's request histogram, from its /metrics: `<verb>_s` (seconds in total) and
    `<verb>_n` (calls); and its bind and assumption counters by outcome (`binds:<outcome>`...)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("deepres_extender_binds", "deepres_extender_assumptions"):  # counters, by outcome
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    totals[f"{family.name.rsplit('_', 1)[-1]}:{sample.labels.get('outcome', '')}"] = sample.value
            continue
        if family.name != "deepres_extender_request_seconds":
            continue
        for sample in family.samples:
            verb = sample.labels.get("verb", "")
            if verb and sample.name.endswith("_sum"):
                totals[f"{verb}_s"] = totals.get(f"{verb}_s", 0.0) + sample.value
            elif verb and sample.name.endswith("_count"):
                totals[f"{verb}_n"] = totals.get(f"{verb}_n", 0.0) + sample.value
    return totals


def verb_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per verb, ms per call between two `verb_totals`."""
    out = {}
    for key in after:
        if key.endswith("_n"):
            verb = key[:-2]
            calls = after[key] - before.get(key, 0.0)
            if calls:
                out[verb] = round(1000 * (after[f"{verb}_s"] - before.get(f"{verb}_s", 0.0)) / calls, 2)
    return out
