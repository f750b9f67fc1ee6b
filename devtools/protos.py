"""Regenerate the Python modules of the vendored kubelet device plugin API (`python -m devtools.protos`).

Why: the agent's device plugin speaks the kubelet's gRPC protocol from its real .proto
(extender/agent/deviceplugin/api.proto); the generated modules are committed so the serving install
needs only the grpcio and protobuf runtimes, not grpcio-tools (a dev dependency). Run from the
repository root, the include path is the root, so the generated gRPC module imports the messages as
`extender.agent.deviceplugin.api_pb2` (a package import, not a top-level `api_pb2`).
`--check` regenerates into a temporary folder and exits 1 if the committed modules differ.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTOS = (Path("extender/agent/deviceplugin/api.proto"), Path("extender/agent/deviceplugin/podresources.proto"))
PROTO = PROTOS[0]
OUTPUTS = tuple(f"{p.stem}{suffix}" for p in PROTOS for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))


def generate(out: Path) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    for proto in PROTOS:
        args = ["grpc_tools.protoc", f"-I{REPO}", f"--python_out={out}", f"--pyi_out={out}",
                f"--grpc_python_out={out}", str(REPO / proto)]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")


#: the lines where a generator writes its own version (grpcio-tools, protobuf): a newer generator of the
#: same proto writes the same code, and the committed stamp is the runtime minimum the deps guarantee
_STAMP = re.compile(r"^(GRPC_GENERATED_VERSION = .*|# Protobuf Python Version: .*|\s*\d+,\s*$)$")


def _code(path: Path) -> list[str]:
    """The module's lines without the generators' version stamps."""
    lines = path.read_text().splitlines()
    return [line for line in lines if not _STAMP.match(line)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.protos", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed modules are out of date")
    args = parser.parse_args(argv)
    if not args.check:
        generate(REPO)
        print(f"generated {', '.join(OUTPUTS)} in {PROTO.parent}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [name for name in OUTPUTS
                 if _code(Path(tmp) / PROTO.parent / name) != _code(REPO / PROTO.parent / name)]
    if stale:
        print(f"out of date: {', '.join(stale)}: run `python -m devtools.protos`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
