"""``python -m bookkeeper_aio.shell``: admin commands (``--help`` lists them).

Exit status: 0 on success, 1 when the command failed (the reason goes to stderr), 2 for usage
errors.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..errors import BookKeeperError, ConfigError
from ..kafka.errors import KafkaError
from . import autorecovery, cluster, logs, ops, spark
from .sanity import bookie_sanity


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bookkeeper_aio.shell", description=__doc__)
    parser.add_argument("--metadata", metavar="URI", help="etcd://HOST:PORT[,...]/ROOT")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "init-cluster", help="create the cluster's instance id (idempotent)"
    ).set_defaults(run=_metadata_command)
    meta = commands.add_parser("ledger-metadata", help="one ledger's metadata as JSON")
    meta.add_argument("ledger_id", type=int, metavar="LEDGER_ID")
    meta.set_defaults(run=_metadata_command)
    _delete_commands(commands)
    info = commands.add_parser("log-info", help="one log: offsets, segments, metadata (JSON)")
    info.add_argument("name", metavar="NAME")
    info.set_defaults(run=_metadata_command)
    fix = commands.add_parser(
        "cookie-fix",
        help="let a bookie whose disk was wiped or replaced start again (BP-46)",
        description="A bookie whose dir lost its COOKIE refuses to start (acknowledged entries "
        "may be gone) unless it runs with --cookie-auto-fix true. This approves one repair: on "
        "its next start the bookie fences and puts in limbo every open ledger it serves, "
        "restamps its cookies, serves, and copies the entries it should hold from its peers.",
    )
    fix.add_argument("--bookie", required=True, metavar="BOOKIE_ID", help="e.g. 127.0.0.1:3181")
    fix.set_defaults(run=_metadata_command)
    sanity = commands.add_parser(
        "bookie-sanity", help="write, read back and verify a few entries on one bookie"
    )
    sanity.add_argument("--bookie", required=True, metavar="HOST:PORT")
    sanity.add_argument("--entries", type=int, default=10)
    sanity.add_argument("--entry-size", type=int, default=1024, metavar="BYTES")
    sanity.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
    sanity.set_defaults(run=_run_sanity)
    _kafka_commands(commands)
    spark.add_commands(commands)
    ops.add_commands(commands)  # simpletest, read-ledger, bookie-info, list-* --json
    _autorecovery_commands(commands)
    _integrity_commands(commands)
    return parser


def _delete_commands(commands: Any) -> None:
    """delete-ledger, mark-archived, cluster-config, list-tombstones (docs/durability.md)."""
    delete = commands.add_parser(
        "delete-ledger", help="delete a ledger (tombstone; bookies free its space at their GC)"
    )
    delete.add_argument("ledger_id", type=int, metavar="LEDGER_ID")
    delete.set_defaults(run=_metadata_command)
    archive = commands.add_parser("mark-archived", help="set a closed ledger's archival bit")
    archive.add_argument("ledger_id", type=int, metavar="LEDGER_ID")
    archive.set_defaults(run=_metadata_command)
    config = commands.add_parser(
        "cluster-config", help="show the cluster's options, or set one: "
        "require-archival-before-delete true|false",
    )  # fmt: skip
    config.add_argument("option", nargs="?", metavar="OPTION")
    config.add_argument("value", nargs="?", metavar="true|false")
    config.set_defaults(run=_metadata_command)
    stones = commands.add_parser(
        "list-tombstones", help="deleted ledgers whose bookies have not all freed their copies"
    )
    stones.add_argument("--json", action="store_true", help="one JSON object per line")
    stones.set_defaults(run=_metadata_command)


def _integrity_commands(commands: Any) -> None:
    """scrub, recover-metadata (BP-31; docs/durability.md)."""
    scrub = commands.add_parser(
        "scrub", help="one scrub pass on a bookie now: re-read every entry, check its digests, "
        "repair bad copies from peers (progress bar; exit 1 if one could not be repaired)",
    )  # fmt: skip
    scrub.add_argument("--bookie", required=True, metavar="BOOKIE_ID")
    scrub.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="give up waiting after this long (exit 1; it goes on)")  # fmt: skip
    scrub.set_defaults(run=_integrity_command)
    recover = commands.add_parser(
        "recover-metadata", help="rebuild the ledgers' metadata from the bookies after the "
        "metadata store was lost (progress bars)",
    )  # fmt: skip
    recover.add_argument("--merge", action="store_true",
                         help="the store still has ledgers: add only those it lacks")  # fmt: skip
    recover.add_argument("--bookie", action="append", default=[], metavar="BOOKIE_ID",
                         help="also ask this bookie (repeatable; registered ones are)")  # fmt: skip
    recover.set_defaults(run=_integrity_command)


async def _integrity_command(args: argparse.Namespace) -> tuple[str, int]:
    if not args.metadata:
        raise ConfigError(f"{args.command} needs --metadata URI (before the command)")
    if args.command == "scrub":
        from .scrub import scrub

        return await scrub(args.metadata, args.bookie, args.timeout)
    from .recover import recover_metadata

    return await recover_metadata(args.metadata, args.merge, args.bookie)


def _autorecovery_commands(commands: Any) -> None:
    """ledger-check, audit, decommission, autorecovery-status (list-under-replicated: ops)."""
    check = commands.add_parser(
        "ledger-check", help="every fragment of a ledger: which bookie lacks which entries "
        "(exit 1 if any copy is missing)",
    )  # fmt: skip
    check.add_argument("ledger_id", type=int, metavar="ID")
    check.set_defaults(run=_autorecovery_command)
    commands.add_parser(
        "audit", help="check every ledger now and mark what is short (progress bar)"
    ).set_defaults(run=_autorecovery_command)
    leave = commands.add_parser(
        "decommission", help="move every copy off a live or dead bookie, then remove its "
        "cookie (progress bar; exit 0 only when done)",
    )  # fmt: skip
    leave.add_argument("--bookie", required=True, metavar="BOOKIE_ID")
    leave.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                       help="give up waiting after this long (exit 1; it goes on)")  # fmt: skip
    leave.set_defaults(run=_autorecovery_command)
    commands.add_parser(
        "autorecovery-status", help="the auditor, SLA figures, processes, lost bookies (JSON)"
    ).set_defaults(run=_autorecovery_command)


async def _autorecovery_command(args: argparse.Namespace) -> tuple[str, int]:
    if not args.metadata:
        raise ConfigError(f"{args.command} needs --metadata URI (before the command)")
    uri = args.metadata
    if args.command == "ledger-check":
        return await autorecovery.ledger_check(uri, args.ledger_id)
    if args.command == "audit":
        return await autorecovery.audit(uri)
    if args.command == "decommission":
        return await autorecovery.decommission(uri, args.bookie, args.timeout)
    return await autorecovery.autorecovery_status(uri)


def _kafka_commands(commands: Any) -> None:
    """The Kafka gateway's topics and groups (docs/kafka.md)."""
    create = commands.add_parser("create-topic", help="a Kafka topic: one log per partition")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--partitions", type=int, required=True, metavar="N")
    create.add_argument("--ensemble", type=int, default=3, metavar="E")
    create.add_argument("--write-quorum", type=int, default=3, metavar="W")
    create.add_argument("--ack-quorum", type=int, default=2, metavar="A")
    create.set_defaults(run=_metadata_command)
    delete = commands.add_parser("delete-topic", help="a Kafka topic, its logs and offsets")
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(run=_metadata_command)


def _run_sanity(args: argparse.Namespace) -> Awaitable[str]:
    return bookie_sanity(args.bookie, args.entries, args.entry_size, args.timeout)


async def _metadata_command(args: argparse.Namespace) -> str:
    if not args.metadata:
        raise ConfigError(f"{args.command} needs --metadata URI (before the command)")
    if args.command == "init-cluster":
        return await cluster.init_cluster(args.metadata)
    if args.command == "log-info":
        return await logs.log_info(args.metadata, args.name)
    if args.command == "cookie-fix":
        return await cluster.cookie_fix(args.metadata, args.bookie)
    if args.command == "delete-ledger":
        return await cluster.delete_ledger(args.metadata, args.ledger_id)
    if args.command == "mark-archived":
        return await cluster.mark_archived(args.metadata, args.ledger_id)
    if args.command == "cluster-config":
        if (args.option is None) != (args.value is None):
            raise ConfigError("cluster-config takes no argument (show) or OPTION true|false")
        return await cluster.cluster_config(args.metadata, args.option, args.value)
    if args.command == "list-tombstones":
        return await cluster.list_tombstones(args.metadata, args.json)
    if args.command in ("create-topic", "delete-topic"):
        return await _kafka_command(args)
    return await cluster.ledger_metadata(args.metadata, args.ledger_id)


async def _kafka_command(args: argparse.Namespace) -> str:
    from ..kafka import admin

    if args.command == "create-topic":
        return await admin.create_topic(
            args.metadata, args.name, args.partitions, args.ensemble, args.write_quorum,
            args.ack_quorum,
        )  # fmt: skip
    return await admin.delete_topic(args.metadata, args.name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, Any]] = args.run
    try:
        result = asyncio.run(run(args))
    except (BookKeeperError, KafkaError, OSError) as exc:
        print(f"{args.command} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    status = 0
    if isinstance(result, tuple):  # (text, exit status)
        result, status = result
    if result:
        print(result)
    return status


if __name__ == "__main__":
    sys.exit(main())
