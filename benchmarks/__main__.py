"""``python -m benchmarks MODE ...``; ``all --short`` is what ``make bench`` runs."""

from __future__ import annotations

import argparse
import sys

import uvloop

from . import bookie


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    modes = parser.add_subparsers(dest="mode", required=True, metavar="MODE")
    bookie.add_arguments(modes.add_parser("bookie", help="one bookie: latency and throughput"))
    everything = modes.add_parser("all", help="every benchmark, one table each")
    everything.add_argument("--short", action="store_true", help="a few seconds per phase")
    everything.add_argument("--dir", metavar="DIR")
    return parser


async def run_all(args: argparse.Namespace) -> None:
    duration = 5.0 if args.short else 30.0
    bookie_args = build_parser().parse_args(["bookie", "--duration", str(duration)])
    bookie_args.dir = args.dir
    await bookie.run_bookie_bench(bookie_args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode == "bookie":
        uvloop.run(bookie.run_bookie_bench(args))
    else:
        uvloop.run(run_all(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
