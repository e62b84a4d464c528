"""What a log is called, where its keys live, and what it is created with (pure).

Theory of operation
-------------------
A log's name becomes a segment of metadata keys: ``logs/<name>`` holds the log, and
``logs/<name>/cursors/<group>`` its consumer groups' cursors. Names (and group names) are 1-255
bytes of UTF-8, printable, without ``/`` or spaces, so the keys of a log named ``a`` never
collide with those of another log. :class:`LogOptions` are checked on construction: invalid
input is refused before the metadata store is touched.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import IncorrectParameterError
from ..metadata.model import validate_quorums

NAME_BYTES_MAX = 255
LOGS_PREFIX = "logs/"
_NAME = re.compile(r"^[^\x00-\x20\x7f/]+$")  # a key segment (metadata.store_shared.check_key)


def check_name(name: object, what: str = "log name") -> str:
    """Return ``name`` if it is a valid log (or cursor group) name: 1-255 bytes of UTF-8,
    printable, without ``/`` or spaces.

    Raises:
        IncorrectParameterError: it is not (the message says why).
    """
    if not isinstance(name, str) or not name:
        raise IncorrectParameterError(f"{what} must be a non-empty string, got {name!r}")
    try:
        size = len(name.encode())
    except UnicodeEncodeError as exc:
        raise IncorrectParameterError(f"{what} {name!r} is not valid UTF-8: {exc}") from None
    if size > NAME_BYTES_MAX:
        raise IncorrectParameterError(
            f"{what} {name[:40]!r}... is {size} bytes; at most {NAME_BYTES_MAX}"
        )
    if "/" in name:
        raise IncorrectParameterError(f"{what} {name!r} must not contain '/'")
    if not _NAME.match(name):
        raise IncorrectParameterError(f"{what} {name!r}: printable characters, no spaces")
    return name


def log_key(name: str) -> str:
    """The metadata key of a log."""
    return LOGS_PREFIX + name


def cursor_prefix(name: str) -> str:
    """The prefix of a log's cursors (under the log's key: names cannot contain ``/``)."""
    return f"{LOGS_PREFIX}{name}/cursors/"


def cursor_key(name: str, group: str) -> str:
    """The metadata key of one consumer group's cursor on a log."""
    return cursor_prefix(name) + group


def _optional(value: Any, what: str, kind: type) -> None:
    """None, or a positive finite number of ``kind`` (ints are accepted for floats)."""
    if value is None:
        return
    ok = type(value) is int or (kind is float and type(value) is float)
    if not ok or not math.isfinite(value) or value <= 0:
        raise IncorrectParameterError(f"{what} must be None or a positive number, got {value!r}")


@dataclass(frozen=True)
class LogOptions:
    """What a log was created with: its ledgers' quorums, when a writer rolls over to a new
    ledger, and what retention removes (None: no such limit)."""

    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    segment_bytes_max: int | None = 64 << 20
    segment_entries_max: int | None = None
    segment_age_s: float | None = None
    retention_s: float | None = None
    retention_bytes: int | None = None

    def __post_init__(self) -> None:
        validate_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        _optional(self.segment_bytes_max, "segment_bytes_max", int)
        _optional(self.segment_entries_max, "segment_entries_max", int)
        _optional(self.segment_age_s, "segment_age_s", float)
        _optional(self.retention_s, "retention_s", float)
        _optional(self.retention_bytes, "retention_bytes", int)
