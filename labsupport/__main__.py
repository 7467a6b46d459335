"""Command line: `python -m labsupport live|nightly [chapters]`, `live --smoke`, `runs`,
`book` (what `make book` runs), `recover`, `derive`, `pack <chapter> [run id]`, `gallery add|list`,
`replay <chapter> [--runs PATH_OR_ZIP] [--out DIR]` (no GPU, torch or transformers needed) and
`profile MODEL_DIR [--allow-cpu] [--out DIR] [--dtype ...]` (a model folder through the kernel census) and
`fixture <chapter> [run id]` (a run frozen as the chapter's unit-test fixture under tests/fixtures/runs/).

Errors in what it is given (a parameter, a damaged published.json or run, a folder that is
not a runs folder, a lock held by another command, a folder it cannot read or write) are one
line, `error: ...`, and exit status 1; Ctrl-C is one line too (exit status 130).
"""

from __future__ import annotations

import argparse
import sys


def _chapters_command(sub, name: str, what: str) -> argparse.ArgumentParser:
    """A command that runs chapter notebooks live (live, nightly): the chapters' slugs, their
    parameters (the notebook's overrides), and the tests' --allow-cpu (no GPU needed: the tiny
    model on a CPU, with --param device="cpu" and the fields' other CPU values)."""
    command = sub.add_parser(name, help=what)
    command.add_argument("chapters", nargs="*", help="chapter slugs (default: all)")
    command.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a parameter of the chapter (a field of its Params), e.g. --param repeats=50 (value parsed as JSON)",
    )
    command.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)
    return command


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m labsupport", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    live = _chapters_command(sub, "live", "run chapter notebooks live on this GPU and publish new runs")
    live.add_argument("--no-publish", action="store_true", help="record the runs but leave the book's runs as they are")
    live.add_argument(
        "--smoke",
        action="store_true",
        help="smallest parameters, scratch runs folder (build/smoke/), check each run, publish nothing",
    )
    night = _chapters_command(sub, "nightly", "run every chapter live, validate, compare, build the book, publish")
    night.add_argument(
        "--no-book", action="store_true", help="publish without building the book (no jupyter-book here)"
    )
    # Both checked by nightly.main (params.timing_threshold, params.min_kernels): one line each
    night.add_argument(
        "--timing-threshold",
        default="0.25",
        help="relative change of a headline number still reported as noise, above 0 and below 10 (default 0.25)",
    )
    night.add_argument("--min-kernels", default="1", help="fewest kernels a kernel table may hold, 1 to 100000")
    night.add_argument(
        "--accept-slow-host",
        action="store_true",
        help="publish a run taken on a slow host even where it replaces one taken on a fast host",
    )
    sub.add_parser("runs", help="list chapters, their recorded runs and the published one")
    sub.add_parser("book", help="check the runs, build the book; on failure the reason is the last line")
    pk = sub.add_parser("pack", help="check a run and write it as one archive to share (build/packs/)")
    pk.add_argument("chapter")
    pk.add_argument("run_id", nargs="?", help="run id (default: the published run)")
    pk.add_argument("--label", default="a reader's run", help="what the run is, as the gallery page shows it")
    gal = sub.add_parser("gallery", help="add a packed run to runs/gallery/ (checked as untrusted), or list them")
    gal_sub = gal.add_subparsers(dest="gallery_cmd", required=True)
    gal_sub.add_parser("add", help="check an archive and file it under runs/gallery/").add_argument("archive")
    gal_sub.add_parser("list", help="the runs of the gallery")
    sub.add_parser("recover", help="finish or set aside what a killed nightly or live command left behind")
    rp = sub.add_parser("replay", help="print a chapter's headline numbers and write its figures, from its runs")
    rp.add_argument("chapter")
    rp.add_argument("--runs", help="a runs folder, or the zip the book serves for the chapter (default: runs/)")
    rp.add_argument("--out", default="figures", help="folder the figures are written to (default: figures)")
    prof = sub.add_parser("profile", help="your own model (a local folder with config.json) through the kernel census")
    prof.add_argument(
        "model_dir", help="a folder with config.json, and safetensors weights if any (else random weights)"
    )
    prof.add_argument("--allow-cpu", action="store_true", help="profile on the CPU where no GPU is visible")
    prof.add_argument("--out", help="the runs folder the run is written into (default: build/profile/)")
    prof.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    derive = sub.add_parser("derive", help="bring runs of an older format (meta.json: format) to the current one")
    derive.add_argument("chapters", nargs="*", help="chapter slugs (default: all)")
    fix = sub.add_parser("fixture", help="copy a chapter's run to tests/fixtures/runs/, the run its unit tests read")
    fix.add_argument("chapter")
    fix.add_argument("run_id", nargs="?", help="run id (default: the published run)")
    return ap


def _printed(lines, refusal: type[Exception], command: str) -> int:
    """Print the lines `lines()` gives (exit 0), or the one line of its `refusal` (exit 1)."""
    try:
        out = lines()
    except refusal as e:
        print(f"{command} refused: {e}; nothing was written", file=sys.stderr)
        return 1
    print("\n".join(out))
    return 0


def _run(args) -> int:
    from labsupport import chapters, runs
    from labsupport.ops import params

    if args.cmd in ("live", "nightly"):
        given = params.parse_cli(args.param)
    if args.cmd == "live":
        from labsupport.ops import live

        if args.smoke:
            return live.smoke(args.chapters, given, allow_cpu=args.allow_cpu)
        return live.main(args.chapters, given, allow_cpu=args.allow_cpu, publish=not args.no_publish)
    if args.cmd == "nightly":
        from labsupport.ops import nightly

        return nightly.main(
            args.chapters,
            given,
            allow_cpu=args.allow_cpu,
            build_book=not args.no_book,
            timing_threshold=args.timing_threshold,
            min_kernels=args.min_kernels,
            accept_slow_host=args.accept_slow_host,
        )
    if args.cmd == "runs":
        manifest = runs.published()
        for ch in chapters.CHAPTERS:
            pub = manifest.get(ch.slug)
            print(f"{ch.slug}:")
            for r in runs.list_runs(ch.slug):
                print(f"  {r}{'  (published)' if r == pub else ''}")
        return 0
    if args.cmd == "book":
        from labsupport.ops import bookbuild

        try:
            html = bookbuild.build()
        except bookbuild.BuildError as e:
            print(f"make book failed: {e}", file=sys.stderr)
            return 1
        print(f"The book is at {html / 'index.html'}")
        return 0
    if args.cmd == "derive":
        from labsupport.ops import derive

        return derive.main(args.chapters)
    if args.cmd == "fixture":
        from labsupport.ops import fixture

        print(f"the fixture run of {args.chapter} is {fixture.freeze(args.chapter, args.run_id)}")
        return 0
    if args.cmd == "pack":
        from labsupport.ops import pack

        try:
            _, summary = pack.pack(args.chapter, args.run_id, label=args.label)
        except pack.PackError as e:
            print(f"pack failed: {e}", file=sys.stderr)
            return 1
        print(summary)
        return 0
    if args.cmd == "gallery":
        from labsupport.ops import gallery

        listing = (lambda: [gallery.add(args.archive)]) if args.gallery_cmd == "add" else gallery.listing
        return _printed(listing, gallery.GalleryError, f"gallery {args.gallery_cmd}")
    if args.cmd == "replay":
        from pathlib import Path

        from labsupport.ops import replay

        return _printed(lambda: replay.replay(args.chapter, args.runs, Path(args.out)), replay.ReplayError, "replay")
    if args.cmd == "profile":
        from labsupport.ops import profile

        return profile.main(args.model_dir, allow_cpu=args.allow_cpu, out=args.out, dtype=args.dtype)
    if args.cmd == "recover":
        from labsupport.ops import leftovers, live, nightly
        from labsupport.runs import lock

        root = runs.runs_root()
        try:
            leftovers.check_runs_folder(root)  # before the lock: a folder that is not one gets no .lock either
            with lock.held(root, "recover") as lk:
                done = leftovers.recover(root, lk.stale, nightly.BOOK_DIR, nightly.NIGHTLY_DIR, live.LOG_DIR)
        except (lock.LockError, runs.RunError, OSError) as e:
            why = str(e) if isinstance(e, (lock.LockError, runs.RunError)) else f"{type(e).__name__}: {e}"
            print(f"recover failed: {why}", file=sys.stderr)
            return 1
        print("\n".join(done) if done else "nothing to recover")
        return 0
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from labsupport import runs
    from labsupport.ops import params
    from labsupport.runs import lock, promotion

    try:
        return _run(args)
    except params.ParamError as e:
        print(f"error: {e}; nothing was run, the published run is unchanged", file=sys.stderr)
        return 1
    except (runs.RunError, lock.LockError, promotion.PromotionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a folder missing, read-only or full that the command did not check itself
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {args.cmd}: {e.strerror or e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C in a command that does not handle it itself (live and nightly do)
        print(f"error: {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
