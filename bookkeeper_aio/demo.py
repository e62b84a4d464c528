"""``make run``: start a local cluster of real bookie processes and run a demo workload.

The workload writes a ledger striped over three bookies (write quorum 3, ack quorum 2) directly
with the bookie protocol, kills one bookie with kill -9 half-way (the writes go on at ack quorum
on the other two), restarts it, and finally reads every acknowledged entry back from each bookie
that acknowledged it, checking payload and digest. It exits non-zero if anything acknowledged
was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from .client.bookie_client import BookieClient
from .config import ClientConfig
from .digest import entry_digest, master_key
from .errors import BookKeeperError, StatusCode
from .net import TcpNetwork
from .protocol import AddRequest
from .sandbox import BookieProcess, bookies

KEY = master_key(b"demo")
CONFIG = ClientConfig(connect_timeout_s=2, request_timeout_s=5)


def progress(label: str, done: int, total: int) -> None:
    width = 40
    filled = width * done // total
    print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="", flush=True)
    if done == total:
        print()


async def write(procs: list[BookieProcess], ledger_id: int, count: int) -> dict[int, set[str]]:
    """Write ``count`` entries to all bookies, ack at 2; kill bookie 0 half-way."""
    network = TcpNetwork()
    clients = {p.address: await BookieClient.connect(network, p.address, CONFIG) for p in procs}
    acked: dict[int, set[str]] = {}
    for entry_id in range(count):
        if entry_id == count // 2:
            print(f"\nkilling bookie {procs[0].address} with kill -9")
            procs[0].kill()
        payload = f"demo entry {entry_id}".encode()
        digest = entry_digest(ledger_id, entry_id, entry_id - 1, payload)
        fields = (ledger_id, entry_id, 0, KEY, entry_id - 1, payload, digest)
        results = await asyncio.gather(
            *(_add(c, fields) for c in clients.values()), return_exceptions=True
        )
        holders = {a for a, ok in zip(clients, results, strict=True) if ok is True}
        if len(holders) < 2:
            raise SystemExit(f"entry {entry_id}: only {len(holders)} bookies acknowledged")
        acked[entry_id] = holders
        if entry_id % 100 == 99 or entry_id == count - 1:
            progress("writing", entry_id + 1, count)
    for c in clients.values():
        await c.close()
    return acked


async def _add(client: BookieClient, fields: tuple) -> bool:
    if not client.is_usable:
        return False
    try:
        reply = await client.request(AddRequest, *fields)
    except BookKeeperError:
        return False
    return reply.status == StatusCode.OK


async def verify(ledger_id: int, acked: dict[int, set[str]]) -> int:
    """Read every acknowledged entry back from every bookie that acknowledged it."""
    checked = 0
    for address in sorted({a for holders in acked.values() for a in holders}):
        client = await BookieClient.connect(TcpNetwork(), address, CONFIG)
        ids = [e for e, holders in acked.items() if address in holders]
        for entry_id in ids:
            read = await client.read_entry(ledger_id, entry_id)
            expected = f"demo entry {entry_id}".encode()
            ok = read.payload == expected and read.digest == entry_digest(
                ledger_id, entry_id, read.entry_lac, read.payload
            )
            if not ok:
                raise SystemExit(f"entry {entry_id} on {address} is wrong")
            checked += 1
        await client.close()
    return checked


async def main(count: int, engine: str) -> int:
    with tempfile.TemporaryDirectory(prefix="bookkeeper-aio-demo-") as tmp:
        print(f"starting 3 bookies ({engine} engine) under {tmp}")
        with bookies(Path(tmp), 3, engine) as procs:
            for p in procs:
                print(f"  bookie {p.address}")
            ledger_id = int.from_bytes(os.urandom(4), "big")
            start = time.perf_counter()
            acked = await write(procs, ledger_id, count)
            elapsed = time.perf_counter() - start
            print(f"restarting bookie {procs[0].address}")
            procs[0].start()
            checked = await verify(ledger_id, acked)
    print(
        f"summary: {len(acked)} entries acknowledged in {elapsed:.1f}s, "
        f"{checked} copies read back and verified, nothing lost"
    )
    return 0


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bookkeeper_aio.demo", description=__doc__)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files"))
    args = parser.parse_args(argv)
    return asyncio.run(main(args.entries, args.engine))


if __name__ == "__main__":
    sys.exit(cli())
