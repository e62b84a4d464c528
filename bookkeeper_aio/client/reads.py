"""Reading entries and LACs from bookies: replicas, speculation, digest checks. Shared by the
reader and by recovery.

Theory of operation
-------------------
An entry lives on its write set. :func:`read_entry` asks the first replica; if no good answer
came within ``speculative_read_timeout_s`` it also asks the next one, and so on; a failed or
corrupt answer moves on at once. Every copy's digest is recomputed ("assert twice"): a mismatch
counts as a failed replica, never as data. The result is the first good copy, or an error that
keeps BookKeeper's distinction: NoSuchEntryError only if *every* replica gave an explicit
negative, otherwise ReadError (unknown).

Read repair (BP-31 "no repair in the read path"): a replica that answered with a corrupt copy,
BAD_DIGEST or IO_ERROR is handed, with the good copy found afterwards, to the caller's
``repair`` callback (``read_repair.py`` writes the copy back with :func:`write_copy`); with no
good copy anywhere it is reported short like any other replica without one.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from functools import partial
from typing import Any

from ..digest import LacProof, entry_digest
from ..errors import BookKeeperError, NoSuchEntryError, ReadError, StatusCode, is_explicit_negative
from ..metadata.model import LedgerMetadata
from ..protocol import (
    ADD_FLAG_RECOVERY,
    READ_FLAG_FENCE,
    READ_FLAG_LONG_POLL,
    AddRequest,
    AddResponse,
    ReadRequest,
    ReadResponse,
)
from ..quorum import write_set
from .context import ClientContext, LedgerEntry

# Answers that say a replica lacks a good copy (an OK answer here had a wrong digest). Not
# timeouts, lost connections, overload or limbo: those are the auditor's lost-bookie delay
# and the bookie's own repair.
SHORT_COPY_STATUSES = frozenset(
    {
        StatusCode.OK,
        StatusCode.NO_SUCH_ENTRY,
        StatusCode.NO_SUCH_LEDGER,
        StatusCode.IO_ERROR,
        StatusCode.BAD_DIGEST,
    }
)
# Of those, the answers of a replica that lacks the entry (maybe only for now: see read_entry).
MISSING_STATUSES = frozenset({StatusCode.NO_SUCH_ENTRY, StatusCode.NO_SUCH_LEDGER})
# Of those, the answers of a replica that holds the entry but cannot give it intact: its copy
# is rewritten from a good one (read repair). A missing copy is autorecovery's (marks).
BAD_COPY_STATUSES = frozenset({StatusCode.OK, StatusCode.IO_ERROR, StatusCode.BAD_DIGEST})
Repair = Callable[[int, ReadResponse, list[str]], None]


def entry_ok(ledger_id: int, entry_id: int, response: Any) -> bool:
    """True if ``response`` is an OK read of entry ``entry_id`` whose payload matches its
    digest. The id is checked too: a bookie answering with another entry (its digest valid
    for that entry) must not pass for the one asked."""
    return (
        type(response) is ReadResponse
        and response.status == StatusCode.OK
        and response.entry_id == entry_id
        and response.payload is not None
        and response.entry_lac is not None
        and response.digest
        == entry_digest(ledger_id, response.entry_id, response.entry_lac, response.payload)
    )


def proof_lac(ledger_id: int, proof: LacProof | None) -> int:
    """The LAC a bookie's proof carries, or -1 if absent or corrupt."""
    return proof.lac if proof is not None and proof.verify(ledger_id) else -1


async def request(ctx: ClientContext, bookie: str, msg_type: type, *fields: Any, **kw: Any) -> Any:
    """One request to one bookie; the response (any status) or the exception."""
    try:
        client = await ctx.pool.get(bookie)
        return await client.request(msg_type, *fields, **kw)
    except BookKeeperError as exc:
        return exc


async def read_copy(
    ctx: ClientContext, ledger_id: int, entry_id: int, sources: list[str]
) -> ReadResponse | None:
    """A digest-verified copy of the entry from the first of ``sources`` that has one, asked
    one after the other; None if none has. What every copier uses (the bookie's BP-46 repair,
    autorecovery)."""
    for bookie in sources:
        response = await request(ctx, bookie, ReadRequest, ledger_id, entry_id, 0, None, -1, 0)
        if entry_ok(ledger_id, entry_id, response):
            return response
    return None


async def write_copy(
    ctx: ClientContext, ledger_id: int, master_key: bytes, target: str, copy: ReadResponse
) -> str | None:
    """Write a verified copy (:func:`read_copy`) to ``target`` with the **recovery flag**
    (a fenced or closed ledger takes it; the entry keeps its own LAC and digest, which the
    target checks again; an existing copy is overwritten). None once stored, else why not.
    What every writer of copies uses (autorecovery's copier, read repair)."""
    answer = await request(ctx, target, AddRequest, ledger_id, copy.entry_id, ADD_FLAG_RECOVERY,
                           master_key, copy.entry_lac, copy.payload, copy.digest)  # fmt: skip
    if type(answer) is AddResponse and answer.status == StatusCode.OK:
        return None
    status = getattr(answer, "status", None)
    if status is None:  # not a response: an exception
        return str(answer)
    try:
        return StatusCode(status).name
    except ValueError:  # a number we do not know
        return str(status)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def replicas(md: LedgerMetadata, entry_id: int) -> list[str]:
    """The bookies holding ``entry_id``, in write-set order."""
    ensemble = md.ensemble_at(entry_id)
    return [ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum)]


async def read_entry(
    ctx: ClientContext,
    md: LedgerMetadata,
    entry_id: int,
    short: Callable[[str, int], None] | None = None,
    repair: Repair | None = None,
    *,
    missing_is_short: bool = True,
    first: str | None = None,
) -> LedgerEntry:
    """A verified copy of ``entry_id`` (see the module docstring). ``short(bookie, entry)``
    is told of every replica that answered with an error, "no such entry" or a corrupt copy
    (the caller knows the entry exists: BP-31 read-path detection); with ``repair``, the
    replicas whose copy is bad go to ``repair(entry, good copy, bookies)`` instead once a good
    copy is found (and to ``short`` if none is). Not ``missing_is_short``: "no such entry" or
    "no such ledger" is not short (an open ledger's replica may be behind its writer, which
    reports the copies it fails to make itself). ``first``: a replica to ask before the
    others (a batch read's bookie: range_reads.py), else the write set's order.

    Raises:
        NoSuchEntryError: every replica says it does not have the entry.
        ReadError: no good copy, and not every answer was an explicit negative.
    """
    lid = md.ledger_id
    fields = (lid, entry_id, 0, None, -1, 0)
    remaining = collections.deque(replicas(md, entry_id))
    if first is not None and first in remaining:
        remaining.remove(first)
        remaining.appendleft(first)
    negatives = 0
    bad: list[str] = []  # replicas with a bad copy, for repair
    # Answers by callback (no task per request: a range of a striped ledger is a read per
    # entry); ``wake`` is set by an answer, or by the speculative timer.
    answers: collections.deque[tuple[str, Any]] = collections.deque()
    outstanding = 0
    loop = asyncio.get_running_loop()
    wake: asyncio.Future[None] | None = None

    def answered(bookie: str, result: Any) -> None:
        answers.append((bookie, result))
        if wake is not None and not wake.done():
            wake.set_result(None)

    def ask_next() -> None:
        nonlocal outstanding
        bookie = remaining.popleft()
        outstanding += 1
        ctx.pool.send(bookie, ReadRequest, *fields, callback=partial(answered, bookie))

    ask_next()
    while outstanding:
        if not answers:
            wake = loop.create_future()
            timer = None
            if remaining:
                timer = loop.call_later(ctx.config.speculative_read_timeout_s, _wake, wake)
            try:
                await wake
            finally:
                if timer is not None:
                    timer.cancel()
            if not answers:
                ask_next()  # slow replica: speculate on the next one
                continue
        bookie, result = answers.popleft()
        outstanding -= 1
        if isinstance(result, Exception) and not isinstance(result, BookKeeperError):
            raise result  # not a bookie's failure: a bug of ours
        if entry_ok(lid, entry_id, result):
            if bad and repair is not None:
                repair(entry_id, result, bad)
            return LedgerEntry(entry_id, result.payload)
        status = getattr(result, "status", None)
        negatives += status is not None and is_explicit_negative(status)
        # (not missing_is_short: "no such entry" may be a replica behind the writer)
        if (
            short is not None
            and status in SHORT_COPY_STATUSES
            and (missing_is_short or status not in MISSING_STATUSES)
        ):
            if repair is not None and status in BAD_COPY_STATUSES:
                bad.append(bookie)
            else:
                short(bookie, entry_id)
        if remaining:
            ask_next()  # a failed or corrupt answer moves on at once
    if bad:  # no good copy to repair them from
        assert short is not None  # bad copies are gathered only to be reported short
        for bookie in bad:
            short(bookie, entry_id)
    if negatives == md.write_quorum:
        raise NoSuchEntryError(f"ledger {lid}: no replica has entry {entry_id}")
    raise ReadError(f"ledger {lid}: no good copy of entry {entry_id}")


async def long_poll(
    ctx: ClientContext, md: LedgerMetadata, previous_lac: int
) -> tuple[int, LedgerEntry | None]:
    """Wait (bounded) for the LAC to pass ``previous_lac`` on a replica of the next entry.

    Returns the new LAC seen (maybe unchanged) and the next entry if the bookie sent it.
    """
    entry_id = previous_lac + 1
    timeout_ms = ctx.config.long_poll_timeout_ms
    fields = (md.ledger_id, entry_id, READ_FLAG_LONG_POLL, None, previous_lac, timeout_ms)
    timeout_s = timeout_ms / 1000 + ctx.config.request_timeout_s
    for bookie in replicas(md, entry_id):
        result = await request(ctx, bookie, ReadRequest, *fields, timeout_s=timeout_s)
        if type(result) is ReadResponse and result.status == StatusCode.OK:
            lac = proof_lac(md.ledger_id, result.lac_proof)
            entry = None
            if entry_ok(md.ledger_id, entry_id, result):
                assert result.payload is not None  # entry_ok checked it
                entry = LedgerEntry(entry_id, result.payload)
            return max(lac, previous_lac), entry
    return previous_lac, None


__all__ = [
    "READ_FLAG_FENCE",
    "entry_ok",
    "long_poll",
    "proof_lac",
    "read_copy",
    "read_entry",
    "replicas",
    "write_copy",
]
