"""`deepres report plots|docs`: what the docs draw and list, from its one source.

- `plots`: the PNG plots under docs/img/ from reports/ (devtools/plots.py; needs the `train` extra's
  matplotlib); a plot whose input the reports lack is skipped with the reason.
- `docs`: docs/values.md's table from helm/deepres/values.schema.json and docs/cli.md from the argument
  parsers (devtools/docsgen.py); `--check` writes nothing and fails (exit 1) when a page is stale.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", metavar="WHAT", required=True)
    plots = sub.add_parser("plots", help="draw the docs' plots (docs/img/*.png) from reports/")
    plots.add_argument("--json", action="store_true", help="print what was drawn as JSON")
    docs = sub.add_parser("docs", help="regenerate docs/values.md's table and docs/cli.md")
    docs.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")


def run(args: argparse.Namespace) -> int:
    if args.what == "plots":
        from devtools.plots import draw_all

        drawn = draw_all()
        if args.json:
            print(json.dumps(drawn, indent=2))
        else:
            for name, what in drawn.items():
                print(f"docs/img/{name}: {what}")
        return 0 if not any(v.startswith("skipped") for v in drawn.values()) else 1
    from devtools.docsgen import write_all

    stale = write_all(check=args.check)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path}", file=sys.stderr)
    return 1 if (args.check and stale) else 0
