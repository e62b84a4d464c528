"""A log writer or tailing reader in a process of its own (tests/test_logs_process.py).

    python tests/logs_worker.py writer URI LOG PREFIX COUNT   # prints "ACK <offset> <payload>"
    python tests/logs_worker.py reader URI LOG                # prints "REC <offset> <payload>"

The writer takes the log over, appends COUNT records (several in flight), then ``END`` and
closes; the reader prints every record from offset 0 until it reads ``END``. Each line is
flushed as it is known, so a writer killed with kill -9 has printed every acknowledgement it
got.
"""

from __future__ import annotations

import asyncio
import sys

from bookkeeper_aio import BookKeeper, ClientConfig

CONFIG = ClientConfig(request_timeout_s=3, explicit_lac_interval_s=0.2, long_poll_timeout_ms=1000)
IN_FLIGHT = 16


async def writer(uri: str, log: str, prefix: str, count: int) -> None:
    async with BookKeeper.connect(uri, CONFIG) as bk, bk.open_log_writer(log) as lw:
        print(f"OPEN {lw.next_offset}", flush=True)

        def told(offset: int, error: BaseException | None, payload: bytes) -> None:
            if error is None:
                print(f"ACK {offset} {payload.decode()}", flush=True)

        for i in range(count):
            payload = f"{prefix}-{i}".encode()
            if i % IN_FLIGHT == IN_FLIGHT - 1:  # pace: at most IN_FLIGHT in flight
                told(await lw.append(payload), None, payload)
                continue
            await lw.wait_for_room(len(payload))
            lw.append_callback(payload, lambda o, e, p=payload: told(o, e, p))
        offset = await lw.append(b"END")
        print(f"ACK {offset} END", flush=True)


async def reader(uri: str, log: str) -> None:
    async with BookKeeper.connect(uri, CONFIG) as bk, bk.open_log_reader(log) as records:
        async for record in records:
            print(f"REC {record.offset} {record.payload.decode()}", flush=True)
            if record.payload == b"END":
                return


def main() -> None:
    mode, uri, log, *rest = sys.argv[1:]
    if mode == "writer":
        asyncio.run(writer(uri, log, rest[0], int(rest[1])))
    else:
        asyncio.run(reader(uri, log))


if __name__ == "__main__":
    main()
