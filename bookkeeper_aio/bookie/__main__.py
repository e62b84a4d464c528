"""``python -m bookkeeper_aio.bookie``: run one bookie until SIGTERM/SIGINT.

Flags override the config file (``--config FILE``, TOML with :class:`BookieConfig` keys).
Exit status: 0 after a clean shutdown, 1 when the bookie failed (journal or checkpoint error),
2 for a bad configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

import uvloop

from ..config import BookieConfig, set_options
from ..errors import ConfigError, MetadataUnavailableError
from .cookie import CookieError
from .server import Bookie

log = logging.getLogger("bookkeeper_aio.bookie")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bookkeeper_aio.bookie", description=__doc__)
    p.add_argument("--config", metavar="FILE", help="TOML file with BookieConfig keys")
    p.add_argument("--listen", metavar="HOST:PORT", help="address to listen on")
    p.add_argument("--advertised-address", metavar="HOST:PORT", help="bookie id, if not --listen")
    p.add_argument("--journal-dir", metavar="DIR")
    p.add_argument("--ledger-dir", metavar="DIR", action="append", help="repeatable")
    p.add_argument("--engine", choices=("rocksdb", "files", "memory"))
    p.add_argument("--metadata", metavar="URI", dest="metadata_uri",
                   help="etcd://HOST:PORT[,...]/ROOT: register, check cookies")  # fmt: skip
    p.add_argument("--rack", metavar="LOCATION", help="network location, e.g. /zone-a/rack-1")
    p.add_argument("--journal-write-data", choices=("true", "false"),
                   help="false: adds skip the journal (BP-46; needs --metadata)")  # fmt: skip
    p.add_argument("--cookie-auto-fix", choices=("true", "false"),
                   help="true: repair a wiped dir (fence, limbo, restamp)")  # fmt: skip
    p.add_argument("--autorecovery", choices=("true", "false"),
                   help="true: also run autorecovery (auditor candidate and replication "
                   "workers; needs --metadata; docs/durability.md)")  # fmt: skip
    p.add_argument("--http-listen", metavar="HOST:PORT",
                   help="serve /metrics and the HTTP admin API here (only there)")  # fmt: skip
    p.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca", metavar="FILE",
                   help="require client certificates signed by this CA (mutual TLS)")  # fmt: skip
    p.add_argument("--tls-ca", metavar="FILE",
                   help="CA of the TLS bookies it connects to (repair, recovery)")  # fmt: skip
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="any other config key (TOML value syntax), repeatable")  # fmt: skip
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> BookieConfig:
    """The config file (if any) overridden by flags.

    Raises:
        ConfigError: unknown keys, wrong types, invalid values.
    """
    overrides: dict[str, Any] = {}
    for name in ("listen", "advertised_address", "journal_dir", "engine", "metadata_uri", "rack",
                 "http_listen"):  # fmt: skip
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    for flag in ("tls_cert", "tls_key", "tls_client_ca", "tls_ca"):
        if getattr(args, flag) is not None:
            overrides[flag + "_file"] = getattr(args, flag)
    if args.ledger_dir:
        overrides["ledger_dirs"] = tuple(args.ledger_dir)
    for name in ("journal_write_data", "cookie_auto_fix", "autorecovery"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value == "true"
    overrides.update(set_options(args.set))
    if args.config:
        config = BookieConfig.from_file(args.config, overrides)
    else:
        config = BookieConfig.from_mapping(overrides, source="command line")
    config.validate()
    return config


async def run(config: BookieConfig) -> int:
    """Serve until a signal or a fatal failure; return the exit status."""
    bookie = Bookie(config)
    await bookie.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, bookie, sig)
    await bookie.stopped.wait()  # set by stop(), which a signal or a failure starts
    await bookie.closed.wait()
    return 1 if bookie.failure is not None else 0


def _on_signal(bookie: Bookie, sig: int) -> None:
    log.info("signal %s: shutting down", signal.Signals(sig).name)
    bookie.request_stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"bookie: configuration error: {exc}", file=sys.stderr)
        return 2
    # Process-wide, so here and not in Bookie (tests and the simulator run several in one
    # process): the journal thread gets the GIL back this soon after its syscalls.
    sys.setswitchinterval(config.gil_switch_interval_s)
    try:
        return uvloop.run(run(config))
    except ConfigError as exc:  # e.g. a TLS file that cannot be loaded
        print(f"bookie: configuration error: {exc}", file=sys.stderr)
        return 2
    except (CookieError, MetadataUnavailableError) as exc:
        print(f"bookie: refusing to start: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"bookie: cannot start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
