"""The house of docs/ARCHITECTURE.md: what `deepres serve` loads, what the serving image copies, how large
the glue may grow. (The import contracts themselves are `lint-imports`, run by `make test`.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.unit.test_dockerfiles import DOCKERFILES, instructions, stages

REPO = Path(__file__).resolve().parents[2]

def test_serving_loads_no_development_tool() -> None:
    """A fresh interpreter that imports the server and builds the app (local mode, formula predictor
    factory not needed: the app loads the predictor in the background) holds no devtools module."""
    code = (
        "import json, sys\n"
        "import extender.server.serve, extender.server.app, extender.cli\n"
        "from extender.settings import Settings\n"
        "s = Settings(); s.kube.no_kube = True\n"
        "extender.server.app.create_app(s)\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "                         if m.split('.')[0] in ('devtools', 'extender', 'predictor'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "extender.server.app" in loaded and "extender.ledger" in loaded  # the scan saw the server
    assert not [m for m in loaded if m.split(".")[0] == "devtools"], loaded


def test_the_extender_image_copies_no_tools_package() -> None:
    copied = [c for stage in stages(DOCKERFILES["extender"].read_text()) for c in instructions(stage, "COPY")]
    assert any(c.startswith("extender ") for c in copied), copied  # the scan read the COPY lines
    assert not [c for c in copied if "devtools" in c], copied
    whole = [c for c in copied if c.split()[0] in (".", "./")]
    assert not whole, f"a whole-context COPY would take devtools/: {whole}"


def test_the_app_is_glue() -> None:
    assert len((REPO / "extender/server/app.py").read_text().splitlines()) <= 400


def test_no_module_over_700_lines() -> None:
    """docs/ARCHITECTURE.md: no module of the packages is over 700 lines (none is generated or data-heavy
    enough to be excused today)."""
    sizes = {str(p.relative_to(REPO)): len(p.read_text().splitlines())
             for pkg in ("extender", "predictor", "devtools") for p in (REPO / pkg).rglob("*.py")}
    assert len(sizes) > 100  # the scan read the tree
    assert not {name: n for name, n in sizes.items() if n > 700}
