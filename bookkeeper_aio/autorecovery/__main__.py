"""``python -m bookkeeper_aio.autorecovery --metadata URI [--config FILE] [--set KEY=VALUE]``

An autorecovery process: a candidate for the auditor seat and replication workers
(docs/durability.md). Any number may run. SIGTERM/SIGINT stop it cleanly (the seat and its
locks are freed at once). Exit status: 0 after a clean stop, 1 when the metadata store cannot
be reached at start, 2 for a bad configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import sys
import time

import uvloop

from ..client.bookie_pool import BookiePool
from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..config import AutorecoveryConfig, ClientConfig, MetadataConfig, set_options
from ..errors import ConfigError, MetadataUnavailableError
from ..metadata.store import open_metadata_store
from ..net import client_network
from .service import Autorecovery

log = logging.getLogger("bookkeeper_aio.autorecovery")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bookkeeper_aio.autorecovery", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--metadata", metavar="URI", required=True, help="etcd://HOST:PORT[,...]/ROOT")
    p.add_argument("--config", metavar="FILE", help="TOML file with AutorecoveryConfig keys")
    p.add_argument("--http-listen", metavar="HOST:PORT",
                   help="serve /metrics and the HTTP admin API here (only there)")  # fmt: skip
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="any config key (TOML value syntax), repeatable")  # fmt: skip
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> AutorecoveryConfig:
    """The config file (if any) overridden by ``--set`` and ``--metadata``.

    Raises:
        ConfigError: unknown keys, wrong types, invalid values.
    """
    overrides = {**set_options(args.set), "metadata_uri": args.metadata}
    if args.http_listen is not None:
        overrides["http_listen"] = args.http_listen
    if args.config:
        return AutorecoveryConfig.from_file(args.config, overrides)
    return AutorecoveryConfig.from_mapping(overrides, source="command line")


def wall_ms() -> int:
    """Wall-clock milliseconds: stamps on marks for people, never used for decisions."""
    return int(time.time() * 1000)


async def run(config: AutorecoveryConfig) -> int:
    """Serve until SIGTERM/SIGINT; return the exit status."""
    process_id = config.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    rng = random.Random()
    mcfg = MetadataConfig(lease_ttl_s=config.lease_ttl_s)
    async with open_metadata_store(config.metadata_uri, mcfg, rng=rng) as store:
        client_config = ClientConfig(tls_ca_file=config.tls_ca_file,
                                     tls_cert_file=config.tls_cert_file,
                                     tls_key_file=config.tls_key_file)  # fmt: skip
        async with BookiePool(client_network(client_config), client_config, rng) as pool:
            ctx = ClientContext(client_config, store, pool, rng, PlacementPolicy())
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            async with contextlib.AsyncExitStack() as stack:
                service = await stack.enter_async_context(
                    Autorecovery.serve(ctx, config, process_id, wall_ms)
                )
                if config.http_listen is not None:
                    from ..admin_http.autorecovery import serve_autorecovery_http

                    await stack.enter_async_context(serve_autorecovery_http(
                        service, config.http_listen, lambda: not stop.is_set()
                    ))  # fmt: skip
                log.info("autorecovery %s running against %s", process_id, config.metadata_uri)
                await stop.wait()
    log.info("autorecovery %s stopped", process_id)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"autorecovery: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        return uvloop.run(run(config))
    except ConfigError as exc:  # e.g. a TLS file that cannot be loaded
        print(f"autorecovery: configuration error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. the HTTP address is taken
        print(f"autorecovery: cannot start: {exc}", file=sys.stderr)
        return 1
    except MetadataUnavailableError as exc:
        print(f"autorecovery: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
