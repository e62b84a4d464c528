"""A writer "crashes" (stops without closing); another client recovers the ledger.

Recovery fences the ledger on its bookies, finds the last entry that may have been
acknowledged, copies it to a write quorum and closes the ledger. The old writer's next append
then fails with LedgerFencedError: it can never add behind the reader's back.

    python examples/recover_after_crash.py etcd://127.0.0.1:2379/bookkeeper
"""

from __future__ import annotations

import asyncio
import sys

from bookkeeper_aio import BookKeeper, LedgerFencedError


async def main(uri: str) -> None:
    async with BookKeeper.connect(uri) as bk1, BookKeeper.connect(uri) as bk2:
        writer = await bk1.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw"
        )
        acked = [await writer.append(f"record {i}".encode()) for i in range(100)]

        recovered = await bk2.open_ledger(writer.ledger_id, password=b"pw", recovery=True)
        last = recovered.last_add_confirmed
        assert last >= acked[-1], "recovery never truncates acknowledged entries"
        entries = await recovered.read(0, last)
        print(f"recovered ledger {writer.ledger_id}: entries 0..{last}, {len(entries)} read")

        try:
            await writer.append(b"too late")
        except LedgerFencedError:
            print("the old writer is fenced out, as it must be")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
