"""What each of the docs' plots was drawn from, written into the PNG itself, so a plot older than its
report is caught.

`deepres report plots` (devtools/plots.py) stores, in each PNG's text chunk `Source`, the input it drew
(`reports/simulation.json#capacity`, ...) and a fingerprint of that input's content at the time. The
fingerprint is recomputed from the inputs in the tree now; tests/unit/test_plot_sources.py fails when the
two differ (the report was rewritten, or the measured rows or the shipped predictor changed, since the
plot was drawn): run `deepres report plots` and commit the pictures.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
KEY = "Source"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_source(reports: Path = REPORTS) -> str:
    """queueing-vs-load.png: reports/simulation.json's `capacity` when it has one, else its `replay`."""
    report = json.loads((reports / "simulation.json").read_text())
    section = "capacity" if "capacity" in report else "replay"
    return f"reports/simulation.json#{section} sha256:{_digest(report[section])}"


def interference_source(reports: Path = REPORTS) -> str:
    """interference-model.png: the whole of reports/interference.json."""
    return f"reports/interference.json sha256:{_digest(json.loads((reports / 'interference.json').read_text()))}"


def memory_source(reports: Path = REPORTS) -> str:
    """memory-predicted-vs-measured.png: the measured rows and the shipped predictor that predicted them."""
    from extender.provenance import predictor_version
    from predictor.dataset import campaign

    tables = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in
              sorted(campaign.MEASURED_DIR.glob("*.csv"))}
    return f"predictor/data/measured/*.csv + predictor {predictor_version()} sha256:{_digest(tables)}"


#: each plot of docs/img and how its source is stated now
SOURCES = {"queueing-vs-load.png": load_source, "interference-model.png": interference_source,
           "memory-predicted-vs-measured.png": memory_source}


def png_text(path: Path) -> dict[str, str]:
    """The tEXt, zTXt and iTXt chunks of a PNG (keyword -> text)."""
    data = path.read_bytes()
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError(f"{path} is not a PNG")
    out, at = {}, 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        at += 12 + length
        if kind == b"tEXt":
            key, _, text = body.partition(b"\0")
            out[key.decode("latin-1")] = text.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed, rest = rest[0], rest[2:]
            _, _, rest = rest.partition(b"\0")  # language tag
            _, _, text = rest.partition(b"\0")  # translated keyword
            out[key.decode("latin-1")] = (zlib.decompress(text) if compressed else text).decode()
        elif kind == b"IEND":
            break
    return out


def stamp(path: Path, text: str, key: str = KEY) -> None:
    """Write `key: text` into the PNG as a tEXt chunk (replacing one of that key), before its IEND."""
    data = path.read_bytes()
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError(f"{path} is not a PNG")
    chunks, at = [], 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        chunk = data[at:at + 12 + length]
        at += 12 + length
        if kind == b"tEXt" and chunk[8:8 + length].partition(b"\0")[0] == key.encode("latin-1"):
            continue
        if kind == b"IEND":
            body = key.encode("latin-1") + b"\0" + text.encode("latin-1")
            chunks.append(struct.pack(">I4s", len(body), b"tEXt") + body
                          + struct.pack(">I", zlib.crc32(b"tEXt" + body) & 0xFFFFFFFF))
        chunks.append(chunk)
    path.write_bytes(data[:8] + b"".join(chunks))
