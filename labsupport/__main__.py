"""Command line: `python -m labsupport live|nightly [chapters]`, `python -m labsupport runs`."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labsupport", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    live = sub.add_parser("live", help="run chapter notebooks live on this GPU and publish new runs")
    live.add_argument("chapters", nargs="*", help="chapter slugs (default: all)")
    live.add_argument("--param", action="append", default=[], metavar="NAME=JSON",
                      help="notebook parameter, e.g. --param repeats=50 (value parsed as JSON)")
    live.add_argument("--no-publish", action="store_true", help="record the runs but leave the book's runs as they are")
    live.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)  # tests: tiny model on a CPU
    night = sub.add_parser("nightly", help="run every chapter live, validate, compare, promote, build the book")
    night.add_argument("chapters", nargs="*", help="chapter slugs (default: all)")
    night.add_argument("--param", action="append", default=[], metavar="NAME=JSON")
    night.add_argument("--no-book", action="store_true", help="promote without building the book (no jupyter-book here)")
    night.add_argument("--timing-threshold", type=float, default=0.25,
                       help="relative change of a headline number still reported as noise (default 0.25)")
    night.add_argument("--min-kernels", type=int, default=1, help="fewest kernels a kernel table may hold")
    night.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)
    sub.add_parser("runs", help="list chapters, their recorded runs and the published one")
    args = ap.parse_args(argv)

    if args.cmd in ("live", "nightly"):
        params = {}
        for p in args.param:
            name, _, value = p.partition("=")
            try:
                params[name] = json.loads(value)
            except json.JSONDecodeError:
                params[name] = value
        if args.allow_cpu:
            params["allow_cpu"] = True
    if args.cmd == "live":
        from . import live

        return live.main(args.chapters, params, allow_cpu=args.allow_cpu, publish=not args.no_publish)
    if args.cmd == "nightly":
        from . import nightly

        return nightly.main(args.chapters, params, allow_cpu=args.allow_cpu, build_book=not args.no_book,
                            timing_threshold=args.timing_threshold, min_kernels=args.min_kernels)
    if args.cmd == "runs":
        from . import chapters, runs

        manifest = runs.published()
        for ch in chapters.CHAPTERS:
            pub = manifest.get(ch.slug)
            print(f"{ch.slug}:")
            for r in runs.list_runs(ch.slug):
                print(f"  {r}{'  (published)' if r == pub else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
