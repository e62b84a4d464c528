"""``python -m bookkeeper_aio.kafka``: run a Kafka gateway until SIGTERM/SIGINT.

Kafka clients (aiokafka, librdkafka/kcat, ...) connect to ``--listen`` and produce to and
consume from topics whose partitions are logs of the cluster at ``--metadata``. Several
gateways may serve one cluster. Flags override the config file (``--config FILE``, TOML with
:class:`~bookkeeper_aio.config.KafkaConfig` keys; ``--set KEY=VALUE`` for any other key).
Exit status: 0 after a clean shutdown, 1 when it could not start or failed, 2 for a bad
configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

import uvloop

from ..config import KafkaConfig, set_options
from ..errors import BookKeeperError, ConfigError

log = logging.getLogger("bookkeeper_aio.kafka")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bookkeeper_aio.kafka", description=__doc__)
    p.add_argument("--metadata", metavar="URI", help="etcd://HOST:PORT[,...]/ROOT")
    p.add_argument("--listen", metavar="HOST:PORT", help="where Kafka clients connect")
    p.add_argument("--advertised-address", metavar="HOST:PORT",
                   help="the address clients are told (default: --listen)")  # fmt: skip
    p.add_argument("--config", metavar="FILE", help="TOML file with KafkaConfig keys")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="any config key (TOML value syntax), repeatable")  # fmt: skip
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> KafkaConfig:
    """The config file (if any) overridden by flags.

    Raises:
        ConfigError: unknown keys, wrong types, invalid values, no metadata URI.
    """
    overrides: dict[str, Any] = {}
    for flag, key in (
        ("metadata", "kafka_metadata_uri"),
        ("listen", "kafka_listen"),
        ("advertised_address", "kafka_advertised_address"),
    ):
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    overrides.update(set_options(args.set))
    if args.config:
        config = KafkaConfig.from_file(args.config, overrides)
    else:
        config = KafkaConfig.from_mapping(overrides, source="command line")
    if not config.kafka_metadata_uri:
        raise ConfigError("--metadata URI (or kafka_metadata_uri) is required")
    return config


async def run(config: KafkaConfig) -> int:
    """Serve until a signal; return the exit status."""
    from ..client.bookkeeper import BookKeeper
    from .gateway import Gateway
    from .log_storage import LogPartitionStorage

    assert config.kafka_metadata_uri is not None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with BookKeeper.connect(config.kafka_metadata_uri) as bk:
        storage = LogPartitionStorage(bk, config)
        async with Gateway.serve(config, bk.ctx.metadata, storage) as gateway:
            print(
                f"kafka gateway node {gateway.membership.node_id} listening on "
                f"{config.kafka_listen} (advertised {config.advertised_address})",
                flush=True,
            )
            await stop.wait()
            log.info("signal: shutting down")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"kafka gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        return uvloop.run(run(config))
    except (BookKeeperError, OSError) as exc:
        print(f"kafka gateway: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
