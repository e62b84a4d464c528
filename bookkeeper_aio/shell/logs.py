"""Log admin commands: list-logs, log-info NAME. Each returns the text to print (JSON where a
script may parse it)."""

from __future__ import annotations

import json

from ..client.bookkeeper import BookKeeper
from ..logs import LogSegmentInfo


async def list_logs(uri: str, as_json: bool = False) -> str:
    """Every log's name, one per line (``as_json``: ``{"name": NAME}`` per line)."""
    async with BookKeeper.connect(uri) as bk:
        names = await bk.list_logs()
    if as_json:
        return "\n".join(json.dumps({"name": n}) for n in names)
    return "\n".join(names) if names else "no logs"


async def log_info(uri: str, name: str) -> str:
    """One log as indented JSON: offsets, segments (ledger id, first and last offset, state),
    and the metadata as stored.

    Raises:
        NoSuchLogError: no such log. IncorrectParameterError: an invalid name.
    """
    async with BookKeeper.connect(uri) as bk:
        info = await bk.log_info(name)
    doc = {
        "name": info.name,
        "start_offset": info.start_offset,
        "next_offset": info.next_offset,
        "segments": [_segment(s) for s in info.segments],
        "metadata": json.loads(info.metadata.to_json_bytes()),
        "version": info.version,
    }
    return json.dumps(doc, indent=2, sort_keys=True)


def _segment(segment: LogSegmentInfo) -> dict[str, object]:
    return {
        "ledger_id": segment.ledger_id,
        "first_offset": segment.first_offset,
        "last_offset": segment.last_offset,
        "state": segment.state.value,
    }
