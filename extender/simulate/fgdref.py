"""FGD's cached results (../shared/data/fgd): allocation per arrived-load column, per trace/policy/seed."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

#: FGD's policy column names -> ours.
FGD_POLICY_NAMES = {"01-Random": "random", "02-DotProd": "dotprod", "03-GpuClustering": "clustering",
                    "04-GpuPacking": "packing", "05-BestFit": "bestfit", "06-FGD": "fgd"}


@dataclass(frozen=True)
class FgdReference:
    """columns[(trace, policy)][seed] = the 131 allocation columns (None where blank)."""

    columns: dict[tuple[str, str], dict[int, list[float | None]]]

    def mean(self, trace: str, policy: str, column: int) -> float | None:
        runs = self.columns.get((trace, policy), {})
        values = [c[column] for c in runs.values() if c[column] is not None]
        return sum(values) / len(values) if values else None  # type: ignore[arg-type]

    def seeds(self, trace: str, policy: str) -> int:
        return len(self.columns.get((trace, policy), {}))


def read_reference(path: Path) -> FgdReference:
    """Parse `fgd_analysis_allo_discrete.csv`; a missing file gives an empty reference."""
    columns: dict[tuple[str, str], dict[int, list[float | None]]] = {}
    if not path.is_file():
        return FgdReference(columns)
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        first = header.index("0")
        for row in reader:
            trace = row[0].removeprefix("openb_pod_list_")
            policy = FGD_POLICY_NAMES.get(row[1], row[1])
            values: list[float | None] = [float(v) if v else None for v in row[first : first + 131]]
            columns.setdefault((trace, policy), {})[int(row[3])] = values
    return FgdReference(columns)
