"""The data the simulations and their tests read is in the repository, intact, with its source and licence.

Why: `deepres simulate` and the tests that need traces read ../shared/data, which a plain clone does not
have, so the command failed and the tests skipped on a user's machine. data/ now holds what may be kept
(data/README.md); SHA256SUMS pins every file, and no default data path may lead outside the repository
again (the one exception, GPUMemNet's unlicensed measurements, is named).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from extender.simulate import interference, traces
from predictor import datapaths, steptime_check

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"


def test_every_data_file_has_the_checksum_recorded_for_it() -> None:
    recorded = {}
    for line in (DATA / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        recorded[name.removeprefix("./")] = digest
    present = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file()} - {"SHA256SUMS", "README.md"}
    assert set(recorded) == present, f"unlisted: {present - set(recorded)}; missing: {set(recorded) - present}"
    changed = [name for name, digest in recorded.items()
               if hashlib.sha256((DATA / name).read_bytes()).hexdigest() != digest]
    assert not changed, f"data files differ from SHA256SUMS: {changed}"


def test_the_code_reads_its_data_from_the_repository() -> None:
    defaults = {"openb traces": traces.DEFAULT_DATA, "FGD results": traces.FGD_DATA,
                "co-location": interference.COLOCATION, "step-time check": steptime_check.COLOCATION}
    for what, path in defaults.items():
        assert path.resolve().is_relative_to(DATA), f"{what}: {path} is outside data/"
        assert path.exists(), f"{what}: {path} is missing"
    assert (traces.DEFAULT_DATA / "openb_pod_list_default.csv").is_file()
    assert all(traces.pod_list_path(traces.DEFAULT_DATA, name).is_file() for name in traces.FGD_TRACES)
    # the one dataset left outside, by its licence
    assert not datapaths.GPUMEM.resolve().is_relative_to(REPO)


def test_no_code_names_a_data_path_outside_the_repository_but_the_one_home() -> None:
    outside = re.compile(r"""["']shared["']\s*/\s*["']data["']|parents\[\d\]\.parent\s*/\s*["']shared""")
    sources = [p for pkg in ("extender", "predictor", "devtools") for p in (REPO / pkg).rglob("*.py")]
    offenders = [str(p.relative_to(REPO)) for p in sources
                 if p.name != "datapaths.py" and outside.search(p.read_text())]
    assert not offenders, f"data paths outside predictor/datapaths.py: {offenders}"


def test_the_readme_gives_every_folder_its_source_and_licence() -> None:
    readme = (DATA / "README.md").read_text()
    for folder in sorted(p.name for p in DATA.iterdir() if p.is_dir()):
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{folder}/`")), "")
        assert row, f"data/README.md has no row for {folder}/"
        assert re.search(r"CC BY|Apache|measured for this project", row), f"{folder}/: no licence stated"
