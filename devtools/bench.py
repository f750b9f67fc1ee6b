"""`deepres bench TARGET`: one command for every benchmark; each target's module does the work.

Every target prints its figures and writes them to `reports/bench-<target>.json`.
"""

from __future__ import annotations

import argparse
import importlib

from extender.cli import UsageError

# target -> module exposing add_arguments(parser) and run(args) -> int
TARGETS: dict[str, str] = {
    "predictor": "predictor.bench",
    "extender": "devtools.bench_extender",
    "intake": "devtools.bench_intake",
    "agent": "devtools.bench_agent",
    "slowbody": "devtools.bench_slowbody",
    "idle": "devtools.bench_idle",
    "cluster": "devtools.bench_cluster",
    "transport": "devtools.bench_transport",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    for target, module_name in TARGETS.items():
        target_parser = sub.add_parser(target, help=f"benchmark the {target}")
        target_parser.set_defaults(_bench_module=module_name)
        target_parser.add_argument("--json", action="store_true", help="print the figures as JSON")
        target_parser.add_argument("--out", default=f"reports/bench-{target}.json", help="where to write them")
        # (a target may set another default --out, e.g. slowbody writes reports/adversarial-slowbody.json)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:  # a real import problem inside the target: show it
                raise
            target_parser.set_defaults(_bench_missing=f"the {target} benchmark is not installed ({err})")
            continue
        module.add_arguments(target_parser)


def run(args: argparse.Namespace) -> int:
    missing = getattr(args, "_bench_missing", None)
    if missing:
        raise UsageError(missing)
    code: int = importlib.import_module(args._bench_module).run(args)
    return code
