"""``bookie-sanity``: write a few entries to a fresh ledger on one bookie and read them back.

Like BookKeeper's ``bookiesanity``: it talks to the bookie directly (no metadata store), so it
checks exactly one thing — that this bookie accepts, persists and serves entries with correct
digests. The ledger id is random in the upper half of the id space, far from ids a metadata
store hands out, and the ledger is fenced at the end so nothing can extend it by mistake.
"""

from __future__ import annotations

import os
import random

from ..client.bookie_client import BookieClient
from ..config import ClientConfig
from ..digest import entry_digest, master_key
from ..errors import BookKeeperError
from ..net import TcpNetwork

SANITY_PASSWORD = b"bookie-sanity"


async def bookie_sanity(address: str, entries: int, entry_bytes: int, timeout_s: float) -> str:
    """Run the check; return a one-line report.

    Raises:
        BookKeeperError: the bookie refused or failed a request (the message says which).
        AssertionError: an entry read back differs from what was written.
    """
    config = ClientConfig(connect_timeout_s=timeout_s, request_timeout_s=timeout_s)
    client = await BookieClient.connect(TcpNetwork(), address, config)
    try:
        ledger_id = random.SystemRandom().randrange(1 << 62, 1 << 63)
        key = master_key(SANITY_PASSWORD)
        payloads = [os.urandom(entry_bytes) for _ in range(entries)]
        for entry_id, payload in enumerate(payloads):
            lac = entry_id - 1
            digest = entry_digest(ledger_id, entry_id, lac, payload)
            await client.add_entry(ledger_id, entry_id, key, lac, payload, digest)
        for entry_id, payload in enumerate(payloads):
            read = await client.read_entry(ledger_id, entry_id)
            _check(read.payload == payload, f"entry {entry_id}: payload differs")
            entry_lac = read.entry_lac  # None only from a bookie that is wrong
            want = (
                None if entry_lac is None else entry_digest(ledger_id, entry_id, entry_lac, payload)
            )
            _check(read.digest == want, f"entry {entry_id}: digest does not match")
        answer = await client.read_lac(ledger_id, master_key=key, fence=True)
        _check(answer.last_entry_id == entries - 1, f"last entry id {answer.last_entry_id}")
    finally:
        await client.close()
    return f"bookie {address} ok: wrote and verified {entries} entries on ledger {ledger_id}"


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise BookKeeperError(f"verification failed: {what}")
