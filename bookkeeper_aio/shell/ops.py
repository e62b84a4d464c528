"""Operators' shell commands (BookKeeper's shell, our spelling): ``simpletest``,
``read-ledger``, ``bookie-info``, and the listing commands with ``--json`` (one JSON object per
line, for scripts): ``list-bookies [--read-only]``, ``list-ledgers``, ``list-logs``,
``list-topics``, ``list-groups``, ``list-under-replicated``.

Exit status, as every shell command: 0 on success, 1 when the command failed (the reason on
stderr; ``simpletest``: any entry not written, read back or equal, or the ledger not
deleted), 2 for usage errors. Long work shows a tqdm progress bar on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from tqdm import tqdm

from ..client.bookie_client import BookieClient
from ..client.bookkeeper import BookKeeper
from ..config import ClientConfig
from ..errors import BookKeeperError, ConfigError
from ..metadata.store import open_metadata_store
from ..net import client_network
from . import autorecovery, cluster, logs

SIMPLETEST_PASSWORD = b"simpletest"
READ_CHUNK_ENTRIES = 1_000  # entries one read asks for (the reader's limits apply within)
JSON_HELP = "one JSON object per line (for scripts)"


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_commands(commands: Any) -> None:
    """Add these commands to the shell's subparsers."""
    _listing_commands(commands)
    test = commands.add_parser(
        "simpletest",
        help="create a ledger, write entries, read them back, verify, delete it (exit 1 on "
        "any failure)",
    )
    for flag, default, metavar, text in (
        ("--ensemble", 3, "E", "bookies the ledger is striped over"),
        ("--write-quorum", 2, "W", "copies of each entry"),
        ("--ack-quorum", 2, "A", "acknowledgements an add waits for"),
        ("--entries", 100, "N", "entries to write"),
        ("--entry-size", 1024, "BYTES", "bytes per entry"),
    ):
        test.add_argument(flag, type=positive, default=default, metavar=metavar,
                          help=f"{text} (default %(default)s)")  # fmt: skip
    _tls_flags(test)
    test.set_defaults(run=_run)
    read = commands.add_parser(
        "read-ledger", help="print a ledger's entries (text, or hex when not text); no recovery"
    )
    read.add_argument("ledger_id", type=non_negative, metavar="ID")
    read.add_argument("--first", type=non_negative, default=0, metavar="N")
    read.add_argument("--last", type=non_negative, default=None, metavar="N",
                      help="default: the last add confirmed")  # fmt: skip
    read.add_argument("--format", choices=("auto", "text", "hex"), default="auto",
                      help="auto: text when the payload is printable UTF-8, else hex")  # fmt: skip
    read.add_argument("--password", default="", help="the ledger's password")
    read.add_argument("--json", action="store_true", help=JSON_HELP)
    _tls_flags(read)
    read.set_defaults(run=_run)
    info = commands.add_parser(
        "bookie-info", help="a bookie's disk space, state and registration (JSON)"
    )
    info.add_argument("--bookie", required=True, metavar="BOOKIE_ID", help="e.g. 127.0.0.1:3181")
    _tls_flags(info)
    info.set_defaults(run=_run)


def _listing_commands(commands: Any) -> None:
    for name, text in (
        ("list-bookies", "registered bookies: id, rack, writable or read-only"),
        ("list-ledgers", "every ledger id"),
        ("list-logs", "every log's name (docs/logs.md)"),
        ("list-topics", "Kafka topics"),
        ("list-groups", "Kafka consumer groups"),
        ("list-under-replicated", "under-replicated ledgers: missing copies, since, why"),
    ):
        parser = commands.add_parser(name, help=text)
        parser.add_argument("--json", action="store_true", help=JSON_HELP)
        parser.set_defaults(run=_run)
        if name == "list-bookies":
            parser.add_argument("--read-only", action="store_true", help="only read-only ones")


def _tls_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-ca", metavar="FILE", help="CA of bookies that serve TLS")
    parser.add_argument("--tls-cert", metavar="FILE", help="client certificate (mutual TLS)")
    parser.add_argument("--tls-key", metavar="FILE", help="the client certificate's key")


def _client_config(args: argparse.Namespace) -> ClientConfig:
    config = ClientConfig(tls_ca_file=args.tls_ca, tls_cert_file=args.tls_cert,
                          tls_key_file=args.tls_key)  # fmt: skip
    config.validate()
    return config


async def _run(args: argparse.Namespace) -> str | tuple[str, int]:
    command = args.command
    if command == "bookie-info":
        return await bookie_info(args.metadata, args.bookie, _client_config(args))
    if not args.metadata:
        raise ConfigError(f"{command} needs --metadata URI (before the command)")
    uri = args.metadata
    if command == "simpletest":
        return await simpletest(uri, args.ensemble, args.write_quorum, args.ack_quorum,
                                args.entries, args.entry_size, _client_config(args))  # fmt: skip
    if command == "read-ledger":
        password, config = args.password.encode(), _client_config(args)
        return await read_ledger(uri, args.ledger_id, args.first, args.last, args.format,
                                 args.json, password, config)  # fmt: skip
    if command == "list-bookies":
        return await cluster.list_bookies(uri, args.read_only, args.json)
    if command == "list-ledgers":
        return await cluster.list_ledgers(uri, args.json)
    if command == "list-logs":
        return await logs.list_logs(uri, args.json)
    if command == "list-under-replicated":
        return await autorecovery.list_under_replicated(uri, args.json)
    from ..kafka import admin

    if command == "list-topics":
        return await admin.list_topics(uri, args.json)
    return await admin.list_groups(uri, args.json)


# --- simpletest ---------------------------------------------------------------------------


async def simpletest(
    uri: str, ensemble: int, write_quorum: int, ack_quorum: int, entries: int,
    entry_bytes: int, config: ClientConfig,
) -> tuple[str, int]:  # fmt: skip
    """Write ``entries`` entries to a new ledger, read them back, compare, delete the ledger.

    Raises:
        BookKeeperError: the cluster refused or failed a step (the message says which).
    """
    async with BookKeeper.connect(uri, config) as bk:
        writer = await bk.create_ledger(ensemble, write_quorum, ack_quorum, SIMPLETEST_PASSWORD)
        ledger_id, bookies = writer.ledger_id, list(writer.metadata.ensembles[0][1])
        started = time.monotonic()
        try:
            payloads = [_payload(ledger_id, i, entry_bytes) for i in range(entries)]
            await _write(writer, payloads)
            write_s = time.monotonic() - started
            await writer.close()
            bad = await _verify(bk, ledger_id, payloads)
        finally:
            await bk.delete_ledger(ledger_id)
    rate = entries / write_s if write_s > 0 else float("inf")
    summary = (f"ledger {ledger_id} (E{ensemble}/W{write_quorum}/A{ack_quorum} on "
               f"{', '.join(bookies)}): {entries} entries of {entry_bytes} bytes written "
               f"({rate:.0f} entries/s)")  # fmt: skip
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (" ..." if len(bad) > 10 else "")
        return f"simpletest FAILED: {summary}; {len(bad)} entries differ: {shown}", 1
    return f"simpletest ok: {summary}, read back and verified, ledger deleted", 0


def _payload(ledger_id: int, entry_id: int, size: int) -> bytes:
    head = f"simpletest ledger {ledger_id} entry {entry_id} ".encode()
    return (head * (size // len(head) + 1))[:size]


async def _write(writer: Any, payloads: list[bytes]) -> None:
    """Pipelined appends (the writer's own limits bound what is in flight)."""
    futures = []
    with tqdm(total=len(payloads), desc="write", unit="entry", file=sys.stderr) as bar:
        for payload in payloads:
            await writer.wait_for_room(len(payload))
            future = writer.append_nowait(payload)
            future.add_done_callback(lambda _f: bar.update(1))
            futures.append(future)
        await asyncio.gather(*futures)


async def _verify(bk: BookKeeper, ledger_id: int, payloads: list[bytes]) -> list[int]:
    """Entry ids whose copy read back differs from what was written (or is missing)."""
    reader = await bk.open_ledger(ledger_id, SIMPLETEST_PASSWORD)
    last = reader.last_add_confirmed
    bad = list(range(last + 1, len(payloads)))  # acknowledged but not in the closed ledger
    with tqdm(total=last + 1, desc="read back", unit="entry", file=sys.stderr) as bar:
        for first in range(0, last + 1, READ_CHUNK_ENTRIES):
            chunk = await reader.read(first, min(last, first + READ_CHUNK_ENTRIES - 1))
            for entry in chunk:
                if entry.entry_id >= len(payloads) or entry.payload != payloads[entry.entry_id]:
                    bad.append(entry.entry_id)
            bar.update(len(chunk))
    return sorted(bad)


# --- read-ledger ----------------------------------------------------------------------------


async def read_ledger(
    uri: str, ledger_id: int, first: int, last: int | None, form: str, as_json: bool,
    password: bytes, config: ClientConfig,
) -> str:  # fmt: skip
    """Print entries ``first..last`` (default: to the LAC) as they are read, one per line:
    ``ENTRY_ID<TAB>PAYLOAD`` or a JSON object. The ledger is opened without recovery: an
    open ledger's writer is not disturbed, and only entries up to its LAC are readable.

    Raises:
        NoSuchLedgerError, UnauthorizedError; IncorrectParameterError: past the LAC.
    """
    async with BookKeeper.connect(uri, config) as bk:
        reader = await bk.open_ledger(ledger_id, password, recovery=False)
        lac = reader.last_add_confirmed
        last = lac if last is None else last
        if last < first:
            return "" if lac >= 0 or as_json else f"ledger {ledger_id} has no entries"
        with tqdm(total=last - first + 1, desc=f"ledger {ledger_id}", unit="entry",
                  file=sys.stderr, disable=None) as bar:  # fmt: skip
            for start in range(first, last + 1, READ_CHUNK_ENTRIES):
                chunk = await reader.read(start, min(last, start + READ_CHUNK_ENTRIES - 1))
                for entry in chunk:
                    print(_shown(entry.entry_id, entry.payload, form, as_json))
                bar.update(len(chunk))
    return ""


def _shown(entry_id: int, payload: bytes, form: str, as_json: bool) -> str:
    text = None
    if form != "hex":
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            text = payload.decode(errors="replace") if form == "text" else None
        if form == "auto" and text is not None and not text.isprintable():
            text = None
    if as_json:
        doc: dict[str, Any] = {"entry_id": entry_id, "bytes": len(payload)}
        doc["text" if text is not None else "hex"] = text if text is not None else payload.hex()
        return json.dumps(doc)
    return f"{entry_id}\t{text if text is not None else payload.hex()}"


# --- bookie-info ----------------------------------------------------------------------------


async def bookie_info(uri: str | None, bookie_id: str, config: ClientConfig) -> str:
    """What the bookie says of itself (disk space, read-only) and, with a metadata URI, its
    registration (rack, read-only as registered), as indented JSON.

    Raises:
        BookieUnavailableError: the bookie cannot be reached.
    """
    client = await BookieClient.connect(client_network(config), bookie_id, config)
    try:
        info = await client.bookie_info()
    finally:
        await client.close()
    doc: dict[str, Any] = {
        "bookie_id": info.bookie_id,
        "free_bytes": info.free_bytes,
        "total_bytes": info.total_bytes,
        "used_fraction": round(1 - info.free_bytes / info.total_bytes, 4)
        if info.total_bytes else None,
        "read_only": info.read_only,
    }  # fmt: skip
    if uri:
        async with open_metadata_store(uri) as store:
            registered = (await store.list_bookies()).get(bookie_id)
        doc["registered"] = registered is not None
        if registered is not None:
            doc["rack"] = registered.rack
            doc["registered_read_only"] = registered.read_only
    return json.dumps(doc, indent=2, sort_keys=True)


__all__ = ["BookKeeperError", "add_commands"]
