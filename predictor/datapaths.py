"""Where the data the commands and tests read live: one home for the paths.

`data/` in the repository holds what may be kept there (its README names each file's source and
licence; SHA256SUMS their checksums): the openb traces, FGD's results, the co-location measurements.
GPUMemNet's measurements carry no licence, so they are read from `../shared/data/gpumem` beside the
repository when it is there (only a calibration refit and its checks need them).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
#: Alibaba's GPU cluster trace v2023 (CC BY 4.0): the pod and node lists every simulation reads
OPENB = DATA / "openb"
#: FGD's cached experiment results (Apache-2.0): the packing report's reference
FGD = DATA / "fgd"
#: steps/s of real jobs sharing one H100, measured for this project: the interference model's data
COLOCATION = DATA / "colocation"
#: GPUMemNet's A100 measurements: not copied into the repository (no licence), read beside it
GPUMEM = REPO.parent / "shared" / "data" / "gpumem"
