"""``python -m bookkeeper_aio.sim``: replay one seed or sweep a range (see docs/simulation.md).

Exit status: 0 when no invariant was violated, 1 when one was, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .runner import KNOWN_BUGS, SeedTimeoutError, quiet_logging, sweep


def _seed_range(text: str) -> range:
    first, _, last = text.partition("-")
    try:
        a, b = int(first), int(last or first)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected A-B, got {text!r}") from None
    if b < a:
        raise argparse.ArgumentTypeError(f"empty range {text!r}")
    return range(a, b + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bookkeeper_aio.sim",
        description="Deterministic simulation of a whole cluster, checked against the TLA+ "
        "invariants. The same seed replays the same run exactly.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="replay one seed (prints its trace)")
    which.add_argument("--seeds", type=_seed_range, metavar="A-B", help="sweep seeds A..B")
    parser.add_argument(
        "--bug",
        action="append",
        default=[],
        choices=KNOWN_BUGS,
        help="re-introduce a known protocol defect (repeatable)",
    )
    parser.add_argument(
        "--keep-going", action="store_true", help="in a sweep, go on after the first violating seed"
    )
    parser.add_argument("--verbose", action="store_true", help="print each seed's trace")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes running seeds of a sweep in parallel (default: SIM_WORKERS, else one "
        "per CPU); results are the same as with one",
    )
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":
        # Determinism: set iteration order must not depend on the interpreter's hash seed.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "bookkeeper_aio.sim", *sys.argv[1:]])
    quiet_logging()
    seeds = range(args.seed, args.seed + 1) if args.seed is not None else args.seeds
    failed, started, virtual = [], time.perf_counter(), 0.0
    single = args.seed is not None
    stop = not args.keep_going and not single
    results = sweep(seeds, args.bug, stop_at_first=stop, workers=1 if single else args.workers)
    try:
        for result in results:
            seed = result.seed
            virtual += result.virtual_s
            if args.seed is not None or args.verbose or not result.ok:
                print(
                    result.report() if not result.ok or args.verbose or single else "",
                    flush=True,
                )
            if not result.ok:
                failed.append(seed)
    except SeedTimeoutError as exc:  # a seed that never ends fails like a violation
        print(f"error: {exc}", flush=True)
        return 1
    wall = time.perf_counter() - started
    ran = seeds.index(failed[0]) + 1 if failed and not args.keep_going else len(seeds)
    print(
        f"{ran} seed(s) in {wall:.1f} s ({ran / wall:.1f} seeds/s, {virtual:.0f} virtual s); "
        f"violations: {failed or 'none'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
