"""The `deepres` command: one entry point, one subcommand per job.

Each subcommand lives in the module that owns the work and exposes two functions:
`add_arguments(parser)` and `run(args) -> int` (the exit code). Modules are imported only when
their subcommand runs, so `deepres predict` never pays for Flask and `deepres serve` never for
scikit-learn. Exit codes: 0 success, 1 failure, 2 bad input (one line on stderr saying why).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

# the one-line user error: its home is the predictor (which imports nothing from extender), re-exported here
from predictor.errors import UsageError as UsageError

# subcommand -> (module, one-line help). Bench targets dispatch inside `devtools.bench`.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("extender.server.serve", "run the scheduler extender (granian or gunicorn) with the embedded predictor"),
    "pod-certs": ("extender.server.podcerts", "make the per-pod certificates of the scheduler mTLS"),
    "agent": ("extender.agent.main", "run the node agent: sample GPUs, report to the extender, /metrics"),
    "predict": ("predictor.predict_cli", "predict the GPU demand of an annotated pod or JobSpec"),
    "dataset": ("predictor.dataset.generate", "generate the traced, calibrated training-job dataset"),
    "profile": ("predictor.profile", "trace your own training step on the CPU; print the pod annotations to paste"),
    "train": ("predictor.train", "train the Transformer-BiGRU predictor and write the shipped artifact"),
    "evaluate": ("predictor.evaluate", "compare the predictor with the baselines; write reports/predictor.*"),
    "simulate": ("extender.simulate.main", "replay public GPU cluster traces through the policies"),
    "bench": ("devtools.bench", "run a benchmark (predictor, extender, agent) and write reports/bench-*.json"),
    "report": ("devtools.report", "draw the docs' plots from reports/ and regenerate their generated pages"),
}

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the `selected` subcommand's module is imported to add its arguments."""
    from extender import __version__

    parser = argparse.ArgumentParser(prog="deepres", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"deepres {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module_name)
        if name == selected:
            _load(module_name).add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    selected = next((a for a in args_list if a in COMMANDS), None)
    try:
        parser = build_parser(selected)
    except UsageError as err:  # the subcommand's module needs what this install lacks
        print(f"deepres {selected}: {err}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(args_list)
    _configure_logging(args.verbose, args.quiet)
    if getattr(args, "json", False):
        from predictor.progress import silence

        silence()  # machine output only: no progress bars (they are drawn only on a terminal anyway)
    try:
        code: int = _load(args._module).run(args)
    except UsageError as err:
        print(f"deepres {args.command}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"deepres {args.command}: interrupted", file=sys.stderr)
        return 130
    return code


#: Top-level modules only the `train` extra installs (pyproject.toml): the serving install (and image)
#: has none of them, so a subcommand that needs one names the extra instead of a traceback.
TRAIN_EXTRA_MODULES = frozenset({"torch", "pandas", "timm", "transformers", "torchvision", "sklearn", "xgboost",
                                 "lightgbm", "catboost", "matplotlib"})


def _load(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if missing not in TRAIN_EXTRA_MODULES:
            raise
        raise UsageError(f"needs the training extra, not in this install (no module {missing!r}): "
                         "pip install 'deepres[train]'") from None


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.DEBUG if verbose > 1 else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":
    # `python -m extender.cli`: run the imported module's main so that subcommands raising
    # extender.cli.UsageError are caught by the same class.
    from extender.cli import main as _main

    sys.exit(_main())
